"""Review round 3 of issue 18's probers (R1): breaks found by trying them as production
would, each red before its fix.

* A provider pause nothing bounded: a rate-limit reset sent in milliseconds, a gateway's
  year-long ``Retry-After`` or an infinite one held every probe of that provider "not
  asked" (no journal line, no person) for years in the process and a day in Redis. A
  pause now lasts at most ``_http.MAX_PAUSE`` (an hour: GitHub's window).
* ``GitHubPullRequestProber(created_skew=nan or inf)`` counted last week's closed PR as
  this effect's and committed it (item 1 again); the skew is now checked like Stripe's
  seconds.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from openonce_core import EffectState
from openonce_core._probe import ProbeOutcome
from openonce_core._records import Effect
from openonce_core.errors import ProbeTransientError
from openonce_core.probers import (
    GitHubPullRequestProber,
    GitHubRestClient,
    RateLimiter,
    StripeProber,
    StripeRestClient,
)
from tests.support.fake_github import FakeGitHubServer, iso_utc
from tests.support.fake_http import ManualClock
from tests.support.fake_stripe import FakeStripeServer

HOUR = 3600.0
REDIS_URL = "redis://127.0.0.1:6379/0"


def pr_effect(created_at: float | None = None) -> Effect:
    return Effect(
        id="eff_pr", tool="github.create_pr", idempotency_key="k", scope=None,
        state=EffectState.UNKNOWN, args={"owner": "acme", "repo": "api", "head": "fix-login"},
        args_fingerprint="fp", provider_key="oo_x", attempt=1,
        **({"created_at": created_at} if created_at is not None else {}),
    )  # fmt: skip


# -- a provider's pause is bounded ----------------------------------------------------------


@pytest.fixture
def github() -> Iterator[FakeGitHubServer]:
    with FakeGitHubServer() as server:
        yield server  # type: ignore[misc]


def test_a_reset_sent_in_milliseconds_holds_github_probes_an_hour_at_most(github):
    github.add_pull("acme", "api", "fix-login")
    github.primary_limit = 101  # the first answer leaves the reserve: pause until the reset
    github.reset_at = int(time.time() * 1000)  # milliseconds: ~56 years ahead in seconds
    clock = ManualClock()
    limiter = RateLimiter("github", 1000.0, clock=clock)
    prober = GitHubPullRequestProber(
        GitHubRestClient("ghp_good", base_url=github.url, limiter=limiter, reserve=100)
    )
    assert prober.probe(pr_effect()).outcome is ProbeOutcome.HAPPENED
    with pytest.raises(ProbeTransientError, match="not asked") as held:
        prober.probe(pr_effect())
    assert held.value.retry_after is not None and held.value.retry_after <= HOUR
    clock.advance(HOUR + 1)
    github.primary_limit = 5000
    assert prober.probe(pr_effect()).outcome is ProbeOutcome.HAPPENED
    assert len(github.seen()) == 2


def test_a_year_long_retry_after_from_stripe_holds_its_probes_an_hour_at_most():
    clock = ManualClock()
    limiter = RateLimiter("stripe", 1000.0, clock=clock)
    with FakeStripeServer() as stripe:
        stripe.fail_next(429, headers={"Retry-After": str(365 * 86400)})
        prober = StripeProber(
            StripeRestClient("sk_test_good", base_url=stripe.url, limiter=limiter)
        )
        effect = Effect(
            id="eff_1", tool="stripe.charge", idempotency_key="k", scope=None,
            state=EffectState.UNKNOWN, args={}, args_fingerprint="fp", provider_key="oo_k",
            attempt=1, created_at=time.time(), updated_at=time.time(),
        )  # fmt: skip
        with pytest.raises(ProbeTransientError):
            prober.probe(effect)
        with pytest.raises(ProbeTransientError, match="not asked") as held:
            prober.probe(effect)
        assert held.value.retry_after is not None and held.value.retry_after <= HOUR
        clock.advance(HOUR + 1)
        prober.probe(effect)  # asked again: a young miss, not "not asked"
        assert len(stripe.seen("/v1/payment_intents/search")) == 2


@pytest.mark.parametrize("seconds", [365 * 86400.0, math.inf])
def test_an_endless_pause_is_an_hour_for_the_process_limiter(seconds):
    limiter = RateLimiter("stripe", 10.0, clock=ManualClock())
    limiter.pause(seconds, "a gateway said so")
    assert 0 < limiter.paused_for() <= HOUR


def redis_up() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.mark.skipif(not redis_up(), reason="needs Redis at 127.0.0.1:6379")
@pytest.mark.parametrize("seconds", [365 * 86400.0, math.inf])
def test_an_endless_pause_is_an_hour_for_every_worker(seconds):
    from reconciler import ratelimit

    prefix = f"openonce-test:{uuid.uuid4().hex}:"
    factory = ratelimit.RedisLimiterFactory(REDIS_URL, prefix=prefix)
    try:
        one = factory("github", 10.0, 1, "token-x")
        one.pause(seconds, "a gateway said so")
        other = ratelimit.RedisRateLimiter(factory.client, "github", 10.0, 1, key=one.key)
        with pytest.raises(ProbeTransientError, match="not asked") as held:
            other.acquire(max_wait=1.0)
        assert held.value.retry_after is not None and 0 < held.value.retry_after <= HOUR
        assert 0 < one.paused_for() <= HOUR
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)


# -- GitHub's skew margin is a number of seconds --------------------------------------------


@pytest.mark.parametrize("skew", [math.nan, math.inf, -1.0])
def test_a_skew_that_is_not_a_number_of_seconds_is_refused(skew):
    class OldClosedPR:
        def list_pulls(self, owner: str, repo: str, head: str) -> list[dict[str, Any]]:
            week_ago = time.time() - 7 * 86400
            return [{
                "number": 7, "state": "closed", "html_url": "https://github.com/acme/api/pull/7",
                "created_at": iso_utc(week_ago), "closed_at": iso_utc(week_ago + 60),
                "head": {"ref": "fix-login", "label": "acme:fix-login", "sha": "a" * 40},
                "base": {"repo": {"full_name": "acme/api"}},
            }]  # fmt: skip

    with pytest.raises(ValueError, match="created_skew"):
        GitHubPullRequestProber(OldClosedPR(), created_skew=skew)
    # The default still leaves last week's PR out.
    result = GitHubPullRequestProber(OldClosedPR()).probe(pr_effect(time.time()))
    assert result.outcome is ProbeOutcome.NOT_HAPPENED
