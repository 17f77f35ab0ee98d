"""A ledger that cannot be reached before the handler runs is a "nothing ran" error.

The database down, a dropped connection, a lock or pool wait that timed out: before the
claim is written, the handler has not run and nothing was sent. The agent's loop gets a
``LedgerUnavailableError`` (a ``NothingRanError``), never a raw driver error that fits
neither of its two ``except`` clauses; the same call runs once when the ledger is back.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from openonce_core import LedgerUnavailableError, NothingRanError, OpenOnce, SQLiteStore

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_locked_sqlite_ledger_refuses_the_call_and_runs_it_once_when_free(tmp_path):
    path = str(tmp_path / "ledger.db")
    store = SQLiteStore(path, busy_timeout=0.2)
    store.migrate()
    oo = OpenOnce(store)
    runs: list[str] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge: f"refund-{charge}")
    def refund(charge: str) -> dict[str, str]:
        runs.append(charge)
        return {"id": "re_1"}

    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(LedgerUnavailableError) as refused:
            refund("ch_1")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert isinstance(refused.value, NothingRanError)
    assert "stripe.refund" in str(refused.value) and "OperationalError" in str(refused.value)
    assert runs == []
    assert refund("ch_1") == {"id": "re_1"}
    assert refund("ch_1") == {"id": "re_1"}
    assert runs == ["ch_1"]
    oo.close()


@pytest.mark.postgres
def test_a_postgres_ledger_gone_refuses_the_call_and_nothing_runs(pg_dsn):
    from openonce_core.stores.postgres import PostgresStore

    sys.path.insert(0, str(BENCH))
    try:
        from soak_proxy import PgProxy
    finally:
        sys.path.remove(str(BENCH))
    parts = urlsplit(pg_dsn)
    proxy = PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    via = parts._replace(netloc=f"{parts.username or 'root'}@127.0.0.1:{proxy.port}")
    query = parts.query + ("&" if parts.query else "") + "sslmode=disable&gssencmode=disable"
    store = PostgresStore(urlunsplit(via._replace(query=query)), timeout=1.0)
    store.migrate()
    oo = OpenOnce(store)
    runs: list[str] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge: f"refund-{charge}")
    def refund(charge: str) -> dict[str, str]:
        runs.append(charge)
        return {"id": f"re_{charge}"}

    assert refund("ch_0") == {"id": "re_ch_0"}
    proxy.stop()  # the database is gone: every connection cut, no new one accepted
    with pytest.raises(LedgerUnavailableError) as refused:
        refund("ch_1")
    assert isinstance(refused.value, NothingRanError)
    with pytest.raises(LedgerUnavailableError):
        refund("ch_0")  # a replay read fails the same way
    assert runs == ["ch_0"]
    oo.close()
    direct = OpenOnce(PostgresStore(pg_dsn))
    assert [e.idempotency_key for e in direct.store.list_effects()] == ["refund-ch_0"]
    direct.close()


def test_an_identifier_too_long_to_index_is_bad_input_on_every_store(store):
    # Postgres cannot index a b-tree entry over ~2.7 kB: a long scope or key failed there
    # alone, as "the ledger could not be reached". It is refused alike everywhere, as the
    # argument it is, before anything is written.
    from openonce_core import InvalidArgumentsError
    from openonce_core._keys import MAX_IDENTIFIER_BYTES

    oo = OpenOnce(store)
    runs: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda key: key)
    def send(key: str) -> str:
        runs.append(key)
        return "sent"

    longest = "é" * (MAX_IDENTIFIER_BYTES // 2)  # two bytes each: exactly the limit
    assert send(longest) == "sent"
    with pytest.raises(InvalidArgumentsError, match=r"idempotency_key.*at most 1024"):
        send(longest + "x")
    with pytest.raises(InvalidArgumentsError, match=r"scope.*at most 1024"), oo.scope("r" * 3000):
        pass
    with oo.scope("r" * MAX_IDENTIFIER_BYTES) as scope:
        assert len(scope) == MAX_IDENTIFIER_BYTES
    assert runs == [longest]
    assert [e.idempotency_key for e in oo.store.list_effects()] == [longest]
