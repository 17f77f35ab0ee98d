"""The Stripe prober's real HTTP client against a Stripe-like server on a local socket
(tests/support/fake_stripe.py): the wire format it sends, the object it reads per tool,
and what it raises when Stripe fails the way Stripe fails (429 with Retry-After, 503,
401, slow replies, a search index that lags behind writes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, current_effect
from openonce_core._probe import ProbeOutcome
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core.errors import ProbeCredentialError, ProbeTransientError
from openonce_core.probers import (
    STRIPE_VERSION,
    RateLimiter,
    StripeProber,
    StripeRestClient,
    effect_metadata,
)
from tests.support.fake_http import ManualClock
from tests.support.fake_imap import free_port
from tests.support.fake_stripe import FakeStripeServer

KEY = "oo_" + "cd" * 20
GOOD = "sk_test_good"


class Sleeps:
    """A limiter's sleep that only records (time is the manual clock's)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def stripe() -> Iterator[FakeStripeServer]:
    with FakeStripeServer() as server:
        yield server  # type: ignore[misc]


def effect(
    tool: str = "stripe.charge",
    args: dict[str, Any] | None = None,
    age: float = 600.0,
    key: str = KEY,
) -> Effect:
    at = time.time() - age
    return Effect(
        id="eff_1", tool=tool, idempotency_key="k", scope=None, state=EffectState.UNKNOWN,
        args=args or {}, args_fingerprint="fp", provider_key=key, attempt=1,
        created_at=at, updated_at=at,
    )  # fmt: skip


def client(server: FakeStripeServer, **kw: Any) -> StripeRestClient:
    kw.setdefault("limiter", RateLimiter("stripe", 1000.0))
    return StripeRestClient(kw.pop("api_key", GOOD), base_url=server.url, **kw)


# -- the wire format ----------------------------------------------------------------------


def test_search_sends_the_pinned_version_the_key_and_the_metadata_query(stripe):
    intent = stripe.add("payment_intents", KEY, effect_id="eff_1")
    result = StripeProber(client(stripe, timeout=2.0)).probe(effect())
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.receipt == {
        "stripe_id": intent["id"], "amount": 500, "currency": "usd", "status": "succeeded",
    }  # fmt: skip
    [seen] = stripe.seen()
    assert seen.path == "/v1/payment_intents/search"
    assert seen.query["query"] == [f"metadata['openonce_provider_key']:'{KEY}'"]
    assert seen.headers["authorization"] == f"Bearer {GOOD}"
    assert seen.headers["stripe-version"] == STRIPE_VERSION
    assert STRIPE_VERSION >= "2020-08-27"  # search needs 2020-08-27 or later
    assert "stripe-account" not in seen.headers


def test_connect_requests_carry_stripe_account(stripe):
    stripe.add("payment_intents", KEY)
    StripeProber(client(stripe, stripe_account="acct_123")).probe(effect())
    assert stripe.seen()[-1].headers["stripe-account"] == "acct_123"
    # Per effect: the account named in the effect's arguments wins.
    prober = StripeProber(client(stripe), account_arg="account")
    assert prober.probe(effect(args={"account": "acct_456"})).outcome is ProbeOutcome.HAPPENED
    assert stripe.seen()[-1].headers["stripe-account"] == "acct_456"
    refused = prober.probe(effect(args={"account": "not-an-account"}))
    assert refused.outcome is ProbeOutcome.INCONCLUSIVE
    assert len(stripe.seen()) == 2  # nothing sent for an effect that names no account
    with pytest.raises(ValueError, match="acct_"):
        StripeRestClient(GOOD, stripe_account="123")


def test_charges_are_searched_where_the_tool_creates_charges(stripe):
    charge = stripe.add("charges", KEY)
    stripe.add("payment_intents", "oo_other")
    result = StripeProber(client(stripe), objects="charges").probe(effect())
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.receipt is not None and result.receipt["stripe_id"] == charge["id"]
    assert [s.path for s in stripe.seen()] == ["/v1/charges/search"]


def test_refunds_are_listed_by_their_charge_across_pages_not_searched(stripe):
    # Refunds are not searchable: the prober lists the charge's refunds and matches the
    # metadata. 150 other refunds of the same charge put ours on the second page.
    ours = stripe.add("refunds", KEY, charge="ch_9")
    for n in range(150):
        stripe.add("refunds", f"oo_partial_{n}", charge="ch_9")
    stripe.add("refunds", "oo_elsewhere", charge="ch_other")
    result = StripeProber(client(stripe)).probe(
        effect("stripe.refund", {"charge": "ch_9", "amount_cents": 500})
    )
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.receipt is not None and result.receipt["stripe_id"] == ours["id"]
    pages = stripe.seen()
    assert [s.path for s in pages] == ["/v1/refunds", "/v1/refunds"]
    assert pages[0].query["charge"] == ["ch_9"] and "starting_after" in pages[1].query
    assert result.observed["ignored_unrelated"] == 150  # other refunds, not suspicious


def test_a_refund_miss_on_the_list_is_not_happened_without_an_index_lag(stripe):
    stripe.add("refunds", "oo_someone_else", payment_intent="pi_7")
    result = StripeProber(client(stripe)).probe(
        effect("stripe.refund", {"payment_intent": "pi_7"}, age=5)
    )
    assert result.outcome is ProbeOutcome.NOT_HAPPENED  # a list reads the primary store
    assert "a list, not the search index" in result.detail and "Backstop" in result.detail
    assert stripe.seen()[0].query["payment_intent"] == ["pi_7"]


def test_a_refund_without_its_charge_cannot_be_probed(stripe):
    result = StripeProber(client(stripe)).probe(effect("stripe.refund", {"amount_cents": 5}))
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "Refunds are not searchable" in result.detail
    assert stripe.seen() == []


def test_search_that_lags_behind_writes_is_a_young_miss_then_a_hit():
    clock = ManualClock()
    with FakeStripeServer(search_lag=60.0, clock=clock) as stripe:
        stripe.add("payment_intents", KEY)
        prober = StripeProber(client(stripe))
        young = prober.probe(effect(age=30))
        assert young.outcome is ProbeOutcome.INCONCLUSIVE and "young miss" in young.detail
        clock.advance(61)  # the index caught up
        assert prober.probe(effect(age=30)).outcome is ProbeOutcome.HAPPENED


# -- Stripe failing -----------------------------------------------------------------------


def test_429_with_retry_after_is_transient_and_pauses_every_probe_of_the_process(stripe):
    clock = ManualClock()
    limiter = RateLimiter("stripe", 100.0, clock=clock, sleep=Sleeps(clock))
    prober = StripeProber(client(stripe, limiter=limiter))
    stripe.add("payment_intents", KEY)
    stripe.fail_next(429, headers={"Retry-After": "7"}, body={"error": {"message": "slow down"}})
    with pytest.raises(ProbeTransientError, match="HTTP 429: slow down") as info:
        prober.probe(effect())
    assert (info.value.status, info.value.retry_after) == (429, 7.0)
    # While Stripe asked us to wait, nothing is sent: the next probe fails fast.
    with pytest.raises(ProbeTransientError, match="told us to wait") as waiting:
        prober.probe(effect())
    assert waiting.value.retry_after is not None and 6.9 <= waiting.value.retry_after <= 7.0
    assert len(stripe.seen()) == 1
    clock.advance(7.0)
    assert prober.probe(effect()).outcome is ProbeOutcome.HAPPENED
    assert len(stripe.seen()) == 2


def test_retry_after_as_an_http_date(stripe):
    stamp = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    stripe.fail_next(429, headers={"Retry-After": stamp})
    with pytest.raises(ProbeTransientError) as info:
        StripeProber(client(stripe)).probe(effect())
    assert info.value.retry_after is not None and 25 <= info.value.retry_after <= 30


def test_503_is_transient_without_a_provider_pause(stripe):
    stripe.fail_next(503, body={"error": {"message": "Stripe is temporarily unavailable"}})
    with pytest.raises(ProbeTransientError, match="503") as info:
        StripeProber(client(stripe)).probe(effect())
    assert info.value.retry_after is None
    stripe.add("payment_intents", KEY)
    assert StripeProber(client(stripe)).probe(effect()).outcome is ProbeOutcome.HAPPENED


def test_a_revoked_key_is_a_credential_error_and_fixing_it_works(stripe):
    stripe.accept_keys("sk_test_new")
    stripe.add("payment_intents", KEY)
    prober = StripeProber(client(stripe))
    with pytest.raises(ProbeCredentialError, match="Invalid API Key") as info:
        prober.probe(effect())
    assert info.value.status == 401 and info.value.provider == "stripe"
    assert GOOD not in str(info.value)
    stripe.accept_keys(GOOD)
    assert prober.probe(effect()).outcome is ProbeOutcome.HAPPENED


def test_a_restricted_key_without_permission_is_a_credential_error(stripe):
    stripe.fail_next(403, body={"error": {"message": "The provided key does not have access"}})
    with pytest.raises(ProbeCredentialError, match="does not have access"):
        StripeProber(client(stripe)).probe(effect())


def test_a_slow_reply_is_a_transient_timeout(stripe):
    stripe.fail_next(200, body={"object": "search_result", "data": []}, delay=3.0)
    started = time.monotonic()
    with pytest.raises(ProbeTransientError, match="timed out"):
        StripeProber(client(stripe, timeout=0.2)).probe(effect())
    assert time.monotonic() - started < 2.5  # gave up at 0.2 s, not after the 3 s reply


def test_a_refused_connection_is_transient():
    refused = StripeRestClient(
        GOOD, base_url=f"http://127.0.0.1:{free_port()}", limiter=RateLimiter("stripe", 100)
    )
    with pytest.raises(ProbeTransientError, match="ConnectionRefusedError"):
        StripeProber(refused).probe(effect())


def test_an_unknown_request_is_a_plain_probe_error_not_a_credential_problem(stripe):
    stripe.fail_next(400, body={"error": {"message": "Invalid query: unknown field"}})
    with pytest.raises(Exception) as info:
        StripeProber(client(stripe)).probe(effect())
    assert type(info.value).__name__ == "StripeReadError" and info.value.status == 400


# -- the client-side rate limit -----------------------------------------------------------


def test_a_shared_limiter_keeps_four_threads_under_the_providers_limit(stripe):
    # The server answers 429 above 10 requests in any second; four threads probing
    # through one limiter at 9/s (a margin for the jitter of requests in flight) never
    # see one.
    stripe.rate_limit = 10
    stripe.add("payment_intents", KEY)
    shared = RateLimiter("stripe", 9.0)
    prober = StripeProber(client(stripe, limiter=shared))
    outcomes: list[Any] = []

    def probe_some() -> None:
        for _ in range(5):
            outcomes.append(prober.probe(effect()).outcome)

    threads = [threading.Thread(target=probe_some) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == [ProbeOutcome.HAPPENED] * 20
    assert stripe.statuses() == {200: 20}
    assert stripe.max_in_window(1.0) <= 10


def test_without_the_limiter_the_fake_does_answer_429_above_its_limit(stripe):
    # The other side of the previous test: the fake's limit is real.
    stripe.rate_limit = 3
    prober = StripeProber(client(stripe, limiter=RateLimiter("stripe", 10_000.0)))
    errors = 0
    for _ in range(8):
        try:
            prober.probe(effect())
        except ProbeTransientError as exc:
            errors += 1
            assert exc.status in (429, None)
    assert stripe.statuses().get(429, 0) >= 1 and errors >= 1


# -- end to end: a timed-out charge resolved over the socket -------------------------------


def test_reconciler_commits_a_lost_reply_found_over_http(stripe):
    oo = OpenOnce(":memory:")
    try:

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
        def charge(order: str) -> dict[str, Any]:
            ctx = current_effect()
            stripe.add("payment_intents", ctx.provider_key, effect_id=ctx.effect_id)
            assert effect_metadata(ctx)["openonce_effect_id"] == ctx.effect_id
            raise TimeoutError("read timed out after Stripe took the charge")

        with pytest.raises(OutcomeUnknownError) as info:
            charge("order-1")
        rec = Reconciler(oo, grace_seconds=0)
        rec.register("stripe.charge", StripeProber(client(stripe), index_lag_seconds=0))
        report = rec.run_once()
        rec.close()
        assert report.committed == [info.value.effect_id]
        assert oo.get(info.value.effect_id).result["stripe_id"].startswith("pi_fake")
    finally:
        oo.close()
