"""Issue 18, item 5: the GitHub prober's default pace against a token's hourly budget.

A token has 5,000 requests an hour. At the old 5 requests/s a backlog spent it in 17
minutes and then every GitHub call of the deployment, the agents' own included, was
refused until the reset. The client now asks at most ``REQUESTS_PER_SECOND`` (1/s) with
bursts of ``BURST``: one simulated hour of back-to-back probes against a GitHub-like
server, timed by a clock the test moves, stays under the budget with room to spare.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from openonce_core import EffectState
from openonce_core._probe import ProbeOutcome
from openonce_core._records import Effect
from openonce_core.errors import ProbeError
from openonce_core.probers import GitHubPullRequestProber, GitHubRestClient, RateLimiter
from openonce_core.probers import github as gh
from tests.support.fake_github import FakeGitHubServer
from tests.support.fake_http import ManualClock

TOKEN = "ghp_good"
HOUR = 3600.0
BUDGET = 5000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_800_000_000.0)


@pytest.fixture
def github(clock: ManualClock) -> Iterator[FakeGitHubServer]:
    with FakeGitHubServer(primary_limit=BUDGET, clock=clock, wall=clock) as server:
        server.add_pull("acme", "api", "fix-login")
        yield server  # type: ignore[misc]


def effect() -> Effect:
    return Effect(
        id="eff_pr", tool="github.create_pr", idempotency_key="k", scope=None,
        state=EffectState.UNKNOWN, args={"owner": "acme", "repo": "api", "head": "fix-login"},
        args_fingerprint="fp", provider_key="oo_x", attempt=1, created_at=0.0,
    )  # fmt: skip


def an_hour_of_probes(github: FakeGitHubServer, clock: ManualClock, limiter: RateLimiter) -> int:
    """Probe back to back for one hour of the clock; the requests GitHub saw in it."""
    client = GitHubRestClient(TOKEN, base_url=github.url, limiter=limiter, clock=clock)
    prober = GitHubPullRequestProber(client)
    start = clock.now
    while clock.now - start < HOUR:
        try:
            assert prober.probe(effect()).outcome is ProbeOutcome.HAPPENED
        except ProbeError as exc:
            pytest.fail(f"after {len(github.seen())} requests: {exc}")
    return len(github.seen())


def test_an_hour_at_the_default_pace_stays_within_a_tokens_budget(github, clock):
    limiter = RateLimiter(
        "github", gh.REQUESTS_PER_SECOND, gh.BURST, clock=clock, sleep=clock.advance
    )
    sent = an_hour_of_probes(github, clock, limiter)
    assert sent <= BUDGET - gh.RESERVE  # room left for the agents that open the PRs
    assert sent >= 0.9 * gh.REQUESTS_PER_SECOND * HOUR  # and the pace is used, not starved
    assert github.statuses() == {200: sent}


def test_the_default_client_and_prober_take_that_pace():
    for client in (
        GitHubRestClient(TOKEN),
        GitHubPullRequestProber.from_token(TOKEN).client,
    ):
        assert isinstance(client, GitHubRestClient)
        assert client.limiter.rate == gh.REQUESTS_PER_SECOND
        assert client.limiter.rate * HOUR + client.limiter.burst <= BUDGET - gh.RESERVE
        assert client.reserve == gh.RESERVE


def test_the_pace_and_the_reserve_are_configurable():
    prober = GitHubPullRequestProber.from_token("ghp_other", requests_per_second=0.5, reserve=500)
    assert isinstance(prober.client, GitHubRestClient)
    assert prober.client.limiter.rate == 0.5 and prober.client.reserve == 500
    with pytest.raises(ValueError, match="reserve"):
        GitHubRestClient(TOKEN, reserve=-1)
