"""A prober that could not ask its provider says nothing about the effect: transient
failures are asked again (honouring Retry-After) and reach a person only after a bounded
number of attempts; a refused key marks the prober failing and pages nobody; a probe our
own rate limit held back is no attempt at all."""

from __future__ import annotations

from typing import Any

import pytest

from openonce_core import (
    EffectState,
    OpenOnce,
    OutcomeUnknownError,
    ProbeCredentialError,
    ProbeOutcome,
    ProbeResult,
    ProbeTransientError,
    Reconciler,
)
from openonce_core.testing import FakeClock

S = EffectState


class Scripted:
    """Raises (or answers) what the test lines up, one per probe."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def probe(self, effect: Any) -> ProbeResult:
        self.calls += 1
        answer = self.answers.pop(0) if self.answers else "happened"
        if isinstance(answer, BaseException):
            raise answer
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_1"},
            provider_reference=effect.provider_key,
        )  # fmt: skip


@pytest.fixture
def world(store):
    clock = FakeClock()
    oo = OpenOnce(store, clock=clock)

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> None:
        raise TimeoutError("read timed out")

    with pytest.raises(OutcomeUnknownError) as unknown:
        charge("o1")
    return oo, clock, unknown.value.effect_id


def busy(retry_after: float | None = None, *, sent: bool = True) -> ProbeTransientError:
    return ProbeTransientError(
        "stripe", "Stripe answered HTTP 429", status=429, retry_after=retry_after, sent=sent
    )


def test_a_429_is_asked_again_after_retry_after_and_then_commits(world):
    oo, clock, effect_id = world
    prober = Scripted(busy(30), busy(30))
    rec = Reconciler(oo, grace_seconds=0, retry_backoff=1)
    rec.register("stripe.charge", prober)
    assert rec.run_once().retried == [effect_id]
    assert rec.run_once().resolved == 0 and prober.calls == 1  # Retry-After is honoured
    clock.advance(30)
    assert rec.run_once().retried == [effect_id]
    clock.advance(30)
    assert rec.run_once().committed == [effect_id]
    evidence = oo.get(effect_id).verification_evidence
    attempts = [a for line in oo.journal(effect_id) if line.action == "reprobe" for a in [line]]
    assert len(attempts) == 2 and "(2/8)" in attempts[-1].reason
    assert evidence["observations"][-1]["outcome"] == "happened"


def test_a_provider_down_for_good_goes_to_a_person_after_the_bounded_retries(world):
    oo, clock, effect_id = world
    prober = Scripted(*[busy() for _ in range(10)])
    rec = Reconciler(oo, grace_seconds=0, retry_backoff=1, transient_retries=3)
    rec.register("stripe.charge", prober)
    for _ in range(3):
        assert rec.run_once().retried == [effect_id]
        clock.advance(100)
    report = rec.run_once()
    assert report.escalated == [effect_id] and prober.calls == 4
    effect = oo.get(effect_id)
    assert effect.state == S.HUMAN_REVIEW
    kept = oo.journal(effect_id)[-2].evidence or {}
    assert kept["retry"] == 3  # every attempt is in the evidence before a person is asked
    assert len(effect.verification_evidence["observations"]) == 1


def test_a_provider_down_longer_than_the_window_goes_to_a_person(world):
    oo, clock, effect_id = world
    rec = Reconciler(oo, grace_seconds=0, retry_backoff=1, transient_window=600)
    rec.register("stripe.charge", Scripted(*[busy() for _ in range(10)]))
    assert rec.run_once().retried == [effect_id]
    clock.advance(601)
    assert rec.run_once().escalated == [effect_id]


def test_a_refused_key_marks_the_prober_failing_and_pages_nobody(world):
    oo, clock, effect_id = world
    refused = [ProbeCredentialError("stripe", "HTTP 401: invalid API key", status=401)] * 20
    prober = Scripted(*refused)
    rec = Reconciler(oo, grace_seconds=0, retry_backoff=1, transient_retries=2)
    rec.register("stripe.charge", prober)
    for _ in range(12):
        report = rec.run_once()
        if report.retried:
            assert report.prober_failures == {"stripe": "ProbeCredentialError: stripe: HTTP 401:"
                                              " invalid API key"}  # fmt: skip
        clock.advance(1000)
    assert oo.get(effect_id).state == S.UNKNOWN  # waiting for the key, not for a person
    prober.answers.clear()  # the key is fixed
    clock.advance(1000)
    assert rec.run_once().committed == [effect_id]


def test_a_probe_our_own_rate_limit_held_back_is_no_attempt(world):
    oo, clock, effect_id = world
    prober = Scripted(busy(5, sent=False), busy(5, sent=False))
    rec = Reconciler(oo, grace_seconds=0, retry_backoff=1, transient_retries=1)
    rec.register("stripe.charge", prober)
    lines = len(oo.journal(effect_id))
    for _ in range(2):
        report = rec.run_once()
        assert report.deferred == [effect_id] and report.retried == []
        assert rec.run_once().deferred == []  # not due again before the pause ends
        clock.advance(5)
    assert len(oo.journal(effect_id)) == lines  # nothing journaled, nothing counted
    assert rec.run_once().committed == [effect_id]
