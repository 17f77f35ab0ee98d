"""The protocol every ledger store implements, and the in-process wake-up board.

Stores persist; they do not decide. Every rule lives in the core, which asks a store for
*conditional* changes: ``update`` applies only if the effect is still in one of the
expected states with the expected fence, and writes the journal entry (and approval, if
any) in the same transaction. A store never changes state on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..records import Approval, Effect, JournalEntry


class Store(Protocol):
    def migrate(self) -> int: ...
    def schema_version(self) -> int: ...
    def get(self, effect_id: str) -> Effect | None: ...
    def find(self, tool: str, idempotency_key: str) -> Effect | None: ...
    def insert(self, effect: Effect, entry: JournalEntry) -> bool: ...
    def update(
        self,
        effect_id: str,
        expect_states: Sequence[str],
        expect_fence: int,
        changes: dict[str, Any],
        entry: JournalEntry,
        approval: Approval | None = None,
    ) -> bool: ...
    def append_journal(self, entry: JournalEntry) -> None: ...
    def journal(self, effect_id: str) -> list[JournalEntry]: ...
    def approvals(self, effect_id: str) -> list[Approval]: ...
    def list_effects(
        self, states: Iterable[str] | None = None, limit: int = 100
    ) -> list[Effect]: ...
    def expired_leases(self, at: float, limit: int = 100) -> list[Effect]: ...
    def due_unknown(
        self, before: float, limit: int = 100, after: tuple[float, str] | None = None
    ) -> list[Effect]: ...
    def get_many(self, effect_ids: Sequence[str]) -> list[Effect]: ...
    def count(self, states: Iterable[str]) -> int: ...
    def count_by_state(self) -> dict[str, int]:
        """How many effects are in each state (states with none are left out)."""
        ...

    def oldest_change(self, state: str) -> float | None:
        """When the longest-waiting effect in ``state`` last changed, or None."""
        ...

    def claim(
        self,
        effect_ids: Sequence[str],
        owner: str,
        until: float,
        at: float,
        *,
        steal_from: Sequence[str] = (),
        expect_fence: int | None = None,
    ) -> list[str]:
        """Mark UNKNOWN effects as being probed by ``owner`` until ``until`` (bumping the
        fence), unless a claim of someone not in ``steal_from`` is still live. Not a state
        change, so no journal line. Returns the ids claimed."""
        ...

    def watch(self, effect_id: str) -> Watch: ...
    def close(self) -> None: ...


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
        evs = self._waiters.get(effect_id)
        if evs:
            with self._lock:
                for ev in self._waiters.get(effect_id, ()):
                    ev.set()


class Watch:
    """Waits for changes to one effect. Register *before* reading the state, so a commit
    that lands between the read and the wait still wakes us.

    ``poll`` bounds each wait for stores that cannot be woken across processes (SQLite):
    another process's commit is then seen within ``poll`` seconds.
    """

    def __init__(self, board: WakeBoard, effect_id: str, poll: float | None = None) -> None:
        self.board = board
        self.effect_id = effect_id
        self.poll = poll
        self._ev = board.register(effect_id)

    def wait(self, timeout: float) -> None:
        if self.poll is not None:
            timeout = min(timeout, self.poll)
        self._ev.wait(timeout)
        self._ev.clear()

    def close(self) -> None:
        self.board.unregister(self.effect_id, self._ev)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
