"""Ledger stores: in-memory (tests), SQLite (embedded default), Postgres (production)."""

from __future__ import annotations

from typing import Any

from ..clock import Clock
from .base import Store, Watch
from .sqlite import InMemoryStore, SQLiteStore

__all__ = ["InMemoryStore", "PostgresStore", "SQLiteStore", "Store", "Watch", "open_store"]


def __getattr__(name: str) -> Any:
    # Postgres support is an extra (``openonce[postgres]``): import psycopg only on demand.
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(name)


def open_store(target: str, *, clock: Clock | None = None) -> Store:
    """``":memory:"``, a ``postgresql://`` DSN, or a SQLite file path. ``clock`` replaces the
    store's own time source (tests pass a FakeClock)."""
    if type(target) is not str or not target:
        raise ValueError("give a SQLite path, a postgresql:// DSN, ':memory:' or a Store")
    if target == ":memory:":
        return InMemoryStore(clock=clock)
    if target.startswith(("postgresql://", "postgres://")) or (
        "=" in target and "dbname" in target
    ):
        from .postgres import PostgresStore

        return PostgresStore(target, clock=clock)
    scheme, sep, _ = target.partition("://")
    if sep and scheme.replace("+", "").replace(".", "").replace("-", "").isalnum():
        # "memory://" or "sqlite:///x.db" would otherwise become a file named "memory:".
        raise ValueError(
            f"{target!r}: {scheme}:// is not a store; give a SQLite path (ledger.db),"
            " a postgresql:// DSN or ':memory:'"
        )
    return SQLiteStore(target, clock=clock)
