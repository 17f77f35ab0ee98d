"""``mypy --strict`` on a user's module: a decorated tool keeps its handler's signature, so
a call with a wrong argument type is an error naming the argument, and the integrations'
decorators type-check too (when their frameworks are installed).

mypy runs as a subprocess on files written to a temporary directory, with its cache there;
the package's own modules are followed silently, as an installed package's are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mypy")

CORRECT = """
    from typing import Any

    from openonce_core import EffectFunction, EffectOptions, OpenOnce

    oo = OpenOnce(":memory:")


    @oo.effect
    def refund(charge: str, amount_cents: int) -> dict[str, Any]:
        return {"charge": charge, "amount_cents": amount_cents}


    @oo.effect(tool="payments.charge", idempotency_key="charge-1", max_attempts=2)
    async def charge(order_id: str, *, cents: int = 100) -> int:
        return cents


    def send(to: str) -> str:
        return to


    sent = oo.effect(send, tool="email.send", idempotency_fields=["to"])
    declared: EffectFunction[[str], str] = oo.declare(send, EffectOptions(tool="email.other"))

    reveal_type(refund)
    reveal_type(charge)
    reveal_type(sent)

    name: str = refund.openonce_tool + charge.openonce_tool + sent.openonce_tool
    receipt: dict[str, Any] = refund("ch_1", amount_cents=500)
    message: str = sent("ada@example.com") + declared("bob@example.com")


    async def main() -> int:
        return await charge("order-1", cents=200)
"""

WRONG_ARGUMENT = """
    from openonce_core import OpenOnce

    oo = OpenOnce(":memory:")


    @oo.effect(tool="payments.refund")
    def refund(charge: str, amount_cents: int) -> str:
        return charge


    @oo.effect
    async def charge(order_id: str) -> int:
        return 1


    refund("ch_1", amount_cents="500")


    async def main() -> str:
        return await charge("order-1")
"""

WRONG_OPTION = """
    from openonce_core import OpenOnce

    oo = OpenOnce(":memory:")


    def refund(charge: str) -> str:
        return charge


    oo.effect(refund, max_attempts="3")
    oo.effect(refund, retries=3)
"""

LANGGRAPH = """
    from langchain_core.tools import StructuredTool

    from openonce_core import OpenOnce
    from openonce_core.integrations.langgraph import effect_tool

    oo = OpenOnce(":memory:")


    @effect_tool(oo, tool="payments.refund", idempotency_key="refund-1", name="refund")
    def refund(charge: str) -> str:
        '''Refund a charge.'''
        return charge


    def send(to: str) -> str:
        '''Send an email.'''
        return to


    tools: list[StructuredTool] = [refund, effect_tool(oo, send, idempotency_fields=["to"])]
"""

OPENAI_AGENTS = """
    from agents import FunctionTool

    from openonce_core import OpenOnce
    from openonce_core.integrations.openai_agents import effect_function_tool

    oo = OpenOnce(":memory:")


    @effect_function_tool(oo, tool="payments.refund", idempotency_key="refund-1", dedup="call")
    def refund(charge: str) -> str:
        '''Refund a charge.'''
        return charge


    def send(to: str) -> str:
        '''Send an email.'''
        return to


    tools: list[FunctionTool] = [refund, effect_function_tool(oo, send, name_override="mail")]
"""


def _mypy(tmp_path: Path, files: dict[str, str]) -> dict[str, list[str]]:
    """Run ``mypy --strict`` once over ``files``; its output lines per file name."""
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\nfollow_imports = silent\n")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config),
         "--cache-dir", str(tmp_path / ".mypy_cache"), *files],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},  # the checkout, as an installed package
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    lines: dict[str, list[str]] = {name: [] for name in files}
    for line in result.stdout.splitlines():
        name = line.split(":", 1)[0]
        if name in lines:
            lines[name].append(line)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return lines


def test_mypy_strict_keeps_each_tools_signature(tmp_path):
    out = _mypy(
        tmp_path,
        {"tools.py": CORRECT, "wrong_argument.py": WRONG_ARGUMENT, "wrong_option.py": WRONG_OPTION},
    )

    assert [line for line in out["tools.py"] if ": error:" in line] == []
    revealed = [line.split("Revealed type is ", 1)[1] for line in out["tools.py"]]
    assert revealed == [
        '"openonce_core._options.EffectFunction[[charge: str, amount_cents: int], dict[str, Any]]"',
        '"openonce_core._options.EffectFunction[[order_id: str, *, cents: int =],'
        ' typing.Coroutine[Any, Any, int]]"',
        '"openonce_core._options.EffectFunction[[to: str], str]"',
    ]

    assert out["wrong_argument.py"] == [
        'wrong_argument.py:17: error: Argument "amount_cents" to "__call__" of'
        ' "EffectFunction" has incompatible type "str"; expected "int"  [arg-type]',
        'wrong_argument.py:21: error: Incompatible return value type (got "int",'
        ' expected "str")  [return-value]',
    ]
    wrong_option = "\n".join(out["wrong_option.py"])
    assert 'wrong_option.py:11: error: No overload variant of "effect"' in wrong_option
    assert 'wrong_option.py:12: error: Unexpected keyword argument "retries"' in wrong_option


INTEGRATIONS = {"langgraph": LANGGRAPH, "agents": OPENAI_AGENTS}


@pytest.mark.parametrize(
    "framework",
    # mypy reads the framework's own packages with a cold cache: ~9 s for LangGraph,
    # ~30 s for the Agents SDK (it reads the openai package).
    ["langgraph", pytest.param("agents", marks=pytest.mark.slow)],
)
def test_mypy_strict_accepts_the_integrations_decorators(tmp_path, framework):
    pytest.importorskip(framework)

    out = _mypy(tmp_path, {"tools.py": INTEGRATIONS[framework]})

    assert out["tools.py"] == []
