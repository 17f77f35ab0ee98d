"""When a Stripe miss becomes evidence, over the fake Stripe's real socket
(tests/support/fake_stripe.py): a young search miss says when to ask again, age is read on
the clock the prober is given (the reconciler's), a search that is unavailable or lags past
its normal lag is checked against the list API over a narrow ``created`` window, a miss past
Stripe's 24 h idempotency window is for a person, and ``verify`` checks a receipt a person
offers against the object it names."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from openonce_core import EffectState
from openonce_core._probe import ProbeOutcome
from openonce_core._records import Effect
from openonce_core.errors import ProbeTransientError
from openonce_core.probers import RateLimiter, StripeProber, StripeRestClient
from openonce_core.probers.stripe import CREATED_SKEW_SECONDS
from tests.support.fake_http import ManualClock
from tests.support.fake_stripe import FakeStripeServer

KEY = "oo_" + "ef" * 20
GOOD = "sk_test_good"
T0 = 1_800_000_000.0
HAPPENED, NOT_HAPPENED = ProbeOutcome.HAPPENED, ProbeOutcome.NOT_HAPPENED
INCONCLUSIVE = ProbeOutcome.INCONCLUSIVE


@pytest.fixture
def wall() -> ManualClock:
    """Stripe's clock and the ledger's: the same time base here (skew has its own test)."""
    return ManualClock(T0)


@pytest.fixture
def stripe(wall: ManualClock) -> Iterator[FakeStripeServer]:
    with FakeStripeServer(clock=wall, wall_clock=wall) as server:
        yield server  # type: ignore[misc]


def effect(at: float = T0, *, tool: str = "stripe.charge", key: str = KEY, **kw: Any) -> Effect:
    return Effect(
        id=kw.pop("id", "eff_1"), tool=tool, idempotency_key="k", scope=None,
        state=EffectState.UNKNOWN, args=kw.pop("args", {}), args_fingerprint="fp",
        provider_key=key, attempt=1, created_at=at, updated_at=kw.pop("updated_at", at), **kw,
    )  # fmt: skip


def prober(server: FakeStripeServer, clock: Any, **kw: Any) -> StripeProber:
    client = StripeRestClient(GOOD, base_url=server.url, limiter=RateLimiter("stripe", 1000.0))
    found = StripeProber(client, **kw)
    found.bind_clock(clock)
    return found


# -- young misses say when they mature ----------------------------------------------------


def test_a_young_search_miss_says_when_to_ask_again(stripe, wall):
    stripe.search_lag = 120
    stripe.add("payment_intents", KEY, effect_id="eff_1")
    wall.advance(60)  # a 60 s grace with Stripe's 120 s lag
    p = prober(stripe, wall, maturity_margin_seconds=10)
    young = p.probe(effect())
    assert young.outcome is INCONCLUSIVE and "young miss" in young.detail
    assert young.retry_after == pytest.approx(60 + 10)
    assert [s.path for s in stripe.seen()] == ["/v1/payment_intents/search"]  # no list yet
    wall.advance(young.retry_after)
    assert p.probe(effect()).outcome is HAPPENED


def test_age_is_read_on_the_bound_clock_not_the_hosts(stripe, wall):
    # The ledger's clock (the database's) says the attempt ended 120 s ago, exactly the lag;
    # this host's time.time() is a month away. The bound clock decides: a mature miss.
    wall.advance(120)
    p = prober(stripe, wall, index_lag_seconds=120)
    result = p.probe(effect())
    assert result.outcome is NOT_HAPPENED, result.detail
    assert result.retry_after is None
    assert abs(time.time() - wall()) > 86400  # the host's clock really is elsewhere


def test_an_unbound_prober_reads_the_hosts_clock():
    # Standalone (no reconciler), it still works: time.time().
    with FakeStripeServer() as stripe:
        client = StripeRestClient(GOOD, base_url=stripe.url, limiter=RateLimiter("stripe", 1e3))
        result = StripeProber(client).probe(effect(time.time() - 30))
        assert result.outcome is INCONCLUSIVE and 85 <= (result.retry_after or 0) <= 101


def test_an_explicit_clock_is_not_replaced_by_binding(stripe, wall):
    mine = ManualClock(T0 + 600)
    p = StripeProber(
        StripeRestClient(GOOD, base_url=stripe.url, limiter=RateLimiter("stripe", 1e3)),
        clock=mine,
    )
    p.bind_clock(wall)  # wall says 0 s old: would be a young miss
    assert p.probe(effect()).outcome is NOT_HAPPENED


def test_a_clock_an_hour_behind_the_ledgers_waits_the_lag_not_the_hour(stripe, wall):
    # The ledger wrote the attempt an hour ahead of the prober's clock (a host clock
    # stepped back): the attempt cannot be in the future, so its age counts as 0.
    p = prober(stripe, wall, index_lag_seconds=120, maturity_margin_seconds=10)
    young = p.probe(effect(T0 + 3600))
    assert young.outcome is INCONCLUSIVE and "clocks disagree" in young.detail
    assert young.retry_after == pytest.approx(120 + 10)


def test_without_an_index_lag_a_clock_behind_does_not_make_a_miss_young(stripe, wall):
    # No lag to wait for (the soak's and a test account's): the list API decides at once,
    # instead of a young miss parked for the hour the clocks disagree by.
    p = prober(stripe, wall, index_lag_seconds=0)
    result = p.probe(effect(T0 + 3600))
    assert result.outcome is NOT_HAPPENED, result.detail
    assert "/v1/payment_intents" in [s.path for s in stripe.seen()]


def test_the_daemon_tests_lazy_prober_is_bound_to_the_reconcilers_clock(stripe, wall, monkeypatch):
    # tests/support/provider_probers.LazyStripe (the soak's and the daemon tests' prober)
    # builds its StripeProber after the fork; the clock the reconciler binds must reach it.
    from openonce_core import InMemoryStore, OpenOnce
    from openonce_core._reconcile import Reconciler
    from tests.support.provider_probers import LazyStripe

    monkeypatch.setenv("OPENONCE_TEST_STRIPE_URL", stripe.url)
    lazy = LazyStripe()
    rec = Reconciler(OpenOnce(InMemoryStore()), clock=wall)  # a callable clock
    rec.register("stripe.charge", lazy)
    wall.advance(3600)  # this host: elsewhere; the reconciler's clock: an hour on
    result = lazy.probe(effect(T0 + 3590))
    assert result.outcome is NOT_HAPPENED, result.detail  # 10 s old on the bound clock
    assert abs(time.time() - wall()) > 86400


def test_a_young_miss_counts_from_when_the_effect_went_unknown_across_reprobes(stripe, wall):
    # A reconciler's re-probe moves the effect (updated_at) but keeps when it went UNKNOWN.
    wall.advance(130)
    moved = effect(
        updated_at=T0 + 125,
        verification_evidence={"unknown_since": {"attempt": 1, "at": T0}},
    )
    assert prober(stripe, wall).probe(moved).outcome is NOT_HAPPENED
    # ... but only for the attempt it was written for.
    other = effect(
        updated_at=T0 + 125,
        verification_evidence={"unknown_since": {"attempt": 0, "at": T0}},
    )
    assert prober(stripe, wall).probe(other).outcome is INCONCLUSIVE


# -- the list API: when search is unavailable, and to confirm a mature search miss ---------


def test_search_unavailable_falls_back_to_a_created_window_list(stripe, wall):
    stripe.search_unavailable = True
    for n in range(150):  # other charges in the window: ours is on the second page
        stripe.add("payment_intents", f"oo_other_{n}")
    wall.advance(1)
    ours = stripe.add("payment_intents", KEY, effect_id="eff_1")
    wall.advance(5)
    result = prober(stripe, wall).probe(effect(T0 + 1))
    assert result.outcome is HAPPENED, result.detail
    assert result.receipt is not None and result.receipt["stripe_id"] == ours["id"]
    assert result.provider_reference == KEY
    paths = [s.path for s in stripe.seen()]
    assert paths == ["/v1/payment_intents/search", "/v1/payment_intents", "/v1/payment_intents"]
    first = stripe.seen("/v1/payment_intents")[1]
    assert first.query["created[gte]"] == [str(int(T0 + 1 - CREATED_SKEW_SECONDS))]
    assert first.query["created[lte]"] == [str(int(T0 + 6 + CREATED_SKEW_SECONDS))]
    assert first.query["limit"] == ["100"]
    assert "starting_after" in stripe.seen("/v1/payment_intents")[2].query
    assert "search is not available" in result.detail


def test_search_unavailable_and_nothing_listed_is_a_miss_without_index_lag(stripe, wall):
    stripe.search_unavailable = True
    stripe.add("payment_intents", "oo_someone_else")
    wall.advance(5)
    result = prober(stripe, wall).probe(effect())
    assert result.outcome is NOT_HAPPENED, result.detail
    assert "list" in result.detail and "Backstop" in result.detail


def test_an_object_created_before_the_window_is_not_listed(stripe, wall):
    stripe.search_unavailable = True
    stripe.add("payment_intents", KEY, effect_id="eff_1")
    wall.advance(CREATED_SKEW_SECONDS + 60)
    result = prober(stripe, wall).probe(effect(T0 + CREATED_SKEW_SECONDS + 30))
    assert result.outcome is NOT_HAPPENED  # older than the effect less the skew: not its own


def test_a_search_lagging_past_its_normal_lag_is_checked_on_the_list(stripe, wall):
    # An outage: the index is an hour behind. Past the normal 120 s lag the search miss is
    # confirmed on the list, which has the object.
    stripe.search_lag = 3600
    ours = stripe.add("charges", KEY, effect_id="eff_1")
    wall.advance(200)
    result = prober(stripe, wall, objects="charges").probe(effect())
    assert result.outcome is HAPPENED, result.detail
    assert result.receipt is not None and result.receipt["stripe_id"] == ours["id"]
    assert [s.path for s in stripe.seen()] == ["/v1/charges/search", "/v1/charges"]


def test_a_mature_search_miss_confirmed_by_the_list_is_not_happened(stripe, wall):
    stripe.add("payment_intents", "oo_someone_else")
    wall.advance(200)
    result = prober(stripe, wall).probe(effect())
    assert result.outcome is NOT_HAPPENED
    assert "mature miss" in result.detail and "list" in result.detail
    assert result.observed["idempotency_backstop"] is True


def test_two_listed_objects_with_our_key_are_for_a_person(stripe, wall):
    stripe.search_unavailable = True
    stripe.add("payment_intents", KEY, effect_id="eff_1")
    stripe.add("payment_intents", KEY, effect_id="eff_1")
    wall.advance(5)
    result = prober(stripe, wall).probe(effect())
    assert result.outcome is INCONCLUSIVE and "possible duplicates" in result.detail


def test_a_list_failing_is_could_not_ask_not_a_miss(stripe, wall):
    wall.advance(5)
    # The other message Stripe has given for it; then the list answers 503.
    stripe.fail_next(400, body={"error": {"message": "search feature unavailable for merchant"}})
    stripe.fail_next(503, body={"error": {"message": "try later"}})
    with pytest.raises(ProbeTransientError, match="503"):
        prober(stripe, wall).probe(effect())
    assert [s.path for s in stripe.seen()] == ["/v1/payment_intents/search", "/v1/payment_intents"]


def test_too_many_objects_in_the_window_asks_for_a_person_not_a_guess(stripe, wall):
    stripe.search_unavailable = True
    for n in range(30):
        stripe.add("payment_intents", f"oo_other_{n}")
    wall.advance(5)
    p = prober(stripe, wall)
    p.client.max_list_pages = 2  # type: ignore[attr-defined]
    p.client.list_page_size = 10  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="look by hand") as info:
        p.probe(effect())
    assert type(info.value).__name__ == "StripeReadError"


# -- past Stripe's 24 h idempotency window a miss is for a person --------------------------


@pytest.mark.parametrize("unavailable", [False, True])
def test_a_mature_miss_past_the_idempotency_window_is_inconclusive(stripe, wall, unavailable):
    stripe.search_unavailable = unavailable
    wall.advance(25 * 3600)
    result = prober(stripe, wall).probe(effect())
    assert result.outcome is INCONCLUSIVE, result.detail
    assert result.retry_after is None  # it will not mature: a person decides
    assert "idempotency window" in result.detail
    assert result.observed["idempotency_backstop"] is False


def test_a_refund_list_miss_past_the_window_is_inconclusive_too(stripe, wall):
    wall.advance(25 * 3600)
    result = prober(stripe, wall).probe(effect(tool="stripe.refund", args={"charge": "ch_1"}))
    assert result.outcome is INCONCLUSIVE and "idempotency window" in result.detail


# -- verify: a receipt a person offers, checked against the object it names -----------------


def verify(stripe: FakeStripeServer, wall: ManualClock, receipt: Any, **kw: Any) -> Any:
    tool = kw.pop("tool", "stripe.charge")
    return prober(stripe, wall, **kw).verify(effect(tool=tool), receipt)


def test_verify_a_receipt_stamped_with_this_effect_is_happened(stripe, wall):
    ours = stripe.add("payment_intents", KEY, effect_id="eff_1", amount=700)
    result = verify(stripe, wall, {"stripe_id": ours["id"]})
    assert result.outcome is HAPPENED
    assert result.receipt == {
        "stripe_id": ours["id"], "amount": 700, "currency": "usd", "status": "succeeded",
    }  # fmt: skip
    assert result.provider_reference == KEY
    assert [s.path for s in stripe.seen()] == [f"/v1/payment_intents/{ours['id']}"]


def test_verify_charges_and_refunds_by_their_prefix(stripe, wall):
    charge = stripe.add("charges", KEY, effect_id="eff_1")
    assert verify(stripe, wall, {"stripe_id": charge["id"]}, objects="charges").decisive
    py = stripe.add("charges", KEY, id="py_42")
    assert verify(stripe, wall, {"stripe_id": "py_42"}, objects="charges").outcome is HAPPENED
    refund = stripe.add("refunds", KEY, charge="ch_9")
    result = verify(stripe, wall, {"stripe_id": refund["id"]}, tool="stripe.refund")
    assert result.outcome is HAPPENED and py["id"] == "py_42"
    assert stripe.seen()[-1].path == f"/v1/refunds/{refund['id']}"


@pytest.mark.parametrize(
    ("receipt", "words"),
    [
        ({"stripe_id": "re_1"}, "is a Refund"),  # a refund id for a charge tool
        ({"stripe_id": "cus_1"}, "not an id of"),
        ({"stripe_id": "pi_1/../../v1/charges"}, "not a Stripe object id"),
        ({"stripe_id": ""}, "no stripe_id"),
        ({"amount": 5}, "no stripe_id"),
        ("pi_1", "no stripe_id"),
    ],
)
def test_verify_refuses_what_cannot_be_this_tools_object_without_asking(
    stripe, wall, receipt, words
):
    result = verify(stripe, wall, receipt)
    assert result.outcome is INCONCLUSIVE and words in result.detail, result.detail
    assert stripe.seen() == []


def test_verify_an_object_without_our_stamp_or_with_anothers_is_inconclusive(stripe, wall):
    bare = stripe.add("payment_intents", "ignored")
    bare["metadata"] = {}
    result = verify(stripe, wall, {"stripe_id": bare["id"]})
    assert result.outcome is INCONCLUSIVE and "carries no openonce_provider_key" in result.detail
    other = stripe.add("payment_intents", "oo_another_key", effect_id="eff_2")
    result = verify(stripe, wall, {"stripe_id": other["id"]})
    assert result.outcome is INCONCLUSIVE and "oo_another_key" in result.detail
    stranger = stripe.add("payment_intents", KEY, effect_id="eff_2")
    result = verify(stripe, wall, {"stripe_id": stranger["id"]})
    assert result.outcome is INCONCLUSIVE and "eff_2" in result.detail
    assert result.provider_reference is None


def test_verify_an_id_stripe_does_not_have_is_inconclusive(stripe, wall):
    result = verify(stripe, wall, {"stripe_id": "pi_nothere"})
    assert result.outcome is INCONCLUSIVE
    assert "Stripe has no PaymentIntent pi_nothere" in result.detail


def test_verify_when_stripe_cannot_be_asked_says_so(stripe, wall):
    stripe.fail_next(503, body={"error": {"message": "down"}})
    result = verify(stripe, wall, {"stripe_id": "pi_1"})
    assert result.outcome is INCONCLUSIVE and "could not be asked" in result.detail
    assert result.observed.get("probe_error") is True


@pytest.mark.parametrize(
    "field", ["index_lag_seconds", "idempotency_window_seconds", "maturity_margin_seconds"]
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_lag_window_or_margin_that_is_not_a_time_is_refused(field: str, bad: float) -> None:
    # NaN would make every search miss look mature at once (age < NaN is never true).
    class NoClient:
        pass

    with pytest.raises(ValueError, match=field):
        StripeProber(NoClient(), **{field: bad})  # type: ignore[arg-type]
