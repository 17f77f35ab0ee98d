"""The seed's API as its README writes it (issue 20): ``import openonce`` is this library
under the name it is installed as, the README's code blocks run as written, ``clock=``
takes a callable, and the seed's helper functions answer exactly what the decorator, the
classifier, the reconciler and the scanner do."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import requests

import openonce
import openonce_core
from openonce_core import (
    BusinessError,
    CapabilityError,
    EffectState,
    FloatInKeyMaterialError,
    OpenOnce,
    OutcomeUnknownError,
    ProbeOutcome,
    ProbeResult,
    Reconciler,
    ScopeRequiredError,
    canonicalize,
    capabilities_for_tool,
    capability_from_dict,
    capability_guidance_for_tool,
    classify_exception,
    derive_key,
    load_capabilities_file,
    scan_effect_tools,
)
from openonce_core._scan import scan_tree
from openonce_core.testing import FakeClock
from tests.conftest import make_target

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = Path(__file__).parent / "seed_snippets"
S = EffectState


def run_snippet(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute ``seed_snippets/<name>.py`` as written, in ``namespace`` (the prelude)."""
    path = SNIPPETS / f"{name}.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    return namespace


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (imports start from nothing); its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def effects_of(oo: OpenOnce, tool: str) -> list[Any]:
    return [e for e in oo.store.list_effects(limit=1000) if e.tool == tool]


# -- import openonce ---------------------------------------------------------------------


def test_import_openonce_gives_the_same_objects_as_openonce_core():
    assert openonce.__all__ == openonce_core.__all__
    for name in openonce_core.__all__:
        assert getattr(openonce, name) is getattr(openonce_core, name), name
    assert openonce.__version__ == openonce_core.__version__
    assert openonce.PostgresStore is openonce_core.PostgresStore
    assert openonce.testing is openonce_core.testing


def test_openonce_submodules_are_the_openonce_core_modules_whichever_comes_first():
    out = run_python(
        """
        import pickle
        import openonce.integrations.langgraph as alias
        import openonce_core.integrations.langgraph as real
        import openonce_core.stores.sqlite as real_sqlite
        import openonce.stores.sqlite as alias_sqlite
        import openonce.testing, openonce_core.testing, openonce_core._probe
        from openonce.probe import ProbeOutcome, ProbeResult

        assert alias is real and alias_sqlite is real_sqlite
        assert openonce.testing is openonce_core.testing
        # The module keeps its own name: relative imports and pickles resolve to it.
        assert real.__spec__.name == real.__name__ == "openonce_core.integrations.langgraph"
        assert ProbeResult is openonce_core._probe.ProbeResult
        result = pickle.loads(pickle.dumps(ProbeResult(ProbeOutcome.HAPPENED, receipt={"n": 1})))
        assert isinstance(result, openonce_core.ProbeResult)
        assert result.outcome is openonce_core.ProbeOutcome.HAPPENED
        try:
            import openonce.no_such_module
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    assert out.strip() == "No module named 'openonce.no_such_module'"


def test_star_import_works_without_psycopg_and_postgres_store_needs_it():
    out = run_python(
        """
        import sys
        sys.modules["psycopg"] = None  # as if the postgres extra were not installed
        from openonce_core import *
        from openonce import *
        import openonce_core
        assert OpenOnce is openonce_core.OpenOnce and derive_key is openonce_core.derive_key
        try:
            from openonce import PostgresStore
        except ImportError as exc:
            print("refused:", "psycopg" in str(exc))
        """
    )
    assert out.strip() == "refused: True"


def test_the_testing_kit_is_reachable_without_importing_it_first():
    out = run_python(
        """
        import openonce_core
        print(openonce_core.testing.FakeClock().now())
        """
    )
    assert float(out) == FakeClock().now()


# -- clock= ------------------------------------------------------------------------------


def test_clock_takes_a_zero_argument_callable_on_every_store(store_kind, tmp_path, request):
    now = [1_900_000_000.0]
    target = make_target(store_kind, tmp_path, request)
    oo = OpenOnce(target, clock=lambda: now[0], migrate=True, retry_delay=0)

    @oo.effect(idempotency_key=lambda to: f"mail:{to}")
    def send_email(to: str) -> str:
        return "sent"

    send_email("a@b.c")
    now[0] += 50
    send_email("d@e.f")
    first, second = (oo.store.find("send_email", f"mail:{to}") for to in ("a@b.c", "d@e.f"))
    assert (first.created_at, second.created_at) == (1_900_000_000.0, 1_900_000_050.0)
    assert first.state == second.state == S.COMMITTED
    oo.close()


def test_clock_time_time_works_on_every_store(store_kind, tmp_path, request):
    target = make_target(store_kind, tmp_path, request)
    oo = OpenOnce(target, clock=time.time, migrate=True, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key="only-once")
    def send_email(to: str) -> str:
        calls.append(to)
        return "sent"

    before = time.time()
    assert send_email("a@b.c") == send_email("a@b.c") == "sent"
    effect = oo.store.find("send_email", "only-once")
    assert calls == ["a@b.c"] and effect.state == S.COMMITTED
    assert before <= effect.created_at <= time.time()
    oo.close()


class CountingProber:
    def __init__(self) -> None:
        self.probed: list[str] = []

    def probe(self, effect: Any) -> ProbeResult:
        self.probed.append(effect.id)
        return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail="not sure")


def park_unknown_charge(oo: OpenOnce) -> str:
    """A stripe.charge whose request timed out after it was sent: UNKNOWN."""

    @oo.effect(tool="stripe.charge", idempotency_key="charge-1")
    def charge(amount_cents: int) -> dict:
        raise requests.exceptions.ReadTimeout("read timed out")

    with pytest.raises(OutcomeUnknownError) as parked:
        charge(500)
    return parked.value.effect_id


def test_the_reconciler_reads_its_grace_on_a_callable_clock():
    now = [1_900_000_000.0]
    oo = OpenOnce(":memory:", clock=lambda: now[0])
    effect_id = park_unknown_charge(oo)
    prober = CountingProber()
    rec = Reconciler(oo.store, clock=lambda: now[0])
    rec.register("stripe.charge", prober)
    now[0] += 119  # inside Stripe's 120 s grace window
    rec.run_once()
    assert prober.probed == []
    now[0] += 2
    rec.run_once()
    assert prober.probed == [effect_id]


@pytest.mark.parametrize(
    ("clock", "message"),
    [
        (42, "pass a Clock .* or a zero-argument callable returning epoch seconds"),
        (FakeClock, r"pass an instance \(FakeClock\(\)\)"),
        (lambda: "noon", "returned 'noon'; a clock callable returns epoch seconds"),
        (lambda: float("nan"), "returned nan"),
        (lambda: True, "returned True"),
        (lambda start: start, "cannot be called without arguments"),
    ],
)
def test_a_clock_that_is_neither_is_refused_and_nothing_is_created(tmp_path, clock, message):
    target = str(tmp_path / "ledger.db")
    with pytest.raises(TypeError, match=message):
        OpenOnce(target, clock=clock)
    with pytest.raises(TypeError, match=message):
        Reconciler(target, clock=clock)
    with pytest.raises(TypeError, match=message):
        openonce_core.open_store(target, clock=clock)
    assert list(tmp_path.iterdir()) == []


# -- a SQLAlchemy URL --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///ledger.db", ": 'ledger.db'$"),
        ("sqlite:////var/lib/openonce/ledger.db", ": '/var/lib/openonce/ledger.db'$"),
        ("sqlite://", ": ':memory:'$"),
        ("sqlite:///:memory:", ": ':memory:'$"),
        ("sqlite://host/ledger.db", r" \(ledger.db, /var/lib/openonce/ledger.db\) or ':memory:'$"),
        ("sqlite:///ledger.db?mode=ro", r" \(ledger.db, /var/lib/openonce/ledger.db\) or"),
    ],
)
def test_a_sqlite_url_is_refused_with_the_path_to_pass(tmp_path, monkeypatch, url, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="URL is not a store name here; pass the SQLite file's"
                       " path itself" + path):  # fmt: skip
        OpenOnce(url)
    assert list(tmp_path.iterdir()) == []


# -- the helpers -------------------------------------------------------------------------


def test_canonicalize_writes_rfc_8785_and_refuses_floats():
    assert canonicalize({"b": 2, "a": [1, "x", None, True]}) == '{"a":[1,"x",null,true],"b":2}'
    # RFC 8785 section 3.2.3: members sorted by their UTF-16 code units.
    keys = ["\u20ac", "\r", "\ufb33", "1", "\U0001f600", "\u0080", "\u00f6"]
    ordered = json.loads(canonicalize(dict.fromkeys(keys, 0)))
    assert list(ordered) == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    with pytest.raises(FloatInKeyMaterialError, match="integer minor units"):
        canonicalize({"amount": 5.0})


def test_derive_key_is_the_key_the_decorator_stores():
    oo = OpenOnce(":memory:")

    @oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])
    def create_pr(owner: str, repo: str, head: str, title: str = "Fix") -> dict:
        return {"number": 1}

    @oo.effect
    def send_email(to: str, subject: str) -> str:
        return "sent"

    with oo.scope("run-1"):
        create_pr("acme", "api", "fix-login")
        send_email("a@b.c", subject="hi")
    pr_key = derive_key(
        "github.create_pr",
        {"owner": "acme", "repo": "api", "head": "fix-login", "title": "another title"},
        scope="run-1",
        fields=["owner", "repo", "head"],
    )
    mail_key = derive_key("send_email", {"to": "a@b.c", "subject": "hi"}, scope="run-1")
    assert [e.idempotency_key for e in effects_of(oo, "github.create_pr")] == [pr_key]
    assert [e.idempotency_key for e in effects_of(oo, "send_email")] == [mail_key]
    assert derive_key("send_email", {"to": "a@b.c", "subject": "hi"}, scope="run-2") != mail_key


def test_derive_key_refuses_what_the_decorator_refuses():
    with pytest.raises(ScopeRequiredError):
        derive_key("send_email", {"to": "a@b.c"}, scope=None)  # type: ignore[arg-type]
    with pytest.raises(FloatInKeyMaterialError):
        derive_key("stripe.charge", {"amount": 5.0}, scope="run-1")
    with pytest.raises(ValueError, match="'head' is not one of the arguments: owner"):
        derive_key("github.create_pr", {"owner": "acme"}, scope="run-1", fields=["head"])


@pytest.mark.parametrize(
    ("raised", "verdict", "state", "calls"),
    [
        (requests.exceptions.ReadTimeout("read timed out"), "unknown", S.UNKNOWN, 1),
        (requests.exceptions.ConnectTimeout("connect timed out"), "retryable", S.FAILED, 2),
        (BusinessError("card declined"), "failed", S.FAILED, 1),
    ],
)
def test_classify_exception_agrees_with_what_the_decorator_does(raised, verdict, state, calls):
    oo = OpenOnce(":memory:", max_attempts=2, retry_delay=0)
    ran: list[int] = []

    @oo.effect(idempotency_key="k")
    def charge() -> None:
        ran.append(1)
        raise raised

    with pytest.raises(Exception):  # noqa: B017 - what was recorded is the assertion
        charge()
    assert classify_exception(raised) == verdict
    assert (oo.store.find("charge", "k").state, len(ran)) == (state, calls)


def test_capabilities_for_tool_resolves_as_the_reconciler_does():
    assert [c.name for c in capabilities_for_tool("email.send")] == [
        "email_provider_api",
        "email_smtp",
    ]
    assert [c.name for c in capabilities_for_tool("email.send", "email_smtp")] == ["email_smtp"]
    [slack] = load_capabilities_file(SNIPPETS / "openonce-providers.json")
    assert capabilities_for_tool("slack.post_message") == ()
    assert capabilities_for_tool("slack.post_message", capabilities=[slack]) == (slack,)
    with pytest.raises(CapabilityError, match=r"covers 'stripe\.\*', not tool 'email\.send'"):
        capabilities_for_tool("email.send", "stripe")


def test_capability_guidance_is_the_note_the_reconciler_writes():
    clock = FakeClock()
    oo = OpenOnce(":memory:", clock=clock)
    effect_id = park_unknown_charge(oo)
    clock.advance(121)  # past Stripe's grace window; no prober is registered
    Reconciler(oo, clock=clock).run_once()
    last = oo.journal(effect_id)[-1]
    assert last.to_state == S.HUMAN_REVIEW
    assert last.reason == "no prober registered for stripe.charge"
    assert last.evidence["guidance"] == capability_guidance_for_tool("stripe.charge")
    assert "missing prober: register StripeProber" in last.evidence["guidance"]


def test_capability_from_dict_reads_one_capability_file_entry():
    entry = json.loads((SNIPPETS / "openonce-providers.json").read_text())["capabilities"][0]
    assert (
        capability_from_dict(entry)
        == load_capabilities_file(SNIPPETS / "openonce-providers.json")[0]
    )
    del entry["tier"]
    with pytest.raises(CapabilityError, match=r"\(slack_metadata\)\.tier: required field"):
        capability_from_dict(entry)


def test_scan_effect_tools_finds_what_providers_scan_finds(tmp_path):
    src = tmp_path / "src"
    (src / "billing").mkdir(parents=True)
    (src / "billing" / "charges.py").write_text(
        'TOOL = "stripe.charge"\n\n@oo.effect(tool=TOOL)\ndef charge(amount_cents):\n'
        "    return {}\n"
    )
    (src / "mail.py").write_text("@oo.effect\nasync def send_email(to):\n    return 'ok'\n")
    found = scan_effect_tools(src)
    assert [(f.path, f.line, f.function, f.tool) for f in found] == [
        (str(src / "mail.py"), 2, "send_email", "send_email"),
        (str(src / "billing" / "charges.py"), 4, "charge", "stripe.charge"),
    ]
    assert [f.tool for f in found] == scan_tree(src).tool_names
    assert scan_effect_tools([src / "billing", src / "mail.py"]) == [found[1], found[0]]
    (src / "broken.py").write_text("@oo.effect\ndef half(:\n")
    with pytest.raises(SyntaxError, match=r"broken\.py:2: cannot parse"):
        scan_effect_tools(src)


# -- the README's code blocks, as written ------------------------------------------------


def test_the_quickstart_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tool_calls: list[str] = []

    def existing_tool(query: str) -> str:
        tool_calls.append(query)
        return "done"

    ns = run_snippet("quickstart_minimal", {"existing_tool": existing_tool})
    oo = ns["oo"]
    assert (tmp_path / "openonce.db").exists()
    [email] = effects_of(oo, "send_email")
    assert email.state == S.COMMITTED
    assert (oo.stats["executed"], oo.stats["replayed"]) == (1, 1)  # re-sent: never
    with oo.scope():
        assert ns["protected"]("weather") == ns["protected"]("weather") == "done"
    assert tool_calls == ["weather"]

    replayed = oo.stats["replayed"]
    run_snippet("quickstart_precision", ns)
    [pr] = effects_of(oo, "create_pr")
    assert (pr.state, pr.attempt, oo.stats["replayed"]) == (S.COMMITTED, 1, replayed + 1)

    run_snippet("quickstart_async", ns)

    async def agent_turn() -> None:
        with oo.scope():
            await ns["send"]("a@b.c", "hi", "body")
            await ns["send"]("a@b.c", "hi", "reworded body")

    asyncio.run(agent_turn())
    assert [e.state for e in effects_of(oo, "email.send")] == [S.COMMITTED]
    oo.close()


def test_approvals_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notified: list[str] = []
    ns = run_snippet("approvals_client", {"openonce": openonce, "notify_human": notified.append})
    oo = ns["oo"]
    refunds: list[str] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge, amount_cents: charge)
    def refund(charge: str, amount_cents: int) -> dict:
        refunds.append(charge)
        return {"stripe_id": "re_1"}

    ns["refund"] = refund
    run_snippet("approvals_first_call", ns)
    assert len(notified) == 1 and refunds == []
    oo.approve(notified[0], by="eric")
    run_snippet("approvals_retry", ns)
    run_snippet("approvals_retry", ns)
    assert refunds == ["ch_1"]
    assert oo.get(notified[0]).state == S.COMMITTED
    oo.close()


class TimingOutStripe:
    """``stripe``: its PaymentIntent.create sends the request, then the reply is lost."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.PaymentIntent = self

    def create(self, *params: Any, idempotency_key: str) -> dict:
        self.sent.append(idempotency_key)
        raise requests.exceptions.ReadTimeout("read timed out")


def test_unknown_outcomes_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SNIPPETS / "openonce-providers.json", tmp_path)
    stripe = TimingOutStripe()
    ns: dict[str, Any] = {
        "openonce": openonce,
        "oo": openonce.OpenOnce("openonce.db", retry_delay=0),
        "stripe": stripe,
        "STRIPE_KEY": "sk_test_seed",
        "StripeProber": openonce.StripeProber,
        "gmail_prober": CountingProber(),
        "slack_prober": CountingProber(),
    }
    oo = run_snippet("unknown_charge", ns)["oo"]
    with oo.scope("run-1"), pytest.raises(OutcomeUnknownError) as parked:
        ns["charge"](500)
    effect = oo.get(parked.value.effect_id)
    assert effect.state == S.UNKNOWN and stripe.sent == [effect.provider_key]

    run_snippet("unknown_reconcile", ns)  # young: inside the grace window, not probed
    assert oo.get(effect.id).state == S.UNKNOWN and len(stripe.sent) == 1
    run_snippet("unknown_pin", ns)
    run_snippet("unknown_capability_file", ns)
    assert [c.name for c in ns["extra"]] == ["slack_metadata"]

    ns["effect_id"] = effect.id
    run_snippet("resolve_happened", ns)
    assert oo.get(effect.id).state == S.COMMITTED
    with oo.scope("run-1"), pytest.raises(OutcomeUnknownError) as parked:
        ns["charge"](700)
    ns["effect_id"] = parked.value.effect_id
    run_snippet("resolve_not_happened", ns)
    last = oo.journal(parked.value.effect_id)[-1]
    assert (last.from_state, last.actor) == (S.UNKNOWN, "operator:eric")
    assert last.to_state != S.UNKNOWN
    oo.close()


def test_enforced_receipts_conformance_and_integrations_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    oo = run_snippet("enforce_receipts", {"openonce": openonce})["oo"]
    assert oo.enforce_provider_receipts and oo.provider_capabilities == {
        "github.create_pr": "github_pr"
    }
    [stripe_capability] = openonce.capabilities_for_tool("stripe.charge")
    run_snippet("conformance", {"stripe_capability": stripe_capability})

    ns = run_snippet("langgraph_tool", {"oo": oo})
    assert ns["refund"].name == "refund"
    ns = run_snippet("openai_agents_tool", {"oo": oo})
    assert ns["refund"].name == "refund" and ns["OpenOnceRunContext"] is not None
    oo.close()
