"""Leases, round two: owners that cannot be judged, owners gone mid-request, hosts that
share a name, clock steps, a database clock that cannot be read, and the keeper's wake-up.

Each test here failed before its fix (see the report of the round): a live process read as
dead, a dead owner's in-flight request re-armed, a clock step expiring live leases...
"""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from openonce_core import LedgerUnavailableError, OpenOnce, Store
from openonce_core import _leases as leases
from openonce_core._clock import ClockUnavailableError, DatabaseClock
from openonce_core._leases import HOST, LeaseKeeper, dead_owner, process_owner
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core._states import EffectState
from openonce_core.testing import FakeClock, fake_payment_capability, stop_heartbeat

S = EffectState
TOOL = "charge_customer"  # fake_payment_capability: tier 1, grace 0, a miss may re-arm


def wait_until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    """Wait (real time, bounded) for another thread to get somewhere."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def dead_pid() -> int:
    """The pid of a process that existed a moment ago and has been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def in_thread(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def blocking_charge(
    oo: OpenOnce, **options: Any
) -> tuple[Callable[..., Any], threading.Event, threading.Event, list[str]]:
    """A handler that enters, then waits for ``release``; ``calls`` counts runs."""
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    @oo.effect(tool=TOOL, idempotency_key=lambda order: order, **options)
    def charge(order: str) -> dict[str, str]:
        calls.append(order)
        entered.set()
        assert release.wait(20)
        return {"charge_id": "ch_" + order}

    return charge, entered, release, calls


def not_happened(effect: Effect) -> ProbeResult:
    """A prober that finds nothing (the provider is still creating it, say)."""
    return ProbeResult(
        ProbeOutcome.NOT_HAPPENED, detail="no charge carries the reference",
        provider_reference=effect.provider_key,
    )  # fmt: skip


def reconciler(oo: OpenOnce, clock: FakeClock, **options: Any) -> Reconciler:
    rec = Reconciler(oo, extra_capabilities=[fake_payment_capability(TOOL)], clock=clock,
                     **options)  # fmt: skip
    rec.register(TOOL, not_happened)
    return rec


def only_id(store: Store) -> str:
    [effect] = store.list_effects(None, 10)
    return effect.id


# -- A: a process this one may not inspect is not dead --------------------------------------


def test_an_unreadable_pid_namespace_is_not_death(monkeypatch: pytest.MonkeyPatch) -> None:
    """EACCES on /proc/<pid>/ns/pid (another uid, hidepid) says nothing about the process."""
    owner = process_owner()

    def refused(path: Any, *args: Any, **kwargs: Any) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(leases.os, "readlink", refused)
    assert dead_owner(owner) is None


def test_an_unreadable_stat_is_not_death(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        owner = f"{HOST}:{child.pid}:-"
        real_open = builtins.open

        def guarded(path: Any, *args: Any, **kwargs: Any) -> Any:
            if str(path) == f"/proc/{child.pid}/stat":
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", guarded)
        assert dead_owner(owner) is None
    finally:
        child.kill()
        child.wait()
    monkeypatch.undo()
    assert dead_owner(f"{HOST}:{child.pid}:-") == f"process {child.pid} on {HOST} no longer exists"


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="needs root to run the check as another uid")  # fmt: skip
def test_another_uid_reads_a_live_root_process_as_alive() -> None:
    """As ``celery --uid nobody`` or an operator's ``openonce review`` would: a forked child
    that dropped to uid 65534 judges this (root) process, whose namespace link it may not
    read, and a process that really is gone."""
    owner, gone = process_owner(), f"{HOST}:{dead_pid()}:-"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and never return into pytest
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            try:
                os.readlink(f"/proc/{os.getppid()}/ns/pid")
                unreadable = "readable"
            except PermissionError:
                unreadable = "unreadable"
            answer = f"{unreadable}|{dead_owner(owner)}|{dead_owner(gone)}"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    unreadable, live, dead = answer.split("|")
    assert unreadable == "unreadable"  # the situation of the bug
    assert live == "None", f"a live process read as dead from another uid: {live}"
    assert dead.endswith("no longer exists")


# -- C: one hostname, two machines ---------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [
        "{host}:100000000000000000000:-",  # os.kill raised OverflowError: every sweep failed
        "{host}:{pid}:.123",  # no namespace: a live pid was "another process now"
        "{host}:{pid}:abc.def",
        "{host}:{pid}:1.2.3.4",
        "{host}:\u0663:-",  # a digit to str.isdigit, not to int()
        "{host}:-1:-",
        "{host}:{pid}:",
    ],
)
def test_an_owner_of_odd_shape_cannot_be_judged(shape: str) -> None:
    owner = shape.format(host=HOST, pid=dead_pid())
    assert dead_owner(owner) is None


def test_an_owner_from_another_boot_cannot_be_judged() -> None:
    """A cloned VM or a host-network container has our hostname and the same initial pid
    namespace inode; its pids are not ours. Another boot id: cannot judge."""
    assert leases.BOOT_ID, "the kernel's boot id should be readable here"
    mine = process_owner()
    namespace, start, boot = mine.rsplit(":", 1)[1].split(".")
    assert boot == leases.BOOT_ID  # owner names carry it: host:pid:ns.start.boot
    pid = dead_pid()
    other_boot = "0" * 12 if boot != "0" * 12 else "1" * 12
    assert dead_owner(f"{HOST}:{pid}:{namespace}.{start}.{other_boot}") is None
    # The same owner on this boot is judged as before ...
    gone = f"process {pid} on {HOST} no longer exists"
    assert dead_owner(f"{HOST}:{pid}:{namespace}.{start}.{boot}") == gone
    # ... and so are the owner names already in ledgers: no boot id, or no token at all.
    assert dead_owner(f"{HOST}:{pid}:{namespace}.{start}") == gone
    assert dead_owner(f"{HOST}:{pid}:-") == gone
    assert dead_owner(process_owner()) is None


# -- B: a dead owner's last request may still be in flight -------------------------------------


def test_a_dead_owner_is_unknown_at_once_but_a_miss_waits_out_its_grace(store: Store) -> None:
    clock = FakeClock()
    # The agent that claimed it is a process that no longer exists on this host.
    agent = stop_heartbeat(OpenOnce(store, owner=f"{HOST}:{dead_pid()}:-", clock=clock))
    charge, entered, release, calls = blocking_charge(agent, lease_seconds=300)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        other = OpenOnce(store, clock=clock)
        assert other.expire_leases() == [effect_id]  # the evidence: UNKNOWN at once
        effect = other.get(effect_id)
        assert effect.state == S.UNKNOWN and effect.execution_evidence["owner_gone"]
        rec = reconciler(other, clock)
        # A miss right after: the provider may still be processing what it sent.
        report = rec.run_once()
        assert report.rearmed == [] and report.retried == [effect_id]
        last = other.journal(effect_id)[-1]
        assert last.action == "reprobe" and "in flight" in last.reason
        clock.advance(30)
        assert rec.run_once().rearmed == []
        clock.advance(31)  # past dead_owner_grace (60 s): a miss is evidence now
        assert rec.run_once().rearmed == [effect_id]
        assert other.get(effect_id).state == S.PLANNED
    finally:
        release.set()
        first.exception(timeout=20)
    assert calls == ["o-1"]


# -- D: clock steps --------------------------------------------------------------------------


def test_a_forward_step_expires_no_live_lease(store: Store) -> None:
    clock = FakeClock()
    agent = OpenOnce(store, clock=clock, wait_seconds=600)
    charge, entered, release, calls = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        other = OpenOnce(store, clock=clock, wait_seconds=600)
        duplicate_charge = blocking_charge(other, lease_seconds=60)[0]
        duplicate = in_thread(duplicate_charge, "o-1")  # waits for the first call
        wait_until(lambda: store.board.waiting() == [effect_id], "the duplicate to wait")
        rec = reconciler(other, clock)
        clock.step(3600)  # NTP, a resumed VM: every lease's end is now an hour ago
        assert rec.run_once().expired == []
        assert other.expire_leases() == []
        assert other.review() == []
        clock.advance(20)  # the keeper renews on its monotonic schedule, in the new time
        wait_until(lambda: other.get(effect_id).lease_expires_at > clock.now(), "a renewal")
        assert rec.run_once().expired == [] and other.expire_leases() == []
        assert not duplicate.done()
        assert other.get(effect_id).state == S.STARTED
        release.set()
        assert first.result(timeout=20) == {"charge_id": "ch_o-1"}
        assert duplicate.result(timeout=20) == {"charge_id": "ch_o-1"}  # a replay
    finally:
        release.set()
    assert calls == ["o-1"]
    assert other.get(effect_id).state == S.COMMITTED


def test_a_stopped_owner_still_expires_after_a_step_once_time_passes(store: Store) -> None:
    clock = FakeClock()
    agent = stop_heartbeat(OpenOnce(store, clock=clock))
    charge, entered, release, _ = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        other = OpenOnce(store, clock=clock)
        clock.step(3600)
        assert other.expire_leases() == []  # a step alone proves nothing
        clock.advance(31)  # un-renewed for more than a keeper's interval and a half
        assert other.expire_leases() == [effect_id]
        assert other.get(effect_id).state == S.UNKNOWN
    finally:
        release.set()
        first.exception(timeout=20)


def test_a_stopped_owner_expires_as_before_without_a_step(store: Store) -> None:
    clock = FakeClock()
    agent = stop_heartbeat(OpenOnce(store, clock=clock))
    charge, entered, release, _ = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        rec = reconciler(OpenOnce(store, clock=clock), clock)
        clock.advance(59)
        assert rec.run_once().expired == []
        clock.advance(2)
        assert rec.run_once().expired == [effect_id]
    finally:
        release.set()
        first.exception(timeout=20)


def test_a_backward_step_does_not_stop_the_keeper(store: Store) -> None:
    clock = FakeClock()
    agent = OpenOnce(store, clock=clock)
    charge, entered, release, _ = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        before = agent.get(effect_id).lease_expires_at
        clock.step(-3600)
        clock.advance(20)  # a third of the lease passed: renewed, not an hour later
        wait_until(lambda: agent.get(effect_id).lease_expires_at != before, "a renewal")
        # Renewed, and never to an earlier end than the claim wrote (see the next test).
        assert before < agent.get(effect_id).lease_expires_at < before + 1
    finally:
        release.set()
    assert first.result(timeout=20) == {"charge_id": "ch_o-1"}


def test_a_step_back_then_forward_expires_no_live_lease(store: Store) -> None:
    # A judge reads a lease's length as its end minus the claim's time. Stepped back 59 s
    # after the claim, a renewal to now + 60 would make that 21 s, and the judge would give
    # the keeper 10.5 s to renew where it takes 20: after a step forward, a live call was
    # expired (found by an attack script running two processes on one stepped clock).
    clock = FakeClock()
    agent = OpenOnce(store, clock=clock, wait_seconds=600)
    charge, entered, release, calls = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        before = agent.get(effect_id).lease_expires_at
        clock.step(-59)
        clock.advance(20)  # the keeper's first renewal, on the stepped clock
        wait_until(lambda: agent.get(effect_id).lease_expires_at != before, "a renewal")
        clock.step(3600)  # and forward: every lease's end is in the past
        other = OpenOnce(store, clock=clock)
        clock.advance(11)  # longer than 1.5 x a third of 21 s, shorter than the keeper's 20
        assert other.expire_leases() == []
        assert other.get(effect_id).state == S.STARTED
        release.set()
        assert first.result(timeout=20) == {"charge_id": "ch_o-1"}
    finally:
        release.set()
    assert calls == ["o-1"]
    assert other.get(effect_id).state == S.COMMITTED


def test_a_step_does_not_spend_the_stale_call_grace(store: Store) -> None:
    clock = FakeClock()
    agent = stop_heartbeat(OpenOnce(store, clock=clock))
    charge, entered, release, _ = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        other = OpenOnce(store, clock=clock)
        clock.advance(61)
        assert other.expire_leases() == [effect_id]
        rec = reconciler(other, clock)  # stale_call_grace 300 s
        clock.step(3600)  # the grace looks spent on the wall clock; no time passed
        report = rec.run_once()
        assert report.rearmed == [] and report.retried == [effect_id]
        clock.advance(301)
        assert rec.run_once().rearmed == [effect_id]
    finally:
        release.set()
        first.exception(timeout=20)


def test_a_database_clock_resync_that_jumps_expires_no_live_lease(store: Store) -> None:
    jump = [0.0]

    def database_time() -> float:
        return time.time() + jump[0]

    agent = OpenOnce(store, clock=DatabaseClock(database_time, resync_seconds=0))
    charge, entered, release, calls = blocking_charge(agent, lease_seconds=60)
    first = in_thread(charge, "o-1")
    try:
        assert entered.wait(10)
        effect_id = only_id(store)
        clock = DatabaseClock(database_time, resync_seconds=0)
        other = OpenOnce(store, clock=clock)
        rec = Reconciler(other, clock=clock)
        assert other.expire_leases() == []
        jump[0] = 3600.0  # the server's clock was corrected; the next reading shows it
        assert other.expire_leases() == []
        assert rec.run_once().expired == []
        assert other.get(effect_id).state == S.STARTED
    finally:
        release.set()
    assert first.result(timeout=20) == {"charge_id": "ch_o-1"}
    assert calls == ["o-1"]


# -- E: no ledger time from the host's clock ---------------------------------------------------


def test_a_database_clock_that_cannot_be_read_yet_runs_nothing(store: Store) -> None:
    offset = 900.0  # this host's clock is 15 minutes slow
    failures = [ConnectionError("database unreachable")]

    def database_time() -> float:
        if failures:
            raise failures.pop()
        return time.time() + offset

    oo = OpenOnce(store, clock=DatabaseClock(database_time))
    calls: list[str] = []

    @oo.effect(tool="acme.ship", idempotency_key=lambda parcel: parcel, lease_seconds=60)
    def ship(parcel: str) -> str:
        calls.append(parcel)
        return "shipped"

    with pytest.raises(LedgerUnavailableError) as refused:  # a NothingRanError
        ship("p-1")
    assert isinstance(refused.value.__cause__, ClockUnavailableError)
    assert calls == [] and store.list_effects(None, 10) == []  # nothing STARTED, not called
    assert ship("p-1") == "shipped"  # the next call reads the database's clock again
    effect = store.find("acme.ship", "p-1")
    assert effect is not None and effect.state == S.COMMITTED
    assert effect.created_at > time.time() + offset - 60  # the database's time, not ours


def test_a_database_clock_follows_its_anchor_when_a_later_read_fails() -> None:
    readings = [1_000.0]

    def database_time() -> float:
        if not readings:
            raise ConnectionError("database unreachable")
        return readings.pop()

    clock = DatabaseClock(database_time, resync_seconds=0)
    assert 1_000.0 <= clock.now() < 1_010.0
    assert 1_000.0 <= clock.now() < 1_010.0  # the read failed: the anchor is followed


# -- F: the keeper's wake-up ------------------------------------------------------------------


class _Renewals:
    """A ledger stub that records renewals."""

    def __init__(self) -> None:
        self.renewed: list[str] = []

    def renew_lease(self, effect_id: str, fence: int, owner: str, until: float) -> bool:
        self.renewed.append(effect_id)
        return True


def test_a_hold_while_the_keeper_picks_its_sleep_is_not_lost() -> None:
    """The keeper thread picks how long to sleep from what it holds, then clears its
    wake-up event; a hold landing in between must still wake it for a shorter lease."""
    clock = FakeClock()
    ledger = _Renewals()
    keeper = LeaseKeeper(ledger, clock)  # type: ignore[arg-type]
    in_clear, go_on = threading.Event(), threading.Event()

    class PausingEvent(threading.Event):
        def clear(self) -> None:
            in_clear.set()
            assert go_on.wait(10)
            super().clear()

    keeper._wake = PausingEvent()
    try:
        keeper.hold("long", 1, "me", 300.0)  # the thread starts, sleeps until +60
        assert in_clear.wait(10)  # ... and is between choosing its sleep and clearing
        # A shorter lease arrives now (renewal due in 1 s).
        short = threading.Thread(target=keeper.hold, args=("short", 1, "me", 3.0))
        short.start()
        short.join(0.5)  # returns at once without the lock; waits for it with
        go_on.set()
        short.join(10)
        assert not short.is_alive()
        clock.advance(1.5)
        wait_until(lambda: "short" in ledger.renewed, "the short lease's renewal", 5.0)
        assert "long" not in ledger.renewed
    finally:
        go_on.set()
        keeper.close()


# -- a reconciler's clock an hour ahead, then back ---------------------------------------------


def test_a_probe_pause_written_an_hour_ahead_ends_on_time_after_the_clock_steps_back(
    store: Store,
) -> None:
    # Found by the nemesis soak: a reprobe ("provider unavailable ... asking again in 2s")
    # written while the reconciler's clock ran an hour ahead kept the effect waiting an
    # hour once the clock stepped back; the soak's drain timed out with it UNKNOWN.
    from openonce_core import OutcomeUnknownError
    from openonce_core.errors import ProbeTransientError

    clock = FakeClock()
    oo = OpenOnce(store, clock=clock)

    @oo.effect(tool=TOOL, idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, str]:
        raise TimeoutError("read timed out")  # sent, no answer: UNKNOWN

    with pytest.raises(OutcomeUnknownError):
        charge("o-1")
    effect_id = only_id(store)
    answers: list[str] = []

    def busy_then_miss(effect: Effect) -> ProbeResult:
        answers.append(effect.id)
        if len(answers) == 1:
            raise ProbeTransientError("fake", "503 Service Unavailable", status=503)
        return not_happened(effect)

    rec = Reconciler(oo, extra_capabilities=[fake_payment_capability(TOOL)], clock=clock,
                     retry_backoff=2.0)  # fmt: skip
    rec.register(TOOL, busy_then_miss)
    clock.step(3600)  # the reconciler's clock runs an hour ahead
    rec.run_once()
    assert "asking again in 2s" in oo.journal(effect_id)[-1].reason
    clock.step(-3600)  # and is put right
    assert rec.run_once().rearmed == []  # first seen now: its 2 s pause starts here
    clock.advance(3)
    assert rec.run_once().rearmed == [effect_id]  # not an hour later
    assert len(answers) == 2
    assert oo.get(effect_id).state == S.PLANNED


class _CountingEvent:
    """An event nobody sets until ``sets_after`` waits: records each real-time pause."""

    def __init__(self, clock: FakeClock, sets_after: int, advance_at: int | None = None):
        self.clock, self.sets_after, self.advance_at = clock, sets_after, advance_at
        self.pauses: list[float] = []

    def is_set(self) -> bool:
        return len(self.pauses) >= self.sets_after

    def wait(self, timeout: float) -> bool:
        self.pauses.append(timeout)
        if self.advance_at is not None and len(self.pauses) == self.advance_at:
            self.clock.advance(1)  # the test moves the clock: look often again
        return False


def test_a_thread_waiting_on_a_still_fake_clock_backs_off_but_answers_its_event() -> None:
    """A lease keeper a test left behind waits on a FakeClock that never moves again: it
    must not wake 500 times a second for ever (a hundred such threads starved the suite of
    the interpreter lock), yet notice a clock step within 50 ms of real time."""
    clock = FakeClock()
    still = _CountingEvent(clock, sets_after=12)
    assert clock.wait(still, 3600) is True  # set by "another thread" after 12 looks
    assert still.pauses[:5] == [0.002, 0.004, 0.008, 0.016, 0.032]
    assert still.pauses[5:] == [0.05] * 7  # never longer than 50 ms

    moving = _CountingEvent(clock, sets_after=10, advance_at=6)
    assert clock.wait(moving, 3600) is True
    assert moving.pauses[6] == 0.002  # the clock moved: back to looking every 2 ms

    real = threading.Event()
    real.set()
    assert clock.wait(real, 3600) is True  # a set event answers at once
    assert clock.wait(threading.Event(), 0) is False  # a deadline already reached
