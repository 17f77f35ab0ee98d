"""Every framework example runs offline as its own process and tells the same story: a
duplicate replayed, an approval, an UNKNOWN outcome parked and later resolved.

Judged twice: by the lines the example prints, and by the SQLite ledger it leaves (the
one the console and ``openonce --db`` open): each effect's state, how many attempts ran,
who approved, and the journal of the charge that was UNKNOWN.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from openonce_core import EffectState, OpenOnce

ROOT = Path(__file__).resolve().parents[2]

# Each example, and the words that say how its UNKNOWN charge was resolved.
EXAMPLES = {
    "langgraph_langchain.py": "resolved as happened by eric",
    "openai_agents_sdk.py": "resolved as happened by the reconciler",
    "openai_sdk.py": "resolved as happened by eric",
    "anthropic_sdk.py": "resolved as happened by the reconciler",
}


def run_example(name: str, ledger: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, f"examples/{name}", str(ledger)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def line(lines: list[str], *words: str) -> str:
    """The one printed line that holds all of ``words``."""
    found = [text for text in lines if all(w in text for w in words)]
    assert len(found) == 1, f"no single line with {words!r} in:\n" + "\n".join(lines)
    return found[0]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_replays_a_duplicate_waits_for_approval_and_parks_an_unknown(name, tmp_path):
    ledger = tmp_path / "ledger.db"
    lines = run_example(name, ledger)

    assert "handler ran 1 time" in line(lines, "email.send", "duplicate replayed")
    pending = line(lines, "payments.refund", "approval required")
    assert "handler ran 0 times" in pending
    approved = line(lines, "payments.refund", "approved by eric")
    assert "executed once (handler ran 1 time, state committed)" in approved
    assert "parked as unknown" in line(lines, "payments.charge", "outcome unknown")
    retried = line(lines, "payments.charge", "not retried")
    assert "retried 1 time" in retried
    assert "(handler ran 1 time, provider charged 1 time)" in retried
    line(lines, "payments.charge", EXAMPLES[name])
    assert "(handler ran 1 time)" in line(lines, "payments.charge", "replayed")

    with OpenOnce(str(ledger)) as oo:
        effects = {e.tool: e for e in oo.store.list_effects()}
        assert sorted(effects) == ["email.send", "payments.charge", "payments.refund"]
        for effect in effects.values():
            assert (effect.state, effect.attempt) == (EffectState.COMMITTED, 1)

        refund = effects["payments.refund"]
        assert refund.id in pending
        assert [(a.decision, a.by) for a in oo.approvals(refund.id)] == [("approve", "eric")]

        charge = effects["payments.charge"]
        moves = [(j.from_state, j.to_state) for j in oo.journal(charge.id)]
        assert ("started", "unknown") in moves
        assert moves[-1][1] == "committed"
        assert not any(m == ("unknown", "started") for m in moves)  # never blindly re-run
        assert charge.result["charge_id"] == "ch_0001"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_example_run_again_on_the_same_ledger_is_a_new_conversation(name, tmp_path):
    ledger = tmp_path / "ledger.db"
    run_example(name, ledger)
    second = run_example(name, ledger)

    assert "handler ran 1 time" in line(second, "email.send", "duplicate replayed")
    assert re.search(r"approval required.*\(eff_\w+\)", line(second, "payments.refund", "approval"))
    with OpenOnce(str(ledger)) as oo:
        effects = oo.store.list_effects()
        assert len(effects) == 6
        assert {e.state for e in effects} == {EffectState.COMMITTED}
        assert len({e.scope for e in effects if e.tool == "email.send"}) == 2


def test_examples_default_to_a_ledger_in_the_working_directory(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_sdk.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "examples-openai-sdk.db").exists()
