"""Leases that mean something: who holds a running attempt, whether that process still
exists, and a heartbeat that keeps a live call's lease from running out.

An attempt's lease says "this process is running the handler until then". It is renewed
while the handler runs (:class:`LeaseKeeper`, fenced: a renewal after someone took the
effect over changes nothing), so a lease runs out only when its process stopped renewing
it — killed, stopped, or cut off — and the effect then becomes UNKNOWN, never a retry.

The owner names the process: ``host:pid:token``, the token telling a pid's current process
from an earlier one that had the same pid (its start time and pid namespace on Linux). A
STARTED effect owned by a process on this host that no longer exists is evidence: it
becomes UNKNOWN at once instead of after its lease (:func:`dead_owner`).
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass

from . import forksafe
from .clock import Clock
from .ledger import Ledger

HOST = socket.gethostname()


def _proc_token(pid: int) -> str | None:
    """``<pid namespace>.<start time>`` of process ``pid`` (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        namespace = os.readlink(f"/proc/{pid}/ns/pid").partition("[")[2].rstrip("]")
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3 of stat(5)); fields[19] the start time (field 22).
    if fields[0] in ("Z", "X"):
        return "dead"
    return f"{namespace}.{fields[19]}"


def process_owner() -> str:
    """This process's lease owner name."""
    pid = os.getpid()
    return f"{HOST}:{pid}:{_proc_token(pid) or '-'}"


def dead_owner(owner: str | None) -> str | None:
    """Why ``owner`` is known to be gone — a process on this host that no longer exists —
    or None when it may be alive (or runs elsewhere, or cannot be judged from here)."""
    if not owner:
        return None
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != HOST or not parts[1].isdigit():
        return None
    pid, token = int(parts[1]), parts[2]
    if token != "-":
        mine = _proc_token(os.getpid())
        if mine is not None and mine.partition(".")[0] != token.partition(".")[0]:
            return None  # another pid namespace (another container): its pids are not ours
    current = _proc_token(pid)
    if current is None:
        if os.path.exists("/proc/self/stat"):
            return f"process {pid} on {HOST} no longer exists"  # Linux: no /proc entry
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"process {pid} on {HOST} no longer exists"
        except PermissionError:
            pass  # it exists, owned by someone else
        return None
    if current == "dead":
        return f"process {pid} on {HOST} has exited"
    if token != "-" and current != token:
        return f"process {pid} on {HOST} is another process now (the owner exited)"
    return None


@dataclass(slots=True)
class _Held:
    fence: int
    owner: str
    lease_seconds: float
    renew_at: float  # clock time
    lost: bool = False


class LeaseKeeper:
    """Renews the leases of this process's running attempts from one background thread.

    A lease is renewed once a third of it has passed, so a live handler's lease never runs
    out; the thread sleeps while nothing is due, and exits while nothing is held."""

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
        self._sleep_until = 0.0  # clock time the thread sleeps until
        self._closed = False

    def after_fork(self) -> None:
        self._reset()  # the parent's running attempts are not running here

    def hold(self, effect_id: str, fence: int, owner: str, lease_seconds: float) -> None:
        # On every call: a dict store, no lock. The thread clears _thread under the lock
        # only after it saw _held empty, so a hold after that finds None and starts one.
        renew_at = self.clock.now() + lease_seconds / 3
        self._held[effect_id] = _Held(fence, owner, lease_seconds, renew_at)
        if self._thread is None:
            self._start()
        elif renew_at < self._sleep_until:
            self._wake.set()  # it sleeps past this lease's renewal

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
        now = self.clock.now()
        due = [(i, h) for i, h in list(self._held.items()) if not h.lost and h.renew_at <= now]
        for effect_id, held in due:
            self._renew(effect_id, held)
        return len(due)

    def _renew(self, effect_id: str, held: _Held) -> bool:
        now = self.clock.now()
        try:
            ok = self.ledger.renew_lease(
                effect_id, held.fence, held.owner, now + held.lease_seconds
            )
        except Exception:
            # The ledger is unreachable: try again soon; the lease still has two thirds left.
            held.renew_at = now + min(5.0, held.lease_seconds / 10)
            return False
        if ok:
            held.renew_at = now + held.lease_seconds / 3
        else:
            held.lost = True  # someone took it over: the handler's result is only evidence
        return ok

    def _run(self) -> None:
        while not self._closed:
            self.renew_due()
            with self._lock:
                if not self._held:
                    self._thread = None
                    break
                live = [h.renew_at for h in list(self._held.values()) if not h.lost]
                self._sleep_until = min(live) if live else self.clock.now() + 1.0
                self._wake.clear()
            self.clock.wait(self._wake, max(0.0, self._sleep_until - self.clock.now()))
        else:
            with self._lock:
                self._thread = None
        # A hold that read _thread just before it was cleared started no thread: look once
        # more now that it is None (a hold after this sees None and starts one itself).
        if self._held and not self._closed:
            self._start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for a renewal in flight: the store closes its
        connections next, and closing one another thread is using can crash the driver."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
