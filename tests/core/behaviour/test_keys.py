"""Keys: idempotency keys, argument fingerprints, refused arguments.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import enum
from datetime import date
from decimal import Decimal
from typing import Any

import pytest

from openonce_core import (
    FloatInKeyMaterialError,
    IdempotencyMismatchError,
    InvalidArgumentsError,
    OpenOnce,
    ScopeRequiredError,
    current_scope,
)

from .helpers import (
    only_effect,
)


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
