"""The GitHub prober's real HTTP client against a GitHub-like server on a local socket
(tests/support/fake_github.py): pagination, the head SHA check, and GitHub's primary and
secondary rate limits told apart from a permissions 403."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from openonce_core import EffectState
from openonce_core._probe import ProbeOutcome
from openonce_core._records import Effect
from openonce_core.errors import ProbeCredentialError, ProbeTransientError
from openonce_core.probers import (
    GitHubPullRequestProber,
    GitHubReadError,
    GitHubRestClient,
    RateLimiter,
)
from tests.support.fake_github import FakeGitHubServer
from tests.support.fake_http import ManualClock

TOKEN = "ghp_good"


@pytest.fixture
def github() -> Iterator[FakeGitHubServer]:
    with FakeGitHubServer() as server:
        yield server  # type: ignore[misc]


def pr_effect(**args: Any) -> Effect:
    base = {"owner": "acme", "repo": "api", "head": "fix-login", "title": "Fix"}
    return Effect(
        id="eff_pr", tool="github.create_pr", idempotency_key="k", scope=None,
        state=EffectState.UNKNOWN, args={**base, **args}, args_fingerprint="fp",
        provider_key="oo_x", attempt=1,
    )  # fmt: skip


def prober(github: FakeGitHubServer, limiter: RateLimiter | None = None, **kw: Any) -> Any:
    client = GitHubRestClient(
        kw.pop("token", TOKEN), base_url=github.url,
        limiter=limiter or RateLimiter("github", 1000.0), **kw,
    )  # fmt: skip
    return GitHubPullRequestProber(client)


def test_request_headers_and_a_found_pr_with_its_head_sha(github):
    github.add_pull("acme", "api", "fix-login", sha="c" * 40)
    result = prober(github).probe(pr_effect())
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.receipt == {
        "number": 1, "head": "fix-login", "url": "https://github.com/acme/api/pull/1",
        "head_sha": "c" * 40,
    }  # fmt: skip
    [seen] = github.seen()
    assert seen.path == "/repos/acme/api/pulls"
    assert seen.query["head"] == ["acme:fix-login"] and seen.query["state"] == ["all"]
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["x-github-api-version"] == "2022-11-28"
    assert seen.headers["accept"] == "application/vnd.github+json"


def test_pages_are_followed_through_the_link_header():
    with FakeGitHubServer(page_size=2) as github:
        for _ in range(5):  # five PRs for one head: closed and reopened ones
            github.add_pull("acme", "api", "fix-login", state="closed")
        client = GitHubRestClient(TOKEN, base_url=github.url, limiter=RateLimiter("g", 100))
        pulls = client.list_pulls("acme", "api", "acme:fix-login")
        assert [p["number"] for p in pulls] == [1, 2, 3, 4, 5]
        assert [s.query.get("page", ["1"])[0] for s in github.seen()] == ["1", "2", "3"]
        result = GitHubPullRequestProber(client).probe(pr_effect())
        assert result.outcome is ProbeOutcome.INCONCLUSIVE
        assert "5 PRs match" in result.detail


def test_a_pr_whose_head_commit_differs_is_inconclusive(github):
    github.add_pull("acme", "api", "fix-login", sha="a" * 40)
    other = prober(github).probe(pr_effect(head_sha="b" * 40))
    assert other.outcome is ProbeOutcome.INCONCLUSIVE
    assert "head commit is" in other.detail and "b" * 40 in other.detail
    assert other.observed["head_sha"] == "a" * 40
    same = prober(github).probe(pr_effect(head_sha="a" * 40))
    assert same.outcome is ProbeOutcome.HAPPENED
    short = prober(github).probe(pr_effect(head_sha="aaaaaaa"))
    assert short.outcome is ProbeOutcome.HAPPENED  # an abbreviated SHA as a prefix
    assert prober(github).probe(pr_effect(head_sha="aaa")).outcome is ProbeOutcome.INCONCLUSIVE


def test_the_head_sha_from_the_execution_evidence_is_checked_too(github):
    github.add_pull("acme", "api", "fix-login", sha="a" * 40)
    effect = pr_effect()
    effect.execution_evidence = {"head_sha": "f" * 40}
    assert prober(github).probe(effect).outcome is ProbeOutcome.INCONCLUSIVE


def test_a_miss_is_authoritative(github):
    github.add_pull("acme", "api", "other-branch")
    result = prober(github).probe(pr_effect())
    assert result.outcome is ProbeOutcome.NOT_HAPPENED


# -- rate limits --------------------------------------------------------------------------


def test_primary_limit_403_waits_until_the_reset_and_pauses_the_process():
    clock = ManualClock()
    with FakeGitHubServer(primary_limit=1) as github:
        github.add_pull("acme", "api", "fix-login")
        github.reset_at = int(time.time()) + 120
        limiter = RateLimiter("github", 100.0, clock=clock)
        p = prober(github, limiter)
        # The first request is the window's last: GitHub says remaining 0 with it, so the
        # client stops before the refusal instead of spending a request to learn it.
        assert p.probe(pr_effect()).outcome is ProbeOutcome.HAPPENED
        with pytest.raises(ProbeTransientError, match="told us to wait") as info:
            p.probe(pr_effect())
        assert info.value.retry_after is not None and 100 < info.value.retry_after <= 120
        assert len(github.seen()) == 1
        # A client that did not know (a fresh limiter) gets the 403 and reads it right.
        with pytest.raises(ProbeTransientError, match="API rate limit exceeded") as refused:
            prober(github).probe(pr_effect())
        assert refused.value.status == 403
        assert refused.value.retry_after is not None and refused.value.retry_after > 100


def test_secondary_limit_with_retry_after(github):
    github.secondary_limit_next(retry_after=30)
    with pytest.raises(ProbeTransientError, match="secondary rate limit") as info:
        prober(github).probe(pr_effect())
    assert (info.value.status, info.value.retry_after) == (403, 30.0)


@pytest.mark.parametrize("status", [403, 429])
def test_secondary_limit_without_a_header_waits_at_least_a_minute(github, status):
    github.secondary_limit_next(status=status)
    clock = ManualClock()
    limiter = RateLimiter("github", 100.0, clock=clock)
    p = prober(github, limiter)
    with pytest.raises(ProbeTransientError) as info:
        p.probe(pr_effect())
    assert info.value.retry_after == 60.0
    clock.advance(59)
    with pytest.raises(ProbeTransientError, match="told us to wait"):
        p.probe(pr_effect())
    clock.advance(1.5)
    github.add_pull("acme", "api", "fix-login")
    assert p.probe(pr_effect()).outcome is ProbeOutcome.HAPPENED


def test_a_permission_403_is_a_credential_error_not_a_rate_limit(github):
    github.forbidden.add(TOKEN)
    with pytest.raises(ProbeCredentialError, match="Resource not accessible") as info:
        prober(github).probe(pr_effect())
    assert info.value.status == 403


def test_bad_credentials_are_a_credential_error(github):
    with pytest.raises(ProbeCredentialError, match="Bad credentials") as info:
        prober(github, token="ghp_revoked").probe(pr_effect())
    assert info.value.status == 401 and "ghp_revoked" not in str(info.value)


def test_a_repository_the_token_cannot_see_is_a_read_error(github):
    with pytest.raises(GitHubReadError, match="cannot see it") as info:
        prober(github).probe(pr_effect(repo="secret"))
    assert info.value.status == 404


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_transient(github, status):
    github.fail_next(status, body={"message": "Server Error"})
    with pytest.raises(ProbeTransientError, match=str(status)):
        prober(github).probe(pr_effect())


def test_a_slow_reply_is_a_transient_timeout(github):
    github.fail_next(200, body=[], delay=1.0)
    with pytest.raises(ProbeTransientError, match="timed out"):
        prober(github, timeout=0.2).probe(pr_effect())


# -- GitHub's rules for a well-behaved client (issue 18, item 5) ---------------------------


def test_one_request_of_a_token_is_in_flight_at_a_time_in_the_process(github):
    # GitHub: "make requests serially instead of concurrently". Four threads probing with
    # one token, a generous rate: the server never has two of them at once.
    github.add_pull("acme", "api", "fix-login")
    github.delay = 0.05
    p = prober(github)
    outcomes: list[Any] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(p.probe(pr_effect()).outcome))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == [ProbeOutcome.HAPPENED] * 4
    assert github.peak_in_flight == 1


def test_a_request_that_cannot_get_its_turn_in_time_is_not_sent(github, monkeypatch):
    github.add_pull("acme", "api", "fix-login")
    # The first request's reply is held until the test lets it go (not a delay that a
    # loaded machine could outlast before the second probe asks for its turn).
    release = threading.Event()
    answering = github.answering

    def held(seen: Any) -> None:
        if seen is not None:
            release.wait(30)
        answering(seen)

    monkeypatch.setattr(github, "answering", held)
    slow = prober(github, timeout=60.0)
    first = threading.Thread(target=lambda: slow.probe(pr_effect()))
    first.start()
    try:
        deadline = time.monotonic() + 30
        while not github.seen():
            assert time.monotonic() < deadline, "the first request never reached the server"
            time.sleep(0.01)
        impatient = prober(github, timeout=0.1)  # same token, same API: same turn to wait for
        with pytest.raises(ProbeTransientError, match="not asked") as info:
            impatient.probe(pr_effect())
        assert info.value.sent is False
    finally:
        release.set()
        first.join(30)
    assert not first.is_alive()
    assert len(github.seen()) == 1


def test_a_low_remaining_budget_pauses_until_the_reset(github):
    # The token's last requests of the hour are left to its other users (the agents that
    # open PRs): at `reserve` remaining the client stops until GitHub's reset.
    github.add_pull("acme", "api", "fix-login")
    github.primary_limit = 103
    github.reset_at = int(time.time()) + 600
    limiter = RateLimiter("github", 1000.0)
    p = prober(github, limiter, reserve=100)
    for _ in range(3):  # remaining 102, 101, 100
        assert p.probe(pr_effect()).outcome is ProbeOutcome.HAPPENED
    with pytest.raises(ProbeTransientError, match="x-ratelimit-remaining is 100") as info:
        p.probe(pr_effect())
    assert info.value.sent is False
    assert info.value.retry_after is not None and 590 < info.value.retry_after <= 600
    assert len(github.seen()) == 3


def test_repeated_secondary_limits_wait_exponentially_longer(github):
    # "If your request continues to fail due to a secondary rate limit, wait for an
    # exponentially increasing amount of time between retries" (GitHub's docs).
    clock = ManualClock()
    p = prober(github, RateLimiter("github", 100.0, clock=clock))
    github.add_pull("acme", "api", "fix-login")
    waits = []
    for _ in range(6):
        github.secondary_limit_next()
        with pytest.raises(ProbeTransientError, match="secondary rate limit") as info:
            p.probe(pr_effect())
        assert info.value.retry_after is not None
        waits.append(info.value.retry_after)
        clock.advance(info.value.retry_after + 1)  # asks again soon after the pause
    assert waits == [60.0, 120.0, 240.0, 480.0, 900.0, 900.0]  # doubling, capped
    clock.advance(3600)  # quiet for long: the next limit starts again at a minute
    github.secondary_limit_next()
    with pytest.raises(ProbeTransientError) as again:
        p.probe(pr_effect())
    assert again.value.retry_after == 60.0


def test_the_default_client_asks_well_under_the_hourly_budget():
    client = GitHubRestClient(TOKEN)
    assert client.limiter.rate * 3600 <= 4000  # of GitHub's 5,000 an hour per token


# -- a receipt a person gives, checked at GitHub --------------------------------------------


def dated_effect(**args: Any) -> Effect:
    return dataclasses.replace(pr_effect(**args), created_at=time.time() - 60)


@pytest.mark.parametrize("field", ["number", "pr_number"])
def test_a_receipt_naming_this_effects_pr_is_verified(github, field):
    github.add_pull("acme", "api", "fix-login", sha="c" * 40)
    result = prober(github).verify(dated_effect(), {field: 1})
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.provider_reference == "acme/api:fix-login"
    assert result.receipt == {
        "number": 1, "head": "fix-login", "url": "https://github.com/acme/api/pull/1",
        "head_sha": "c" * 40,
    }  # fmt: skip
    [seen] = github.seen()
    assert seen.path == "/repos/acme/api/pulls/1"


def test_a_receipt_naming_another_heads_pr_is_not_this_effects(github):
    github.add_pull("acme", "api", "other-branch")
    result = prober(github).verify(dated_effect(), {"number": 1})
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "acme:other-branch" in result.detail and "not this effect's" in result.detail


def test_a_receipt_naming_a_pr_older_than_the_effect_is_not_this_effects(github):
    github.add_pull("acme", "api", "fix-login", created_at=time.time() - 7 * 24 * 3600)
    result = prober(github).verify(dated_effect(), {"number": 1})
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "before this effect" in result.detail


def test_a_receipt_whose_pr_carries_another_commit_is_not_verified(github):
    github.add_pull("acme", "api", "fix-login", sha="a" * 40)
    result = prober(github).verify(dated_effect(head_sha="b" * 40), {"number": 1})
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "b" * 40 in result.detail


def test_a_receipt_naming_no_pr_at_github_is_not_happened(github):
    github.add_pull("acme", "api", "fix-login")
    result = prober(github).verify(dated_effect(), {"number": 99})
    assert result.outcome is ProbeOutcome.NOT_HAPPENED
    assert "no PR #99" in result.detail
    assert result.provider_reference == "acme/api:fix-login"


@pytest.mark.parametrize(
    "receipt",
    [{}, {"number": "seven"}, {"number": True}, {"number": 0}, {"number": 1, "pr_number": 2}],
)
def test_a_malformed_receipt_is_not_looked_up(github, receipt):
    result = prober(github).verify(dated_effect(), receipt)
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "receipt" in result.detail
    assert github.seen() == []


def test_an_unreadable_reset_time_never_pauses_for_ever(github):
    # A proxy or a GitHub Enterprise that sends x-ratelimit-reset "inf": no endless pause,
    # the refusal that follows is read as a rate limit without a wait (a minute).
    github.add_pull("acme", "api", "fix-login")
    github.primary_limit = 1
    github.reset_at = float("inf")  # type: ignore[assignment]
    limiter = RateLimiter("github", 1000.0)
    p = prober(github, limiter)
    assert p.probe(pr_effect()).outcome is ProbeOutcome.HAPPENED  # remaining 0, reset "inf"
    assert limiter.paused_for() == 0
    with pytest.raises(ProbeTransientError, match="rate limit exceeded") as info:
        p.probe(pr_effect())
    assert info.value.retry_after == 60.0
