"""Leases that mean something: who holds a running attempt, whether that process still
exists, and a heartbeat that keeps a live call's lease from running out.

An attempt's lease says "this process is running the handler until then". It is renewed
while the handler runs (:class:`LeaseKeeper`, fenced: a renewal after someone took the
effect over changes nothing), so a lease runs out only when its process stopped renewing
it — killed, stopped, or cut off — and the effect then becomes UNKNOWN, never a retry.

The owner names the process: ``host:pid:token``. The token tells a pid's current process
from an earlier one that had the same pid, and this machine from another one with the same
hostname: ``<pid namespace>.<start time>.<boot id>`` on Linux (older ledgers hold
``<pid namespace>.<start time>``, or ``-`` where nothing could be read). A STARTED effect
owned by a process on this host that no longer exists is evidence: it becomes UNKNOWN at
once instead of after its lease (:func:`dead_owner`). Only proof counts as gone: no such
process, an exited one, or another process under that pid now. A process this one may not
inspect (another user's, ``hidepid``), an owner on another boot, or anything unreadable
cannot be judged, and then the lease decides.

Wall clocks step. A lease is judged lapsed only when its end has passed on the ledger's
clock *and* this process has seen it un-renewed for longer than a live keeper takes to
renew it, measured on its own monotonic clock (:func:`lease_lapsed`): a step moves every
lease's end into the past at once, but it cannot stop a live keeper from renewing.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from . import _forksafe as forksafe
from ._clock import Clock, FakeClock, monotonic_of
from ._ledger import Ledger
from ._records import Effect

HOST = socket.gethostname()

# A keeper renews a lease once a third of it has passed, and at least this often, so that
# whoever judges a lease need not wait for a third of a long lease (see unrenewed_span).
RENEW_EVERY_MAX = 60.0


def _boot_id() -> str | None:
    """A prefix of this kernel's boot id: another machine (or this one after a reboot) has
    another, even where the hostname and the initial pid namespace's inode are the same."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip().replace("-", "")[:12] or None
    except OSError:
        return None


BOOT_ID = _boot_id()


def _namespace(pid: int) -> str | None:
    """The pid namespace (inode) of process ``pid``, or None if it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid").partition("[")[2].rstrip("]") or None
    except OSError:
        return None  # EACCES for another user's process: says nothing about whether it lives


def _look(pid: int) -> tuple[str, str | None]:
    """What this host can tell about process ``pid``: ``("gone" | "exited" | "running" |
    "unknown", its start time or None)``. Only ENOENT/ESRCH mean gone."""
    if not os.path.exists("/proc/self/stat"):
        return _signal(pid), None  # no /proc (not Linux)
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        # No entry. With hidepid=2 another user's processes have none either: ask the kernel.
        return _signal(pid), None
    except OSError:
        return "unknown", None  # EACCES, EPERM, EIO...: cannot judge, so not gone
    fields = text.rsplit(")", 1)[-1].split()
    if len(fields) < 20:
        return "unknown", None
    # fields[0] is the state (field 3 of stat(5)); fields[19] the start time (field 22).
    return ("exited" if fields[0] in ("Z", "X") else "running"), fields[19]


def _signal(pid: int) -> str:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except OSError:
        return "unknown"  # EPERM: it exists, owned by someone else
    return "running"


def _token(pid: int) -> str:
    namespace = _namespace(pid)
    state, start = _look(pid)
    if namespace is None or start is None or state != "running":
        return "-"
    return f"{namespace}.{start}.{BOOT_ID}" if BOOT_ID else f"{namespace}.{start}"


# pid, then the token: "-", "<namespace>.<start>" (older ledgers) or "<ns>.<start>.<boot>".
# Linux pids stay below 2**22 (PID_MAX_LIMIT): seven digits at most.
_OWNER = re.compile(r"([0-9]{1,7}):(?:-|([0-9]+)\.([0-9]+)(?:\.([0-9a-f]+))?)", re.ASCII)


def process_owner() -> str:
    """This process's lease owner name."""
    pid = os.getpid()
    return f"{HOST}:{pid}:{_token(pid)}"


def dead_owner(owner: str | None) -> str | None:
    """Why ``owner`` is known to be gone — a process on this host that no longer exists —
    or None when it may be alive (or runs elsewhere, or cannot be judged from here)."""
    if not owner:
        return None
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != HOST:
        return None
    # Anything but a well-formed pid and token (an owner= of someone's own choosing) cannot
    # be judged: a wrong "gone" would re-arm a live call.
    shape = _OWNER.fullmatch(f"{parts[1]}:{parts[2]}")
    if shape is None:
        return None
    pid = int(parts[1])
    namespace, start, boot = shape.group(2), shape.group(3), shape.group(4)
    if boot is not None and boot != BOOT_ID:
        # Another machine with our hostname (a cloned VM, a container on the host's
        # network), or this machine before a reboot. After a reboot the owner is surely
        # dead, but from here the two look alike: cannot judge, the lease decides.
        return None
    if namespace is not None:
        mine = _namespace(os.getpid())
        if mine is not None and mine != namespace:
            return None  # another pid namespace (another container): its pids are not ours
    state, current = _look(pid)
    if state == "gone":
        return f"process {pid} on {HOST} no longer exists"
    if state == "exited":
        return f"process {pid} on {HOST} has exited"
    if state == "running" and start is not None and current is not None and current != start:
        return f"process {pid} on {HOST} is another process now (the owner exited)"
    return None


# -- judging a lease across clock steps ------------------------------------------------------

_ANY = object()


class _Sightings:
    """What this process knew when, on its own monotonic clock: since when it has seen a
    lease (effect, fence) end at the same time, and since when it has known that an attempt
    stopped. Kept per FakeClock (its monotonic time is its own) and once for every real
    clock. Forgetting an entry only makes a judgment wait longer."""

    LIMIT = 50_000

    def __init__(self) -> None:
        self.after_fork()
        self._tables: weakref.WeakKeyDictionary[Any, dict[Any, tuple[Any, float]]] = (
            weakref.WeakKeyDictionary()
        )
        self._host: dict[Any, tuple[Any, float]] = {}
        forksafe.register(self)

    def after_fork(self) -> None:
        self._lock = threading.Lock()  # what was seen stays true: the child keeps it

    def _table(self, clock: Clock) -> tuple[dict[Any, tuple[Any, float]], float]:
        if isinstance(clock, FakeClock):
            return self._tables.setdefault(clock, {}), clock.monotonic()
        return self._host, time.monotonic()

    def note(self, clock: Clock, key: Any, value: Any = _ANY) -> None:
        """``key`` holds ``value`` as of now (``_ANY``: whatever is read next)."""
        with self._lock:
            table, now = self._table(clock)
            table.pop(key, None)
            table[key] = (value, now)
            self._trim(table)

    def since(self, clock: Clock, key: Any, value: Any) -> float:
        """Monotonic seconds this process has known ``key`` to hold ``value``: 0 when this
        is the first time (from now on it is known)."""
        with self._lock:
            table, now = self._table(clock)
            seen = table.get(key)
            if seen is None or (seen[0] is not _ANY and seen[0] != value):
                table.pop(key, None)
                table[key] = (value, now)
                self._trim(table)
                return 0.0
            # Move it to the newest end: a lease being watched is trimmed last.
            del table[key]
            table[key] = (value, seen[1])
            return now - seen[1]

    def _trim(self, table: dict[Any, tuple[Any, float]]) -> None:
        if len(table) > self.LIMIT:
            for key in list(table)[: self.LIMIT // 2]:
                del table[key]


_SIGHTINGS = _Sightings()


def renew_interval(lease_seconds: float) -> float:
    """How often a keeper renews a lease of ``lease_seconds``."""
    return min(lease_seconds / 3, RENEW_EVERY_MAX)


def unrenewed_span(effect: Effect) -> float:
    """How long a lease must be seen un-renewed before it counts as lapsed: a live keeper
    renews every ``renew_interval`` of its monotonic time; half as much again is the margin
    for a late wake-up and a slow write. The lease's length is not stored; its end minus
    the claim's time (``updated_at``: renewals do not touch it) is at least that length."""
    lease = (effect.lease_expires_at or 0.0) - effect.updated_at
    if lease <= 0:
        lease = 3 * RENEW_EVERY_MAX  # the clock stepped back since the claim: the longest
    return 1.5 * renew_interval(lease)


def lease_lapsed(effect: Effect, clock: Clock, now: float | None = None) -> bool:
    """Whether the lease of a STARTED ``effect`` (as read) has run out.

    Its end must have passed on the ledger's clock, and this process must have seen that
    same lease (same claim, same end) for ``unrenewed_span`` of its own monotonic time. A
    forward step of the ledger's clock (this host's, or the database server's after a
    resync) moves every lease's end into the past at once; the second condition keeps
    that from expiring a live call, because its keeper renews meanwhile and the lease we
    read next is another one. Every read counts as a sighting, so a caller that has been
    watching a lease since before it ended judges it as soon as it ends."""
    end = effect.lease_expires_at
    if end is None:
        return False
    unrenewed = _SIGHTINGS.since(clock, ("lease", effect.id, effect.fence), end)
    if end > (clock.now() if now is None else now):
        return False
    return unrenewed >= unrenewed_span(effect)


def wait_over(clock: Clock, key: Any, until: float, now: float, longest: float) -> bool:
    """Whether a wait written to end at ``until`` (a probe's pause, a probe claim) is over
    at ``now``, both on the ledger's clock.

    A wait that ends further ahead than such a wait ever lasts (``longest``) was written
    by a clock that has since stepped back (this host's, or a reconciler's that ran an hour
    ahead): it is counted instead on this process's monotonic clock, from when it first saw
    it, for ``longest`` — not the hour the step put in the way."""
    if until <= now:
        return True
    if until - now <= longest:
        return False
    return _SIGHTINGS.since(clock, ("wait", key), until) >= longest


def note_stopped(clock: Clock, effect_id: str, attempt: int) -> None:
    """This process saw attempt ``attempt`` of the effect stop (its lease expired)."""
    _SIGHTINGS.note(clock, ("stopped", effect_id, attempt), None)


def stopped_for(clock: Clock, effect_id: str, attempt: int) -> float:
    """Monotonic seconds since this process first knew the attempt had stopped (0 now)."""
    return _SIGHTINGS.since(clock, ("stopped", effect_id, attempt), None)


@dataclass(slots=True)
class _Held:
    fence: int
    owner: str
    lease_seconds: float
    renew_at: float  # monotonic time: a step of the wall clock must not delay a renewal
    until: float  # the lease end last written: a renewal never moves it back (see _renew)
    lost: bool = False


class LeaseKeeper:
    """Renews the leases of this process's running attempts from one background thread.

    A lease is renewed once a third of it has passed (at least every ``RENEW_EVERY_MAX``
    seconds), on this clock's monotonic time, so a live handler's lease never runs out,
    whatever the wall clock does; the thread sleeps while nothing is due, and exits while
    nothing is held."""

    def __init__(self, ledger: Ledger, clock: Clock) -> None:
        self.ledger = ledger
        self.clock = clock
        self._reset()
        forksafe.register(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._sleep_until = 0.0  # monotonic time the thread sleeps until
        self._closed = False

    def after_fork(self) -> None:
        self._reset()  # the parent's running attempts are not running here

    def _monotonic(self) -> float:
        return monotonic_of(self.clock)

    def hold(self, effect_id: str, fence: int, owner: str, lease_seconds: float) -> None:
        renew_at = self._monotonic() + renew_interval(lease_seconds)
        # This process just wrote this claim's lease: a judge in this process counts its
        # un-renewed time from now (lease_lapsed).
        _SIGHTINGS.note(self.clock, ("lease", effect_id, fence))
        # Under the lock, with the thread's choice of how long to sleep: without it, the
        # thread could pick its sleep from _held before this entry, and then clear the
        # wake-up this sets, sleeping past this lease's renewal.
        with self._lock:
            until = self.clock.now() + lease_seconds  # what the claim just wrote, or more
            self._held[effect_id] = _Held(fence, owner, lease_seconds, renew_at, until)
            start = self._thread is None
            if not start and renew_at < self._sleep_until:
                self._wake.set()  # it sleeps past this lease's renewal
        if start:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="openonce-leases", daemon=True
                )
                self._thread.start()

    def release(self, effect_id: str) -> None:
        self._held.pop(effect_id, None)

    def owns(self, effect_id: str) -> bool:
        """False once a renewal found the claim taken over."""
        held = self._held.get(effect_id)
        return held is not None and not held.lost

    def renew_now(self, effect_id: str) -> bool:
        """Renew this attempt's lease at once; False if the claim is no longer ours."""
        held = self._held.get(effect_id)
        if held is None or held.lost:
            return False
        return self._renew(effect_id, held)

    def renew_due(self) -> int:
        """Renew every lease due now (the background thread does this on its own)."""
        mono = self._monotonic()
        due = [(i, h) for i, h in list(self._held.items()) if not h.lost and h.renew_at <= mono]
        for effect_id, held in due:
            self._renew(effect_id, held)
        return len(due)

    def _renew(self, effect_id: str, held: _Held) -> bool:
        # Never an earlier end than the last one written, and always a new one. A judge
        # reads the lease's length as its end minus the claim's time (unrenewed_span): after
        # a backward step of the clock, now + lease would shorten that reading, and a judge
        # would give the keeper less time than it takes to renew. And a judge sees a
        # renewal only as a changed end, so an end held back still moves a little.
        until = max(self.clock.now() + held.lease_seconds, held.until + 0.001)
        # The next renewal counts from this one's start, read with its end: read after the
        # write, time that passed during it (a slow disk, or a test's clock moved once it saw
        # the new end) would push the next renewal a whole interval past its due time.
        mono = self._monotonic()
        try:
            ok = self.ledger.renew_lease(effect_id, held.fence, held.owner, until)
        except Exception:
            # The ledger is unreachable: try again soon; the lease still has two thirds left.
            held.renew_at = self._monotonic() + min(5.0, held.lease_seconds / 10)
            return False
        if ok:
            held.until = until
            held.renew_at = mono + renew_interval(held.lease_seconds)
            _SIGHTINGS.note(self.clock, ("lease", effect_id, held.fence), until)
        else:
            held.lost = True  # someone took it over: the handler's result is only evidence
        return ok

    def _run(self) -> None:
        while not self._closed:
            self.renew_due()
            with self._lock:
                if not self._held:
                    # A hold takes the lock too: it either came before this (and _held is
                    # not empty) or comes after, finds _thread None and starts one.
                    self._thread = None
                    return
                live = [h.renew_at for h in list(self._held.values()) if not h.lost]
                self._sleep_until = min(live) if live else self._monotonic() + 1.0
                self._wake.clear()
            self.clock.wait(self._wake, max(0.0, self._sleep_until - self._monotonic()))
        with self._lock:
            self._thread = None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for a renewal in flight: the store closes its
        connections next, and closing one another thread is using can crash the driver."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
