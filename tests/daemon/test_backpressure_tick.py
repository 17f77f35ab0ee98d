"""The beat tick's backpressure (issue 19, "Backpressure in dispatch"), in-process on the
pytest-django test database, and the batch queue's depth read from a real Redis.

A tick queues batches and claims their effects for OPENONCE_DISPATCH_TTL. Measured in
review: with batches waiting 70 s in the queue, newer ticks re-claimed the same effects
and every older batch skipped them; 0 probes in 600 s. Here the reconciler runs on a
FakeClock and the queue is a list drained 70 (fake) seconds after each tick.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from celery import Celery

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core.testing import FakeClock
from tests.support.daemon import pick_redis_db, redis_client

S = EffectState
TICK = 5.0
QUEUE_WAIT = 70.0  # what review measured: longer than the 60 s dispatch TTL


class Counting:
    """Every effect happened; counts the questions asked of the provider."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def probe(self, effect: Effect) -> ProbeResult:
        self.calls.append(effect.id)
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_" + effect.id[:12]},
            detail="found at the provider", provider_reference=effect.provider_key,
        )  # fmt: skip


class World:
    """The ledger on a FakeClock, and the reconciler the sweep and the batches use."""

    def __init__(self, target: str) -> None:
        self.clock = FakeClock()
        self.oo = OpenOnce(target, migrate=False, clock=self.clock)
        self.prober = Counting()
        self.reconciler = Reconciler(self.oo, grace_seconds=0.0, owner="daemon")
        self.reconciler.register("stripe.charge", self.prober)

        @self.oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
        def charge(order: str) -> dict[str, Any]:
            raise TimeoutError("read timed out")

        self._charge = charge

    def unknown(self, n: int) -> list[str]:
        ids = []
        for i in range(n):
            with pytest.raises(OutcomeUnknownError) as info:
                self._charge(f"order-{i}")
            ids.append(info.value.effect_id)
        return ids

    def effect(self, effect_id: str) -> Effect:
        return self.oo.get(effect_id)

    def close(self) -> None:
        self.reconciler.close()
        self.oo.close()


@pytest.fixture
def world(transactional_db, settings, monkeypatch) -> Iterator[World]:
    from django.db import connection

    from ledger import clients as site_ledger
    from reconciler import sweep as sweep_module

    site_ledger.reset()
    target = site_ledger.ledger_target()
    assert connection.vendor == "postgresql"
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("TRUNCATE openonce_effects, openonce_journal, openonce_approvals")
    settings.OPENONCE_SWEEP_SPREAD = 1
    settings.OPENONCE_DISPATCH_TTL = 60.0
    w = World(target)
    monkeypatch.setattr(sweep_module, "get_reconciler", lambda: w.reconciler)
    yield w
    w.close()
    site_ledger.reset()


class Queue:
    """The batch queue: what the ticks dispatched, in order, with when."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waiting: deque[tuple[float, list[str], int]] = deque()

    def dispatch(self, ids: list[str], sweep_id: int) -> None:
        self.waiting.append((self.clock.now(), list(ids), sweep_id))

    def depth(self) -> int:
        return len(self.waiting)

    def run_waited(self, wait: float) -> None:
        """A worker takes every batch that has waited ``wait`` seconds."""
        from reconciler.sweep import run_batch

        while self.waiting and self.waiting[0][0] <= self.clock.now() - wait:
            _, ids, sweep_id = self.waiting.popleft()
            run_batch(ids, sweep_id, f"task-{sweep_id}")


def test_batches_that_wait_past_the_dispatch_ttl_still_probe_their_effects(world) -> None:
    """The livelock, with the queue's depth unknown (an eager or unreadable broker, so no
    backpressure): 600 s of ticks every 5 s, each batch run 70 s after its tick."""
    from reconciler.models import Sweep
    from reconciler.sweep import sweep

    ids = world.unknown(4)
    queue = Queue(world.clock)
    for _ in range(int(600 / TICK)):
        sweep("beat", dispatch=queue.dispatch, backlog=lambda: None)
        queue.run_waited(QUEUE_WAIT)
        world.clock.advance(TICK)

    assert sorted(world.prober.calls) == sorted(ids)  # each effect probed, and once
    assert {world.effect(i).state for i in ids} == {S.COMMITTED}
    assert sum(Sweep.objects.values_list("committed", flat=True)) == len(ids)


def test_a_tick_queues_nothing_while_the_batch_queue_is_behind(world, settings, caplog) -> None:
    from reconciler.models import Sweep
    from reconciler.sweep import sweep

    settings.OPENONCE_DISPATCH_MAX_QUEUED = 4
    ids = world.unknown(3)
    before = {i: world.effect(i).fence for i in ids}
    queue = Queue(world.clock)

    with caplog.at_level(logging.WARNING, logger="openonce.reconciler"):
        held = sweep("beat", dispatch=queue.dispatch, backlog=lambda: 5)
    assert queue.depth() == 0
    assert (held.due, held.batches, held.finished_at) == (0, 0, held.started_at)
    # Nothing was claimed either: a claim would keep the next tick from queueing them.
    assert {i: world.effect(i).fence for i in ids} == before
    assert {world.effect(i).lease_owner for i in ids} == {None}
    assert any(
        f"sweep {held.pk} queued no batches: 5 already wait in the batch queue" in r.message
        and "OPENONCE_DISPATCH_MAX_QUEUED=4" in r.message
        for r in caplog.records
    ), caplog.text

    # At the threshold it dispatches again, and the batches probe as usual.
    dispatched = sweep("beat", dispatch=queue.dispatch, backlog=lambda: 4)
    assert (dispatched.due, dispatched.batches) == (3, 1)
    assert sorted(i for _, batch, _ in queue.waiting for i in batch) == sorted(ids)
    queue.run_waited(0)
    assert sorted(world.prober.calls) == sorted(ids)
    assert Sweep.objects.get(pk=dispatched.pk).committed == 3


def test_with_backpressure_a_slow_queue_holds_no_duplicates(world, settings) -> None:
    """The tick reads the depth of the queue it fills: while its batches wait past the TTL
    it queues nothing more, so each effect is queued once and probed once."""
    from reconciler.sweep import sweep

    settings.OPENONCE_DISPATCH_MAX_QUEUED = 0
    ids = world.unknown(4)
    queue = Queue(world.clock)
    queued: list[str] = []
    for _ in range(int(600 / TICK)):
        before = queue.depth()
        sweep("beat", dispatch=queue.dispatch, backlog=queue.depth)
        queued += [i for _, batch, _ in list(queue.waiting)[before:] for i in batch]
        queue.run_waited(QUEUE_WAIT)
        world.clock.advance(TICK)

    assert sorted(queued) == sorted(ids)
    assert sorted(world.prober.calls) == sorted(ids)


def test_the_beat_tick_reads_the_batch_queue(world, settings, monkeypatch) -> None:
    from reconciler import queue as batch_queue
    from reconciler import tasks
    from reconciler.models import Sweep

    settings.OPENONCE_DISPATCH_MAX_QUEUED = 8
    ids = world.unknown(2)
    sent: list[list[str]] = []
    monkeypatch.setattr(tasks.reconcile_batch, "delay", lambda batch, sweep_id: sent.append(batch))

    monkeypatch.setattr(batch_queue, "depth", lambda: 9)
    tasks.tick()
    assert sent == []
    assert Sweep.objects.latest("started_at").due == 0

    monkeypatch.setattr(batch_queue, "depth", lambda: 8)
    tasks.tick()
    assert sorted(i for batch in sent for i in batch) == sorted(ids)


# -- the depth, from the broker ------------------------------------------------------------


@pytest.fixture
def redis_broker(settings) -> Iterator[tuple[int, str]]:
    """An empty Redis database of its own; no worker consumes from it."""
    db, url = pick_redis_db()
    settings.CELERY_BROKER_URL = url
    try:
        yield db, url
    finally:
        client = redis_client(db)
        client.flushdb()
        client.close()


def test_depth_reads_the_batch_queue_in_redis(redis_broker, settings) -> None:
    from reconciler.queue import depth

    db, url = redis_broker
    assert depth() == 0  # no list yet: nothing waits
    sender = Celery("test-sender", broker=url)
    sender.conf.update(
        task_queues=settings.CELERY_TASK_QUEUES,
        task_routes=settings.CELERY_TASK_ROUTES,
        task_default_queue=settings.CELERY_TASK_DEFAULT_QUEUE,
        broker_transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    )
    try:
        for n in range(3):
            sender.send_task("openonce.reconcile_batch", args=[[f"eff_{n}"], None])
        # A message with a priority goes to a list of its own ("openonce.batches\x06\x169").
        for n in range(2):
            sender.send_task("openonce.reconcile_batch", args=[[f"eff_p{n}"], None], priority=9)
        sender.send_task("openonce.tick")  # another queue: not a batch
    finally:
        sender.close()

    client = redis_client(db)
    try:
        assert client.llen("openonce.batches") == 3
        assert client.llen("openonce.tick") == 1
        suffixed = [k for k in client.keys("openonce.batches*") if k != b"openonce.batches"]
        assert len(suffixed) == 1 and client.llen(suffixed[0]) == 2
    finally:
        client.close()
    assert depth() == 5


def test_depth_is_unknown_when_nothing_is_queued_through_a_broker(settings) -> None:
    from reconciler.queue import depth

    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    assert depth() is None
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    settings.CELERY_TASK_ALWAYS_EAGER = True  # tasks run inline: no queue to read
    assert depth() is None


def test_depth_is_unknown_when_the_broker_accepts_but_never_answers(settings, monkeypatch) -> None:
    """A stopped Redis: the connection is accepted (by the kernel) and nothing ever comes
    back. The tick reads the depth as unknown instead of waiting behind it (for the
    module's timeout, shortened here from 2 s so the test does not wait 2 s)."""
    from reconciler import queue
    from reconciler.queue import depth

    monkeypatch.setattr(queue, "CONNECT_TIMEOUT", 0.2)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        assert depth() is None
