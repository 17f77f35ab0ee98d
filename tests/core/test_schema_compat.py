"""A ledger that a newer OpenOnce migrated keeps working for older agents while the change
is additive (openonce_core/_schema.py, ``READABLE_FROM``).

Each schema version names the oldest code that works with a ledger at that version, and
the ledger records it (``openonce_schema.readable_from``, from version 7). An agent opens
a newer ledger whose recorded oldest reader it is; it refuses one it is too old for, and
says to upgrade itself, not to migrate; an older ledger is refused as before ("run
migrate"). ``openonce migrate`` of an older release leaves a newer ledger alone.

The future is simulated: versions 8 (an index, oldest reader still 7) and 9 (a change old
code cannot live with, oldest reader 9) are added to the migrations for the moment a
"newer OpenOnce" migrates the ledger; the agent, the store and the ``openonce`` command
then run as the release at hand."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from openonce_core import (
    OpenOnce,
    RetentionPolicy,
    SchemaVersionError,
    cli,
    open_store,
    run_retention,
)
from openonce_core import _schema as schema
from openonce_core.errors import EffectArchivedError
from openonce_core.testing import FakeClock
from tests.core.test_schema_upgrade import install_up_to
from tests.core.test_schema_v7 import refunder
from tests.support.daemon import daemon_env, fresh_database, manage

CURRENT = schema.SCHEMA_VERSION
FUTURE = {
    # An index a newer console reads: code at 7 never notices it.
    8: ["CREATE INDEX openonce_effects_future ON openonce_effects (provider_key, id)"],
    # Say, a column whose meaning code at 8 and older would ignore when it writes effects.
    9: ["ALTER TABLE openonce_effects ADD COLUMN tenant text"],
}
FUTURE_READERS = {8: CURRENT, 9: 9}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return request.getfixturevalue("pg_dsn")


def rows(db: str, sql: str) -> list[tuple[Any, ...]]:
    if db.startswith("postgresql://"):
        with psycopg.connect(db) as conn:
            return conn.execute(sql).fetchall()
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def migrate_as_newer_release(monkeypatch: pytest.MonkeyPatch, db: str, version: int) -> None:
    """What ``openonce migrate`` of the release whose SCHEMA_VERSION is ``version`` does to
    the ledger; afterwards this process is the current release again."""
    with monkeypatch.context() as future:
        real = schema.migrations

        def migrations(dialect: str) -> dict[int, list[str]]:
            found = real(dialect)
            found.update({v: s for v, s in FUTURE.items() if v <= version})
            return found

        future.setattr(schema, "READABLE_FROM", {**schema.READABLE_FROM, **FUTURE_READERS})
        future.setattr(schema, "migrations", migrations)
        future.setattr(schema, "SCHEMA_VERSION", version)
        store = open_store(db)
        try:
            assert store.migrate() == version
        finally:
            store.close()
    assert schema.SCHEMA_VERSION == CURRENT


def install_old(db: str, version: int) -> None:
    """A ledger at ``version``, as an older release's migrate left it."""
    if db.startswith("postgresql://"):
        with psycopg.connect(db, autocommit=True) as conn:
            install_up_to(conn.execute, "postgres", version)
        return
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        install_up_to(conn.execute, "sqlite", version)
    finally:
        conn.close()


def apply(db: str) -> tuple[int, int]:
    """``_schema.apply`` on a connection of the caller's, as ``manage.py migrate`` runs it
    (ledger/apps.py, console/migrations/0001_initial.py)."""
    if db.startswith("postgresql://"):
        with psycopg.connect(db) as conn, conn.transaction(), conn.cursor() as cursor:
            return schema.apply(cursor, "postgres")
    conn = sqlite3.connect(db)
    try:
        with conn:
            return schema.apply(conn.cursor(), "sqlite")
    finally:
        conn.close()


def install(db: str) -> None:
    store = open_store(db)
    try:
        store.migrate()
    finally:
        store.close()


def openonce(capsys: pytest.CaptureFixture[str], db: str, *args: str) -> tuple[int, str, str]:
    """The ``openonce`` command of the release at hand, as a deploy script runs it: (exit
    status, stdout, stderr). In this process, so ``make check`` runs it too."""
    capsys.readouterr()
    status = cli.main(["--db", db, *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def ledger_at_8(db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A ledger at this release's version, then migrated by a release at 8."""
    install(db)
    migrate_as_newer_release(monkeypatch, db, 8)
    yield db


@pytest.fixture
def ledger_at_9(db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    install(db)
    migrate_as_newer_release(monkeypatch, db, 9)
    yield db


def test_the_current_version_keeps_its_oldest_reader_and_the_ledger_records_it(db) -> None:
    assert CURRENT == 7
    assert schema.READABLE_FROM[CURRENT] == 5
    store = open_store(db)
    try:
        assert store.migrate() == CURRENT
        assert store.schema_readable_from() == 5
    finally:
        store.close()
    assert rows(db, "SELECT version, readable_from FROM openonce_schema WHERE version = 7") == [
        (7, 5)
    ]


@pytest.mark.parametrize("migrate", [False, True])
def test_an_agent_runs_effects_on_a_newer_ledger_it_can_still_read(
    ledger_at_8: str, migrate: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="openonce")
    oo = OpenOnce(ledger_at_8, migrate=migrate)
    calls: list[str] = []
    refund = refunder(oo, calls)
    try:
        assert refund("o-1") == "re_o-1"
        assert refund("o-1") == "re_o-1"  # the duplicate replays
        assert calls == ["o-1"]
        assert oo.store.find("stripe.refund", "o-1").state == "committed"
    finally:
        oo.close()
    said = [r for r in caplog.records if "version 8" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"], caplog.text
    assert f"this OpenOnce is at {CURRENT}" in said[0].getMessage()
    # Nothing was migrated back or forth: the ledger is still at 8, read by 7 and newer.
    assert rows(ledger_at_8, "SELECT max(version), count(*) FROM openonce_schema") == [(8, 8)]


@pytest.mark.parametrize("migrate", [False, True])
def test_an_agent_refuses_a_newer_ledger_it_cannot_read_and_says_to_upgrade_itself(
    ledger_at_9: str, migrate: bool
) -> None:
    with pytest.raises(SchemaVersionError) as info:
        OpenOnce(ledger_at_9, migrate=migrate)
    message = str(info.value)
    assert "version 9" in message and f"this OpenOnce is at {CURRENT}" in message, message
    assert "pip install --upgrade openonce" in message, message
    assert "run `openonce" not in message, message
    assert info.value.needs_upgrade is True and info.value.ledger_version == 9
    assert rows(ledger_at_9, "SELECT count(*) FROM openonce_effects") == [(0,)]
    assert rows(ledger_at_9, "SELECT max(version) FROM openonce_schema") == [(9,)]


def test_migrate_of_an_older_release_leaves_a_readable_newer_ledger_alone(
    ledger_at_8: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = rows(ledger_at_8, "SELECT version, applied_at FROM openonce_schema ORDER BY 1")

    status, out, err = openonce(capsys, ledger_at_8, "migrate")

    assert status == 0, err
    assert out.strip() == (
        f"ledger schema is at version 8, newer than this OpenOnce ({CURRENT}), which can"
        " still use it: nothing to migrate"
    )
    assert apply(ledger_at_8) == (8, 8)
    assert rows(ledger_at_8, "SELECT version, applied_at FROM openonce_schema ORDER BY 1") == (
        before
    )
    store = open_store(ledger_at_8)
    try:
        assert store.migrate() == 8
        assert (store.schema_version(), store.schema_readable_from()) == (8, CURRENT)
    finally:
        store.close()


def test_migrate_of_an_older_release_refuses_a_newer_ledger_it_cannot_read(
    ledger_at_9: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = openonce(capsys, ledger_at_9, "migrate")

    assert status == 1
    assert out == ""
    assert "version 9" in err and f"this OpenOnce is at {CURRENT}" in err
    assert "pip install --upgrade openonce" in err
    assert "migrating cannot help" in err
    with pytest.raises(SchemaVersionError, match="upgrade OpenOnce here"):
        apply(ledger_at_9)
    assert rows(ledger_at_9, "SELECT max(version), count(*) FROM openonce_schema") == [(9, 9)]


def test_a_v6_ledger_migrated_to_7_records_its_oldest_reader(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    install_old(db, 6)

    status, out, err = openonce(capsys, db, "migrate")

    assert status == 0, err
    assert out.strip() == "ledger schema migrated from version 6 to 7"
    recorded = rows(db, "SELECT version, readable_from FROM openonce_schema ORDER BY 1")
    assert recorded == [(v, None) for v in range(1, 7)] + [(7, 5)]


@pytest.mark.parametrize("version", [0, 6])
def test_an_older_ledger_is_still_refused_with_run_migrate(db, version: int) -> None:
    """A guard, green before and after: new code may rely on what a migration adds."""
    if version:
        install_old(db, version)
    with pytest.raises(SchemaVersionError) as info:
        OpenOnce(db, migrate=False)
    assert str(info.value) == (
        f"ledger schema is at version {version}, this OpenOnce needs {CURRENT};"
        " run `openonce --db DSN migrate`"
    )
    assert info.value.needs_upgrade is False and info.value.ledger_version == version


def test_the_retention_works_on_a_newer_ledger_it_can_read_and_not_on_one_it_cannot(
    ledger_at_8: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    clock = FakeClock()
    oo = OpenOnce(ledger_at_8, migrate=False, clock=clock)
    calls: list[str] = []
    refund = refunder(oo, calls)
    try:
        refund("o-1")
        clock.advance(3600)
        refund("o-2")
        report = run_retention(oo.store, RetentionPolicy(older_than=60), tmp_path)
        assert (report.effects, report.tombstones) == (1, 1)
        with pytest.raises(EffectArchivedError):
            refund("o-1")  # its tombstone refuses the duplicate
        assert calls == ["o-1", "o-2"]
    finally:
        oo.close()

    migrate_as_newer_release(monkeypatch, ledger_at_8, 9)
    store = open_store(ledger_at_8)
    try:
        with pytest.raises(SchemaVersionError, match="upgrade OpenOnce here"):
            run_retention(store, RetentionPolicy(older_than=60), tmp_path)
    finally:
        store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def django_ledger(request, tmp_path) -> Iterator[str]:
    """A ledger in a database of its own that ``manage.py migrate`` has not seen yet."""
    if request.param == "sqlite":
        yield str(tmp_path / "console.db")
        return
    with fresh_database("oo_compat_") as (_, dsn):
        yield dsn


@pytest.mark.process
def test_manage_py_migrate_of_an_older_console_leaves_a_readable_newer_ledger_alone(
    django_ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(django_ledger)
    migrate_as_newer_release(monkeypatch, django_ledger, 8)

    done = manage(daemon_env(django_ledger), "migrate", "--noinput")

    assert done.returncode == 0, done.stderr
    assert (
        f"OpenOnce ledger schema is at version 8, newer than this OpenOnce ({CURRENT}),"
        " which can still use it: left as it is"
    ) in done.stdout
    assert rows(django_ledger, "SELECT max(version), count(*) FROM openonce_schema") == [(8, 8)]

    migrate_as_newer_release(monkeypatch, django_ledger, 9)
    done = manage(daemon_env(django_ledger), "migrate", "--noinput")

    assert done.returncode != 0
    assert "version 9" in done.stderr and "pip install --upgrade openonce" in done.stderr
    assert "no tables yet" not in done.stderr  # the ledger's own words, not a guess
