"""Dispatch claims against probe claims, on every store (issue 19, "Backpressure in
dispatch").

A tick claims the due UNKNOWN effects it queues for OPENONCE_DISPATCH_TTL seconds (a
dispatch claim: "queued for a batch"); a batch claims an effect again just before it asks
the provider (a probe claim: "being probed now"). When batches wait in the queue longer
than the TTL, newer ticks re-claim the same effects for their own batches. Only a probe
claim may keep a batch from probing: a batch that skipped every effect a newer tick had
re-dispatched never probed anything (70 s of queue wait gave 0 probes in 600 s).

Time is a FakeClock moved by hand; the queue is a list the test drains.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, Store
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler, ReconcileReport
from openonce_core._records import Effect
from openonce_core.testing import FakeClock

S = EffectState
TTL = 60.0  # OPENONCE_DISPATCH_TTL's default
TICK = 5.0  # OPENONCE_SWEEP_INTERVAL's default


class Counting:
    """Every effect happened; ``during`` runs while the probe is in flight (another batch
    reaching the same effect at that moment)."""

    def __init__(self, during: Callable[[Effect], None] | None = None) -> None:
        self.calls: list[str] = []
        self.during = during

    def probe(self, effect: Effect) -> ProbeResult:
        self.calls.append(effect.id)
        if self.during is not None:
            self.during(effect)
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_" + effect.id[:12]},
            detail="found at the provider", provider_reference=effect.provider_key,
        )  # fmt: skip


@pytest.fixture
def oo(store: Store, clock: FakeClock) -> OpenOnce:
    return OpenOnce(store, retry_delay=0, clock=clock)


@pytest.fixture
def reconciler(oo: OpenOnce) -> Iterator[Callable[..., Reconciler]]:
    made: list[Reconciler] = []

    def make(owner: str, prober: Any = None) -> Reconciler:
        rec = Reconciler(oo, grace_seconds=0.0, owner=owner)
        if prober is not None:
            rec.register("stripe.charge", prober)
        made.append(rec)
        return rec

    yield make
    for rec in made:
        rec.close()


def make_unknown(oo: OpenOnce, n: int) -> list[str]:
    """``n`` charges whose calls timed out after the request was sent: UNKNOWN."""

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, Any]:
        raise TimeoutError("read timed out")

    ids = []
    for n_ in range(n):
        with pytest.raises(OutcomeUnknownError) as info:
            charge(f"order-{n_}")
        ids.append(info.value.effect_id)
    return ids


def committed(oo: OpenOnce, ids: list[str]) -> bool:
    return all(oo.get(i).state == S.COMMITTED for i in ids)


def test_batches_queued_past_the_ttl_still_probe_their_effects(oo, clock, reconciler) -> None:
    """The livelock measured in review: every batch waits 70 s in the queue, a tick runs
    every 5 s and re-claims what it finds unclaimed. Each effect must be probed once."""
    ids = make_unknown(oo, 3)
    beat = reconciler("beat")
    prober = Counting()
    worker = reconciler("worker", prober)
    queue: deque[tuple[float, list[str], str]] = deque()
    reports: list[ReconcileReport] = []
    for n in range(int(600 / TICK)):
        owner = f"dispatch:sweep:{n}"
        due = beat.claim_due(100, owner, TTL)
        if due:
            queue.append((clock.now(), due, owner))
        while queue and queue[0][0] <= clock.now() - 70:
            _, batch, owner = queue.popleft()
            reports.append(
                worker.reconcile_ids(batch, dispatched_by=owner, claimer="task:" + owner)
            )
        clock.advance(TICK)

    assert sorted(prober.calls) == sorted(ids)  # every effect probed, and once
    assert committed(oo, ids)
    # Newer ticks did queue the effects again while the first batch waited; those batches
    # found them resolved and asked nobody.
    assert len(reports) > 1
    assert sum(len(r.committed) for r in reports) == len(ids)


@pytest.mark.parametrize("first", ["older", "newer"])
def test_a_live_probe_claim_keeps_the_other_batch_away(oo, clock, reconciler, first) -> None:
    """Two batches carry one effect (the newer tick re-dispatched it after the TTL). While
    one of them is asking the provider, the other reaches the effect: it must not ask too,
    whichever of the two came first."""
    [eid] = make_unknown(oo, 1)
    beat = reconciler("beat")
    assert beat.claim_due(10, "dispatch:sweep:1", TTL) == [eid]
    clock.advance(TTL + 10)  # the first batch is still waiting in the queue
    assert beat.claim_due(10, "dispatch:sweep:2", TTL) == [eid]
    batches = {"older": ("dispatch:sweep:1", "task:1"), "newer": ("dispatch:sweep:2", "task:2")}
    second = "newer" if first == "older" else "older"
    late_prober = Counting()
    late = reconciler("worker-b", late_prober)
    meanwhile: list[ReconcileReport] = []

    def other_batch_arrives(effect: Effect) -> None:
        dispatched_by, claimer = batches[second]
        meanwhile.append(late.reconcile_ids([eid], dispatched_by=dispatched_by, claimer=claimer))

    early_prober = Counting(during=other_batch_arrives)
    early = reconciler("worker-a", early_prober)
    dispatched_by, claimer = batches[first]
    report = early.reconcile_ids([eid], dispatched_by=dispatched_by, claimer=claimer)

    assert early_prober.calls == [eid]
    assert late_prober.calls == []  # skipped: somebody is probing it right now
    assert report.committed == [eid]
    assert meanwhile[0].resolved == 0
    # Once decided, the other batch (a redelivery, say) finds nothing to do.
    again = late.reconcile_ids([eid], dispatched_by=batches[second][0], claimer="task:3")
    assert again.resolved == 0 and late_prober.calls == []
    assert oo.get(eid).state == S.COMMITTED


def test_a_batch_that_read_before_another_batch_probed_loses_the_race(
    oo, clock, reconciler
) -> None:
    """A batch reads its effects once, then probes them one after the other: by the time it
    reaches the second, a newer batch has probed and decided it. Taking over the dispatch
    claim it read is fenced, so it does not ask the provider again."""
    ids = make_unknown(oo, 2)
    beat = reconciler("beat")
    assert sorted(beat.claim_due(10, "dispatch:sweep:1", TTL)) == sorted(ids)
    clock.advance(TTL + 10)
    assert sorted(beat.claim_due(10, "dispatch:sweep:2", TTL)) == sorted(ids)
    newer_prober = Counting()
    newer = reconciler("worker-b", newer_prober)
    taken: list[str] = []

    def newer_batch_takes_the_other(effect: Effect) -> None:
        if not taken:  # while the older batch probes its first effect
            taken.extend(i for i in ids if i != effect.id)
            newer.reconcile_ids(taken, dispatched_by="dispatch:sweep:2", claimer="task:2")

    older_prober = Counting(during=newer_batch_takes_the_other)
    older = reconciler("worker-a", older_prober)
    report = older.reconcile_ids(ids, dispatched_by="dispatch:sweep:1", claimer="task:1")

    [other] = taken
    [first] = [i for i in ids if i != other]
    assert older_prober.calls == [first] and newer_prober.calls == [other]
    assert report.committed == [first] and report.lost_races == 1
    assert committed(oo, ids)


def test_a_dispatch_claim_is_named_as_one(oo, reconciler) -> None:
    """A dispatch claim another batch may take over must not be mistaken for a probe claim,
    nor the other way round: a name without the dispatch prefix is refused before anything
    is claimed, and so is a probe claimer named like a dispatcher."""
    [eid] = make_unknown(oo, 1)
    beat = reconciler("beat")
    with pytest.raises(ValueError, match="dispatch:"):
        beat.claim_due(10, "sweep:1", TTL)
    effect = oo.get(eid)
    assert (effect.lease_owner, effect.lease_expires_at) == (None, None)

    prober = Counting()
    worker = reconciler("worker", prober)
    with pytest.raises(ValueError, match="dispatch:"):
        worker.reconcile_ids([eid], claimer="dispatch:task:1")
    assert prober.calls == [] and oo.get(eid).fence == effect.fence

    assert beat.claim_due(10, "dispatch:sweep:1", TTL) == [eid]
    assert worker.reconcile_ids([eid], dispatched_by="dispatch:sweep:1").committed == [eid]


def test_a_live_dispatch_claim_still_keeps_the_next_tick_from_queueing_it_again(
    oo, clock, reconciler
) -> None:
    """What the dispatch claim is for: while a batch waits less than the TTL, later ticks
    do not queue its effects again; after the TTL (its worker may have died) they do."""
    [eid] = make_unknown(oo, 1)
    beat = reconciler("beat")
    assert beat.claim_due(10, "dispatch:sweep:1", TTL) == [eid]
    clock.advance(TTL - 1)
    assert beat.claim_due(10, "dispatch:sweep:2", TTL) == []
    clock.advance(1)
    assert beat.claim_due(10, "dispatch:sweep:3", TTL) == [eid]
