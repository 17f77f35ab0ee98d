"""In-process wake-ups: a waiter on an effect is woken the moment a commit changes it."""

from __future__ import annotations

import threading


class WakeBoard:
    """Wakes in-process waiters the moment an effect changes, instead of polling."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}

    def register(self, effect_id: str) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            self._waiters.setdefault(effect_id, set()).add(ev)
        return ev

    def unregister(self, effect_id: str, ev: threading.Event) -> None:
        with self._lock:
            evs = self._waiters.get(effect_id)
            if evs is not None:
                evs.discard(ev)
                if not evs:
                    del self._waiters[effect_id]

    def wake(self, effect_id: str) -> None:
        # Runs after every commit on the hot path: one dict lookup when nobody waits.
        if self._waiters.get(effect_id):
            with self._lock:
                for ev in self._waiters.get(effect_id, ()):
                    ev.set()

    def waiting(self) -> list[str]:
        with self._lock:
            return list(self._waiters)

    def wake_all(self) -> None:
        with self._lock:
            for evs in self._waiters.values():
                for ev in evs:
                    ev.set()

    def after_fork(self) -> None:
        # The parent's waiters are not in this process; its lock may have been held.
        self._lock = threading.Lock()
        self._waiters = {}
