"""The retention where production breaks it: a clock that steps, two hosts with one name
sharing an archive volume, a connection dropped in the middle of a batch, and every
client behind pgbouncer in transaction pool mode."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import openonce_core._retention as retention
from openonce_core._retention import find_tombstone, import_archive, run_retention
from openonce_core.errors import EffectArchivedError
from openonce_core.stores.postgres import PostgresStore
from openonce_core.stores.sqlite import SQLiteStore
from openonce_core.testing import FakeClock
from tests.support.pgbouncer import (
    PgBouncer,
    database_behind_pgbouncer,
    reset_public_schema,
    with_database,
)
from tests.support.retention import (
    DAY,
    POLICY,
    Agent,
    age,
    archive_lines,
    dump,
    raw_connection,
    run,
    statement_held,
    stones,
)

PG_DSN = os.environ.get("OPENONCE_TEST_PG", "postgresql://root@127.0.0.1:5432/test")
YEAR = 365 * DAY


def _recent_history(store: Any) -> Agent:
    """o-old ended 91 days before the newest change; o-week a week before; o-today now."""
    agent = Agent(store, FakeClock())
    agent.refund("o-old")
    agent.clock.advance(84 * DAY)
    agent.refund("o-week")
    agent.clock.advance(7 * DAY)
    agent.refund("o-today")
    return agent


# -- a clock that steps ----------------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"], indirect=True)
def test_a_clock_stepped_a_year_ahead_archives_only_what_was_old(store, tmp_path) -> None:
    """The retention's clock (the store's: this host's on SQLite, the database server's
    on Postgres) jumps a year ahead. Ages are measured from the ledger's newest change:
    the effect of a week ago still replays instead of being refused as archived."""
    agent = _recent_history(store)
    store.clock = agent.clock  # the clock the run reads (no now= given)
    agent.clock.step(YEAR)

    report = run_retention(store, POLICY, str(tmp_path))

    assert [d["effect"]["args"]["order"] for d in archive_lines(report.archives[0])] == ["o-old"]
    assert report.clock_ahead == pytest.approx(YEAR)
    assert "365.0 day(s) past the ledger's newest change" in str(report)
    assert agent.refund("o-week") == {"refund": "re_o-week"}  # replayed, not refused
    assert agent.refund("o-today") == {"refund": "re_o-today"}
    with pytest.raises(EffectArchivedError):
        agent.refund("o-old")
    assert sorted(agent.calls) == [("refund", o) for o in ("o-old", "o-today", "o-week")]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"], indirect=True)
def test_a_clock_stepped_back_archives_nothing_new_and_loses_nothing(store, tmp_path) -> None:
    agent = _recent_history(store)
    before = dump(store)
    agent.clock.step(-YEAR)

    report = run(store, agent.clock, tmp_path)

    assert (report.effects, report.archives, report.clock_ahead) == (0, [], 0.0)
    assert dump(store) == before and stones(store) == []
    agent.clock.step(YEAR)  # set right again: the old effect goes, as it would have
    assert run(store, agent.clock, tmp_path).effects == 1


@pytest.mark.parametrize("store_kind", ["sqlite"], indirect=True)
def test_a_ledger_idle_for_a_year_keeps_its_last_activity(store, tmp_path) -> None:
    """Measured from the newest change, an idle ledger's last 90 days stay (its clock
    cannot be told from a stepped one); what was old before them goes."""
    agent = _recent_history(store)
    agent.clock.advance(YEAR)  # time really passed; nobody called
    report = run(store, agent.clock, tmp_path)
    assert report.effects == 1 and report.cutoff == agent.effect_of("o-today").updated_at - 90 * DAY


# -- two hosts with one name ------------------------------------------------------------------


def test_two_hosts_with_one_name_never_share_an_archive_file(tmp_path, monkeypatch) -> None:
    """Two containers, each with its own ledger, both host "app" and pid 1, run the
    retention in the same second into one shared volume, and draw the same name: each
    run still gets a file of its own, and importing one host's archive brings back only
    that host's effects."""
    shared = tmp_path / "archives"
    names = iter(["openonce-archive-20270101T000000Z-0000000000000001.jsonl.gz"] * 2)
    real = retention._archive_name
    monkeypatch.setattr(retention, "_archive_name", lambda: next(names, None) or real())
    hosts = []
    for host in ("a", "b"):
        store = SQLiteStore(str(tmp_path / f"{host}.db"))
        store.migrate()
        agent = Agent(store, FakeClock())
        agent.refund(f"{host}-1")
        key = agent.effect_of(f"{host}-1").idempotency_key
        age(agent)
        before = dump(store)
        report = run(store, agent.clock, shared)
        hosts.append((store, agent, key, before, report))

    (a_path,), (b_path,) = (h[-1].archives for h in hosts)
    assert a_path != b_path
    for (store, agent, key, before, _), path in zip(hosts, (a_path, b_path), strict=True):
        assert [d["effect"]["args"]["order"] for d in archive_lines(path)] == [agent.calls[0][1]]
        stone = find_tombstone(store, "stripe.refund", key)
        assert stone is not None and stone.archive == path
        assert import_archive(store, path).effects == 1
        assert dump(store) == before  # exactly its own rows back, nobody else's
        store.close()


# -- a connection dropped in the middle of a batch ----------------------------------------------


@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_a_backend_killed_mid_delete_loses_nothing(store, tmp_path, monkeypatch) -> None:
    agent = Agent(store, FakeClock())
    agent.refund("o-1")
    agent.refund("o-2")
    age(agent)
    before = dump(store)
    admin = raw_connection(store)
    original = store.retention_write

    def retention_write(work: Any) -> Any:
        def killed(cur: Any) -> Any:
            class Cur:
                dialect = cur.dialect
                all = cur.all
                run_many = cur.run_many

                def run(self, q: str, p: Any = ()) -> Any:
                    if q.startswith("DELETE FROM openonce_approvals"):  # lines deleted
                        (pid,) = cur.all("SELECT pg_backend_pid()")[0]
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    return cur.run(q, p)

            return work(Cur())

        return original(killed)

    monkeypatch.setattr(store, "retention_write", retention_write)
    try:
        with pytest.raises(psycopg.OperationalError):
            run(store, agent.clock, tmp_path / "first")
    finally:
        admin.close()
    monkeypatch.undo()

    assert dump(store) == before  # rolled back: every effect, line and approval
    (partial,) = (tmp_path / "first").iterdir()  # the batch was fsynced before the delete
    assert import_archive(store, partial).effects == 0  # all still there
    assert agent.refund("o-1") == {"refund": "re_o-1"}  # the pool gave a live connection
    report = run(store, agent.clock, tmp_path / "later")
    assert report.effects == 2
    with pytest.raises(EffectArchivedError):
        agent.refund("o-2")
    assert Counter(agent.calls)[("refund", "o-1")] == 1


# -- behind pgbouncer ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bouncer() -> Iterator[tuple[PgBouncer, str]]:
    with database_behind_pgbouncer(PG_DSN, "oo_ret_") as bounced:
        yield bounced


@pytest.fixture
def bounced(bouncer: tuple[PgBouncer, str]) -> Iterator[tuple[PgBouncer, PostgresStore, str]]:
    """A store of an empty ledger reached through pgbouncer (4 server connections), and
    the ledger's database reached directly."""
    proxy, name = bouncer
    direct = with_database(PG_DSN, name)
    reset_public_schema(direct)
    store = PostgresStore(proxy.dsn(name), max_size=12)
    store.migrate()
    yield proxy, store, direct
    store.close()


def test_behind_pgbouncer_the_barrier_sees_statements_on_shared_server_connections(
    bounced,
) -> None:
    """An agent's statement running on one of pgbouncer's server connections is waited
    for by a retention that also reaches Postgres through pgbouncer."""
    _, store, direct = bounced
    holder = psycopg.connect(direct, autocommit=True)  # advisory locks are per database
    agent = psycopg.connect(store.dsn, autocommit=True, prepare_threshold=None)
    try:
        with statement_held(holder, agent, 4444):
            assert store.wait_for_older_statements(0.05) is False
        assert store.wait_for_older_statements(10) is True
    finally:
        agent.close()
        holder.close()


def test_behind_pgbouncer_duplicates_racing_the_retention_never_run_twice(
    bounced, tmp_path
) -> None:
    """Agents call duplicates of the keys being archived, all through pgbouncer, while the
    retention archives them in small batches through it too: each handler ran once, each
    duplicate got the recorded result or EffectArchivedError, every effect is either in
    the ledger or in the archive, and no server connection is left able to delete."""
    proxy, store, _ = bounced
    clock = FakeClock()
    agent = Agent(store, clock)
    orders = [f"o-{n}" for n in range(30)]
    for order in orders:
        agent.refund(order)
    age(agent)
    old = {e.id for e in store.list_effects(limit=100) if not e.args["order"].startswith("young")}
    stop = threading.Event()
    outcomes: Counter[str] = Counter()
    failures: list[BaseException] = []

    def duplicates(start: int) -> None:
        n = start
        while not stop.is_set():
            try:
                agent.refund(orders[n % len(orders)])
                outcomes["replayed"] += 1
            except EffectArchivedError:
                outcomes["archived"] += 1
            except BaseException as exc:  # reported below
                failures.append(exc)
                return
            n += 7

    threads = [threading.Thread(target=duplicates, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    policy = retention.RetentionPolicy(older_than=90 * DAY, batch_size=3)
    try:
        report = run(store, clock, tmp_path, policy=policy)
    finally:
        stop.set()
        for t in threads:
            t.join(30)

    assert failures == []
    assert outcomes["replayed"] > 0
    assert Counter(agent.calls) == Counter(("refund", o) for o in [*orders, "young-1"])
    archived = [d["effect"]["id"] for path in report.archives for d in archive_lines(path)]
    assert sorted(archived) == sorted(old)  # each once; none left, none lost
    for order in orders:
        with pytest.raises(EffectArchivedError):
            agent.refund(order)
    assert Counter(agent.calls)[("refund", "o-0")] == 1
    _assert_no_server_connection_may_delete(proxy, store)


def _assert_no_server_connection_may_delete(proxy: PgBouncer, store: PostgresStore) -> None:
    """As many clients as pgbouncer has server connections, each inside a transaction:
    together they hold every one, and none still carries ``openonce.retention``."""
    clients = [psycopg.connect(store.dsn, prepare_threshold=None) for _ in range(proxy.pool_size)]
    try:
        for conn in clients:
            setting = conn.execute("SELECT current_setting('openonce.retention', true)")
            assert setting.fetchone()[0] in (None, "")
        for conn in clients:
            conn.rollback()
            with pytest.raises(psycopg.Error, match="append-only"):
                conn.execute("DELETE FROM openonce_journal")
            conn.rollback()
    finally:
        for conn in clients:
            conn.close()
