"""Ledger stores: in-memory (tests), SQLite (embedded default), Postgres (production)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._clock import ClockLike, as_clock
from .base import Store, Watch
from .sqlite import InMemoryStore, SQLiteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore as PostgresStore

# PostgresStore is left out: ``import *`` reads every listed name, and without the
# ``openonce[postgres]`` extra reading it fails. ``from ... import PostgresStore`` works.
__all__ = ["InMemoryStore", "SQLiteStore", "Store", "Watch", "open_store"]


def __getattr__(name: str) -> Any:
    # Postgres support is an extra (``openonce[postgres]``): import psycopg only on demand.
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(target: str, *, clock: ClockLike | None = None) -> Store:
    """``":memory:"``, a ``postgresql://`` DSN, or a SQLite file path. ``clock`` replaces the
    store's own time source (tests pass a FakeClock; a zero-argument callable such as
    ``time.time`` is taken as the wall time)."""
    if type(target) is not str or not target:
        raise ValueError("give a SQLite path, a postgresql:// DSN, ':memory:' or a Store")
    ledger_clock = as_clock(clock)
    if target == ":memory:":
        return InMemoryStore(clock=ledger_clock)
    if target.startswith(("postgresql://", "postgres://")) or (
        "=" in target and "dbname" in target
    ):
        from .postgres import PostgresStore

        return PostgresStore(target, clock=ledger_clock)
    scheme, sep, _ = target.partition("://")
    if sep and scheme.replace("+", "").replace(".", "").replace("-", "").isalnum():
        # "memory://" or "sqlite:///x.db" would otherwise become a file named "memory:".
        raise ValueError(_not_a_store(target, scheme))
    return SQLiteStore(target, clock=ledger_clock)


def _not_a_store(target: str, scheme: str) -> str:
    """Why a URL is refused, and what to pass instead.

    ``sqlite:///ledger.db`` (SQLAlchemy's spelling) is refused, not translated: the
    console's ``OPENONCE_DATABASE`` takes the same value as the library and refuses URLs
    too, so one ledger has one spelling everywhere."""
    if scheme.lower().startswith("sqlite"):
        path = _sqlalchemy_sqlite_path(target)
        if path is not None:
            return (
                f"{target!r}: a sqlite:// URL is not a store name here; pass the SQLite"
                f" file's path itself: {path!r}"
            )
        return (
            f"{target!r}: a sqlite:// URL is not a store name here; pass the SQLite file's"
            " path itself (ledger.db, /var/lib/openonce/ledger.db) or ':memory:'"
        )
    return (
        f"{target!r}: {scheme}:// is not a store; give a SQLite path (ledger.db),"
        " a postgresql:// DSN or ':memory:'"
    )


def _sqlalchemy_sqlite_path(url: str) -> str | None:
    """The path SQLAlchemy reads from ``sqlite:///relative.db``, ``sqlite:////abs.db`` or
    ``sqlite://`` (memory); None for a URL with a host or options."""
    _, _, rest = url.partition("://")
    if rest == "":
        return ":memory:"
    if not rest.startswith("/") or "?" in rest or len(rest) == 1:
        return None
    return rest[1:]
