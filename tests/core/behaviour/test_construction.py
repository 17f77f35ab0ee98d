"""Constructing OpenOnce and declaring effects.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from openonce_core import (
    ConfigurationError,
    IdempotencyMismatchError,
    OpenOnce,
)

from .helpers import (
    AGENT,
    OWNER,
    PEPPER,
    S,
    moves,
    only_effect,
)


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
