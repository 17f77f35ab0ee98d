"""The behavioural suite: what an agent and an operator see, on every store.

Every test takes the ``store`` fixture (in-memory, SQLite, Postgres) and builds
``OpenOnce(store, retry_delay=0, ...)``. Handlers append to a list, so "ran once" is a
count, not a hope; states, journal lines and raised errors are what a user would see.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import os
import sqlite3
import threading
import time
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
import requests

from openonce_core import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    ApproverAlreadyCounted,
    BusinessError,
    ConfigurationError,
    EffectCancelled,
    EffectFailed,
    EffectInFlightError,
    EffectNotFoundError,
    EffectState,
    FloatInKeyMaterialError,
    IdempotencyMismatchError,
    IllegalTransitionError,
    InMemoryStore,
    InvalidArgumentsError,
    InvalidReceiptError,
    LeaseLostError,
    LedgerWriteError,
    OpenOnce,
    OpenOnceError,
    OutcomeUnknownError,
    ResultUnavailableError,
    RetryableEffectError,
    ScopeRequiredError,
    UnknownOutcomeError,
    current_effect,
    current_scope,
    require_approval_for,
)
from openonce_core.schema import SCHEMA_VERSION
from openonce_core.testing import FakeClock

S = EffectState
OWNER = "worker-1"
AGENT = f"agent:{OWNER}"
PEPPER = b"test-pepper-0123456789abcdef"


# -- exceptions named like the ones real HTTP clients raise ------------------------------


class CardDeclined(BusinessError):
    """A business error defined at module level, so a replay can rebuild it."""


class Timeout(OSError):
    """Named like requests.exceptions.Timeout."""


class ReadTimeout(Timeout):
    """Like requests.ReadTimeout: the request may have been sent."""


# -- helpers -----------------------------------------------------------------------------


def moves(oo: OpenOnce, effect_id: str) -> list[tuple[str | None, str]]:
    return [(line.from_state, line.to_state) for line in oo.journal(effect_id)]


def only_effect(store: Any, tool: str | None = None) -> Any:
    effects = [e for e in store.list_effects() if tool is None or e.tool == tool]
    assert len(effects) == 1, effects
    return effects[0]


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
    """Run ``fn`` on its own thread (another caller), its outcome in a future."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args, **kwargs)
    pool.shutdown(wait=False)
    return future


class DelegatingStore:
    """A store that forwards everything to ``inner``; subclasses override one method."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CommitFailsStore(DelegatingStore):
    """The finishing write (state -> committed/failed) raises, like a ledger that went away
    between the handler's return and the second commit."""

    def __init__(self, inner: Any, failing_states: tuple[str, ...] = (S.COMMITTED,)) -> None:
        super().__init__(inner)
        self.failing_states = failing_states

    def update(self, effect_id, expect_states, expect_fence, changes, entry, approval=None):
        if changes.get("state") in self.failing_states:
            raise RuntimeError("ledger unreachable: disk full")
        return self.inner.update(effect_id, expect_states, expect_fence, changes, entry, approval)


class SlowStore(DelegatingStore):
    """Every write blocks its thread for ``delay`` seconds and records which thread it was."""

    def __init__(self, inner: Any, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay
        self.write_threads: list[int] = []

    def insert_or_find(self, effect, entries):
        self.write_threads.append(threading.get_ident())
        time.sleep(self.delay)
        return self.inner.insert_or_find(effect, entries)

    def update(self, *args, **kwargs):
        self.write_threads.append(threading.get_ident())
        time.sleep(self.delay)
        return self.inner.update(*args, **kwargs)


def raw_ledger_text(store: Any, store_kind: str) -> str:
    """Everything a durable store has written, as text (for secret-leak checks)."""
    if store_kind == "sqlite":
        data = b""
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = store.path + suffix
            if os.path.exists(path):
                with open(path, "rb") as f:
                    data += f.read()
        return data.decode("latin-1")
    assert store_kind == "postgres"
    import psycopg

    parts = []
    with psycopg.connect(store.dsn) as conn:
        for table in ("openonce_effects", "openonce_journal", "openonce_approvals"):
            rows = conn.execute(f"SELECT t::text FROM {table} t").fetchall()
            parts.extend(r[0] for r in rows)
    return "\n".join(parts)


# -- constructing OpenOnce and declaring effects -----------------------------------------


def test_openonce_opens_memory_sqlite_path_and_dsn_targets(store, store_kind):
    target = {
        "memory": ":memory:",
        "sqlite": getattr(store, "path", None),
        "postgres": getattr(store, "dsn", None),
    }[store_kind]
    calls: list[str] = []
    with OpenOnce(target, retry_delay=0) as oo:
        assert type(oo.store) is type(store)

        @oo.effect
        def send_email(to: str, subject: str) -> str:
            calls.append(to)
            return f"sent:{to}:{subject}"

        with oo.scope():
            assert send_email("a@b.c", "hi") == "sent:a@b.c:hi"
            assert send_email("a@b.c", "hi") == "sent:a@b.c:hi"
        effect = only_effect(oo.store, "send_email")
    assert calls == ["a@b.c"]
    if store_kind != "memory":
        # The path / DSN names the same ledger the fixture's store reads.
        assert store.get(effect.id).state == S.COMMITTED
        assert store.get(effect.id).result == "sent:a@b.c:hi"
    else:
        assert store.list_effects() == []  # ":memory:" is a ledger of its own


def test_bare_decorator_uses_function_name_and_replays_duplicates(store):
    oo = OpenOnce(store, retry_delay=0, owner=OWNER)
    calls: list[tuple[str, str]] = []

    @oo.effect
    def send_email(to: str, subject: str = "hi") -> str:
        calls.append((to, subject))
        return "msg-1"

    assert send_email.__name__ == "send_email"
    with oo.scope():
        assert send_email("a@b.c", "hi") == "msg-1"
        assert send_email("a@b.c", "hi") == "msg-1"  # LLM retry: replayed, not re-sent
        assert send_email(to="a@b.c", subject="hi") == "msg-1"  # same call, spelled by name
        assert send_email("a@b.c") == "msg-1"  # same call, subject left at its default
    assert calls == [("a@b.c", "hi")]
    effect = only_effect(store)
    assert effect.tool == "send_email"
    assert effect.state == S.COMMITTED
    assert effect.args == {"to": "a@b.c", "subject": "hi"}
    assert moves(oo, effect.id) == [(S.PLANNED, S.STARTED), (S.STARTED, S.COMMITTED)]
    journal = oo.journal(effect.id)
    assert {line.actor for line in journal} == {AGENT}
    assert journal[0].evidence == {"attempt": 1}


def test_tool_name_separates_effects_with_equal_arguments(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="email.send")
    def send(to: str) -> str:
        calls.append("email")
        return "email"

    @oo.effect(tool="sms.send")
    def text(to: str) -> str:
        calls.append("sms")
        return "sms"

    with oo.scope():
        assert send("a") == "email"
        assert text("a") == "sms"
        assert send("a") == "email"
    assert calls == ["email", "sms"]
    assert sorted(e.tool for e in store.list_effects()) == ["email.send", "sms.send"]


def test_wrapping_an_existing_callable(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    def existing_tool(order_id: int) -> dict[str, Any]:
        calls.append(order_id)
        return {"shipped": order_id}

    protected = oo.effect(existing_tool)
    with oo.scope("run-1"):
        assert protected(7) == {"shipped": 7}
        assert protected(7) == {"shipped": 7}
        assert protected(8) == {"shipped": 8}
    assert calls == [7, 8]
    assert protected.openonce_tool == "existing_tool"
    assert {e.tool for e in store.list_effects()} == {"existing_tool"}


def test_effect_declaration_errors_are_raised_up_front(store):
    oo = OpenOnce(store, retry_delay=0, secret_pepper=PEPPER)

    def refund(charge: str, amount_cents: int) -> None: ...

    with pytest.raises(ValueError, match="'charges' is not a parameter"):
        oo.effect(refund, idempotency_fields=["charges"])
    with pytest.raises(ValueError, match="not both"):
        oo.effect(refund, idempotency_fields=["charge"], idempotency_key=lambda **a: "k")
    with pytest.raises(ValueError, match="max_attempts"):
        oo.effect(refund, max_attempts=0)
    with pytest.raises(ValueError, match="'card' is not a parameter"):
        oo.effect(refund, secret_fields=["card"])
    # A key that is neither a function nor a literal is refused when declared, naming it.
    for bad in (42, b"refund-1", ["refund-1"], ""):
        with pytest.raises(ValueError, match="idempotency_key"):
            oo.effect(refund, idempotency_key=bad)
    with pytest.raises(ValueError, match="business_errors"):
        oo.effect(refund, business_errors=["CardDeclined"])
    assert store.list_effects() == []


def test_a_literal_idempotency_key_names_one_effect(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(tool="stripe.refund", idempotency_key="refund-1")
    def refund(charge: str, amount_cents: int) -> dict[str, Any]:
        calls.append(amount_cents)
        return {"refund": "re_1"}

    assert refund("ch_1", 500) == {"refund": "re_1"}
    assert refund("ch_1", 500) == {"refund": "re_1"}  # replayed: one key, no scope needed
    with pytest.raises(IdempotencyMismatchError):
        refund("ch_1", 700)
    assert calls == [500]
    assert only_effect(store).idempotency_key == "refund-1"


def test_secret_fields_need_a_pepper(store, monkeypatch):
    monkeypatch.delenv("OPENONCE_SECRET_PEPPER", raising=False)
    oo = OpenOnce(store, retry_delay=0)

    def charge(card: str, amount_cents: int) -> None: ...

    # Without a pepper a 6-digit PIN is recovered from its digest in seconds.
    with pytest.raises(ConfigurationError, match="secret_fields need a pepper"):
        oo.effect(charge, secret_fields=["card"])
    with pytest.raises(ConfigurationError, match="at least 16 bytes"):
        OpenOnce(store, secret_pepper=b"short")
    monkeypatch.setenv("OPENONCE_SECRET_PEPPER", "from-the-environment-0123456789")
    assert OpenOnce(store).effect(charge, secret_fields=["card"]) is not None
    assert store.list_effects() == []


# -- keys ----------------------------------------------------------------------------------


def test_idempotency_fields_ignore_reworded_prose(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_fields=["owner", "repo", "head"])
    def create_pr(owner: str, repo: str, head: str, title: str, body: str) -> dict[str, Any]:
        calls.append(body)
        return {"number": len(calls), "head": head}

    with oo.scope("run-2026-07-02-a"):
        first = create_pr(owner="acme", repo="api", head="fix-login", title="Fix", body="...")
        again = create_pr(
            owner="acme", repo="api", head="fix-login", title="Fix login", body="reworded"
        )
        other = create_pr(owner="acme", repo="api", head="fix-signup", title="Fix", body="...")
    assert first == again == {"number": 1, "head": "fix-login"}
    assert other == {"number": 2, "head": "fix-signup"}
    assert calls == ["...", "..."]
    assert len(store.list_effects()) == 2


def test_explicit_idempotency_key_needs_no_scope_and_is_global(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge, **_: f"refund-{charge}")
    def refund(charge: str, amount_cents: int) -> dict[str, Any]:
        calls.append(charge)
        return {"refund": f"re_{charge}"}

    assert refund("ch_1", 500) == {"refund": "re_ch_1"}  # no scope needed
    with oo.scope():
        assert refund("ch_1", 500) == {"refund": "re_ch_1"}  # another run: same key
    with oo.scope("run-9"):
        assert refund(charge="ch_1", amount_cents=500) == {"refund": "re_ch_1"}
    assert calls == ["ch_1"]
    effect = only_effect(store)
    assert effect.idempotency_key == "refund-ch_1"
    assert oo.stats["executed"] == 1
    assert oo.stats["replayed"] == 2


def test_idempotency_key_callable_must_return_a_non_empty_string(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(idempotency_key=lambda n: n)
    def numbered(n: int) -> int:
        calls.append(n)
        return n

    with pytest.raises(InvalidArgumentsError) as info:
        numbered(3)
    assert info.value.path == "idempotency_key"
    assert calls == []
    assert store.list_effects() == []


def test_explicit_key_reused_with_different_arguments_is_refused(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge, **_: f"refund-{charge}")
    def refund(charge: str, amount_cents: int) -> dict[str, Any]:
        calls.append(amount_cents)
        return {"amount": amount_cents}

    assert refund("ch_1", 500) == {"amount": 500}
    effect = only_effect(store)
    journal_before = oo.journal(effect.id)
    with pytest.raises(IdempotencyMismatchError) as info:
        refund("ch_1", 50_000)
    assert info.value.effect_id == effect.id
    assert "nothing was run" in str(info.value)
    assert calls == [500]
    assert oo.journal(effect.id) == journal_before
    assert oo.get(effect.id).args == {"charge": "ch_1", "amount_cents": 500}
    assert len(store.list_effects()) == 1


def test_float_in_key_material_is_refused_and_names_the_field(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[Any] = []

    @oo.effect(idempotency_fields=["charge", "amount"])
    def refund(charge: str, amount: Any, note: str) -> str:
        calls.append(amount)
        return "ok"

    @oo.effect
    def order(items: list[Any]) -> str:
        calls.append(items)
        return "ok"

    with oo.scope():
        with pytest.raises(FloatInKeyMaterialError) as info:
            refund("ch_1", 12.5, note="partial")
        assert info.value.path == "$.amount"
        assert "$.amount" in str(info.value)
        with pytest.raises(FloatInKeyMaterialError) as info:
            order(items=[1, 2.5])
        assert info.value.path == "$.items[1]"
    assert calls == []
    assert store.list_effects() == []


def test_floats_outside_key_material_are_fine(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[float] = []

    @oo.effect(idempotency_fields=["charge"])
    def refund(charge: str, confidence: float) -> str:
        calls.append(confidence)
        return "re_1"

    with oo.scope():
        assert refund("ch_1", 0.93) == "re_1"
        assert refund("ch_1", 0.91) == "re_1"  # not key material: noise, replayed
    assert calls == [0.93]
    assert only_effect(store).args == {"charge": "ch_1", "confidence": 0.93}


def test_integer_beyond_2_53_is_refused_as_key_material(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect
    def transfer(amount_minor: int) -> str:
        calls.append(amount_minor)
        return "ok"

    with oo.scope(), pytest.raises(InvalidArgumentsError) as info:
        transfer(2**53)
    assert info.value.path == "$.amount_minor"
    assert calls == []
    assert store.list_effects() == []


def test_derived_keys_need_a_scope(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect
    def send_email(to: str) -> str:
        calls.append(to)
        return "sent"

    @oo.effect(idempotency_fields=["to"])
    def send_digest(to: str, body: str) -> str:
        calls.append(to)
        return "sent"

    assert current_scope() is None
    with pytest.raises(ScopeRequiredError, match="scope"):
        send_email("a@b.c")
    with pytest.raises(ScopeRequiredError):
        send_digest("a@b.c", "hello")
    assert calls == []
    assert store.list_effects() == []


def test_auto_scope_is_a_new_run_each_time(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect
    def send_email(to: str) -> str:
        calls.append(to)
        return f"sent-{len(calls)}"

    with oo.scope() as run_a:
        assert current_scope() == run_a
        assert send_email("a@b.c") == "sent-1"
        assert send_email("a@b.c") == "sent-1"
    with oo.scope() as run_b:
        assert send_email("a@b.c") == "sent-2"
    assert run_a != run_b
    assert current_scope() is None
    assert calls == ["a@b.c", "a@b.c"]
    assert sorted(e.scope for e in store.list_effects()) == sorted([run_a, run_b])


def test_named_scope_is_stable_across_openonce_instances(store):
    calls: list[str] = []

    def make_agent() -> Any:
        oo = OpenOnce(store, retry_delay=0)

        @oo.effect(tool="email.send")
        def send(to: str, subject: str) -> str:
            calls.append(to)
            return "msg-1"

        return oo, send

    oo1, send1 = make_agent()
    with oo1.scope("run-1"):
        assert send1("a@b.c", "hi") == "msg-1"
    # A resumed run after a crash: a new process (instance), the same stable run id.
    oo2, send2 = make_agent()
    with oo2.scope("run-1"):
        assert send2("a@b.c", "hi") == "msg-1"
    assert calls == ["a@b.c"]
    assert oo2.stats["replayed"] == 1
    with oo2.scope("run-2"):
        send2("a@b.c", "hi")
    assert calls == ["a@b.c", "a@b.c"]


def test_scope_id_must_be_a_non_empty_string(store):
    oo = OpenOnce(store, retry_delay=0)
    for bad in ("", 7):
        with pytest.raises(ValueError), oo.scope(bad):  # type: ignore[arg-type]
            pass


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 1


class Name(str):
    pass


class Count(int):
    pass


NON_JSON_ARGUMENTS = [
    pytest.param({"items": [1, (2, 3)]}, "$.items[1]", id="tuple"),
    pytest.param({"tags": {"vip"}}, "$.tags", id="set"),
    pytest.param({"when": date(2026, 7, 2)}, "$.when", id="date"),
    pytest.param({"color": Color.RED}, "$.color", id="enum"),
    pytest.param({"count": Level.HIGH}, "$.count", id="intenum"),
    pytest.param({"payload": b"raw"}, "$.payload", id="bytes"),
    pytest.param({"meta": {"ratio": float("nan")}}, "$.meta.ratio", id="nan"),
    pytest.param({"meta": {"ratio": float("inf")}}, "$.meta.ratio", id="inf"),
    pytest.param({"meta": {1: "one"}}, "$.meta", id="int-dict-key"),
    pytest.param({"name": Name("alice")}, "$.name", id="str-subclass"),
    pytest.param({"count": Count(3)}, "$.count", id="int-subclass"),
    pytest.param({"meta": {"lines": [{"qty": Decimal("1")}]}}, "$.meta.lines[0].qty", id="deep"),
]


@pytest.mark.parametrize(("kwargs", "path"), NON_JSON_ARGUMENTS)
def test_non_json_arguments_are_refused_naming_the_field(store, kwargs, path):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[dict[str, Any]] = []

    @oo.effect
    def place_order(
        items: Any = None,
        tags: Any = None,
        when: Any = None,
        color: Any = None,
        count: Any = None,
        payload: Any = None,
        meta: Any = None,
        name: Any = None,
    ) -> str:
        calls.append(kwargs)
        return "ok"

    with oo.scope("run-1"), pytest.raises(InvalidArgumentsError) as info:
        place_order(**kwargs)
    assert info.value.path == path
    assert path in str(info.value)
    assert calls == []
    assert store.list_effects() == []


def test_non_json_arguments_are_refused_with_an_explicit_key_too(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[Any] = []

    @oo.effect(idempotency_key=lambda charge, **_: f"refund-{charge}")
    def refund(charge: str, extra: Any) -> str:
        calls.append(extra)
        return "ok"

    with pytest.raises(InvalidArgumentsError) as info:
        refund("ch_1", extra={"at": date(2026, 7, 2)})
    assert info.value.path == "$.extra.at"
    assert calls == []
    assert store.list_effects() == []


# -- replay --------------------------------------------------------------------------------


def test_results_replay_without_calling_the_handler(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="github.create_issue")
    def create_issue(title: str) -> dict[str, Any]:
        calls.append(title)
        return {"number": 42, "labels": ["bug"], "draft": False, "meta": None}

    with oo.scope():
        results = [create_issue("Login broken") for _ in range(3)]
    assert results == [{"number": 42, "labels": ["bug"], "draft": False, "meta": None}] * 3
    assert calls == ["Login broken"]
    assert oo.stats["executed"] == 1
    assert oo.stats["replayed"] == 2
    effect = only_effect(store)
    assert len(oo.journal(effect.id)) == 2  # a replay writes nothing


def test_business_error_is_recorded_failed_and_replayed(store):
    oo = OpenOnce(store, retry_delay=0, max_attempts=3, owner=OWNER)
    calls: list[int] = []

    # A ValueError alone would be UNKNOWN (it may come from reading the provider's reply);
    # this tool declares it the provider's "no".
    @oo.effect(tool="stripe.charge", business_errors=(ValueError,))
    def charge(amount_cents: int) -> dict[str, Any]:
        calls.append(amount_cents)
        raise ValueError("card declined")

    with oo.scope():
        with pytest.raises(ValueError, match=r"^card declined$"):
            charge(500)
        with pytest.raises(ValueError, match=r"^card declined$") as replayed:
            charge(500)
    assert calls == [500]  # a business error is final: not retried, not re-run
    assert type(replayed.value) is ValueError
    assert replayed.value.openonce_replayed is True
    effect = only_effect(store)
    assert effect.state == S.FAILED
    assert replayed.value.openonce_effect_id == effect.id
    assert effect.error["type"] == "builtins.ValueError"
    assert effect.error["message"] == "card declined"
    assert moves(oo, effect.id) == [(S.PLANNED, S.STARTED), (S.STARTED, S.FAILED)]
    last = oo.journal(effect.id)[-1]
    assert last.actor == AGENT
    assert last.reason == "ValueError: declared a business error"
    assert last.evidence["error"]["message"] == "card declined"
    assert oo.stats["failed"] == 1
    assert oo.stats["replayed"] == 1


def test_custom_business_error_replays_as_its_own_class_with_its_args(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise CardDeclined("insufficient_funds", 402)

    with oo.scope():
        with pytest.raises(CardDeclined) as first:
            charge(500)
        with pytest.raises(CardDeclined) as again:
            charge(500)
    assert calls == [500]
    assert again.value.args == first.value.args == ("insufficient_funds", 402)
    assert again.value is not first.value


def test_failure_of_a_class_that_cannot_be_rebuilt_replays_as_effect_failed(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    class LocalDecline(BusinessError):
        pass

    @oo.effect
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise LocalDecline("do not honor")

    with oo.scope():
        with pytest.raises(LocalDecline):
            charge(500)
        with pytest.raises(EffectFailed) as replayed:
            charge(500)
    assert calls == [500]
    assert replayed.value.error_type.endswith("LocalDecline")
    assert "do not honor" in str(replayed.value)
    assert replayed.value.effect_id == only_effect(store).id


def test_a_result_that_is_not_json_commits_but_cannot_be_replayed(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> Any:
        calls.append(to)
        return date(2026, 7, 2)

    assert send("a@b.c") == date(2026, 7, 2)  # the first caller gets the real value
    with pytest.raises(ResultUnavailableError, match="date"):
        send("a@b.c")
    assert calls == ["a@b.c"]
    effect = only_effect(store)
    assert effect.state == S.COMMITTED
    assert effect.execution_evidence["result_unavailable"] == "date"


def test_interrupted_handler_parks_unknown_and_the_interrupt_propagates(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    def charge(amount_cents: int) -> str:
        calls.append(amount_cents)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return "charged again"  # a blind re-run would get here

    with pytest.raises(KeyboardInterrupt):
        charge(500)
    assert only_effect(store).state == S.UNKNOWN
    with pytest.raises(OutcomeUnknownError):
        charge(500)
    assert calls == [500]


# -- the three failure classes -------------------------------------------------------------


def test_retryable_error_is_retried_up_to_max_attempts_then_failed(store):
    oo = OpenOnce(store, retry_delay=0, owner=OWNER)
    calls: list[int] = []

    @oo.effect(max_attempts=3)
    def charge(amount_cents: int) -> None:
        calls.append(current_effect().attempt)
        raise RetryableEffectError("connection pool exhausted")

    with oo.scope():
        with pytest.raises(RetryableEffectError, match="pool exhausted"):
            charge(500)
        assert calls == [1, 2, 3]
        effect = only_effect(store)
        assert effect.state == S.FAILED
        assert effect.attempt == 3
        assert moves(oo, effect.id) == [
            (S.PLANNED, S.STARTED),
            (S.STARTED, S.STARTED),
            (S.STARTED, S.STARTED),
            (S.STARTED, S.FAILED),
        ]
        journal = oo.journal(effect.id)
        for line, attempt in zip(journal[1:3], (2, 3), strict=True):
            assert line.actor == AGENT
            assert line.reason == "retry: nothing was sent"
            assert line.evidence["attempt"] == attempt
            assert line.evidence["previous_error"]["class"] == "retryable"
        assert journal[-1].reason == "retryable error, 3 attempts used"
        # Exhausted retries are a recorded failure: replayed, never run a fourth time.
        with pytest.raises(RetryableEffectError):
            charge(500)
    assert calls == [1, 2, 3]


@pytest.mark.parametrize(
    "connect_error",
    [
        pytest.param(ConnectionRefusedError(111, "Connection refused"), id="refused"),
        pytest.param(requests.ConnectTimeout("connect timed out"), id="connect-timeout"),
    ],
)
def test_connect_phase_errors_are_retried_until_success(store, connect_error):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(max_attempts=3)
    def send(to: str) -> str:
        calls.append(current_effect().attempt)
        if len(calls) < 3:
            raise connect_error
        return "sent"

    with oo.scope():
        assert send("a@b.c") == "sent"
        assert send("a@b.c") == "sent"
    assert calls == [1, 2, 3]
    effect = only_effect(store)
    assert effect.state == S.COMMITTED
    assert effect.attempt == 3
    assert [m for m in moves(oo, effect.id) if m == (S.STARTED, S.STARTED)] == [
        (S.STARTED, S.STARTED)
    ] * 2


def test_max_attempts_defaults_to_the_openonce_setting(store):
    oo = OpenOnce(store, retry_delay=0, max_attempts=2)
    calls: list[str] = []

    @oo.effect
    def send(to: str) -> str:
        calls.append(to)
        raise ConnectionRefusedError("refused")

    @oo.effect(max_attempts=1)
    def send_once(to: str) -> str:
        calls.append("once:" + to)
        raise ConnectionRefusedError("refused")

    with oo.scope():
        with pytest.raises(ConnectionRefusedError):
            send("a")
        with pytest.raises(ConnectionRefusedError):
            send_once("a")
    assert calls == ["a", "a", "once:a"]
    assert {e.state for e in store.list_effects()} == {S.FAILED}


@pytest.mark.parametrize(
    "ambiguous",
    [
        pytest.param(UnknownOutcomeError("reply lost"), id="unknown-outcome-error"),
        pytest.param(TimeoutError("timed out"), id="timeout-error"),
        pytest.param(ReadTimeout("read timed out"), id="read-timeout"),
    ],
)
def test_ambiguous_errors_park_unknown_and_are_never_retried(store, ambiguous):
    oo = OpenOnce(store, retry_delay=0, max_attempts=5, owner=OWNER)
    calls: list[int] = []

    @oo.effect(tool="stripe.charge")
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise ambiguous

    with oo.scope():
        with pytest.raises(OutcomeUnknownError) as info:
            charge(500)
        assert info.value.__cause__ is ambiguous
        effect = only_effect(store)
        assert info.value.effect_id == effect.id
        assert effect.state == S.UNKNOWN
        assert moves(oo, effect.id) == [(S.PLANNED, S.STARTED), (S.STARTED, S.UNKNOWN)]
        last = oo.journal(effect.id)[-1]
        assert last.actor == AGENT
        assert last.reason.startswith("may have happened: ")
        assert type(ambiguous).__name__ in last.reason
        # A duplicate does not run it again, whatever max_attempts says.
        with pytest.raises(OutcomeUnknownError) as again:
            charge(500)
        assert again.value.effect_id == effect.id
    assert calls == [500]
    assert oo.get(effect.id).state == S.UNKNOWN
    assert [e.id for e in oo.review()] == [effect.id]
    assert oo.stats["unknown"] == 2  # both calls ended UNKNOWN; the handler ran once


def test_explicit_retryable_raise_wins_over_the_cause(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(max_attempts=2)
    def send(to: str) -> str:
        calls.append(current_effect().attempt)
        if len(calls) == 1:
            try:
                raise ReadTimeout("read timed out")
            except ReadTimeout as exc:
                # The handler knows better (say, it checked the provider): nothing happened.
                raise RetryableEffectError("verified not sent") from exc
        return "sent"

    with oo.scope():
        assert send("a@b.c") == "sent"
    assert calls == [1, 2]
    assert only_effect(store).state == S.COMMITTED


def test_explicit_raise_wins_over_the_class_name(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []
    # Named like a read timeout (UNKNOWN by name), but declared retryable.
    retryable_read_timeout = type("ReadTimeout", (RetryableEffectError,), {})
    # Named like a connect timeout (RETRYABLE by name), but declared unknown.
    unknown_connect_timeout = type("ConnectTimeout", (UnknownOutcomeError,), {})

    @oo.effect(max_attempts=3)
    def first(to: str) -> str:
        calls.append("first")
        if len(calls) == 1:
            raise retryable_read_timeout("nothing sent")
        return "sent"

    @oo.effect(max_attempts=3)
    def second(to: str) -> str:
        calls.append("second")
        raise unknown_connect_timeout("may be out")

    assert not issubclass(RetryableEffectError, OpenOnceError)
    assert not issubclass(UnknownOutcomeError, OpenOnceError)
    with oo.scope():
        assert first("a") == "sent"
        with pytest.raises(OutcomeUnknownError):
            second("a")
        with pytest.raises(OutcomeUnknownError):
            second("a")
    assert calls == ["first", "first", "second"]


# -- leases and fencing --------------------------------------------------------------------


def _slow_sender(oo: OpenOnce, release: threading.Event, entered: threading.Event):
    calls: list[int] = []
    ids: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, Any]:
        attempt = current_effect().attempt
        calls.append(attempt)
        ids.append(current_effect().effect_id)
        if len(calls) == 1:
            entered.set()
            assert release.wait(10), "test never released the first attempt"
        return {"message_id": f"m-{attempt}"}

    return send, calls, ids


def stalled(oo: OpenOnce) -> OpenOnce:
    """Stop ``oo`` renewing its leases, like a process that was stopped (SIGSTOP) or cut off
    from the ledger while its handler runs: its lease can now run out."""
    oo.keeper.close()
    return oo


def wait_until(check: Any, what: str, timeout: float = 10.0) -> None:
    """Wait (real time, bounded) for another thread to get somewhere."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def test_a_running_handler_keeps_its_lease(store):
    clock = FakeClock()
    oo = OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock)
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    try:
        assert entered.wait(5)
        effect_id = ids[0]
        for _ in range(4):  # four minutes of a 60 s lease: renewed, never expired
            before = oo.get(effect_id).lease_expires_at
            clock.advance(25)
            wait_until(lambda b=before: oo.get(effect_id).lease_expires_at != b, "a renewal")
            assert oo.get(effect_id).lease_expires_at == clock.now() + 60
            assert oo.expire_leases() == []
        effect = oo.get(effect_id)
        assert effect.state == S.STARTED and effect.fence == 1  # renewals keep the fence
        assert moves(oo, effect_id) == [(S.PLANNED, S.STARTED)]  # and write no journal
    finally:
        release.set()
    assert first.result(timeout=10) == {"message_id": "m-1"}
    assert oo.get(ids[0]).state == S.COMMITTED
    assert calls == [1]


def test_a_handler_can_ask_whether_it_still_owns_its_effect(store):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    other = OpenOnce(store, retry_delay=0, clock=clock)
    seen: list[bool] = []
    go_on = threading.Event()
    entered = threading.Event()

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        ctx = current_effect()
        seen.append(ctx.owns())
        entered.set()
        assert go_on.wait(10)
        seen.append(ctx.owns())  # about to do the irreversible part: still mine?
        seen.append(ctx.renew())
        return "sent"

    first = in_thread(send, "a@b.c")
    assert entered.wait(5)
    clock.advance(61)
    assert other.expire_leases() != []  # the lease lapsed: the effect is UNKNOWN now
    go_on.set()
    assert first.result(timeout=10) == "sent"
    assert seen == [True, False, False]
    # Nobody decided meanwhile, so its late receipt stands — but it could have asked first.
    assert only_effect(store).verification_status == "late_receipt"


def test_expired_lease_becomes_unknown_and_is_never_run_again(store):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")  # a worker that hangs (or died) mid-call
    try:
        assert entered.wait(5)
        effect_id = ids[0]
        clock.advance(59)
        assert oo.expire_leases() == []  # the lease still runs
        assert oo.get(effect_id).state == S.STARTED
        assert oo.review() == []
        clock.advance(2)
        assert oo.expire_leases() == [effect_id]
        effect = oo.get(effect_id)
        assert effect.state == S.UNKNOWN
        assert effect.lease_owner is None
        assert effect.execution_status == "unknown"
        last = oo.journal(effect_id)[-1]
        assert (last.from_state, last.to_state, last.action) == (S.STARTED, S.UNKNOWN, "expire")
        assert last.actor == "openonce"
        assert last.reason == f"lease of attempt 1 held by {OWNER} expired"
        for _ in range(2):
            with pytest.raises(OutcomeUnknownError):
                send("a@b.c")
        assert calls == [1]
        assert oo.expire_leases() == []
    finally:
        release.set()
        first.exception(timeout=10)


def test_duplicate_waiting_on_an_expired_lease_gets_unknown_not_a_rerun(store):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, wait_seconds=300, clock=clock))
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    try:
        assert entered.wait(5)
        # Arrives while the lease is live: waits for it, then finds it expired.
        duplicate = in_thread(send, "a@b.c")
        wait_until(lambda: store.board.waiting() == [ids[0]], "the duplicate to wait")
        assert not duplicate.done()
        clock.advance(61)
        with pytest.raises(OutcomeUnknownError):
            duplicate.result(timeout=10)
        assert oo.get(ids[0]).state == S.UNKNOWN
        assert calls == [1]
    finally:
        release.set()
        first.exception(timeout=10)


def test_duplicate_gives_up_waiting_on_a_live_lease(store):
    oo = OpenOnce(store, retry_delay=0, lease_seconds=30, wait_seconds=0.1)
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    try:
        assert entered.wait(5)
        with pytest.raises(EffectInFlightError) as info:
            send("a@b.c")
        assert info.value.effect_id == ids[0]
        # A running effect is not a person's to resolve: its lease is live.
        with pytest.raises(IllegalTransitionError):
            oo.resolve_not_happened(ids[0], by="eric", reason="looks stuck")
        with pytest.raises(IllegalTransitionError):
            oo.resolve_happened(ids[0], receipt={"id": "m-1"}, by="eric", reason="seen")
        assert oo.get(ids[0]).state == S.STARTED
        assert calls == [1]
    finally:
        release.set()
    assert first.result(timeout=10) == {"message_id": "m-1"}
    assert send("a@b.c") == {"message_id": "m-1"}
    assert calls == [1]


def _lapsed(store: Any) -> tuple[OpenOnce, FakeClock, Any, list[int], list[str], Any, Any]:
    """An attempt that is still running after its lease lapsed: its effect is UNKNOWN."""
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    assert entered.wait(5)
    clock.advance(61)
    assert oo.expire_leases() == [ids[0]]
    return oo, clock, send, calls, ids, first, release


def test_late_result_commits_when_nobody_decided(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        with pytest.raises(OutcomeUnknownError):
            send("a@b.c")
    finally:
        release.set()
    # The slow attempt returns after all: its receipt resolves the uncertainty.
    assert first.result(timeout=10) == {"message_id": "m-1"}
    effect = oo.get(ids[0])
    assert effect.state == S.COMMITTED
    assert effect.result == {"message_id": "m-1"}
    assert effect.verification_status == "late_receipt"
    last = oo.journal(ids[0])[-1]
    assert (last.from_state, last.to_state, last.action) == (S.UNKNOWN, S.COMMITTED, "late_result")
    assert last.reason == "late result of attempt 1 after its lease expired"
    assert send("a@b.c") == {"message_id": "m-1"}
    assert calls == [1]


def test_late_result_after_a_committed_retry_is_a_double_execution_for_a_person(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        oo.resolve_not_happened(ids[0], by="eric", reason="not in the sent folder")
        # The re-armed effect runs again as attempt 2 and commits.
        assert send("a@b.c") == {"message_id": "m-2"}
        assert oo.get(ids[0]).state == S.COMMITTED
    finally:
        release.set()
    error = first.exception(timeout=10)
    assert isinstance(error, LeaseLostError)
    assert isinstance(error, LedgerWriteError)
    assert error.effect_id == ids[0]
    assert error.observed_outcome == "returned"
    assert error.observed_value == {"message_id": "m-1"}
    # Both attempts sent the mail: never a clean COMMITTED, a person must look.
    effect = oo.get(ids[0])
    assert effect.state == S.HUMAN_REVIEW
    assert effect.attempt == 2
    assert effect.result == {"message_id": "m-2"}  # the fenced-off result did not overwrite
    last = oo.journal(ids[0])[-1]
    assert (last.from_state, last.to_state, last.action) == (
        S.COMMITTED, S.HUMAN_REVIEW, "contradict",
    )  # fmt: skip
    assert last.reason.startswith("attempt 1 finished (returned) after losing its lease")
    assert "committed (attempt 2)" in last.reason
    assert last.evidence["observed"] == "returned"
    assert last.evidence["attempt"] == 1
    assert last.evidence["result"] == {"message_id": "m-1"}
    with pytest.raises(OutcomeUnknownError):
        send("a@b.c")
    assert calls == [1, 2]


def test_late_result_contradicting_a_not_happened_decision_goes_to_human_review(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        oo.resolve_not_happened(ids[0], by="eric", reason="not in the sent folder")
        assert oo.get(ids[0]).state == S.PLANNED
    finally:
        release.set()
    error = first.exception(timeout=10)
    assert isinstance(error, LeaseLostError)
    assert error.observed_value == {"message_id": "m-1"}
    assert oo.get(ids[0]).state == S.HUMAN_REVIEW
    last = oo.journal(ids[0])[-1]
    assert (last.from_state, last.to_state) == (S.PLANNED, S.HUMAN_REVIEW)
    assert last.actor == "openonce"
    assert "contradicts the recorded planned" in last.reason
    with pytest.raises(OutcomeUnknownError):
        send("a@b.c")
    assert calls == [1]


@pytest.mark.parametrize("outcome", ["failed", "unknown"])
def test_a_late_failure_after_a_re_arm_is_journaled_and_escalated(store, outcome):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    release, entered = threading.Event(), threading.Event()

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> None:
        entered.set()
        assert release.wait(10)
        raise CardDeclined("no") if outcome == "failed" else TimeoutError("read timed out")

    oo_business = OpenOnce(store, retry_delay=0, clock=clock)
    first = in_thread(send, "a@b.c")
    assert entered.wait(5)
    clock.advance(61)
    (effect_id,) = oo_business.expire_leases()
    oo.resolve_not_happened(effect_id, by="eric", reason="not sent")
    release.set()
    assert isinstance(first.exception(timeout=10), LeaseLostError)
    # Not "only journaled": whatever the first attempt did, a person decides the re-run.
    assert oo.get(effect_id).state == S.HUMAN_REVIEW
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.PLANNED, S.HUMAN_REVIEW)
    assert last.evidence["observed"] == outcome


def test_a_cancel_names_who_cancelled_and_a_late_result_after_it_escalates(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        oo.resolve_not_happened(ids[0], by="eric", reason="not in the sent folder")
        oo.cancel(ids[0], by="eric", reason="customer withdrew")
        with pytest.raises(EffectCancelled) as cancelled:
            send("a@b.c")
        assert "eric" in str(cancelled.value)
        assert "customer withdrew" in str(cancelled.value)
    finally:
        release.set()
    assert isinstance(first.exception(timeout=10), LeaseLostError)
    # The cancelled effect had happened after all: a person must know.
    assert oo.get(ids[0]).state == S.HUMAN_REVIEW
    assert [line.action for line in oo.journal(ids[0])][-2:] == ["cancel", "contradict"]
    assert calls == [1]


# -- approvals -----------------------------------------------------------------------------


def _refund_tool(oo: OpenOnce, **options: Any):
    calls: list[tuple[str, int]] = []
    options.setdefault("idempotency_key", lambda charge, **_: f"refund-{charge}")

    @oo.effect(tool="stripe.refund", **options)
    def refund(charge: str, amount_cents: int) -> dict[str, Any]:
        calls.append((charge, amount_cents))
        return {"refund": "re_1", "amount_cents": amount_cents}

    return refund, calls


def test_approval_pending_then_the_same_call_executes_once(store):
    oo = OpenOnce(store, retry_delay=0, owner=OWNER, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo)
    calls_email: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls_email.append(to)
        return "sent"

    assert send("a@b.c") == "sent"  # not matched by the policy
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    assert info.value.tool == "stripe.refund"
    assert (info.value.approvals, info.value.required) == (0, 1)
    with pytest.raises(ApprovalPending) as again:
        refund("ch_1", 500)  # the agent retries before anyone approved
    assert again.value.effect_id == effect_id
    assert calls == []
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert oo.get(effect_id).attempt == 0
    assert [e.id for e in oo.review()] == [effect_id]

    approved = oo.approve(effect_id, by="eric", reason="customer called")
    assert approved.state == S.APPROVED
    assert refund("ch_1", 500) == {"refund": "re_1", "amount_cents": 500}
    assert refund("ch_1", 500) == {"refund": "re_1", "amount_cents": 500}
    assert calls == [("ch_1", 500)]
    assert calls_email == ["a@b.c"]
    assert moves(oo, effect_id) == [
        (S.PLANNED, S.REQUIRES_APPROVAL),
        (S.REQUIRES_APPROVAL, S.APPROVED),
        (S.APPROVED, S.STARTED),
        (S.STARTED, S.COMMITTED),
    ]
    journal = oo.journal(effect_id)
    assert journal[0].actor == AGENT
    assert "stripe.*" in journal[0].reason
    assert journal[1].actor == "operator:eric"
    assert journal[1].reason == "customer called"
    assert journal[1].evidence == {"approvals": 1, "required": 1}
    [approval] = oo.approvals(effect_id)
    assert (approval.decision, approval.by, approval.reason) == (
        "approve",
        "eric",
        "customer called",
    )


def test_denied_effect_raises_approval_denied_on_every_call(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    with pytest.raises(ValueError, match="reason"):
        oo.deny(effect_id, by="maria", reason="")
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    oo.deny(effect_id, by="maria", reason="looks like fraud")
    for _ in range(2):
        with pytest.raises(ApprovalDenied) as denied:
            refund("ch_1", 500)
        assert denied.value.effect_id == effect_id
        assert denied.value.by == "maria"
        assert denied.value.reason == "looks like fraud"
    assert calls == []
    assert oo.get(effect_id).state == S.DENIED
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.REQUIRES_APPROVAL, S.DENIED)
    assert (last.actor, last.reason) == ("operator:maria", "looks like fraud")
    with pytest.raises(IllegalTransitionError):
        oo.approve(effect_id, by="eric", reason="changed my mind")
    assert oo.get(effect_id).state == S.DENIED


def test_approval_does_not_carry_over_to_different_arguments_under_an_explicit_key(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    oo.approve(info.value.effect_id, by="eric", reason="500 is right")
    with pytest.raises(IdempotencyMismatchError):
        refund("ch_1", 50_000)
    assert calls == []
    assert refund("ch_1", 500)["amount_cents"] == 500
    assert calls == [("ch_1", 500)]


def test_approval_is_void_for_arguments_the_approver_did_not_see(store):
    """An approval is bound to the arguments it was given for (ASVS: an approval is void if
    the arguments change). With ``idempotency_fields=["charge"]`` the amount is not key
    material, so a later call with a larger amount maps to the same approved effect."""
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo, idempotency_key=None, idempotency_fields=["charge"])
    with oo.scope("run-1"):
        with pytest.raises(ApprovalPending) as info:
            refund("ch_1", 500)
        effect_id = info.value.effect_id
        assert oo.get(effect_id).args == {"charge": "ch_1", "amount_cents": 500}
        oo.approve(effect_id, by="eric", reason="refund of 500 cents is right")
        with pytest.raises(OpenOnceError):
            refund("ch_1", 50_000)
    assert ("ch_1", 50_000) not in calls


def test_approval_ttl_expiry_fails_closed(store):
    policy = require_approval_for(["stripe.*"], approval_ttl=0.3)
    oo = OpenOnce(store, retry_delay=0, policy=policy)
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    oo.approve(effect_id, by="eric", reason="ok")
    assert oo.get(effect_id).state == S.APPROVED
    time.sleep(0.4)
    with pytest.raises(ApprovalExpired) as expired:
        refund("ch_1", 500)
    assert isinstance(expired.value, ApprovalPending)
    assert expired.value.effect_id == effect_id
    assert calls == []
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.APPROVED, S.REQUIRES_APPROVAL)
    assert last.actor == "openonce"
    assert "expired" in last.reason
    with pytest.raises(ApprovalPending):
        refund("ch_1", 500)  # still closed until someone approves afresh
    # The expired approval no longer counts, so the same person may approve again.
    oo.approve(effect_id, by="eric", reason="still ok")
    assert refund("ch_1", 500) == {"refund": "re_1", "amount_cents": 500}
    assert calls == [("ch_1", 500)]


def test_two_approvers_must_be_two_distinct_people(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"], approvers=2))
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500_000)
    effect_id = info.value.effect_id
    assert info.value.required == 2
    after_one = oo.approve(effect_id, by="eric", reason="large but expected")
    assert after_one.state == S.REQUIRES_APPROVAL
    with pytest.raises(ApprovalPending) as pending:
        refund("ch_1", 500_000)
    assert (pending.value.approvals, pending.value.required) == (1, 2)
    with pytest.raises(ApproverAlreadyCounted):
        oo.approve(effect_id, by="eric", reason="approving again")
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert len(oo.approvals(effect_id)) == 1
    assert calls == []
    assert oo.approve(effect_id, by="maria", reason="checked").state == S.APPROVED
    assert refund("ch_1", 500_000)["amount_cents"] == 500_000
    assert refund("ch_1", 500_000)["amount_cents"] == 500_000
    assert calls == [("ch_1", 500_000)]
    approvals = oo.journal(effect_id)[1:3]
    assert [(j.actor, j.evidence) for j in approvals] == [
        ("operator:eric", {"approvals": 1, "required": 2}),
        ("operator:maria", {"approvals": 2, "required": 2}),
    ]


# -- decisions by people -------------------------------------------------------------------


def _ambiguous_charge(oo: OpenOnce):
    calls: list[int] = []
    outcomes: list[Any] = [TimeoutError("read timed out")]

    @oo.effect(tool="stripe.charge", idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    def charge(amount_cents: int) -> dict[str, Any]:
        calls.append(current_effect().attempt)
        outcome = outcomes.pop(0) if outcomes else {"id": f"pi_{len(calls)}"}
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return charge, calls


def _park_unknown(oo: OpenOnce, charge: Any) -> str:
    with pytest.raises(OutcomeUnknownError) as info:
        charge(500)
    assert oo.get(info.value.effect_id).state == S.UNKNOWN
    return info.value.effect_id


def test_resolve_happened_commits_the_receipt_and_duplicates_replay_it(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    committed = oo.resolve_happened(
        effect_id, receipt={"stripe_id": "pi_1"}, by="eric", reason="matched in dashboard"
    )
    assert committed.state == S.COMMITTED
    assert charge(500) == {"stripe_id": "pi_1"}
    assert charge(500) == {"stripe_id": "pi_1"}
    assert calls == [1]
    # As the spec's journal shows it: the receipt, then its check, in the same commit.
    receipt_line, verdict = oo.journal(effect_id)[-2:]
    assert (receipt_line.from_state, receipt_line.to_state, receipt_line.action) == (
        S.UNKNOWN, S.RECEIPT_RECORDED, "resolve_happened",
    )  # fmt: skip
    assert (receipt_line.actor, receipt_line.reason) == ("operator:eric", "matched in dashboard")
    assert receipt_line.evidence["receipt"] == {"stripe_id": "pi_1"}
    assert receipt_line.evidence["resolution"] == "happened"
    assert (verdict.from_state, verdict.to_state, verdict.action) == (
        S.RECEIPT_RECORDED, S.COMMITTED, "check_receipt",
    )  # fmt: skip
    assert verdict.at == receipt_line.at and verdict.seq == receipt_line.seq + 1


@pytest.mark.parametrize(
    "receipt",
    [
        pytest.param({}, id="empty"),
        pytest.param([{"stripe_id": "pi_1"}], id="list"),
        pytest.param("pi_1", id="string"),
        pytest.param(None, id="none"),
        pytest.param({"stripe_id": b"pi_1"}, id="bytes-value"),
        pytest.param({"at": date(2026, 7, 2)}, id="date-value"),
        pytest.param({"ids": ("pi_1",)}, id="tuple-value"),
        pytest.param({"amount": float("nan")}, id="nan"),
        pytest.param({1: "pi_1"}, id="int-key"),
    ],
)
def test_malformed_receipts_are_refused_and_change_nothing(store, receipt):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    journal_before = oo.journal(effect_id)
    with pytest.raises(InvalidReceiptError):
        oo.resolve_happened(effect_id, receipt=receipt, by="eric", reason="found it")
    effect = oo.get(effect_id)
    assert effect.state == S.UNKNOWN
    assert effect.result is None
    assert effect.verification_status is None
    assert oo.journal(effect_id) == journal_before
    with pytest.raises(OutcomeUnknownError):
        charge(500)
    assert calls == [1]


def test_resolve_not_happened_needs_a_reason_and_re_arms(store):
    oo = OpenOnce(store, retry_delay=0, owner=OWNER)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    for reason in ("", "   "):
        with pytest.raises(ValueError, match="reason"):
            oo.resolve_not_happened(effect_id, by="eric", reason=reason)
    with pytest.raises(ValueError, match="by"):
        oo.resolve_not_happened(effect_id, by="", reason="not in dashboard")
    assert oo.get(effect_id).state == S.UNKNOWN
    rearmed = oo.resolve_not_happened(effect_id, by="eric", reason="not in dashboard")
    assert rearmed.state == S.PLANNED
    assert charge(500) == {"id": "pi_2"}
    assert charge(500) == {"id": "pi_2"}
    assert calls == [1, 2]
    effect = oo.get(effect_id)
    assert effect.state == S.COMMITTED
    assert effect.attempt == 2
    assert moves(oo, effect_id) == [
        (S.PLANNED, S.STARTED),
        (S.STARTED, S.UNKNOWN),
        (S.UNKNOWN, S.PLANNED),
        (S.PLANNED, S.STARTED),
        (S.STARTED, S.COMMITTED),
    ]
    journal = oo.journal(effect_id)
    assert (journal[2].actor, journal[2].reason) == ("operator:eric", "not in dashboard")
    assert journal[3].evidence == {"attempt": 2}


def test_cancel_stops_an_unstarted_effect_for_good(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    with pytest.raises(ValueError, match="reason"):
        oo.cancel(effect_id, by="eric", reason=" ")
    assert oo.cancel(effect_id, by="eric", reason="customer withdrew").state == S.CANCELLED
    for _ in range(2):
        with pytest.raises(EffectCancelled) as cancelled:
            refund("ch_1", 500)
        assert cancelled.value.effect_id == effect_id
        assert "customer withdrew" in str(cancelled.value)
        assert "eric" in str(cancelled.value)
    assert calls == []
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.REQUIRES_APPROVAL, S.CANCELLED)
    assert (last.actor, last.reason) == ("operator:eric", "customer withdrew")


def test_cancel_a_re_armed_effect(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    oo.resolve_not_happened(effect_id, by="eric", reason="not in dashboard")
    oo.cancel(effect_id, by="eric", reason="customer paid by bank transfer")
    with pytest.raises(EffectCancelled):
        charge(500)
    assert calls == [1]


def test_release_unstarted_lets_the_key_be_claimed_with_other_arguments(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    old_id = info.value.effect_id
    released = oo.release_unstarted(old_id, by="eric", reason="wrong amount requested")
    assert released.state == S.RELEASED
    last = oo.journal(old_id)[-1]
    assert (last.from_state, last.to_state) == (S.REQUIRES_APPROVAL, S.RELEASED)
    assert (last.actor, last.reason) == ("operator:eric", "wrong amount requested")
    with pytest.raises(ApprovalPending) as fresh:
        refund("ch_1", 700)  # same key, new arguments: a new claim, not a mismatch
    new_id = fresh.value.effect_id
    assert new_id != old_id
    oo.approve(new_id, by="eric", reason="700 is right")
    assert refund("ch_1", 700)["amount_cents"] == 700
    assert calls == [("ch_1", 700)]
    with pytest.raises(IdempotencyMismatchError):
        refund("ch_1", 500)
    assert oo.get(old_id).state == S.RELEASED
    assert oo.get(new_id).state == S.COMMITTED


def test_release_refuses_an_effect_that_already_ran(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    oo.resolve_not_happened(effect_id, by="eric", reason="not in dashboard")
    assert oo.get(effect_id).attempt == 1
    with pytest.raises(IllegalTransitionError, match="attempt 1"):
        oo.release_unstarted(effect_id, by="eric", reason="start over")
    assert oo.get(effect_id).state == S.PLANNED
    assert calls == [1]


def test_illegal_transitions_are_refused_and_change_nothing(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls.append(to)
        return "sent"

    send("a@b.c")
    effect_id = only_effect(store).id
    journal_before = oo.journal(effect_id)
    decisions = [
        lambda: oo.approve(effect_id, by="eric", reason="ok"),
        lambda: oo.deny(effect_id, by="eric", reason="no"),
        lambda: oo.cancel(effect_id, by="eric", reason="stop"),
        lambda: oo.release_unstarted(effect_id, by="eric", reason="drop"),
        lambda: oo.resolve_happened(effect_id, receipt={"id": "x"}, by="eric", reason="seen"),
        lambda: oo.resolve_not_happened(effect_id, by="eric", reason="not seen"),
    ]
    for decide in decisions:
        with pytest.raises(IllegalTransitionError) as info:
            decide()
        assert info.value.effect_id == effect_id
        assert info.value.state == S.COMMITTED
        assert "committed" in str(info.value)
    assert oo.get(effect_id).state == S.COMMITTED
    assert oo.journal(effect_id) == journal_before
    assert send("a@b.c") == "sent"
    assert calls == ["a@b.c"]


def test_approving_an_unknown_outcome_is_illegal(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    with pytest.raises(IllegalTransitionError):
        oo.approve(effect_id, by="eric", reason="just run it")
    with pytest.raises(IllegalTransitionError):
        oo.cancel(effect_id, by="eric", reason="forget it")
    assert oo.get(effect_id).state == S.UNKNOWN
    with pytest.raises(OutcomeUnknownError):
        charge(500)
    assert calls == [1]


def test_unknown_effect_ids_raise_effect_not_found(store):
    oo = OpenOnce(store, retry_delay=0)
    missing = "eff_does_not_exist"
    calls = [
        lambda: oo.get(missing),
        lambda: oo.journal(missing),
        lambda: oo.approvals(missing),
        lambda: oo.approve(missing, by="eric", reason="ok"),
        lambda: oo.deny(missing, by="eric", reason="no"),
        lambda: oo.cancel(missing, by="eric", reason="stop"),
        lambda: oo.release_unstarted(missing, by="eric", reason="drop"),
        lambda: oo.resolve_happened(missing, receipt={"id": "x"}, by="eric", reason="seen"),
        lambda: oo.resolve_not_happened(missing, by="eric", reason="not seen"),
    ]
    for call in calls:
        with pytest.raises(EffectNotFoundError) as info:
            call()
        assert info.value.effect_id == missing
    assert store.list_effects() == []


def test_every_decision_needs_a_named_person(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    for by in ("", "  ", None):
        with pytest.raises(ValueError, match="by"):
            oo.approve(effect_id, by=by, reason="ok")  # type: ignore[arg-type]
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert oo.approvals(effect_id) == []
    with pytest.raises(ApprovalPending):
        refund("ch_1", 500)
    assert calls == []


# -- what a handler knows about its effect --------------------------------------------------


def test_current_effect_is_stable_across_retries_and_attempts(store):
    oo = OpenOnce(store, retry_delay=0)
    seen: list[Any] = []
    outcomes: list[Any] = [
        ConnectionRefusedError("refused"),
        UnknownOutcomeError("reply lost"),
        "ok",
    ]

    @oo.effect(tool="stripe.charge", max_attempts=3)
    def charge(amount_cents: int) -> str:
        seen.append(current_effect())
        outcome = outcomes.pop(0) if outcomes else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    with oo.scope("run-1") as run_id:
        with pytest.raises(OutcomeUnknownError) as info:
            charge(500)  # attempt 1 retried, attempt 2 lost its reply
        effect_id = info.value.effect_id
        oo.resolve_not_happened(effect_id, by="eric", reason="no charge in dashboard")
        assert charge(500) == "ok"  # attempt 3
    effect = oo.get(effect_id)
    assert [ctx.attempt for ctx in seen] == [1, 2, 3]
    assert {ctx.effect_id for ctx in seen} == {effect_id}
    assert {ctx.provider_key for ctx in seen} == {effect.provider_key}
    assert effect.provider_key.startswith("oo_")
    assert {ctx.tool for ctx in seen} == {"stripe.charge"}
    assert {ctx.scope for ctx in seen} == {run_id}
    assert {ctx.idempotency_key for ctx in seen} == {effect.idempotency_key}
    with oo.scope("run-1"):
        charge(600)
    assert seen[-1].provider_key != effect.provider_key  # another effect, another key


def test_current_effect_outside_a_handler_raises(store):
    OpenOnce(store, retry_delay=0)
    with pytest.raises(OpenOnceError, match="only available inside"):
        current_effect()


# -- evidence ------------------------------------------------------------------------------


def test_execution_and_verification_evidence_are_kept_apart(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    parked = oo.get(effect_id)
    assert parked.execution_status == "unknown"
    assert parked.execution_evidence["error"]["type"] == "builtins.TimeoutError"
    assert parked.execution_evidence["attempt"] == 1
    assert parked.verification_status is None
    oo.resolve_happened(
        effect_id, receipt={"stripe_id": "pi_9"}, by="eric", reason="in the dashboard"
    )
    resolved = oo.get(effect_id)
    # What the call established is unchanged; what a person verified is added beside it.
    assert resolved.execution_status == "unknown"
    assert resolved.execution_evidence == parked.execution_evidence
    assert resolved.verification_status == "confirmed_by_person"
    assert resolved.verification_evidence["receipt"] == {"stripe_id": "pi_9"}
    assert resolved.verification_evidence["by"] == "eric"
    assert resolved.verification_evidence["reason"] == "in the dashboard"
    assert resolved.result == {"stripe_id": "pi_9"}
    assert calls == [1]


def test_not_happened_is_recorded_as_verification_evidence(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = _ambiguous_charge(oo)
    effect_id = _park_unknown(oo, charge)
    oo.resolve_not_happened(effect_id, by="eric", reason="absent in dashboard")
    effect = oo.get(effect_id)
    assert effect.execution_status == "unknown"
    assert effect.verification_status == "absent_by_person"
    assert effect.verification_evidence["reason"] == "absent in dashboard"
    assert calls == [1]


def test_plain_success_records_execution_evidence_only(store):
    oo = OpenOnce(store, retry_delay=0)

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        return {"message_id": "m-1"}

    send("a@b.c")
    effect = only_effect(store)
    assert effect.execution_status == "returned"
    assert effect.execution_evidence == {"attempt": 1}
    assert effect.verification_status is None
    assert effect.lease_owner is None
    assert effect.lease_expires_at is None


# -- a ledger write that fails after the call ----------------------------------------------


def test_failed_finishing_write_raises_ledger_write_error_and_never_reruns(store):
    oo = OpenOnce(CommitFailsStore(store), retry_delay=0, lease_seconds=0.3, wait_seconds=0.05)
    calls: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        calls.append(to)
        return {"message_id": "m-1"}

    with pytest.raises(LedgerWriteError) as info:
        send("a@b.c")
    error = info.value
    assert not isinstance(error, LeaseLostError)
    assert error.observed_outcome == "returned"
    assert error.observed_value == {"message_id": "m-1"}
    assert "disk full" in str(error)
    assert "Do not repeat the call" in str(error)
    effect = only_effect(store)
    assert error.effect_id == effect.id
    assert effect.state == S.STARTED  # the claim stands; the outcome was not recorded
    with pytest.raises(EffectInFlightError):
        send("a@b.c")  # lease still live: a duplicate waits, then gives up
    time.sleep(0.4)
    with pytest.raises(OutcomeUnknownError):
        send("a@b.c")  # lease ran out: UNKNOWN, not a second send
    assert oo.get(effect.id).state == S.UNKNOWN
    assert calls == ["a@b.c"]


def test_failed_finishing_write_after_a_business_error_carries_the_exception(store):
    failing = CommitFailsStore(store, failing_states=(S.FAILED,))
    oo = OpenOnce(failing, retry_delay=0)
    calls: list[int] = []
    declined = CardDeclined("card declined")

    @oo.effect(idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise declined

    with pytest.raises(LedgerWriteError) as info:
        charge(500)
    assert info.value.observed_outcome == "failed"
    assert info.value.observed_value is declined
    assert calls == [500]


# -- secrets -------------------------------------------------------------------------------


def test_secret_fields_are_stored_as_digests_only_and_still_dedup(store, store_kind):
    oo = OpenOnce(store, retry_delay=0, secret_pepper=PEPPER)
    card = "4242424242424242"
    other_card = "4000056655665556"
    calls: list[str] = []

    @oo.effect(tool="stripe.charge", secret_fields=["card"])
    def charge(card: str, amount_cents: int) -> dict[str, Any]:
        calls.append(card)
        return {"id": f"pi_{len(calls)}"}

    with oo.scope("run-1"):
        first = charge(card, 500)
        again = charge(card=card, amount_cents=500)
        other = charge(other_card, 500)
        with pytest.raises(OutcomeUnknownError):
            # An ambiguous failure writes error evidence too: still no clear value in it.
            oo.effect(tool="stripe.charge.timeout", secret_fields=["card"])(_times_out)(card, 1)
    assert first == again == {"id": "pi_1"}
    assert other == {"id": "pi_2"}
    assert calls == [card, other_card]  # the handler itself gets the clear value
    effects = store.list_effects()
    assert len(effects) == 3
    for effect in effects:
        assert effect.args["card"].startswith("hmac-sha256:")
        assert card not in repr(effect)
        assert other_card not in repr(effect)
        for line in oo.journal(effect.id):
            assert card not in repr(line)
            assert other_card not in repr(line)
    if store_kind != "memory":
        raw = raw_ledger_text(store, store_kind)
        assert "stripe.charge" in raw  # the scan does read the ledger
        assert card not in raw
        assert other_card not in raw


def _times_out(card: str, amount_cents: int) -> None:
    raise TimeoutError("read timed out")


# -- concurrency ---------------------------------------------------------------------------


def test_concurrent_duplicates_run_the_handler_once(store):
    oo = OpenOnce(store, retry_delay=0, wait_seconds=10)
    calls: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        with lock:
            calls.append(to)
        time.sleep(0.05)
        return {"message_id": "m-1"}

    def caller() -> Any:
        barrier.wait(5)
        return send("a@b.c")

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = [f.result(timeout=20) for f in [pool.submit(caller) for _ in range(8)]]
    assert results == [{"message_id": "m-1"}] * 8
    assert calls == ["a@b.c"]
    assert only_effect(store).state == S.COMMITTED


# -- async handlers ------------------------------------------------------------------------


def test_async_handler_runs_once_across_duplicates(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []
    ids: list[str] = []

    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    async def send(to: str, subject: str, body: str) -> str:
        calls.append(to)
        ids.append(current_effect().effect_id)
        await asyncio.sleep(0.02)
        return f"msg-{to}"

    async def main() -> list[str]:
        with oo.scope("run-1"):
            together = await asyncio.gather(
                send("a@b.c", "hi", "v1"), send("a@b.c", "hi", "v2"), send("a@b.c", "hi", "v3")
            )
            later = await send("a@b.c", "hi", "reworded")
            return [*together, later]

    assert asyncio.run(main()) == ["msg-a@b.c"] * 4
    assert calls == ["a@b.c"]
    assert ids == [only_effect(store).id]
    assert only_effect(store).state == S.COMMITTED


def test_wrapping_an_async_callable_object_awaits_it_inside_the_effect(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    class SendEmail:
        """An existing tool object whose ``__call__`` is a coroutine function."""

        async def __call__(self, to: str) -> str:
            calls.append(to)
            await asyncio.sleep(0)
            return f"msg-{to}"

    send = oo.effect(SendEmail(), tool="email.send", idempotency_key=lambda to: f"mail-{to}")

    async def main() -> list[str]:
        return [await send("a@b.c"), await send("a@b.c")]

    assert asyncio.run(main()) == ["msg-a@b.c", "msg-a@b.c"]
    assert calls == ["a@b.c"]
    effect = only_effect(store)
    assert effect.state == S.COMMITTED
    assert effect.result == "msg-a@b.c"  # the awaited value, not a coroutine object


def test_async_ledger_writes_do_not_block_the_event_loop(store):
    slow = SlowStore(store, delay=0.1)
    oo = OpenOnce(slow, retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    async def send(to: str) -> str:
        calls.append(to)
        return "sent"

    async def main() -> tuple[int, int]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        before = ticks
        assert await send("a@b.c") == "sent"  # two slow writes: ~0.2 s
        during = ticks - before
        stop.set()
        await task
        return during, threading.get_ident()

    during, loop_thread = asyncio.run(main())
    assert calls == ["a@b.c"]
    assert len(slow.write_threads) == 2
    assert loop_thread not in slow.write_threads
    # A blocked loop would tick at most once or twice while the writes happened.
    assert during >= 8, f"event loop ticked only {during} times during 0.2 s of ledger writes"


def test_async_ambiguous_error_parks_unknown(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    async def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        await asyncio.sleep(0)
        raise TimeoutError("read timed out")

    async def main() -> None:
        with pytest.raises(OutcomeUnknownError):
            await charge(500)
        with pytest.raises(OutcomeUnknownError):
            await charge(500)

    asyncio.run(main())
    assert calls == [500]
    assert only_effect(store).state == S.UNKNOWN


# -- the ledger itself ---------------------------------------------------------------------


def test_journal_is_append_only(store, store_kind):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, _ = _refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    oo.approve(effect_id, by="eric", reason="ok")
    journal_before = oo.journal(effect_id)
    approvals_before = oo.approvals(effect_id)
    if store_kind == "sqlite":
        conn = sqlite3.connect(store.path, isolation_level=None)
        for statement in (
            "UPDATE openonce_journal SET reason = 'edited'",
            "DELETE FROM openonce_journal",
            "UPDATE openonce_approvals SET decided_by = 'mallory'",
            "DELETE FROM openonce_approvals",
        ):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                conn.execute(statement)
        conn.close()
    elif store_kind == "postgres":
        import psycopg

        for statement in (
            "UPDATE openonce_journal SET reason = 'edited'",
            "DELETE FROM openonce_journal",
            "UPDATE openonce_approvals SET decided_by = 'mallory'",
            "DELETE FROM openonce_approvals",
        ):
            with (
                psycopg.connect(store.dsn, autocommit=True) as conn,
                pytest.raises(psycopg.Error, match="append"),
            ):
                conn.execute(statement)
    else:
        # In memory the same triggers refuse; and what a reader gets back cannot edit it.
        with store._use() as conn:
            for statement in (
                "UPDATE openonce_journal SET reason = 'edited'",
                "DELETE FROM openonce_approvals",
            ):
                with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                    conn.execute(statement)
        lines = oo.journal(effect_id)
        lines.clear()
        with pytest.raises(dataclasses.FrozenInstanceError):
            journal_before[0].reason = "edited"  # type: ignore[misc]
    assert oo.journal(effect_id) == journal_before
    assert oo.approvals(effect_id) == approvals_before
    assert refund("ch_1", 500)["amount_cents"] == 500


def test_schema_version_and_repeated_migrate(store, store_kind):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls.append(to)
        return "sent"

    send("a@b.c")
    assert store.schema_version() == SCHEMA_VERSION == 5
    assert store.migrate() == SCHEMA_VERSION
    assert store.migrate() == SCHEMA_VERSION
    assert store.schema_version() == SCHEMA_VERSION
    assert send("a@b.c") == "sent"  # migrating again kept the ledger
    assert calls == ["a@b.c"]
    if store_kind == "sqlite":
        rows = sqlite3.connect(store.path).execute("SELECT version FROM openonce_schema")
        assert rows.fetchall() == [(1,), (2,), (3,), (4,), (5,)]
    elif store_kind == "postgres":
        import psycopg

        with psycopg.connect(store.dsn) as conn:
            rows = conn.execute("SELECT version FROM openonce_schema ORDER BY 1").fetchall()
        assert rows == [(1,), (2,), (3,), (4,), (5,)]
    else:
        assert isinstance(store, InMemoryStore)
