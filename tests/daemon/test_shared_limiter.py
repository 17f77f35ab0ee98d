"""Issue 18, item 6: a provider's rate limit is the account's, not the process's. Each
worker process with its own limiter spends the whole budget, so N workers spend N times
it. The daemon shares one limiter through Redis (``reconciler.ratelimit``): N processes
together stay within the rate, a pause one worker learns holds every worker, and a Redis
that cannot be reached leaves each process limiting on its own (with a warning) rather
than blocking or failing probes.

These run against the machine's Redis (127.0.0.1:6379), each test under a key prefix of
its own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from openonce_core._probe import ProbeOutcome
from openonce_core._records import Effect
from openonce_core.errors import ProbeTransientError
from openonce_core.probers import GitHubPullRequestProber, GitHubRestClient, RateLimiter, _http
from reconciler import ratelimit
from tests.support.fake_github import FakeGitHubServer
from tests.support.fake_imap import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_up() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


pytestmark = [
    pytest.mark.skipif(not redis_up(), reason="needs Redis at 127.0.0.1:6379"),
    # Worker processes are forked from the test's (threaded) process on purpose.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded"),
]


@pytest.fixture
def factory() -> Iterator[ratelimit.RedisLimiterFactory]:
    prefix = f"openonce-test:{uuid.uuid4().hex}:"
    made = ratelimit.RedisLimiterFactory(REDIS_URL, prefix=prefix)
    yield made
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


@pytest.fixture
def no_factory_left() -> Iterator[None]:
    yield
    _http.set_limiter_factory(None)


def _take_until(limiter: Any, deadline: float, out: Any) -> None:
    """A worker process: take slots as fast as the limiter gives them until ``deadline``."""
    stamps = []
    while time.time() < deadline:
        try:
            limiter.acquire(max_wait=0.5)
        except ProbeTransientError:
            continue
        stamps.append(time.time())
    out.send(stamps)
    out.close()


def run_workers(make: Callable[[], Any], workers: int, seconds: float) -> list[float]:
    """Fork ``workers`` processes, each with the limiter ``make()`` built before the fork;
    returns every slot's time, across them all."""
    ctx = multiprocessing.get_context("fork")
    limiter = make()
    deadline = time.time() + seconds
    pipes, procs = [], []
    for _ in range(workers):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_take_until, args=(limiter, deadline, send))
        proc.start()
        pipes.append(receive)
        procs.append(proc)
    stamps: list[float] = []
    for receive in pipes:
        stamps.extend(receive.recv())
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0
    return sorted(stamps)


def most_in(stamps: list[float], window: float = 1.0) -> int:
    """The most slots taken within any ``window`` seconds."""
    best, start = 0, 0
    for end, at in enumerate(stamps):
        while at - stamps[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def per_hour(stamps: list[float]) -> float:
    """The rate the slots were taken at, as requests an hour."""
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) * 3600


# -- the problem: one limiter per process ---------------------------------------------------


def test_without_a_shared_limiter_three_processes_spend_three_times_the_rate():
    rate, seconds = 20.0, 1.5
    stamps = run_workers(lambda: RateLimiter("github", rate), 3, seconds)
    assert most_in(stamps) > 2 * rate  # each process spends the whole rate
    assert per_hour(stamps) > 2 * rate * 3600


# -- one budget for every process -----------------------------------------------------------


def test_one_process_keeps_the_rate(factory):
    rate, seconds = 20.0, 1.5
    stamps = run_workers(lambda: factory("github", rate, 1, "t1"), 1, seconds)
    assert most_in(stamps) <= rate + 1
    assert 0.8 * rate * 3600 <= per_hour(stamps) <= 1.05 * rate * 3600


def test_three_processes_sharing_the_redis_limiter_keep_the_rate_together(factory):
    rate, seconds = 20.0, 1.5
    stamps = run_workers(lambda: factory("github", rate, 1, "t1"), 3, seconds)
    # One schedule, whichever process took each slot: the rate of one, not of three. (A
    # slot's time is when its process woke, so a busy machine bunches a few of them up.)
    assert most_in(stamps) <= rate + 3
    assert 0.8 * rate * 3600 <= per_hour(stamps) <= 1.2 * rate * 3600


def test_a_burst_is_shared_too(factory):
    one = factory("stripe", 1.0, 3, "acct")
    other = factory("stripe", 1.0, 3, "acct")
    assert [one.acquire(0), other.acquire(0), one.acquire(0)] == [0.0, 0.0, 0.0]
    with pytest.raises(ProbeTransientError, match="shared limit of 1 requests/s") as info:
        other.acquire(max_wait=0.1)
    assert info.value.sent is False and info.value.retry_after == pytest.approx(1.0, abs=0.1)


def test_accounts_have_budgets_of_their_own(factory):
    a, b = factory("github", 1.0, 1, "token-a"), factory("github", 1.0, 1, "token-b")
    assert a.acquire(0) == 0.0 and b.acquire(0) == 0.0


def test_a_pause_one_worker_learns_holds_every_worker(factory, monkeypatch):
    learner, other = factory("github", 100.0, 1, "t"), factory("github", 100.0, 1, "t")
    learner.pause(30, "GitHub rate limit (retry-after)")
    # The other worker's host clock is an hour off: the pause is timed by Redis's clock.
    skewed = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: skewed)
    assert 29 < other.paused_for() <= 30
    with pytest.raises(ProbeTransientError, match=r"retry-after.*s left") as info:
        other.acquire(max_wait=60)
    assert info.value.sent is False and 29 < (info.value.retry_after or 0) <= 30
    other.pause(5, "a shorter pause never shortens a longer one")
    assert learner.paused_for() > 29


def test_backoff_doubles_across_workers(factory):
    first, second = factory("github", 100.0, 1, "t"), factory("github", 100.0, 1, "t")
    assert first.backoff(60, 900, "secondary limit") == 60
    assert second.backoff(60, 900, "secondary limit") == 120  # again, soon: twice as long
    assert 119 < first.paused_for() <= 120


@pytest.mark.parametrize(
    ("last", "since_end", "expected"),
    [(0.0, 0.0, 60.0), (60.0, 1.0, 120.0), (600.0, 1.0, 900.0), (60.0, 61.0, 60.0)],
)
def test_the_shared_backoff_follows_the_same_rule_as_the_process_one(
    factory, last, since_end, expected
):
    # A backoff of `last` seconds ended `since_end` seconds ago; what comes next?
    now = 1000.0
    assert _http.next_backoff(last, now - since_end, now, 60, 900) == expected
    shared = factory("github", 100.0, 1, "rule")
    client = redis.Redis.from_url(REDIS_URL)
    redis_now = float(client.time()[0]) + client.time()[1] / 1e6
    if last:
        client.hset(shared.key, mapping={"backoff": last, "backoff_end": redis_now - since_end})
    assert shared.backoff(60, 900, "secondary limit") == expected


# -- Redis away: each process on its own, never stuck -----------------------------------------


def test_an_unreachable_redis_falls_back_to_the_process_limiter(caplog):
    away = ratelimit.RedisLimiterFactory(f"redis://127.0.0.1:{free_port()}/0")
    limiter = away("github", 2.0, 1, "t")
    caplog.set_level(logging.WARNING, logger="reconciler.ratelimit")
    started = time.monotonic()
    assert limiter.acquire(max_wait=5) == 0.0
    assert 0.4 < limiter.acquire(max_wait=5) <= 0.5  # the process's own 2/s
    assert time.monotonic() - started < 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Redis" in warnings[0].getMessage()
    limiter.pause(10, "GitHub rate limit (retry-after)")  # still honoured, in the process
    with pytest.raises(ProbeTransientError, match="retry-after"):
        limiter.acquire(max_wait=60)
    assert limiter.paused_for() > 9


def test_a_pause_survives_a_redis_that_forgot_it(factory):
    limiter = factory("github", 100.0, 1, "t")
    limiter.pause(30, "x-ratelimit-reset")
    redis.Redis.from_url(REDIS_URL).delete(limiter.key)  # a Redis restarted without its data
    with pytest.raises(ProbeTransientError, match="x-ratelimit-reset"):
        limiter.acquire(max_wait=60)


# -- the daemon installs it -----------------------------------------------------------------


def test_the_setting_installs_the_shared_limiter_for_every_client(settings, no_factory_left):
    settings.OPENONCE_RATE_LIMIT_REDIS = REDIS_URL
    ratelimit.install_from_settings()
    client = GitHubRestClient("ghp_install_test", base_url="http://127.0.0.1:9")
    assert isinstance(client.limiter, ratelimit.RedisRateLimiter)
    assert "ghp_install_test" not in client.limiter.key  # named by a digest, not the token
    settings.OPENONCE_RATE_LIMIT_REDIS = "off"
    ratelimit.install_from_settings()
    assert isinstance(GitHubRestClient("ghp_x").limiter, RateLimiter)


def test_the_app_installs_it_when_django_starts(settings, no_factory_left):
    from django.apps import apps

    settings.OPENONCE_RATE_LIMIT_REDIS = REDIS_URL
    apps.get_app_config("reconciler").ready()
    assert isinstance(_http.shared_limiter("stripe", 5.0), ratelimit.RedisRateLimiter)


def test_the_default_is_the_broker_when_it_is_redis():
    import subprocess
    import sys

    def setting(**env: str) -> str:
        code = "from openonce_site.settings import base; print(base.OPENONCE_RATE_LIMIT_REDIS)"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENONCE_")}
        done = subprocess.run(
            [sys.executable, "-c", code], env={**clean, **env}, capture_output=True,
            text=True, check=True, cwd=str(Path(__file__).resolve().parents[2]),
        )  # fmt: skip
        return done.stdout.strip()

    assert setting(OPENONCE_BROKER_URL="redis://10.0.0.5:6379/2") == "redis://10.0.0.5:6379/2"
    assert setting(OPENONCE_BROKER_URL="amqp://guest@rabbit//") == "off"
    assert setting(OPENONCE_RATE_LIMIT_REDIS="off") == "off"


def test_a_bad_setting_is_refused(settings, no_factory_left):
    from django.core.exceptions import ImproperlyConfigured

    settings.OPENONCE_RATE_LIMIT_REDIS = "amqp://guest@localhost//"
    with pytest.raises(ImproperlyConfigured, match="OPENONCE_RATE_LIMIT_REDIS"):
        ratelimit.install_from_settings()


def _probe_until(prober: Any, effect: Effect, deadline: float, out: Any) -> None:
    outcomes = []
    while time.time() < deadline:
        try:
            outcomes.append(str(prober.probe(effect).outcome))
        except ProbeTransientError:
            continue
    out.send(outcomes)
    out.close()


def test_three_workers_probing_github_together_stay_within_the_rate(factory):
    rate, seconds = 10.0, 3.0
    effect = Effect(
        id="eff_pr", tool="github.create_pr", idempotency_key="k", scope=None,
        state="unknown", args={"owner": "acme", "repo": "api", "head": "fix-login"},  # type: ignore[arg-type]
        args_fingerprint="fp", provider_key="oo_x", attempt=1, created_at=time.time() - 60,
    )  # fmt: skip
    with FakeGitHubServer() as github:
        github.add_pull("acme", "api", "fix-login")
        client = GitHubRestClient(
            "ghp_good", base_url=github.url, limiter=factory("github", rate, 1, "shared")
        )
        prober = GitHubPullRequestProber(client)
        ctx = multiprocessing.get_context("fork")
        deadline = time.time() + seconds
        pipes, procs = [], []
        for _ in range(3):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_probe_until, args=(prober, effect, deadline, send))
            proc.start()
            pipes.append(receive)
            procs.append(proc)
        outcomes = [o for receive in pipes for o in receive.recv()]
        for proc in procs:
            proc.join(10)
        assert set(outcomes) == {str(ProbeOutcome.HAPPENED)}
        arrived = sorted(seen.at for seen in github.seen())
        assert len(arrived) == len(outcomes)
        # Each process's first request is slower to leave than the rest (a fresh
        # connection), which can bunch the first three up; the rate is the one of them all.
        assert most_in(arrived) <= rate + 3
        assert per_hour(arrived) <= 1.2 * rate * 3600
