"""Store fixtures: the behavioural suite runs on every store.

Postgres is required, never skipped: set OPENONCE_TEST_PG (``make test`` does) to a
database the tests may create schemas in. Each test gets a schema of its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pytest

from openonce_core import InMemoryStore, SQLiteStore, Store
from openonce_core.testing import FakeClock

PG_DSN = os.environ.get("OPENONCE_TEST_PG", "postgresql://root@127.0.0.1:5432/test")
STORES = ["memory", "sqlite", "postgres"]
DURABLE_STORES = ["sqlite", "postgres"]


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped afterwards."""
    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in PG_DSN else "?"
    yield f"{PG_DSN}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


def make_target(kind: str, tmp_path, request) -> str:
    """A target string (path or DSN) for a store kind; schema is left uninstalled."""
    if kind == "memory":
        return ":memory:"
    if kind == "sqlite":
        return str(tmp_path / "ledger.db")
    return request.getfixturevalue("pg_dsn")


@pytest.fixture
def clock() -> FakeClock:
    """The ledger's time, moved by the test (``clock.advance(301)``) instead of slept."""
    return FakeClock()


@pytest.fixture(params=STORES)
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def store(store_kind, tmp_path, request) -> Iterator[Store]:
    if store_kind == "memory":
        s: Store = InMemoryStore()
    elif store_kind == "sqlite":
        s = SQLiteStore(str(tmp_path / "ledger.db"))
    else:
        from openonce_core.stores.postgres import PostgresStore

        s = PostgresStore(request.getfixturevalue("pg_dsn"), max_size=20)
    s.migrate()
    yield s
    s.close()


@pytest.fixture(params=DURABLE_STORES)
def durable_target(request, tmp_path) -> str:
    """A SQLite path or a Postgres DSN with the schema installed, for multi-process tests."""
    target = make_target(request.param, tmp_path, request)
    from openonce_core import open_store

    s = open_store(target)
    s.migrate()
    s.close()
    return target
