"""The ledger's time source: one clock for every lease, grace window, backoff and expiry.

Leases are judged by comparing a time written by one host with the time another host
reads. If each used its own ``time.time()``, a reconciler whose clock runs five minutes
fast would see every healthy call's lease as expired (invariant 8). So the time that goes
into the ledger comes from one place per ledger: the database's own clock on Postgres
(:class:`DatabaseClock`), this host's clock for the embedded SQLite and in-memory stores
(:class:`SystemClock`), or a clock a test moves by hand (:class:`FakeClock`, also in
``openonce_core.testing``).

Wall clocks step (NTP corrections, a VM resumed, an operator's ``date -s``, the database
server's clock on Postgres). A step must not make a live lease look expired, so every
clock also has a ``monotonic()`` time that never steps: the lease keeper renews on it, and
whoever expires a lease first watches it go un-renewed for a while of its own monotonic
time (``leases.lease_lapsed``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, on the ledger's time base."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (only differences mean anything)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of this clock's time pass."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait until ``event`` is set (True) or ``timeout`` of this clock's time passed."""
        ...


class SystemClock:
    """This host's wall clock: right for a ledger that only this host writes (SQLite)."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


# What ``clock=`` takes: a Clock, or a zero-argument callable returning epoch seconds
# (``time.time``, a test's ``lambda: now[0]``), as the seed implementation did.
ClockLike = Clock | Callable[[], float]


class CallableClock(SystemClock):
    """A zero-argument callable as the ledger's wall time (``now``).

    A callable gives wall time only. Durations — how long to wait for an in-flight
    duplicate, when to renew a lease, how long a lease has gone un-renewed — are counted
    on this host's monotonic clock, as with :class:`SystemClock`: a callable that stands
    still (a test's lambda) must not make those waits last for ever. To move leases and
    waits by hand in a test, pass a :class:`FakeClock`."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read

    def now(self) -> float:
        return _epoch_seconds(self._read(), self._read)

    def __repr__(self) -> str:
        return f"CallableClock({self._read!r})"


def as_clock(clock: ClockLike | None) -> Clock | None:
    """``clock`` as a :class:`Clock`: a Clock (anything with ``now()``) as it is, a
    zero-argument callable wrapped in a :class:`CallableClock`, None as None.

    Anything else is refused now, with what to pass, rather than failing at the first
    call; a callable is read once here so one that returns no number is refused too."""
    if clock is None:
        return None
    if isinstance(clock, type):
        raise TypeError(
            f"clock={clock.__name__}: pass an instance ({clock.__name__}()) or a"
            " zero-argument callable returning epoch seconds, such as time.time"
        )
    if callable(getattr(clock, "now", None)):
        return clock  # type: ignore[return-value]
    if not callable(clock):
        raise TypeError(
            f"clock={clock!r}: pass a Clock (an object with now(), such as"
            " openonce_core.testing.FakeClock()) or a zero-argument callable returning"
            " epoch seconds, such as time.time"
        )
    try:
        reading = clock()
    except TypeError as exc:
        raise TypeError(
            f"clock={clock!r} cannot be called without arguments ({exc}); pass a"
            " zero-argument callable returning epoch seconds, such as time.time"
        ) from None
    _epoch_seconds(reading, clock)
    return CallableClock(clock)


def _epoch_seconds(value: object, read: Callable[[], float]) -> float:
    # bool is an int, and no time; NaN or infinity would make every lease end never.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(
            f"clock={read!r} returned {value!r}; a clock callable returns epoch seconds"
            " (a finite int or float), as time.time does"
        )
    return float(value)


def monotonic_of(clock: Clock) -> float:
    """``clock.monotonic()``; this host's monotonic clock for a clock written before
    clocks had one."""
    read = getattr(clock, "monotonic", None)
    return read() if read is not None else time.monotonic()


class ClockUnavailableError(RuntimeError):
    """The database's clock could not be read yet: no ledger time exists to write."""


class DatabaseClock(SystemClock):
    """The database server's clock, read now and then and followed in between with this
    host's monotonic clock (so it costs no round trip per call, and a host whose wall clock
    is wrong or jumps still reads the database's time).

    ``read`` returns the database's current epoch time (``clock_timestamp()``). It is
    called again every ``resync_seconds`` to absorb drift; if it fails, the last anchor
    keeps being followed. Until the first reading succeeds there is no ledger time at all:
    ``now()`` raises :class:`ClockUnavailableError` (and reads again on the next call)
    rather than invent one from this host's clock, which may be minutes off — a lease
    written on it could end in the database's past, and its call run twice."""

    def __init__(self, read: Callable[[], float], *, resync_seconds: float = 60.0) -> None:
        self._read = read
        self.resync_seconds = resync_seconds
        self._lock = threading.Lock()
        self._anchor: tuple[float, float] | None = None  # (database time, monotonic)
        self._next_sync = 0.0  # monotonic

    def now(self) -> float:
        anchor = self._anchor
        if anchor is None or time.monotonic() >= self._next_sync:
            anchor = self._sync()
        return anchor[0] + (time.monotonic() - anchor[1])

    @property
    def offset(self) -> float:
        """How far this host's wall clock is behind the database's (seconds)."""
        return self.now() - time.time()

    def _sync(self) -> tuple[float, float]:
        with self._lock:
            anchor = self._anchor
            if anchor is not None and time.monotonic() < self._next_sync:
                return anchor  # another thread just synced
            before = time.monotonic()
            try:
                db_time = self._read()
            except Exception as exc:
                if anchor is None:
                    # Nothing to follow yet: fail this caller's write; the next call reads
                    # again (the statement it wanted to run would fail just the same).
                    raise ClockUnavailableError(
                        f"cannot read the database's clock ({exc!r}); OpenOnce does not"
                        " write ledger times from this host's clock"
                    ) from exc
                # Keep following the last reading, and try the database again shortly.
                self._next_sync = time.monotonic() + min(5.0, self.resync_seconds)
                return anchor
            after = time.monotonic()
            # The reading was taken somewhere in [before, after]: assume the middle.
            anchor = self._anchor = (db_time, (before + after) / 2)
            self._next_sync = after + self.resync_seconds
            return anchor

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "DatabaseClock()"


class FakeClock:
    """A clock a test moves by hand: ``clock.advance(301)`` and every lease, grace window,
    approval expiry and backoff sees five minutes pass, at once, on a loaded machine too.

    ``sleep`` advances the clock by the time slept (the sleeper's wait passes at once and
    everybody sees the new time). ``wait`` returns when the event is set, or when somebody
    advanced the clock past its timeout.

    Time passing (``advance``, ``sleep``) moves both the wall time (``now``) and the
    monotonic time; a clock *step* (``step``, ``set``) moves only the wall time, as an NTP
    correction or ``date -s`` does: no time passed, and waits do not end."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now = float(start)
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not run backwards; use step() or set() to jump")
        with self._lock:
            self._now += seconds
            self._mono += seconds
            return self._now

    def step(self, seconds: float) -> float:
        """Step the wall time by ``seconds`` (either way) while no time passes."""
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, at: float) -> None:
        """Step the wall time to ``at`` (no time passes)."""
        with self._lock:
            self._now = float(at)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        deadline = self._mono + max(0.0, timeout)
        # The event is set by another thread (a commit, a stop request): event.wait returns
        # at once then. The deadline moves only when the test advances the clock, which is
        # looked at in real time: every 2 ms while it moves, less often (up to 50 ms) while
        # it stands still. A thread a test left waiting (a lease keeper of a client never
        # closed) must not wake 500 times a second for ever: a hundred of them starved the
        # rest of the suite of the interpreter lock.
        pause, seen = 0.002, self._mono
        while not event.is_set():
            if self._mono >= deadline:
                return False
            if self._mono != seen:
                pause, seen = 0.002, self._mono
            event.wait(pause)
            pause = min(pause * 2, 0.05)
        return True

    def __repr__(self) -> str:
        return f"FakeClock({self._now!r})"
