"""The three failure classes: FAILED, RETRYABLE and UNKNOWN.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import pytest
import requests

from openonce_core import (
    OpenOnce,
    OpenOnceError,
    OutcomeUnknownError,
    RetryableEffectError,
    UnknownOutcomeError,
    current_effect,
)

from .helpers import (
    AGENT,
    OWNER,
    ReadTimeout,
    S,
    moves,
    only_effect,
)


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
