"""The probers' client-side rate limiter: slots spaced at the rate, bursts bounded, a
provider's pause honoured without sending, waits longer than allowed refused, and one
bucket per provider shared by every client of the process."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from openonce_core.errors import ProbeTransientError
from openonce_core.probers import RateLimiter, set_limiter_factory, shared_limiter
from openonce_core.probers._http import retry_after_seconds
from tests.support.fake_http import ManualClock


class Sleeper:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.slept: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.clock.advance(seconds)


def limiter(rate: float, burst: int = 1) -> tuple[RateLimiter, ManualClock, Sleeper]:
    clock = ManualClock()
    sleeper = Sleeper(clock)
    return RateLimiter("stripe", rate, burst, clock=clock, sleep=sleeper), clock, sleeper


def test_requests_are_spaced_at_the_rate():
    bucket, clock, sleeper = limiter(4.0)
    sent = []
    for _ in range(5):
        bucket.acquire(max_wait=10)
        sent.append(clock.now)
    assert [round(b - a, 6) for a, b in itertools.pairwise(sent)] == [0.25] * 4
    assert sleeper.slept == [0.25] * 4


def test_a_burst_goes_at_once_then_the_rate_applies():
    bucket, _clock, sleeper = limiter(10.0, burst=3)
    for _ in range(3):
        bucket.acquire(max_wait=10)
    assert sleeper.slept == []  # three at once
    bucket.acquire(max_wait=10)
    assert sleeper.slept == [0.1]


def test_a_wait_longer_than_allowed_is_refused_without_taking_a_slot():
    bucket, _clock, sleeper = limiter(1.0)
    bucket.acquire(max_wait=10)
    sleeper.slept.clear()
    with pytest.raises(ProbeTransientError, match="client-side limit of 1 requests/s") as info:
        bucket.acquire(max_wait=0.5)
    assert info.value.retry_after == pytest.approx(1.0)
    bucket.acquire(max_wait=10)  # the refused request took no slot: one interval, not two
    assert sleeper.slept == [1.0]


def test_a_provider_pause_stops_every_acquire_until_it_ends():
    bucket, clock, _ = limiter(100.0)
    bucket.pause(30, "Stripe answered 429")
    with pytest.raises(ProbeTransientError, match="Stripe answered 429") as info:
        bucket.acquire(max_wait=60)
    assert info.value.retry_after == pytest.approx(30)
    bucket.pause(5, "a shorter pause never shortens a longer one")
    assert bucket.paused_for() == pytest.approx(30)
    clock.advance(30)
    assert bucket.acquire(max_wait=1) == 0.0


def test_bad_rates_are_refused():
    for rate in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive"):
            RateLimiter("x", rate)
    with pytest.raises(ValueError, match="burst"):
        RateLimiter("x", 1, burst=0)


def test_one_bucket_per_provider_and_rate_in_the_process():
    assert shared_limiter("stripe-test", 7.0) is shared_limiter("stripe-test", 7.0)
    assert shared_limiter("stripe-test", 7.0) is not shared_limiter("github-test", 7.0)


def test_threads_share_the_bucket_under_the_rate():
    bucket = RateLimiter("stripe", 50.0)
    stamps: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(10):
            bucket.acquire(max_wait=5)
            with lock:
                stamps.append(time.monotonic())

    threads = [threading.Thread(target=take) for _ in range(4)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(stamps) == 40
    # 40 slots at 50/s take at least 39 intervals of 20 ms, however the threads interleave.
    assert max(stamps) - started >= 39 / 50 - 0.01


@pytest.mark.parametrize(
    ("value", "expected"),
    [("7", 7.0), ("0", 0.0), (" 2.5 ", 2.5), ("-3", 0.0), ("soon", None), ("", None), (None, None)],
)
def test_retry_after_in_seconds(value, expected):
    assert retry_after_seconds(value) == expected


def test_retry_after_as_an_http_date():
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412450.0) == 30.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412500.0) == 0.0


def test_a_backoff_doubles_while_limits_keep_coming_and_starts_over_after_quiet():
    bucket, clock, _ = limiter(100.0)
    assert bucket.backoff(60, 900, "secondary limit") == 60
    with pytest.raises(ProbeTransientError, match="secondary limit"):
        bucket.acquire(max_wait=100)
    clock.advance(61)
    assert bucket.backoff(60, 900, "secondary limit") == 120  # again, soon after: doubled
    assert bucket.paused_for() == pytest.approx(120)
    clock.advance(120 + 121)  # quiet for longer than the last backoff
    assert bucket.backoff(60, 900, "secondary limit") == 60


def test_a_factory_builds_the_shared_limiters_until_it_is_removed():
    made: list[tuple[str, float, int, str]] = []

    def factory(provider: str, rate: float, burst: int, account: str) -> RateLimiter:
        made.append((provider, rate, burst, account))
        return RateLimiter(provider, rate, burst)

    set_limiter_factory(factory)
    try:
        first = shared_limiter("factory-test", 3.0, 2, account="acct-1")
        assert shared_limiter("factory-test", 3.0, 2, account="acct-1") is first
        assert shared_limiter("factory-test", 3.0, 2, account="acct-2") is not first
        assert made == [("factory-test", 3.0, 2, "acct-1"), ("factory-test", 3.0, 2, "acct-2")]
    finally:
        set_limiter_factory(None)
    assert shared_limiter("factory-test", 3.0, 2, account="acct-1") is not first
    assert len(made) == 2
