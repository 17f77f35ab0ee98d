"""Attacks on the retention's promises (openonce_core/_retention.py), on every store: a crash
or a full disk at each step loses nothing and leaves nothing behind, a re-import restores
the rows exactly, a duplicate racing the archival never runs twice, the journal stays
append-only for everyone else, and bad archives are refused with nothing changed."""

from __future__ import annotations

import errno
import gzip
import json
import sqlite3
import threading
from typing import Any

import psycopg
import pytest

from openonce_core import ApprovalPending, EffectState, require_approval_for
from openonce_core._retention import (
    ArchiveError,
    RetentionPolicy,
    find_tombstone,
    import_archive,
    parse_duration,
)
from openonce_core.errors import EffectArchivedError
from openonce_core.testing import FakeClock
from tests.support.retention import (
    DAY,
    Agent,
    age,
    approved_history,
    archive_lines,
    dump,
    raw_connection,
    run,
    statement_held,
    stones,
)

S = EffectState


def _only_leftovers(store: Any) -> None:
    """Tombstones a failed batch left behind name effects still in the ledger, whose rows
    answer their keys (a replay), so they refuse nothing."""
    for stone in stones(store):
        assert store.get(stone[2]) is not None


class Crash(Exception):
    """The process dies here: the transaction in flight never commits."""


def crash_on(store: Any, monkeypatch: Any, statement: str) -> None:
    """The retention's next statement starting with ``statement`` crashes its transaction."""
    original = store.retention_write

    def retention_write(work: Any) -> Any:
        def crashing(cur: Any) -> Any:
            class Cur:
                dialect = cur.dialect

                def all(self, q: str, p: Any = ()) -> Any:
                    if q.startswith(statement):
                        raise Crash(statement)
                    return cur.all(q, p)

                def run(self, q: str, p: Any = ()) -> Any:
                    if q.startswith(statement):
                        raise Crash(statement)
                    return cur.run(q, p)

                def run_many(self, q: str, rows: Any) -> Any:
                    if q.startswith(statement):
                        raise Crash(statement)
                    return cur.run_many(q, rows)

            return work(Cur())

        return original(crashing)

    monkeypatch.setattr(store, "retention_write", retention_write)


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO openonce_tombstones",  # step 1
        "SELECT id, tool",  # step 2's re-read (tombstones already committed)
        "UPDATE openonce_tombstones",  # after the archive's fsync
        "DELETE FROM openonce_approvals",  # the journal's lines already deleted
        "DELETE FROM openonce_effects",  # lines and approvals already deleted
    ],
)
def test_a_crash_at_any_step_loses_nothing(store, tmp_path, monkeypatch, statement) -> None:
    agent = approved_history(store)
    before = dump(store)
    crash_on(store, monkeypatch, statement)
    with pytest.raises(Crash):
        run(store, agent.clock, tmp_path)
    monkeypatch.undo()

    assert dump(store) == before  # every row, every journal line, every approval
    _only_leftovers(store)
    for archive in tmp_path.glob("*.gz"):
        assert import_archive(store, archive).effects == 0  # all "already there"
    assert agent.refund("o-1") == {"refund": "re_o-1"}  # replayed from its row
    # A later run does the work, and then the duplicate is refused.
    report = run(store, agent.clock, tmp_path / "later")
    assert report.effects == 3
    with pytest.raises(EffectArchivedError):
        agent.refund("o-2")
    assert agent.calls.count(("refund", "o-1")) == agent.calls.count(("refund", "o-2")) == 1


def test_a_full_disk_is_a_clear_error_and_changes_nothing(store, tmp_path, monkeypatch) -> None:
    agent = approved_history(store)
    before = dump(store)
    import openonce_core._retention as retention

    class FullDisk:
        """The file takes half of what is written, then the disk is full."""

        def __init__(self, path: str, mode: str) -> None:
            self.f = open(path, mode)  # noqa: SIM115

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(retention, "open", FullDisk, raising=False)
    with pytest.raises(ArchiveError, match=r"disk is full.*nothing of this batch was deleted"):
        run(store, agent.clock, tmp_path)
    monkeypatch.undo()

    assert dump(store) == before
    _only_leftovers(store)
    (partial,) = tmp_path.glob("*.gz")
    report = import_archive(store, partial)  # the half-written batch: nothing to put back
    assert (report.effects, report.truncated) == (0, True)
    assert dump(store) == before


def test_a_reimport_restores_every_row_exactly_and_a_second_changes_nothing(
    store, tmp_path
) -> None:
    agent = approved_history(store)
    before = dump(store)
    report = run(store, agent.clock, tmp_path)
    assert report.effects == 3 and report.approvals == 3
    assert len(dump(store)["openonce_effects"]) == 1

    import_archive(store, report.archives[0])
    assert dump(store) == before  # byte-equal rows, seqs, approvals (with their ids)
    assert stones(store) == []
    again = import_archive(store, report.archives[0])
    assert (again.effects, len(again.skipped)) == (0, 3)
    assert dump(store) == before
    # New lines still get numbers above every number ever handed out.
    top = max(r[0] for r in before["openonce_journal"])
    with pytest.raises(ApprovalPending) as info:
        agent.refund("o-new")
    assert min(j.seq for j in store.journal(info.value.effect_id)) > top


def test_every_non_terminal_effect_stays_whatever_its_age(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    ids = {}
    for order in ("waiting", "approved", "planned", "cancel-me"):
        with pytest.raises(ApprovalPending) as info:
            agent.refund(order)
        ids[order] = info.value.effect_id
    agent.oo.approve(ids["approved"], by="maria")
    agent.oo.approve(ids["planned"], by="maria")
    agent.oo.ledger.move(store.get(ids["planned"]), "contradict", S.HUMAN_REVIEW,
                         actor="openonce", reason="x")  # fmt: skip
    agent.oo.ledger.move(store.get(ids["planned"]), "resolve_not_happened", S.PLANNED,
                         actor="operator:maria", reason="x")  # fmt: skip
    agent.oo.ledger.move(store.get(ids["cancel-me"]), "contradict", S.HUMAN_REVIEW,
                         actor="openonce", reason="x")  # fmt: skip
    clock.advance(10_000 * DAY)
    before = dump(store)
    report = run(store, clock, tmp_path)
    assert report.effects == 0 and dump(store) == before
    assert sorted(str(store.get(i).state) for i in ids.values()) == [
        "approved", "human_review", "planned", "requires_approval"
    ]  # fmt: skip


# -- a duplicate racing the archival -----------------------------------------------------------


@pytest.mark.parametrize("at", ["between the steps", "inside the delete"])
def test_a_duplicate_racing_a_batch_never_runs_twice(store, tmp_path, monkeypatch, at) -> None:
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-1")
    age(agent)
    outcome: list[Any] = []
    trying = threading.Event()
    original_insert = store.insert

    def insert(*a: Any, **kw: Any) -> Any:
        trying.set()  # the duplicate is at the ledger now
        return original_insert(*a, **kw)

    def duplicate() -> None:
        try:
            outcome.append(agent.refund("o-1"))
        except EffectArchivedError as exc:
            outcome.append(exc)

    racer = threading.Thread(target=duplicate, daemon=True)
    if at == "between the steps":
        # Tombstones committed, nothing deleted yet: the row answers (a replay).
        def barrier(timeout: float) -> bool:
            racer.start()
            racer.join(30)
            return True

        monkeypatch.setattr(store, "wait_for_older_statements", barrier)
    else:
        # The delete's transaction is open: the duplicate waits (SQLite's write lock) or
        # reads the committed tombstone (Postgres); either way it must not run.
        original_write = store.retention_write

        def retention_write(work: Any) -> Any:
            def paused(cur: Any) -> Any:
                class Cur:
                    dialect = cur.dialect
                    all = cur.all
                    run_many = cur.run_many

                    def run(self, q: str, p: Any = ()) -> Any:
                        if q.startswith("DELETE FROM openonce_effects") and not racer.is_alive():
                            racer.start()
                            trying.wait(30)
                        return cur.run(q, p)

                return work(Cur())

            return original_write(paused)

        monkeypatch.setattr(store, "retention_write", retention_write)
    monkeypatch.setattr(store, "insert", insert)
    # The duplicate is at the ledger as soon as it asks the store anything: on SQLite and in
    # memory its first read already waits for the retention's write lock.
    for name in ("find_replay", "insert_or_find"):
        if hasattr(store, name):
            monkeypatch.setattr(store, name, _via(getattr(store, name), trying, racer))
    report = run(store, clock, tmp_path)
    racer.join(30)
    assert report.effects == 1
    assert agent.calls.count(("refund", "o-1")) == 1
    (got,) = outcome
    assert got == {"refund": "re_o-1"} or isinstance(got, EffectArchivedError)
    with pytest.raises(EffectArchivedError):
        agent.refund("o-1")
    assert agent.calls.count(("refund", "o-1")) == 1


def _via(method: Any, event: threading.Event, caller: threading.Thread) -> Any:
    """``method`` that sets ``event`` when ``caller`` calls it."""

    def wrapped(*a: Any, **kw: Any) -> Any:
        if threading.current_thread() is caller:
            event.set()
        return method(*a, **kw)

    return wrapped


# -- the journal stays append-only for everyone else ---------------------------------------


@pytest.mark.parametrize("store_kind", ["sqlite"], indirect=True)
def test_sqlite_grant_is_never_seen_by_another_connection(store, tmp_path) -> None:
    agent = approved_history(store)
    seen: list[Any] = []

    def look(cur: Any) -> int:
        other = sqlite3.connect(store.path, isolation_level=None, timeout=0)
        try:
            seen.append(other.execute("SELECT count(*) FROM openonce_retention_grant").fetchone())
            with pytest.raises(sqlite3.OperationalError):  # locked, never let through
                other.execute("DELETE FROM openonce_journal")
        finally:
            other.close()
        return 0

    store.retention_write(look)
    assert seen == [(0,)]
    other = raw_connection(store)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        other.execute("DELETE FROM openonce_journal")
    other.close()
    assert len(store.journal(agent.effect_of("o-1").id)) == 4


def test_postgres_retention_setting_never_leaks_to_the_next_use_of_a_connection(
    tmp_path, pg_dsn
) -> None:
    from openonce_core.stores.postgres import PostgresStore

    store = PostgresStore(pg_dsn, max_size=1)  # every use lends the same connection
    try:
        store.migrate()
        agent = approved_history(store)
        store.retention_write(lambda cur: cur.all("SELECT 1"))
        with pytest.raises(Crash):
            store.retention_write(lambda cur: (_ for _ in ()).throw(Crash()))
        run(store, agent.clock, tmp_path)
        setting = store._with_cursor(
            lambda cur: cur.execute("SELECT current_setting('openonce.retention', true)").fetchone()
        )
        assert setting[0] in (None, "")
        with pytest.raises(psycopg.Error, match="append-only"):
            store._with_cursor(lambda cur: cur.execute("DELETE FROM openonce_journal"))
        assert len(store.journal(agent.effect_of("young-1").id)) == 4
    finally:
        store.close()


@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_postgres_waits_for_statements_of_sessions_it_cannot_see(store, tmp_path) -> None:
    """The retention runs as a role that may not read other roles' statements (no
    ``query_start``): an agent's older insert must still be waited for, or it could miss
    the tombstone and go through."""
    from openonce_core.stores.postgres import PostgresStore

    admin = raw_connection(store)
    schema = admin.execute("SELECT current_schema()").fetchone()[0]
    roles = ("r1ret_agent", "r1ret_ops")
    for role in roles:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO r1ret_ops")
    agent = psycopg.connect(store.dsn.replace("root@", "r1ret_agent@"), autocommit=True)
    ops = PostgresStore(store.dsn.replace("root@", "r1ret_ops@"), max_size=2)
    try:
        with statement_held(admin, agent, 4343):
            assert ops.wait_for_older_statements(0.05) is False
        assert ops.wait_for_older_statements(10) is True
    finally:
        ops.close()
        agent.close()
        admin.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM r1ret_ops")
        for role in roles:
            admin.execute(f"REVOKE ALL ON SCHEMA {schema} FROM {role}")
            admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.close()


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1e400d", "1e12d", "99999999999999999999h"])
def test_a_huge_duration_is_refused(text) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)
    with pytest.raises(ValueError):
        RetentionPolicy(older_than=1e300)


def _gz(tmp_path: Any, *docs: Any) -> str:
    path = tmp_path / "crafted.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(json.dumps(d) for d in docs) + "\n").encode()))
    return str(path)


@pytest.mark.parametrize(
    "broken",
    [
        lambda d: d["journal"][0].pop("seq"),
        lambda d: d["journal"][0].update(seq="x"),
        lambda d: d["approvals"][0].pop("by"),
        lambda d: d["approvals"].append("not an approval"),
        lambda d: d["effect"].update(args="not a dict"),
        lambda d: d["effect"].update(state="started"),
    ],
)
def test_a_malformed_archive_is_a_clear_error_and_changes_nothing(store, tmp_path, broken) -> None:
    agent = approved_history(store)
    report = run(store, agent.clock, tmp_path)
    with gzip.open(report.archives[0], "rt") as f:
        docs = [json.loads(line) for line in f]
    before, stones_before = dump(store), stones(store)
    broken(docs[-1])
    with pytest.raises(ArchiveError):
        import_archive(store, _gz(tmp_path, *docs))
    assert dump(store) == before and stones(store) == stones_before


def test_a_leftover_tombstone_never_holds_a_released_key(store, tmp_path) -> None:
    """A key's tombstone naming an effect that was released later (left by a run that
    crashed before its delete) does not hold the key: a new call claims it, and the
    tombstone goes when the effect is archived."""
    clock = FakeClock()
    agent = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    with pytest.raises(ApprovalPending) as info:
        agent.refund("o-1")
    agent.oo.cancel(info.value.effect_id, by="maria", reason="no")
    clock.advance(91 * DAY)
    with pytest.raises(ApprovalPending) as young:
        agent.refund("young-1")
    agent.oo.approve(young.value.effect_id, by="maria")
    agent.refund("young-1")
    crash_on_delete = pytest.MonkeyPatch()
    crash_on(store, crash_on_delete, "SELECT id, tool")
    with pytest.raises(Crash):
        run(store, clock, tmp_path)
    crash_on_delete.undo()
    key = store.get(info.value.effect_id).idempotency_key
    # (with the fix above, the crash leaves none; write one as an older version would)
    if find_tombstone(store, "stripe.refund", key) is None:
        store.retention_write(lambda cur: cur.run(
            "INSERT INTO openonce_tombstones SELECT tool, idempotency_key, id, state,"
            " args_fingerprint, created_at, 0, '' FROM openonce_effects WHERE id = ?",
            (info.value.effect_id,)))  # fmt: skip
    for move, to in (("contradict", S.HUMAN_REVIEW), ("resolve_not_happened", S.PLANNED),
                     ("release", S.RELEASED)):  # fmt: skip
        agent.oo.ledger.move(store.get(info.value.effect_id), move, to, actor="operator:m",
                             reason="x")  # fmt: skip
    # Released: the key is free now, though the leftover tombstone names it.
    with pytest.raises(ApprovalPending) as again:
        agent.refund("o-1")
    assert again.value.effect_id != info.value.effect_id
    agent.oo.ledger.move(store.get(again.value.effect_id), "release", S.RELEASED,
                         actor="operator:m", reason="x")  # fmt: skip
    clock.advance(91 * DAY)
    with pytest.raises(ApprovalPending) as young:
        agent.refund("young-x")
    agent.oo.approve(young.value.effect_id, by="maria")
    agent.refund("young-x")
    run(store, clock, tmp_path / "2")
    assert store.get(info.value.effect_id) is None
    assert find_tombstone(store, "stripe.refund", key) is None
    with pytest.raises(ApprovalPending):
        agent.refund("o-1")  # a new call: asks a person again, never "archived"


# -- the command line ----------------------------------------------------------------------


def test_the_command_refuses_a_huge_age_with_exit_2(tmp_path) -> None:
    from tests.core.test_cli import openonce

    db = str(tmp_path / "cli.db")
    assert openonce(db, "migrate").returncode == 0
    done = openonce(db, "retention", "--older-than", "1e12d", "--archive-dir", str(tmp_path / "A"))
    assert done.returncode == 2 and "at most 36500d" in done.stderr
    assert not (tmp_path / "A").exists()


def test_the_command_refuses_a_malformed_archive_with_exit_1(tmp_path) -> None:
    from tests.core.test_cli import openonce

    db = str(tmp_path / "cli.db")
    assert openonce(db, "migrate").returncode == 0
    effect = {"id": "eff_" + "0" * 32, "state": "committed", "args": {}}
    doc = {"archive_format": 1, "effect": effect, "journal": [{"at": 1.0}], "approvals": []}
    done = openonce(db, "retention", "import", _gz(tmp_path, doc))
    assert done.returncode == 1 and "'seq' missing" in done.stderr
    assert "Traceback" not in done.stderr


def test_two_runs_at_once_archive_each_effect_once(store, tmp_path, monkeypatch) -> None:
    """Beat's run and a re-queued one: the second runs whole while the first sits between
    its tombstones and its delete; each effect lands in one archive, its key refused."""
    agent = approved_history(store)
    old = {e.id for e in store.list_effects(limit=10) if e.args["order"].startswith("o-")}
    original = store.wait_for_older_statements
    second: list[Any] = []

    def barrier(timeout: float) -> bool:
        if not second:
            monkeypatch.setattr(store, "wait_for_older_statements", original)
            second.append(run(store, agent.clock, tmp_path / "second"))
        return original(timeout)

    monkeypatch.setattr(store, "wait_for_older_statements", barrier)
    first = run(store, agent.clock, tmp_path / "first")
    archived = [
        doc["effect"]["id"]
        for report in (first, second[0])
        for path in report.archives
        for doc in archive_lines(path)
    ]
    assert sorted(archived) == sorted(old)  # each once
    for stone in stones(store):
        assert stone[-1] in first.archives + second[0].archives
    for order in ("o-1", "o-2", "o-3"):
        with pytest.raises(EffectArchivedError):
            agent.refund(order)
    assert sorted(agent.calls) == sorted(set(agent.calls))  # every refund ran once
