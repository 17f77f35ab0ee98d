"""A provider that said "I have this already" is evidence the effect may have happened: a
later miss cannot re-arm it (issue 18, items 1 and 2 together).

GitHub answers a create with 422 "A pull request already exists" when an open PR of that
head predates the effect; the classifier parks the call UNKNOWN. The prober, rightly,
ignores the old PR and finds nothing of this attempt: a miss. Re-arming on it sends the
agent to GitHub again, which answers 422 again, for ever, and no person ever sees it. The
same for Stripe's idempotency_error (the key already ran, with other parameters)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from openonce_core import OpenOnce, OutcomeUnknownError
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core.testing import FakeClock
from tests.core import test_classify_real_sdks as real_sdks
from tests.core.test_classify_dedup import PLAIN_422, PR_EXISTS_422, httpx_create_pr

provider = real_sdks.provider  # the fake provider answering over a real socket


class Missing:
    """A prober that finds nothing of this attempt (the old PR is not this effect's)."""

    def __init__(self) -> None:
        self.calls = 0

    def probe(self, effect: Any) -> ProbeResult:
        self.calls += 1
        return ProbeResult(
            ProbeOutcome.NOT_HAPPENED,
            detail="no PR of this head created after the effect",
            provider_reference=effect.provider_key,
        )


@pytest.fixture
def oo() -> Iterator[OpenOnce]:
    with OpenOnce(":memory:", retry_delay=0, clock=FakeClock()) as ledger:
        yield ledger


def parked(oo: OpenOnce, url: str) -> str:
    @oo.effect(tool="github.create_pr", idempotency_key=lambda head: head)
    def create_pr(head: str) -> None:
        httpx_create_pr(url)

    with pytest.raises(OutcomeUnknownError) as info:
        create_pr("feature")
    return info.value.effect_id


def reconcile(oo: OpenOnce, prober: Missing) -> None:
    oo.clock.advance(3600)  # type: ignore[attr-defined]
    reconciler = Reconciler(oo, grace_seconds=0, require_provider_capability=False)
    reconciler.register("github.create_pr", prober)
    try:
        reconciler.run_once()
    finally:
        reconciler.close()


def test_a_miss_after_the_provider_said_it_already_exists_goes_to_a_person(oo, provider):
    effect_id = parked(oo, provider(PR_EXISTS_422).url)
    prober = Missing()
    reconcile(oo, prober)
    assert prober.calls == 1
    effect = oo.get(effect_id)
    assert effect.state == "human_review"
    reason = oo.journal(effect_id)[-1].reason
    assert "already exists" in reason and "a miss" in reason


def test_an_ordinary_unknown_is_still_rearmed_on_a_miss(oo, provider):
    # The rule is about what the provider said, not about every UNKNOWN: a 5xx parks a
    # call UNKNOWN too, and its miss re-arms as before.
    effect_id = parked(oo, provider(httpx.codes.BAD_GATEWAY).url)
    reconcile(oo, Missing())
    assert oo.get(effect_id).state == "planned"


def test_a_plain_422_is_failed_and_never_probed(oo, provider):
    with pytest.raises(httpx.HTTPStatusError):
        parked(oo, provider(PLAIN_422).url)
