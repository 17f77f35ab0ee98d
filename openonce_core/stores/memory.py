"""A process-local store for tests and throwaway runs. Loses everything on exit."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ..records import Approval, Effect, JournalEntry
from ..schema import SCHEMA_VERSION
from ..states import EffectState
from .base import WakeBoard, Watch


class InMemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._effects: dict[str, Effect] = {}
        self._by_key: dict[tuple[str, str], str] = {}
        self._journal: list[JournalEntry] = []
        self._approvals: list[Approval] = []
        self.board = WakeBoard()

    def migrate(self) -> int:
        return SCHEMA_VERSION

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def get(self, effect_id: str) -> Effect | None:
        return self._effects.get(effect_id)

    def find(self, tool: str, idempotency_key: str) -> Effect | None:
        effect_id = self._by_key.get((tool, idempotency_key))
        return self._effects.get(effect_id) if effect_id else None

    def insert(self, effect: Effect, entry: JournalEntry) -> bool:
        with self._lock:
            key = (effect.tool, effect.idempotency_key)
            if key in self._by_key:
                return False
            self._effects[effect.id] = effect
            self._by_key[key] = effect.id
            self._append(entry)
        return True

    def update(
        self,
        effect_id: str,
        expect_states: Sequence[str],
        expect_fence: int,
        changes: dict[str, Any],
        entry: JournalEntry,
        approval: Approval | None = None,
    ) -> bool:
        with self._lock:
            current = self._effects.get(effect_id)
            if current is None or current.state not in expect_states:
                return False
            if current.fence != expect_fence:
                return False
            updated = dataclasses.replace(current, **changes)
            self._effects[effect_id] = updated
            if updated.state == EffectState.RELEASED:
                self._by_key.pop((current.tool, current.idempotency_key), None)
            self._append(entry)
            if approval is not None:
                self._approvals.append(approval)
        self.board.wake(effect_id)
        return True

    def append_journal(self, entry: JournalEntry) -> None:
        with self._lock:
            self._append(entry)

    def _append(self, entry: JournalEntry) -> None:
        self._journal.append(dataclasses.replace(entry, seq=len(self._journal) + 1))

    def journal(self, effect_id: str) -> list[JournalEntry]:
        return [e for e in self._journal if e.effect_id == effect_id]

    def approvals(self, effect_id: str) -> list[Approval]:
        return [a for a in self._approvals if a.effect_id == effect_id]

    def list_effects(self, states: Iterable[str] | None = None, limit: int = 100) -> list[Effect]:
        wanted = set(states) if states is not None else None
        rows = [e for e in self._effects.values() if wanted is None or e.state in wanted]
        rows.sort(key=lambda e: (e.created_at, e.id))
        return rows[:limit]

    def expired_leases(self, at: float, limit: int = 100) -> list[Effect]:
        rows = [
            e
            for e in self._effects.values()
            if e.state == EffectState.STARTED
            and e.lease_expires_at is not None
            and e.lease_expires_at <= at
        ]
        return sorted(rows, key=lambda e: e.lease_expires_at or 0)[:limit]

    def due_unknown(
        self, before: float, limit: int = 100, after: tuple[float, str] | None = None
    ) -> list[Effect]:
        rows = [
            e
            for e in self._effects.values()
            if e.state == EffectState.UNKNOWN
            and e.updated_at <= before
            and (after is None or (e.updated_at, e.id) > after)
        ]
        return sorted(rows, key=lambda e: (e.updated_at, e.id))[:limit]

    def get_many(self, effect_ids: Sequence[str]) -> list[Effect]:
        return [e for e in (self._effects.get(i) for i in effect_ids) if e is not None]

    def count(self, states: Iterable[str]) -> int:
        wanted = set(states)
        return sum(1 for e in self._effects.values() if e.state in wanted)

    def count_by_state(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in self._effects.values():
            counts[str(e.state)] = counts.get(str(e.state), 0) + 1
        return counts

    def oldest_change(self, state: str) -> float | None:
        times = [e.updated_at for e in self._effects.values() if e.state == state]
        return min(times) if times else None

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
        claimed = []
        with self._lock:
            for effect_id in effect_ids:
                e = self._effects.get(effect_id)
                if e is None or e.state != EffectState.UNKNOWN:
                    continue
                if expect_fence is not None and e.fence != expect_fence:
                    continue
                free = e.lease_expires_at is None or e.lease_expires_at <= at
                if not free and e.lease_owner not in steal_from:
                    continue
                self._effects[effect_id] = dataclasses.replace(
                    e, lease_owner=owner, lease_expires_at=until, fence=e.fence + 1
                )
                claimed.append(effect_id)
        return claimed

    def watch(self, effect_id: str) -> Watch:
        return Watch(self.board, effect_id)

    def close(self) -> None:
        pass
