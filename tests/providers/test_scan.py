"""The static scanner: effect tools found in source trees, never by importing them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from openonce_core._providers import CapabilityMatrix
from openonce_core._scan import (
    ScannedTool,
    handler_contract_problems,
    receipt_contract_problems,
    scan_tree,
)

MATRIX = CapabilityMatrix()
GITHUB = MATRIX.for_tool("github.create_pr")
STRIPE = MATRIX.for_tool("stripe.charge")


def write(root: Path, name: str, source: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")


def only_tool(root: Path, source: str) -> ScannedTool:
    write(root, "tools.py", "import openonce\noo = openonce.OpenOnce(':memory:')\n" + source)
    result = scan_tree(root)
    assert result.errors == ()
    [tool] = result.tools
    return tool


def handler(body: str, *, args: str = "owner, repo, head, title", decorator: str = "") -> str:
    decorator = decorator or (
        '@oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])'
    )
    return f"{decorator}\ndef create_pr({args}):\n" + textwrap.indent(textwrap.dedent(body), "    ")


# -- finding tools ------------------------------------------------------------------------


def test_finds_every_supported_declaration(tmp_path):
    write(
        tmp_path,
        "app/agent.py",
        """
        import openonce
        from openonce.integrations.langgraph import effect_tool
        from openonce.integrations import openai_agents

        oo = openonce.OpenOnce("openonce.db")
        REFUND = "stripe.refund"

        @oo.effect(tool="stripe.charge")
        def charge(amount_cents: int) -> dict:
            return {"stripe_id": "pi_1"}

        @oo.effect(tool=REFUND, idempotency_fields=["charge"])
        def refund(charge: str) -> dict:
            return {"stripe_id": "re_1"}

        @oo.effect
        def send_email(to: str, subject: str) -> str:
            return "ok"

        @effect_tool(oo, tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])
        async def open_pr(owner, repo, head):
            return {"number": 1, "head": head}

        class Agent:
            @self.ledger.effect(tool="email.send")
            def mail(self, to):
                return {"message_id": "<m@x>"}

        @openai_agents.effect_function_tool(oo, tool="slack.post_message")
        def post(channel, text):
            return {"ts": "1.2"}

        @other_decorator
        def not_an_effect():
            pass
        """,
    )
    result = scan_tree(tmp_path)
    found = [(t.function, t.tool, t.tool_source, t.decorator) for t in result.tools]
    assert found == [
        ("charge", "stripe.charge", "literal", "oo.effect"),
        ("refund", "stripe.refund", "constant REFUND", "oo.effect"),
        ("send_email", "send_email", "function name", "oo.effect"),
        ("open_pr", "github.create_pr", "literal", "effect_tool"),
        ("mail", "email.send", "literal", "self.ledger.effect"),
        ("post", "slack.post_message", "literal", "openai_agents.effect_function_tool"),
    ]
    assert result.files_scanned == 1
    assert result.tools[0].file == "app/agent.py"
    assert result.tool_names == [
        "stripe.charge",
        "stripe.refund",
        "send_email",
        "github.create_pr",
        "email.send",
        "slack.post_message",
    ]


def test_finds_effects_declared_by_calls_on_module_functions(tmp_path):
    write(
        tmp_path,
        "calls.py",
        """
        import openonce
        from openonce import EffectOptions
        from openonce.integrations.langgraph import effect_tool

        oo = openonce.OpenOnce("openonce.db")
        SHARED = EffectOptions(tool="stripe.refund", idempotency_fields=["charge"])

        def charge(amount_cents: int) -> dict:
            return {"stripe_id": "pi_1"}

        def refund(charge: str) -> dict:
            return {"stripe_id": "re_1"}

        def refund_again(charge: str) -> dict:
            return {"stripe_id": "re_2"}

        def mail(to: str) -> dict:
            return {"message_id": "<m@x>"}

        def open_pr(owner, repo, head):
            return {"number": 1}

        def computed(x): ...

        charged = oo.declare(charge, EffectOptions(tool="stripe.charge"))
        refunded = oo.declare(refund, SHARED)
        again = oo.declare(refund_again, options=openonce.EffectOptions(tool="stripe.refund"))
        mailed = oo.effect(mail, tool="email.send")
        pr = effect_tool(oo, open_pr, tool="github.create_pr", idempotency_fields=["owner"])
        dynamic = oo.declare(computed, options_for("x"))
        not_ours = effect(mail)
        imported = oo.declare(somewhere_else, SHARED)
        """,
    )
    result = scan_tree(tmp_path)
    found = [(t.function, t.tool, t.decorator) for t in result.tools]
    assert sorted(found) == sorted([
        ("charge", "stripe.charge", "oo.declare"),
        ("refund", "stripe.refund", "oo.declare"),
        ("refund_again", "stripe.refund", "oo.declare"),
        ("mail", "email.send", "oo.effect"),
        ("open_pr", "github.create_pr", "effect_tool"),
        ("computed", None, "oo.declare"),
    ])  # fmt: skip
    refund = next(t for t in result.tools if t.function == "refund")
    assert refund.idempotency_fields == ("charge",)
    [dynamic] = result.unauditable
    assert dynamic.tool_expression == "options_for('x')" and dynamic.idempotency_fields_dynamic


def test_dynamic_tool_expressions_are_unauditable(tmp_path):
    write(
        tmp_path,
        "dyn.py",
        """
        import os
        PREFIX = "stripe"
        REBOUND = "stripe.charge"
        if os.environ.get("X"):
            REBOUND = "stripe.refund"
        from config import IMPORTED

        @oo.effect(tool=PREFIX + ".charge")
        def a(): ...

        @oo.effect(tool=REBOUND)
        def b(): ...

        @oo.effect(tool=IMPORTED)
        def c(): ...

        @oo.effect(tool=f"{PREFIX}.x")
        def d(): ...
        """,
    )
    result = scan_tree(tmp_path)
    assert [(t.function, t.tool, t.tool_expression) for t in result.unauditable] == [
        ("a", None, "PREFIX + '.charge'"),
        ("b", None, "REBOUND"),
        ("c", None, "IMPORTED"),
        ("d", None, "f'{PREFIX}.x'"),
    ]
    assert result.tool_names == []


def test_a_constant_rebound_through_global_is_not_a_constant(tmp_path):
    tool = only_tool(
        tmp_path,
        """
TOOL = "stripe.charge"
def switch():
    global TOOL
    TOOL = "stripe.refund"

@oo.effect(tool=TOOL)
def charge(): ...
""",
    )
    assert tool.tool is None


def test_scanning_never_imports_user_code(tmp_path):
    sentinel = tmp_path / "imported"
    write(
        tmp_path,
        "boom.py",
        f"""
        open({str(sentinel)!r}, "w").write("ran")
        raise SystemExit(3)

        @oo.effect(tool="stripe.charge")
        def charge():
            return {{"stripe_id": "pi_1"}}
        """,
    )
    result = scan_tree(tmp_path)
    assert [t.tool for t in result.tools] == ["stripe.charge"]
    assert not sentinel.exists()


def test_unparseable_files_are_reported_not_raised(tmp_path):
    write(tmp_path, "broken.py", "def f(:\n")
    write(tmp_path, "ok.py", '@oo.effect(tool="stripe.charge")\ndef f(): return {"stripe_id": 1}\n')
    result = scan_tree(tmp_path)
    assert [t.tool for t in result.tools] == ["stripe.charge"]
    [error] = result.errors
    assert error.startswith("broken.py:1: cannot parse:")


def test_hidden_and_virtualenv_directories_are_skipped(tmp_path):
    source = '@oo.effect(tool="stripe.charge")\ndef f(): return {"stripe_id": 1}\n'
    write(tmp_path, ".venv/lib/x.py", source)
    write(tmp_path, "venv/lib/x.py", source)
    write(tmp_path, "src/__pycache__/x.py", source)
    write(tmp_path, "src/app.py", source)
    result = scan_tree(tmp_path)
    assert [t.file for t in result.tools] == ["src/app.py"]


def test_a_single_file_can_be_scanned(tmp_path):
    write(tmp_path, "one.py", '@oo.effect(tool="stripe.charge")\ndef f(): ...\n')
    result = scan_tree(tmp_path / "one.py")
    assert [(t.file, t.tool) for t in result.tools] == [("one.py", "stripe.charge")]


def test_a_missing_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_tree(tmp_path / "nope")


def test_parameters_and_key_declarations(tmp_path):
    tool = only_tool(
        tmp_path,
        """
@oo.effect(tool="x.y", idempotency_fields=("a", "b"))
def f(a, /, b, *rest, c=1, **extra):
    return {"a": a}
""",
    )
    assert tool.parameters == ("a", "b", "c")
    assert tool.accepts_var_keyword is True
    assert tool.idempotency_fields == ("a", "b")
    assert tool.idempotency_fields_dynamic is False
    assert tool.explicit_key is False


def test_dynamic_idempotency_fields_and_explicit_keys_are_recorded(tmp_path):
    write(
        tmp_path,
        "k.py",
        """
        FIELDS = ["owner"]

        @oo.effect(tool="a", idempotency_fields=FIELDS)
        def a(owner): ...

        @oo.effect(tool="b", idempotency_key=lambda owner: owner)
        def b(owner): ...

        @oo.effect(tool="c", idempotency_fields=[])
        def c(owner): ...
        """,
    )
    a, b, c = scan_tree(tmp_path).tools
    assert (a.idempotency_fields, a.idempotency_fields_dynamic) == (None, True)
    assert (b.explicit_key, b.idempotency_fields) == (True, None)
    assert (c.idempotency_fields, c.idempotency_fields_dynamic) == (None, False)


# -- return paths -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind", "fields"),
    [
        ('return {"number": pr.number, "head": head}', "dict", {"number": None, "head": "head"}),
        ("return dict(number=pr.number, head=head)", "dict_call", {"number": None, "head": "head"}),
        (
            'receipt = {"number": 1, "head": head}\nlog(receipt["number"])\nreturn receipt',
            "local_dict",
            {"number": None, "head": "head"},
        ),
        ("return None", "none", {}),
        ("return", "none", {}),
        ("return github.create(owner, repo, head)", "dynamic", {}),
        ('return {**base, "head": head}', "dynamic", {}),
        ('return {key: 1, "head": head}', "dynamic", {}),
        ("return dict(base, head=head)", "dynamic", {}),
        ('r = {"number": 1, "head": head}\nr["head"] = "main"\nreturn r', "dynamic", {}),
        ('r = {"number": 1, "head": head}\nr.update(head="main")\nreturn r', "dynamic", {}),
        ('r = {"number": 1, "head": head}\nsave(r)\nreturn r', "dynamic", {}),
        ('r = {"number": 1}\nr = {"number": 2, "head": head}\nreturn r', "dynamic", {}),
        ('r = {"number": 1, "head": head}\nr |= extra\nreturn r', "dynamic", {}),
        ("r = make()\nreturn r", "dynamic", {}),
        ("return head", "dynamic", {}),
    ],
)
def test_return_path_shapes(tmp_path, body, kind, fields):
    tool = only_tool(tmp_path, handler(body))
    [path] = tool.returns
    assert path.kind == kind
    assert dict(path.fields) == fields
    assert path.proven == (kind in ("dict", "dict_call", "local_dict"))
    if not path.proven:
        assert path.reason


def test_mutation_reasons_are_readable(tmp_path):
    tool = only_tool(tmp_path, handler('r = {"number": 1, "head": head}\nsave(r)\nreturn r'))
    assert tool.returns[0].reason == "receipt variable 'r' is used on line 6 (possible mutation)"


def test_nested_function_returns_are_not_the_handlers(tmp_path):
    body = """
    def helper():
        return "not a receipt"
    return {"number": 1, "head": head}
    """
    tool = only_tool(tmp_path, handler(body))
    assert [p.kind for p in tool.returns] == ["dict"]


def test_falling_off_the_end_is_detected(tmp_path):
    ends = only_tool(tmp_path, handler('if title:\n    return {"number": 1, "head": head}'))
    assert ends.may_end_without_return is True
    both = """
    if title:
        return {"number": 1, "head": head}
    else:
        raise ValueError(title)
    """
    assert only_tool(tmp_path, handler(both)).may_end_without_return is False
    tried = """
    try:
        pr = make()
    except OSError:
        raise
    else:
        return {"number": pr, "head": head}
    """
    assert only_tool(tmp_path, handler(tried)).may_end_without_return is False


# -- the contract checks ------------------------------------------------------------------

GOOD_PR = handler(
    """
    pr = github.pulls.create(owner, repo, head=head, title=title)
    receipt = {"number": pr.number, "head": head}
    return receipt
    """
)


def test_a_good_github_handler_proves_both_contracts(tmp_path):
    tool = only_tool(tmp_path, GOOD_PR)
    assert handler_contract_problems(tool, GITHUB) == []
    assert receipt_contract_problems(tool, GITHUB) == []


@pytest.mark.parametrize(
    ("decorator", "args", "problem"),
    [
        (
            '@oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo"])',
            "owner, repo, head",
            "github_pr: idempotency_fields must include head",
        ),
        (
            '@oo.effect(tool="github.create_pr")',
            "owner, repo, head",
            "github_pr: declare idempotency_fields including owner, repo, head",
        ),
        (
            '@oo.effect(tool="github.create_pr", idempotency_key=lambda **a: "k")',
            "owner, repo, head",
            "github_pr: idempotency_key= is opaque; use idempotency_fields including owner,"
            " repo, head",
        ),
        (
            '@oo.effect(tool="github.create_pr", idempotency_fields=FIELDS)',
            "owner, repo, head",
            "github_pr: idempotency_fields is not a literal list; cannot prove it includes"
            " owner, repo, head",
        ),
        (
            '@oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])',
            "owner, repo, **kwargs",
            "github_pr: handler signature lacks required arg 'head'",
        ),
    ],
)
def test_handler_contract_failures(tmp_path, decorator, args, problem):
    source = handler('return {"number": 1, "head": "x"}', args=args, decorator=decorator)
    tool = only_tool(tmp_path, source)
    assert problem in handler_contract_problems(tool, GITHUB)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            'return {"number": 1, "head": "main"}',
            "github_pr: line 5: receipt 'head' must be the handler arg 'head' itself"
            " (write 'head': head)",
        ),
        (
            'return {"number": 1, "head": title}',
            "github_pr: line 5: receipt 'head' must be the handler arg 'head' itself"
            " (write 'head': head)",
        ),
        (
            'head = head.strip()\nreturn {"number": 1, "head": head}',
            "github_pr: line 6: handler arg 'head' is reassigned, so receipt 'head' may not be"
            " the call's head",
        ),
        (
            'for head in heads:\n    pass\nreturn {"number": 1, "head": head}',
            "github_pr: line 7: handler arg 'head' is reassigned, so receipt 'head' may not be"
            " the call's head",
        ),
        (
            'return {"head": head}',
            "github_pr: line 5: receipt lacks required field(s) number",
        ),
        (
            "return github.pulls.create(owner, repo, head=head)",
            "github_pr: line 5: returns 'github.pulls.create(owner, repo, head=head)'; wrap it in"
            " an explicit receipt dict",
        ),
        (
            'if title:\n    return {"number": 1, "head": head}',
            "github_pr: the handler can end without returning (returns None)",
        ),
        ("pass", "github_pr: the handler never returns a receipt"),
    ],
)
def test_receipt_contract_failures(tmp_path, body, problem):
    tool = only_tool(tmp_path, handler(body))
    assert problem in receipt_contract_problems(tool, GITHUB)


def test_every_return_path_must_carry_the_receipt(tmp_path):
    body = """
    if title:
        return {"number": 1, "head": head}
    return {"number": 2}
    """
    tool = only_tool(tmp_path, handler(body))
    assert receipt_contract_problems(tool, GITHUB) == [
        "github_pr: line 8: receipt lacks required field(s) head"
    ]


def test_stripe_receipt_contract_needs_stripe_id(tmp_path):
    good = only_tool(
        tmp_path,
        '@oo.effect(tool="stripe.charge")\ndef charge(amount):\n'
        "    intent = stripe.PaymentIntent.create(amount=amount)\n"
        "    return dict(stripe_id=intent.id)\n",
    )
    assert handler_contract_problems(good, STRIPE) == []
    assert receipt_contract_problems(good, STRIPE) == []
    bad = only_tool(
        tmp_path,
        '@oo.effect(tool="stripe.charge")\ndef charge(amount):\n'
        "    return stripe.PaymentIntent.create(amount=amount)\n",
    )
    [problem] = receipt_contract_problems(bad, STRIPE)
    assert problem.startswith("stripe: line 5: returns 'stripe.PaymentIntent.create(")


def test_no_receipt_fields_means_nothing_to_prove(tmp_path):
    tool = only_tool(tmp_path, '@oo.effect(tool="x")\ndef f():\n    return make()\n')
    assert receipt_contract_problems(tool, []) == []
