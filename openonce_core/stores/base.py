"""The protocol every ledger store implements, and the in-process wake-up board.

Stores persist; they do not decide. Every rule lives in the core, and only one module of
it writes: :class:`openonce_core._ledger.Ledger`, which checks each move against the state
table and then asks a store for a *conditional* change — ``update`` applies only if the
effect is still in one of the expected states with the expected fence, and writes its
journal lines (and approval, if any) in the same transaction. A store never changes state
on its own, and nothing but the Ledger calls its write methods.

Stores are safe under ``fork``: a child process never uses a connection, pool, lock or
thread it inherited (see ``forksafe.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .._clock import Clock, ClockUnavailableError
from .._records import Approval, Effect, JournalEntry
from ._wake import WakeBoard
from .sql import Cutoff, ReplayRow


class Store(Protocol):
    dialect: str  # "memory", "sqlite" or "postgres"
    clock: Clock  # the ledger's time source (the database's clock on Postgres)
    # What the store raises when the ledger cannot be reached or written right now (the
    # database down, a dropped connection, a lock or pool wait that timed out), as opposed
    # to a refusal of the data. Before a handler runs, these become LedgerUnavailableError.
    unavailable: tuple[type[BaseException], ...]

    # ``migrate`` returns the ledger's version after it: above SCHEMA_VERSION when a newer
    # OpenOnce migrated the ledger and this one may still use it (then it changes nothing).
    def migrate(self) -> int: ...
    def schema_version(self) -> int: ...
    # The oldest code version that may use the ledger, as it records it (openonce_schema.
    # readable_from; the ledger's own version where it records none): _schema.require_usable.
    def schema_readable_from(self) -> int: ...

    # -- reads ----------------------------------------------------------------------------
    def get(self, effect_id: str) -> Effect | None: ...
    def find(self, tool: str, idempotency_key: str) -> Effect | None: ...
    def find_replay(self, tool: str, idempotency_key: str) -> ReplayRow | None: ...
    def get_many(self, effect_ids: Sequence[str]) -> list[Effect]: ...
    def journal(self, effect_id: str) -> list[JournalEntry]: ...
    def approvals(self, effect_id: str) -> list[Approval]: ...
    def list_effects(
        self, states: Iterable[str] | None = None, limit: int = 100
    ) -> list[Effect]: ...
    def expired_leases(self, at: float, limit: int = 100) -> list[Effect]: ...
    def started_by(self, owner_prefix: str, limit: int = 100) -> list[Effect]: ...
    # What is due: UNKNOWN effects past their grace or backoff (``openonce_core._due`` is
    # the rule; these are the index ranges it reads, ``sql.SQLStore`` documents each).
    def fresh_unknown_tools(self) -> list[str]: ...
    def fresh_unknown(
        self, cutoffs: Sequence[Cutoff], limit: int, after: tuple[float, str] | None = None
    ) -> list[Effect]: ...
    def count_fresh_unknown(self, cutoffs: Sequence[Cutoff]) -> int: ...
    def backoff_unknown(
        self, at: float, limit: int, after: tuple[float, str] | None = None
    ) -> list[Effect]: ...
    def count_backoff_unknown(self, at: float) -> int: ...
    def unknown_changed_after(
        self, at: float, limit: int, after: tuple[float, str] | None = None
    ) -> list[Effect]: ...
    def count(self, states: Iterable[str]) -> int: ...
    def count_by_state(self) -> dict[str, int]:
        """How many effects are in each state (states with none are left out). Reads every
        row: for a one-off look, never for a loop (``/metrics`` counts ``count`` per
        pending state)."""
        ...

    def oldest_change(self, state: str) -> float | None:
        """When the longest-waiting effect in ``state`` last changed, or None."""
        ...

    def has_journal_line(self, entry: JournalEntry) -> bool: ...
    def committed_receipts_naming(
        self,
        tool_prefix: str,
        field: str,
        value: str | int,
        scope: Sequence[tuple[str, Any]] = (),
        *,
        exclude: str = "",
        limit: int = 5,
        loose: bool = False,
    ) -> list[Effect]:
        """COMMITTED effects (not ``exclude``) whose receipt's ``field`` is ``value``: who
        already holds the provider object a person's receipt names (``sql.SQLStore``;
        ``loose``: however the value is spelt)."""
        ...

    # -- writes (only openonce_core._ledger.Ledger calls these) -------------------------------
    def insert(self, effect: Effect, entries: Sequence[JournalEntry]) -> bool:
        """Create ``effect`` with its first journal line(s), unless its key is taken."""
        ...

    def insert_or_find(
        self, effect: Effect, entries: Sequence[JournalEntry]
    ) -> tuple[bool, ReplayRow | None]:
        """``insert``, or else what holds the key — in one round trip where the database
        can (Postgres). ``(True, None)``: inserted; ``(False, row)``: the key's effect;
        ``(False, None)``: taken by a write this statement could not see yet (read again)."""
        ...

    def update(
        self,
        effect_id: str,
        expect_states: Sequence[str],
        expect_fence: int,
        changes: dict[str, Any],
        entries: Sequence[JournalEntry],
        approval: Approval | None = None,
    ) -> bool: ...
    def append_journal(self, entry: JournalEntry) -> None: ...
    def renew(self, effect_id: str, fence: int, owner: str, until: float) -> bool: ...
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


def ledger_errors(store: Any) -> tuple[type[BaseException], ...]:
    """``store.unavailable`` (nothing for a store that does not say), and on any store a
    database clock not read yet: no ledger time to write with."""
    return (*getattr(store, "unavailable", ()), ClockUnavailableError)


class Watch:
    """Waits for changes to one effect. Register *before* reading the state, so a commit
    that lands between the read and the wait still wakes us.

    ``poll`` bounds each wait for stores that cannot always be woken across processes
    (SQLite; Postgres while its listener reconnects): another process's commit is then
    seen within ``poll`` seconds."""

    def __init__(
        self,
        board: WakeBoard,
        effect_id: str,
        clock: Clock,
        poll: float | None = None,
        on_close: Any = None,
    ) -> None:
        self.board = board
        self.effect_id = effect_id
        self.clock = clock
        self.poll = poll
        self._on_close = on_close
        self._ev = board.register(effect_id)

    def wait(self, timeout: float) -> None:
        """Return when the effect may have changed, or after ``timeout`` (clock time); the
        caller re-reads it either way. With ``poll``, also after ``poll`` real seconds."""
        if self.poll is not None:
            self._ev.wait(min(max(0.0, timeout), self.poll))
        else:
            self.clock.wait(self._ev, timeout)
        self._ev.clear()

    def close(self) -> None:
        self.board.unregister(self.effect_id, self._ev)
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
