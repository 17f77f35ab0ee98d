"""Issue 18, item 1: a head branch outlives its PRs, so the GitHub prober must not take a
PR of the same head that predates the effect for the effect's own.

A ``github.create_pr`` effect whose request may never have left is probed; GitHub lists
last week's closed PR of the same head. Before the fix the prober answered HAPPENED and
the reconciler COMMITTED the effect with that old PR. Effects are dated on the ledger's
clock (``Effect.created_at``), PRs on GitHub's (``created_at``, ISO 8601 UTC); a PR
created up to ``CREATED_SKEW`` before the effect may still be its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError
from openonce_core._probe import ProbeOutcome
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core.probers import GitHubPullRequestProber, GitHubRestClient, RateLimiter
from openonce_core.probers.github import CREATED_SKEW
from tests.support.fake_github import FakeGitHubServer

TOKEN = "ghp_good"
WEEK = 7 * 24 * 3600.0
# When the effect was recorded, on the ledger's clock: a whole second, so GitHub's
# second-resolution timestamps compare exactly.
T_EFFECT = float(int(time.time()) - 3600)

HAPPENED = ProbeOutcome.HAPPENED
NOT_HAPPENED = ProbeOutcome.NOT_HAPPENED
INCONCLUSIVE = ProbeOutcome.INCONCLUSIVE


@pytest.fixture
def github() -> Iterator[FakeGitHubServer]:
    with FakeGitHubServer(tokens=(TOKEN,)) as server:
        yield server  # type: ignore[misc]


def pr_effect(created_at: float = T_EFFECT, **args: Any) -> Effect:
    base = {"owner": "acme", "repo": "api", "head": "fix-login", "title": "Fix"}
    return Effect(
        id="eff_pr", tool="github.create_pr", idempotency_key="k", scope=None,
        state=EffectState.UNKNOWN, args={**base, **args}, args_fingerprint="fp",
        provider_key="oo_x", attempt=1, created_at=created_at, updated_at=created_at + 30,
    )  # fmt: skip


def probe(github: FakeGitHubServer, effect: Effect | None = None) -> Any:
    client = GitHubRestClient(TOKEN, base_url=github.url, limiter=RateLimiter("github", 1000.0))
    return GitHubPullRequestProber(client).probe(effect or pr_effect())


def add(github: FakeGitHubServer, created_at: float | None, **kw: Any) -> dict[str, Any]:
    return github.add_pull("acme", "api", "fix-login", created_at=created_at, **kw)


# -- a PR older than the effect is not its PR ---------------------------------------------


def test_last_weeks_closed_pr_of_the_same_head_is_not_this_effects(github):
    old = add(github, T_EFFECT - WEEK, state="closed")
    assert old["created_at"].endswith("Z") and old["closed_at"]
    result = probe(github)
    assert result.outcome is NOT_HAPPENED  # GitHub's primary store: a real miss
    assert result.receipt is None
    assert result.observed["ignored_older"] == [old["number"]]
    assert f"#{old['number']}" in result.detail and "older" in result.detail


def test_last_weeks_open_pr_of_the_same_head_is_not_this_effects_either(github):
    add(github, T_EFFECT - WEEK)
    assert probe(github).outcome is NOT_HAPPENED


def test_a_pr_created_just_beyond_the_skew_margin_is_older(github):
    add(github, T_EFFECT - CREATED_SKEW - 1)
    assert probe(github).outcome is NOT_HAPPENED


def test_a_closed_pr_with_no_creation_time_closed_long_before_is_older(github):
    add(github, None, state="closed", closed_at=T_EFFECT - WEEK)
    assert probe(github).outcome is NOT_HAPPENED


def test_an_old_pr_carrying_the_commit_this_effect_pushed_goes_to_a_person(github):
    # An open PR follows its branch: its head commit says nothing of who opened it.
    add(github, T_EFFECT - WEEK, sha="c" * 40)
    result = probe(github, pr_effect(head_sha="c" * 40))
    assert result.outcome is INCONCLUSIVE
    assert "created before this effect" in result.detail


# -- a PR the effect may have opened is still found ---------------------------------------


def test_an_open_pr_created_after_the_effect_is_happened_as_before(github):
    pull = add(github, T_EFFECT + 2)
    result = probe(github)
    assert result.outcome is HAPPENED
    assert result.receipt == {
        "number": pull["number"], "head": "fix-login", "url": pull["html_url"],
        "head_sha": "a" * 40,
    }  # fmt: skip


def test_a_closed_pr_created_after_the_effect_is_still_happened(github):
    add(github, T_EFFECT + 2, state="closed", closed_at=T_EFFECT + 60)
    result = probe(github)
    assert result.outcome is HAPPENED and result.observed["state"] == "closed"


@pytest.mark.parametrize("before", [1.0, 60.0, CREATED_SKEW - 1])
def test_a_pr_created_just_before_the_effect_within_the_skew_is_happened(github, before):
    # GitHub's clock runs behind the ledger's: our PR seems older than our effect.
    add(github, T_EFFECT - before)
    assert probe(github).outcome is HAPPENED


def test_the_new_pr_beside_last_weeks_closed_one_is_happened(github):
    add(github, T_EFFECT - WEEK, state="closed")
    new = add(github, T_EFFECT + 5)
    result = probe(github)
    assert result.outcome is HAPPENED
    assert result.receipt is not None and result.receipt["number"] == new["number"]


def test_a_pr_tied_by_the_pushed_head_sha_is_happened(github):
    add(github, T_EFFECT + 5, sha="d" * 40)
    assert probe(github, pr_effect(head_sha="d" * 40)).outcome is HAPPENED


# -- a PR that cannot be tied to this effect is never HAPPENED ---------------------------


def test_two_candidates_are_inconclusive(github):
    add(github, T_EFFECT + 1, state="closed")
    add(github, T_EFFECT + 2)
    result = probe(github)
    assert result.outcome is INCONCLUSIVE
    assert "2 PRs match" in result.detail


def test_a_pr_with_no_creation_time_is_inconclusive(github):
    add(github, None)
    result = probe(github)
    assert result.outcome is INCONCLUSIVE
    assert "created_at" in result.detail


def test_a_pr_with_an_unreadable_creation_time_is_inconclusive(github):
    pull = add(github, T_EFFECT + 1)
    pull["created_at"] = "last tuesday"
    assert probe(github).outcome is INCONCLUSIVE
    pull["created_at"] = "2026-11-25T08:00:00"  # no zone: not how GitHub writes times
    assert probe(github).outcome is INCONCLUSIVE


def test_a_pr_with_no_creation_time_but_the_pushed_commit_is_happened_as_before(github):
    add(github, None, sha="e" * 40)
    assert probe(github, pr_effect(head_sha="e" * 40)).outcome is HAPPENED


# -- end to end: the effect is not committed with the old PR ------------------------------


def create_pr_timing_out(oo: OpenOnce) -> Callable[..., Any]:
    @oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])
    def create_pr(owner: str, repo: str, head: str, title: str) -> dict[str, Any]:
        raise TimeoutError("read timed out")  # the request may never have left

    return create_pr


def test_e2e_an_effect_is_not_committed_with_last_weeks_pr(github):
    oo = OpenOnce(":memory:")
    try:
        old = add(github, time.time() - WEEK, state="closed")
        create_pr = create_pr_timing_out(oo)
        with oo.scope("run-1"), pytest.raises(OutcomeUnknownError) as info:
            create_pr(owner="acme", repo="api", head="fix-login", title="Fix")
        effect_id = info.value.effect_id
        client = GitHubRestClient(TOKEN, base_url=github.url, limiter=RateLimiter("github", 1000.0))
        rec = Reconciler(oo, grace_seconds=0)
        try:
            rec.register("github.create_pr", GitHubPullRequestProber(client))
            report = rec.run_once()
        finally:
            rec.close()
        effect = oo.get(effect_id)
        assert effect.state is not EffectState.COMMITTED
        assert effect.state is EffectState.PLANNED and report.rearmed == [effect_id]
        assert f"#{old['number']}" in oo.journal(effect_id)[-1].reason
    finally:
        oo.close()
