"""A young miss is asked again when it matures, on every store, against the fake Stripe's
real socket: the reconciler re-probes (UNKNOWN stays UNKNOWN, a ``reprobe`` line saying
when) instead of sending a person an effect Stripe's search index simply has not caught up
with; the prober reads the reconciler's clock; and the waiting is bounded.

Time is the ledger's FakeClock, which is also the fake Stripe's clock (its search lag and
its objects' ``created``)."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

import openonce_core.probers.stripe as stripe_module
from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, Store, current_effect
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core.probers import RateLimiter, StripeProber, StripeRestClient, effect_metadata
from openonce_core.testing import FakeClock
from tests.support.fake_stripe import FakeStripeServer

S = EffectState
LAG = 120.0  # Stripe's search lag the prober assumes, and the fake's index lag


@pytest.fixture
def oo(store: Store, clock: FakeClock) -> Iterator[OpenOnce]:
    client = OpenOnce(store, retry_delay=0, clock=clock)
    yield client
    client.close()


@pytest.fixture
def stripe(clock: FakeClock) -> Iterator[FakeStripeServer]:
    with FakeStripeServer(search_lag=LAG, clock=clock.now, wall_clock=clock.now) as server:
        yield server  # type: ignore[misc]


class Shop:
    """A charge tool whose handler reaches Stripe ("after": Stripe made the PaymentIntent,
    stamped with the effect's metadata) or not ("before"), then times out."""

    def __init__(self, oo: OpenOnce, stripe: FakeStripeServer) -> None:
        self.oo, self.stripe, self.calls = oo, stripe, 0

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order, mode: order)
        def charge(order: str, mode: str) -> dict[str, Any]:
            self.calls += 1
            ctx = current_effect()
            if mode == "after":
                meta = effect_metadata(ctx)
                stripe.add(
                    "payment_intents", ctx.provider_key, effect_id=meta["openonce_effect_id"]
                )
            raise TimeoutError("read timed out")

        self.charge = charge

    def unknown(self, order: str = "o1", mode: str = "after") -> str:
        with pytest.raises(OutcomeUnknownError) as info:
            self.charge(order, mode)
        return info.value.effect_id


@pytest.fixture
def shop(oo: OpenOnce, stripe: FakeStripeServer) -> Shop:
    return Shop(oo, stripe)


def stripe_prober(stripe: FakeStripeServer) -> StripeProber:
    client = StripeRestClient("sk_test_good", base_url=stripe.url, limiter=RateLimiter("s", 1e3))
    return StripeProber(client, index_lag_seconds=LAG)


@pytest.fixture
def make_rec(oo: OpenOnce) -> Iterator[Any]:
    made: list[Reconciler] = []

    def make(**options: Any) -> Reconciler:
        options.setdefault("owner", "sweeper-1")
        rec = Reconciler(oo, **options)
        made.append(rec)
        return rec

    yield make
    for rec in made:
        rec.close()


def moves(oo: OpenOnce, effect_id: str) -> list[tuple[str, str]]:
    return [(j.action, str(j.to_state)) for j in oo.journal(effect_id)]


def searches(stripe: FakeStripeServer) -> int:
    return len(stripe.seen("/v1/payment_intents/search"))


# -- a young miss is asked again when it matures ------------------------------------------


def test_a_young_miss_with_grace_60_is_reprobed_then_committed_when_the_index_has_it(
    shop, stripe, make_rec, clock
):
    # OPENONCE_GRACE_SECONDS=60 with Stripe's 120 s lag: the first probe is always young.
    effect_id = shop.unknown()
    rec = make_rec(grace_seconds=60)
    rec.register("stripe.charge", stripe_prober(stripe))
    clock.advance(60)
    report = rec.run_once()
    assert report.retried == [effect_id] and report.escalated == []
    assert shop.oo.get(effect_id).state == S.UNKNOWN
    line = shop.oo.journal(effect_id)[-1]
    assert (line.action, line.from_state, line.to_state) == ("reprobe", S.UNKNOWN, S.UNKNOWN)
    assert "young miss" in line.reason and "asking again in 70s, at " in line.reason
    clock.advance(69)  # not yet: nothing is asked
    assert rec.run_once().resolved == 0 and searches(stripe) == 1
    clock.advance(1)
    report = rec.run_once()
    assert report.committed == [effect_id]
    assert shop.oo.get(effect_id).state == S.COMMITTED
    assert shop.oo.get(effect_id).result["stripe_id"].startswith("pi_fake")
    assert "human_review" not in {to for _, to in moves(shop.oo, effect_id)}
    assert shop.calls == 1


def test_a_young_miss_that_matures_as_a_miss_is_rearmed_on_the_list(shop, stripe, make_rec, clock):
    effect_id = shop.unknown(mode="before")  # Stripe never saw it
    rec = make_rec(grace_seconds=60)
    rec.register("stripe.charge", stripe_prober(stripe))
    clock.advance(60)
    assert rec.run_once().retried == [effect_id]
    clock.advance(70)
    report = rec.run_once()
    assert report.rearmed == [effect_id]
    assert shop.oo.get(effect_id).state == S.PLANNED
    reason = shop.oo.journal(effect_id)[-1].reason
    assert "mature miss" in reason and "Stripe's list API" in reason and "Backstop" in reason
    assert [s.path for s in stripe.seen()][-2:] == [
        "/v1/payment_intents/search",
        "/v1/payment_intents",
    ]


class Wrapper:
    """A prober kept as ``inner`` by a wrapper (the daemon's InstrumentedProber)."""

    def __init__(self, inner: StripeProber) -> None:
        self.inner = inner

    def probe(self, effect: Effect) -> ProbeResult:
        return self.inner.probe(effect)


@pytest.mark.parametrize("how", ["direct", "wrapped", "unbound"])
def test_grace_equal_to_the_lag_and_a_host_clock_1s_behind_never_escalates(
    shop, stripe, make_rec, clock, monkeypatch, how
):
    # This host's time.time() runs 1 s behind the ledger's clock (the database's).
    host = types.SimpleNamespace(time=lambda: clock.now() - 1)
    monkeypatch.setattr(stripe_module, "time", host)
    effect_id = shop.unknown(mode="before")  # a miss: nothing at Stripe
    rec = make_rec(grace_seconds=None)  # Stripe's default grace: 120 s, the lag itself
    prober = stripe_prober(stripe)
    if how == "direct":
        rec.register("stripe.charge", prober)  # gets the reconciler's clock
    elif how == "wrapped":
        rec.register("stripe.charge", Wrapper(prober))  # so does the prober it wraps
    else:
        rec.register("stripe.charge", lambda effect: prober.probe(effect))  # reads the host's
    clock.advance(LAG)
    report = rec.run_once()
    if how != "unbound":
        assert report.rearmed == [effect_id]  # the same clock: exactly mature
    else:
        # 119 s old by the host's clock: a young miss, asked again 1 s + the margin later.
        assert report.retried == [effect_id] and report.escalated == []
        assert "asking again in 11s" in shop.oo.journal(effect_id)[-1].reason
        clock.advance(11)
        assert rec.run_once().rearmed == [effect_id]
    assert shop.oo.get(effect_id).state == S.PLANNED
    assert "human_review" not in {to for _, to in moves(shop.oo, effect_id)}


def test_a_failed_probe_does_not_make_a_mature_miss_young_again(shop, stripe, make_rec, clock):
    # The re-probe after a 503 moves the effect (its updated_at); the miss's age still
    # counts from when the effect went UNKNOWN.
    effect_id = shop.unknown(mode="before")
    rec = make_rec(grace_seconds=60)
    rec.register("stripe.charge", stripe_prober(stripe))
    stripe.fail_next(503, body={"error": {"message": "Stripe is down"}})
    clock.advance(60)
    assert rec.run_once().retried == [effect_id]
    clock.advance(60)  # 120 s after it went UNKNOWN, 60 s after the re-probe
    report = rec.run_once()
    assert report.rearmed == [effect_id], shop.oo.journal(effect_id)[-1].reason
    assert shop.oo.get(effect_id).state == S.PLANNED


# -- the list API ---------------------------------------------------------------------------


def test_an_account_without_search_is_resolved_through_the_list(shop, stripe, make_rec, clock):
    stripe.search_unavailable = True
    found = shop.unknown("o1")
    missing = shop.unknown("o2", mode="before")
    rec = make_rec(grace_seconds=None)
    rec.register("stripe.charge", stripe_prober(stripe))
    clock.advance(LAG)
    report = rec.run_once()
    assert report.committed == [found] and report.rearmed == [missing]
    assert report.escalated == [] and report.retried == []
    assert "search is not available" in shop.oo.journal(missing)[-1].reason


# -- where waiting ends: a person ----------------------------------------------------------


def test_a_miss_past_stripes_24h_idempotency_window_goes_to_a_person(shop, stripe, make_rec, clock):
    effect_id = shop.unknown(mode="before")
    rec = make_rec(grace_seconds=None)
    rec.register("stripe.charge", stripe_prober(stripe))
    clock.advance(25 * 3600)  # the reconciler was down for a day
    report = rec.run_once()
    assert report.escalated == [effect_id] and report.rearmed == []
    effect = shop.oo.get(effect_id)
    assert effect.state == S.HUMAN_REVIEW
    line = shop.oo.journal(effect_id)[-1]
    assert line.action == "escalate" and "idempotency window" in line.reason
    assert shop.calls == 1  # nothing re-sent


class NeverCatchesUp:
    """A prober whose provider's index never catches up: always a young miss."""

    def __init__(self) -> None:
        self.calls = 0

    def probe(self, effect: Effect) -> ProbeResult:
        self.calls += 1
        return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail="young miss: not indexed yet",
                           retry_after=30)  # fmt: skip


def test_an_index_that_never_catches_up_goes_to_a_person_after_the_bound(shop, make_rec, clock):
    effect_id = shop.unknown()
    prober = NeverCatchesUp()
    rec = make_rec(grace_seconds=0, young_reprobes=3)
    rec.register("stripe.charge", prober)
    for _ in range(3):
        assert rec.run_once().retried == [effect_id]
        clock.advance(30)
    report = rec.run_once()
    assert report.escalated == [effect_id] and prober.calls == 4
    reason = shop.oo.journal(effect_id)[-1].reason
    assert "still not decisive after 3 re-probes over 90s" in reason
    assert shop.oo.get(effect_id).state == S.HUMAN_REVIEW


def test_the_maturity_window_bounds_the_waiting_too(shop, make_rec, clock):
    effect_id = shop.unknown()
    rec = make_rec(grace_seconds=0, maturity_window=45)
    rec.register("stripe.charge", NeverCatchesUp())
    assert rec.run_once().retried == [effect_id]
    clock.advance(30)
    assert rec.run_once().retried == [effect_id]
    clock.advance(30)
    assert rec.run_once().escalated == [effect_id]


@pytest.mark.parametrize("wait", [float("nan"), "soon", True, None])
def test_an_unusable_retry_after_is_no_reason_to_wait(shop, make_rec, wait):
    effect_id = shop.unknown()
    rec = make_rec(grace_seconds=0)
    answer = ProbeResult(ProbeOutcome.INCONCLUSIVE, detail="hm", retry_after=wait)
    rec.register("stripe.charge", lambda effect: answer)
    assert rec.run_once().escalated == [effect_id]
