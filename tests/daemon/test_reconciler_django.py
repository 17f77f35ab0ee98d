"""The Django side of the reconciler: settings from the environment, ``manage.py migrate``
installing the ledger, ``manage.py reconcile`` (--once, --watch), ``manage.py
reconciler_health`` and ``/health/``, the sweep records, and probe errors retried with
backoff before a person is asked.

Commands run as subprocesses against a ledger of their own (a fresh Postgres database or a
fresh SQLite file); the sweep and health logic is also exercised in-process on the
pytest-django test database, with the ledger tables emptied before each test.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from openonce_core import OpenOnce
from openonce_core._schema import SCHEMA_VERSION
from openonce_core.testing import stop_heartbeat
from openonce_site import env as envmod
from tests.support.daemon import (
    RaisingProber,
    daemon_env,
    fresh_database,
    log,
    make_unknown,
    manage,
    migrate,
    start_manage,
    wait_until,
)

ACTOR = "reconciler:daemon"
LEDGER_TABLES = ("openonce_effects", "openonce_journal", "openonce_approvals", "openonce_schema")


# -- settings from the environment ------------------------------------------------------


@pytest.mark.parametrize(
    ("reader", "value"),
    [
        (lambda: envmod.env_float("OO_T_FLOAT", 1.0), "abc"),
        (lambda: envmod.env_float("OO_T_FLOAT", 1.0), "-0.5"),
        (lambda: envmod.env_float("OO_T_FLOAT", 1.0), "1,5"),
        (lambda: envmod.env_int("OO_T_INT", 1), "1.5"),
        (lambda: envmod.env_int("OO_T_INT", 1), "-3"),
        (lambda: envmod.env_int("OO_T_INT", 1), "three"),
        (lambda: envmod.env_bool("OO_T_BOOL", False), "maybe"),
        (lambda: envmod.env_bool("OO_T_BOOL", False), "2"),
    ],
)
def test_env_readers_name_the_variable_for_bad_values(monkeypatch, reader, value) -> None:
    for name in ("OO_T_FLOAT", "OO_T_INT", "OO_T_BOOL"):
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=r"OO_T_(FLOAT|INT|BOOL)=") as info:
        reader()
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", ["nan", "inf", "NaN", "1e999"])
def test_env_float_refuses_non_finite_numbers(monkeypatch, value) -> None:
    monkeypatch.setenv("OO_T_FLOAT", value)
    with pytest.raises(ImproperlyConfigured, match="OO_T_FLOAT"):
        envmod.env_float("OO_T_FLOAT", 1.0)


def test_env_readers_defaults_and_good_values(monkeypatch) -> None:
    for name in ("OO_T_FLOAT", "OO_T_INT", "OO_T_BOOL", "OO_T_STR", "OO_T_LIST"):
        monkeypatch.delenv(name, raising=False)
    assert envmod.env_float("OO_T_FLOAT", 2.5) == 2.5
    assert envmod.env_float("OO_T_FLOAT", None) is None
    assert envmod.env_int("OO_T_INT", 7) == 7
    assert envmod.env_bool("OO_T_BOOL", True) is True
    assert envmod.env_str("OO_T_STR", "x") == "x"
    assert envmod.env_list("OO_T_LIST") == []
    monkeypatch.setenv("OO_T_FLOAT", "")  # empty means unset
    assert envmod.env_float("OO_T_FLOAT", 2.5) == 2.5
    monkeypatch.setenv("OO_T_FLOAT", "0.25")
    assert envmod.env_float("OO_T_FLOAT", 2.5) == 0.25
    monkeypatch.setenv("OO_T_INT", "12")
    assert envmod.env_int("OO_T_INT", 7) == 12
    for text, expected in [("Yes", True), (" on ", True), ("0", False), ("FALSE", False)]:
        monkeypatch.setenv("OO_T_BOOL", text)
        assert envmod.env_bool("OO_T_BOOL", not expected) is expected
    monkeypatch.setenv("OO_T_LIST", " a, ,b ,")
    assert envmod.env_list("OO_T_LIST") == ["a", "b"]


def test_env_str_required_names_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("OO_T_REQUIRED", raising=False)
    with pytest.raises(ImproperlyConfigured, match="set the environment variable OO_T_REQUIRED"):
        envmod.env_str("OO_T_REQUIRED")


@pytest.mark.parametrize(
    "url", ["mysql://root@127.0.0.1/x", "postgresql://root@127.0.0.1:5432/", "redis://x/1"]
)
def test_database_url_refuses_what_it_cannot_use(url) -> None:
    with pytest.raises(ImproperlyConfigured, match="OPENONCE_DATABASE"):
        envmod.database_from_url(url, "/base")


def test_database_url_postgres_and_sqlite(tmp_path) -> None:
    pg = envmod.database_from_url("postgresql://u%40x:p%2Fw@db.example:6543/led%20ger", "/b")
    assert pg["ENGINE"] == "django.db.backends.postgresql"
    assert (pg["NAME"], pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"]) == (
        "led ger", "u@x", "p/w", "db.example", "6543",
    )  # fmt: skip
    lite = envmod.database_from_url("ledger.db", tmp_path)
    assert lite["ENGINE"] == "django.db.backends.sqlite3"
    assert lite["NAME"] == str(tmp_path / "ledger.db")
    assert envmod.database_from_url("/abs/l.db", tmp_path)["NAME"] == "/abs/l.db"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OPENONCE_SWEEP_INTERVAL", "soon"),
        ("OPENONCE_SWEEP_INTERVAL", "-1"),
        ("OPENONCE_PROBE_RETRIES", "-1"),
        ("OPENONCE_PROBE_RETRIES", "two"),
        ("OPENONCE_SWEEP_BATCH", "1.5"),
        ("OPENONCE_GRACE_SECONDS", "later"),
        ("OPENONCE_DEBUG", "perhaps"),
        ("OPENONCE_DATABASE", "mysql://root@127.0.0.1/ledger"),
    ],
)
def test_manage_py_stops_on_a_bad_variable_and_names_it(tmp_path, variable, value) -> None:
    env = daemon_env(str(tmp_path / "ledger.db"), **{variable: value})
    done = manage(env, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr
    assert variable in done.stderr.splitlines()[-1], done.stderr[-500:]


@pytest.mark.parametrize("variable", ["OPENONCE_SWEEP_INTERVAL", "OPENONCE_SWEEP_LIMIT"])
def test_zero_sweep_interval_or_limit_is_refused(tmp_path, variable) -> None:
    env = daemon_env(str(tmp_path / "ledger.db"), **{variable: "0"})
    done = manage(env, "check")
    assert done.returncode != 0 and variable in done.stderr


# -- a ledger of its own, for subprocesses ----------------------------------------------


@pytest.fixture(params=["postgres", "sqlite"])
def fresh_ledger(request, tmp_path) -> Iterator[tuple[str, dict[str, str]]]:
    """(target, env) with ``manage.py migrate`` run into a new database."""
    if request.param == "sqlite":
        target = str(tmp_path / "ledger.db")
        env = daemon_env(target)
        log(f"sqlite migrate {migrate(env):.2f}s")
        yield target, env
        return
    with fresh_database("oo_dj_") as (_, dsn):
        env = daemon_env(dsn)
        log(f"postgres migrate {migrate(env):.2f}s")
        yield dsn, env


def tables(target: str) -> set[str]:
    if target.startswith("postgresql://"):
        with psycopg.connect(target) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
    else:
        with sqlite3.connect(target) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows}


def sweeps(target: str) -> list[dict[str, Any]]:
    sql = "SELECT * FROM reconciler_sweep ORDER BY id"
    if target.startswith("postgresql://"):
        with psycopg.connect(target) as conn:
            cur = conn.execute(sql)
            names = [c.name for c in cur.description or ()]
            rows = cur.fetchall()
    else:
        conn = sqlite3.connect(target)
        try:
            cur = conn.execute(sql)
            names = [c[0] for c in cur.description]
            rows = cur.fetchall()
        finally:
            conn.close()
    return [dict(zip(names, row, strict=True)) for row in rows]


def execute(target: str, sql: str) -> None:
    if target.startswith("postgresql://"):
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(sql)
    else:
        conn = sqlite3.connect(target)
        try:
            conn.execute(sql)
            conn.commit()
        finally:
            conn.close()


def _when(value: Any) -> datetime:
    """A sweep timestamp as read back: a datetime (Postgres) or ISO text (SQLite)."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def openonce(target: str) -> OpenOnce:
    return OpenOnce(target, migrate=False)


def test_migrate_installs_the_ledger_tables(fresh_ledger) -> None:
    target, env = fresh_ledger
    installed = tables(target)
    assert set(LEDGER_TABLES) <= installed
    assert {"reconciler_sweep", "django_migrations", "auth_user"} <= installed
    # The core sees its own schema, at its version, and has nothing left to do.
    done = manage(env, "migrate", "--noinput")
    assert done.returncode == 0 and "No migrations to apply" in done.stdout
    cli = Path(sys.executable).with_name("openonce")
    out = subprocess.run(
        [str(cli), "--db", target, "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"ledger schema already at version {SCHEMA_VERSION}"
    # An agent opening the ledger with migrate=False only checks the schema is there.
    ids = make_unknown(target, ["paid-m"])
    oo = openonce(target)
    try:
        assert oo.get(ids["paid-m"]).state == "unknown"
    finally:
        oo.close()


# -- manage.py reconcile ----------------------------------------------------------------


def test_reconcile_once_resolves_due_unknown_effects(fresh_ledger) -> None:
    target, env = fresh_ledger
    ids = make_unknown(target, ["paid-1", "lost-1", "odd-1"])
    started = time.monotonic()
    done = manage(env, "reconcile", "--once")
    log(f"reconcile --once: {time.monotonic() - started:.2f}s")
    assert done.returncode == 0, done.stderr
    assert (
        "due 3: expired 0, committed 1, re-armed 1, to human review 1, probe retries 0,"
        " lost races 0"
    ) in done.stdout
    oo = openonce(target)
    try:
        assert oo.get(ids["paid-1"]).state == "committed"
        assert oo.get(ids["paid-1"]).result == {"stripe_id": "pi_paid-1"}
        assert oo.get(ids["lost-1"]).state == "planned"
        assert oo.get(ids["odd-1"]).state == "human_review"
        for eid in ids.values():
            moves = [j for j in oo.journal(eid) if j.from_state == "unknown"]
            assert len(moves) == 1 and moves[0].actor == ACTOR
    finally:
        oo.close()
    (record,) = sweeps(target)
    assert record["source"] == "once"
    # a small backlog is spread over OPENONCE_SWEEP_SPREAD (8) batches: one effect each
    assert (record["due"], record["batches"], record["batches_done"]) == (3, 3, 3)
    assert (record["committed"], record["rearmed"], record["escalated"]) == (1, 1, 1)
    assert record["probes_happened"] == record["probes_not_happened"] == 1
    assert record["probes_inconclusive"] == 1 and record["probe_errors"] == 0
    assert record["finished_at"] is not None
    # Nothing is due any more: the next sweep finds nothing and changes nothing.
    again = manage(env, "reconcile", "--once")
    assert again.returncode == 0 and "due 0:" in again.stdout
    assert sweeps(target)[-1]["due"] == 0


def test_reconcile_watch_commits_and_stops_cleanly_on_sigterm(fresh_ledger, tmp_path) -> None:
    target, env = fresh_ledger
    watcher = start_manage("watch", env, tmp_path, "reconcile", "--watch", "--interval", "0.2")
    try:
        wait_until(lambda: len(sweeps(target)) >= 2, 60, "--watch sweeping", interval=0.1,
                   on_timeout=watcher.output)  # fmt: skip
        eid = make_unknown(target, ["paid-w"])["paid-w"]
        # Every sweep recorded from here on was created after the effect was: the first
        # of them must pick it up (grace 0). Counted in sweeps, not seconds, so a loaded
        # machine that runs the loop slowly does not matter, and a loop that skips it does.
        swept_before = max(r["id"] for r in sweeps(target))
        oo = openonce(target)
        try:
            wait_until(
                lambda: oo.get(eid).state == "committed",
                30,
                "--watch commits a new UNKNOWN effect",
                interval=0.05,
                on_timeout=watcher.output,
            )
            assert [j.actor for j in oo.journal(eid) if j.from_state == "unknown"] == [ACTOR]
        finally:
            oo.close()
        # The batch reports to its sweep record just after its decisions are committed.
        wait_until(
            lambda: sum(r["committed"] for r in sweeps(target)) == 1, 30,
            "the sweep records the commit", interval=0.05, on_timeout=watcher.output,
        )  # fmt: skip
        records = sweeps(target)
        [committing] = [r for r in records if r["committed"]]
        assert committing["id"] <= swept_before + 1, (swept_before, committing["id"])
        assert {r["source"] for r in records} == {"watch"}
        assert sum(r["committed"] for r in records) == 1
        starts = [_when(r["started_at"]) for r in records]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
        log(f"{len(records)} watch sweeps; gaps {min(gaps, default=0):.2f}..{max(gaps):.2f}s")
        assert watcher.alive()
        stop_at = time.monotonic()
        watcher.popen.send_signal(signal.SIGTERM)
        code = watcher.popen.wait(30)
        log(f"SIGTERM to exit: {time.monotonic() - stop_at:.2f}s")
        assert code == 0, watcher.output()
        assert "reconciling every 0.2s" in watcher.output()
        assert "Traceback" not in watcher.output()
    finally:
        watcher.stop(grace=2)


def test_health_follows_the_interval_reconcile_watch_runs_with(tmp_path) -> None:
    target = str(tmp_path / "ledger.db")
    env = daemon_env(target, OPENONCE_SWEEP_INTERVAL="0.5")
    migrate(env)
    watcher = start_manage("watch", env, tmp_path, "reconcile", "--watch", "--interval", "3")
    try:
        # The loop runs on its --interval, not the setting's 0.5 s: consecutive sweeps
        # start at least 3 s apart (load only widens the gaps; a loop on the setting, or
        # one sweeping twice per interval, makes them 0.5 s or 1.5 s).
        wait_until(lambda: len(sweeps(target)) >= 2, 60, "two --watch sweeps", interval=0.1,
                   on_timeout=watcher.output)  # fmt: skip
        first, second = (_when(r["started_at"]) for r in sweeps(target)[:2])
        gap = (second - first).total_seconds()
        assert gap >= 3.0 - 0.01, f"--watch --interval 3 swept {gap:.2f}s apart"
        # Health judges by the loop's interval (3 s, stale after 6 s), not the setting's
        # (0.5 s, stale after 1 s, which starting manage.py alone exceeds); the loop keeps
        # sweeping meanwhile, so the last sweep is at most about one interval old.
        assert watcher.alive(), watcher.output()
        health = manage(env, "reconciler_health")
        assert health.returncode == 0, health.stdout
    finally:
        watcher.stop(grace=2)


def test_reconcile_negative_interval_is_a_clean_error(tmp_path) -> None:
    env = daemon_env(str(tmp_path / "ledger.db"))
    migrate(env)
    done = manage(env, "reconcile", "--watch", "--interval", "-1", timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "--interval" in done.stderr


# -- manage.py reconciler_health --------------------------------------------------------


def test_reconciler_health_command(fresh_ledger) -> None:
    target, env = fresh_ledger
    # A 60 s interval: each manage.py start takes seconds on a busy 2-core machine (over
    # 10 s with every core taken), and the health check after the sweep must not find it
    # stale (2x interval) only because two processes started slowly. Staleness itself is
    # tested by backdating the sweep, not by waiting.
    env = {**env, "OPENONCE_SWEEP_INTERVAL": "60"}
    empty = manage(env, "reconciler_health")
    assert empty.returncode == 1
    assert empty.stdout.startswith("UNHEALTHY") and "no sweep has run yet" in empty.stdout
    as_json = manage(env, "reconciler_health", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["reasons"] == ["no sweep has run yet"]

    make_unknown(target, ["paid-h"])
    assert manage(env, "reconcile", "--once").returncode == 0
    ok = manage(env, "reconciler_health")
    assert ok.returncode == 0, ok.stdout
    assert ok.stdout.startswith("healthy")
    assert "due 1, committed 1" in ok.stdout and "oldest UNKNOWN: none" in ok.stdout
    report = json.loads(manage(env, "reconciler_health", "--json").stdout)
    assert report["healthy"] is True and report["interval_seconds"] == 60.0
    assert report["last_sweep"]["source"] == "once"
    assert report["last_sweep"]["probes"]["happened"] == 1
    assert report["last_sweep"]["batches"] == "1/1"

    # The last sweep started more than twice the interval (60 s) ago: beat or workers stopped.
    if target.startswith("postgresql://"):
        execute(target, "UPDATE reconciler_sweep SET started_at = now() - interval '300 seconds'")
    else:
        execute(
            target,
            "UPDATE reconciler_sweep SET started_at ="
            " strftime('%Y-%m-%d %H:%M:%f', 'now', '-300 seconds')",
        )
    stale = manage(env, "reconciler_health")
    assert stale.returncode == 1, stale.stdout
    assert stale.stdout.startswith("UNHEALTHY")
    assert re.search(r"last sweep started 3[0-9][0-9]s ago; sweeps run every 60s", stale.stdout)


def test_reconciler_health_turns_red_when_sweeps_stop(tmp_path) -> None:
    """No backdating: a real sweep, then real time passing. Health turns red two intervals
    after the sweep began. The wait for staleness is a lower bound (measured from after
    the sweep ended), so load cannot make the second check early. The first check is
    green if it judged the sweep within two intervals of its start; on a machine so busy
    that ending ``reconcile`` and starting ``manage.py`` took longer than that (12 s), it
    must say red for that reason, as the age it reports shows."""
    interval = 6.0
    env = daemon_env(str(tmp_path / "ledger.db"), OPENONCE_SWEEP_INTERVAL=str(interval))
    migrate(env)
    assert manage(env, "reconcile", "--once").returncode == 0
    swept = time.monotonic()
    fresh = manage(env, "reconciler_health", "--json")
    report = json.loads(fresh.stdout)
    age = report["last_sweep_age_seconds"]
    log(f"first health check judged a sweep {age:.1f}s old")
    if age <= 2 * interval:
        assert fresh.returncode == 0 and report["healthy"] is True, fresh.stdout
    else:  # the machine was too slow to look in time: red, and for this reason only
        assert report["reasons"] == [
            f"last sweep started {age:.0f}s ago; sweeps run every {interval:g}s"
            " (beat or workers stopped)"
        ], fresh.stdout
    time.sleep(max(0.0, 2 * interval + 0.2 - (time.monotonic() - swept)))
    stale = manage(env, "reconciler_health")
    assert stale.returncode == 1 and "last sweep started" in stale.stdout


# -- probe errors: retried with backoff, then a person ----------------------------------


def test_probe_errors_are_retried_then_escalated_via_env(tmp_path) -> None:
    """OPENONCE_PROBE_RETRIES=1: one failed probe is retried, the second goes to a person
    with the error in the journal. (Test settings pin the backoff to 0.2 s.)"""
    target = str(tmp_path / "ledger.db")
    env = daemon_env(
        target, OPENONCE_PROBERS="tests.support.daemon:FAILING_PROBERS", OPENONCE_PROBE_RETRIES="1"
    )
    migrate(env)
    eid = make_unknown(target, ["paid-e"])["paid-e"]
    first = manage(env, "reconcile", "--once")
    assert first.returncode == 0, first.stderr
    assert "committed 0, re-armed 0, to human review 0, probe retries 1" in first.stdout
    oo = openonce(target)
    try:
        assert oo.get(eid).state == "unknown"
        time.sleep(0.3)  # past the 0.2 s backoff
        second = manage(env, "reconcile", "--once")
        assert "to human review 1, probe retries 0" in second.stdout, second.stdout
        effect = oo.get(eid)
        assert effect.state == "human_review"
        journal = oo.journal(eid)
    finally:
        oo.close()
    retry, escalate = journal[-2], journal[-1]
    assert (retry.from_state, retry.to_state, retry.actor) == ("unknown", "unknown", ACTOR)
    assert "probe failed (1/1): prober raised ConnectionError: provider API returned 502" in (
        retry.reason
    )
    assert (escalate.from_state, escalate.to_state) == ("unknown", "human_review")
    assert "prober raised ConnectionError: provider API returned 502" in escalate.reason
    records = sweeps(target)
    assert [r["probe_errors"] for r in records] == [1, 1]
    assert [r["retried"] for r in records] == [1, 0]
    assert [r["escalated"] for r in records] == [0, 1]


def test_no_probe_retries_escalates_at_once(tmp_path) -> None:
    target = str(tmp_path / "ledger.db")
    env = daemon_env(
        target, OPENONCE_PROBERS="tests.support.daemon:FAILING_PROBERS", OPENONCE_PROBE_RETRIES="0"
    )
    migrate(env)
    eid = make_unknown(target, ["paid-z"])["paid-z"]
    done = manage(env, "reconcile", "--once")
    assert "to human review 1, probe retries 0" in done.stdout, done.stdout + done.stderr
    oo = openonce(target)
    try:
        assert oo.get(eid).state == "human_review"
        assert "provider API returned 502" in oo.journal(eid)[-1].reason
    finally:
        oo.close()


# -- in-process: sweeps, backoff and health on the pytest-django database ---------------


@pytest.fixture
def ledger(transactional_db, settings) -> Iterator[str]:
    """The test database's ledger, emptied; the reconciler wired to the test probers."""
    from django.db import connection

    from ledger import clients as site_ledger

    site_ledger.reset()
    settings.OPENONCE_PROBERS = "tests.support.probers:PROBERS"
    settings.OPENONCE_GRACE_SECONDS = 0.0
    settings.OPENONCE_SWEEP_INTERVAL = 1.0
    target = site_ledger.ledger_target()
    if connection.vendor == "postgresql":
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("TRUNCATE openonce_effects, openonce_journal, openonce_approvals")
    else:  # the journal refuses deletes even here; effects are what a sweep selects
        execute(target, "DELETE FROM openonce_effects")
    yield target
    site_ledger.reset()


def test_sweep_records_due_committed_and_probe_outcomes(ledger, settings) -> None:
    from reconciler.models import Sweep
    from reconciler.sweep import sweep

    settings.OPENONCE_SWEEP_BATCH = 2
    settings.OPENONCE_SWEEP_SPREAD = 1  # batches of OPENONCE_SWEEP_BATCH, not spread wider
    ids = make_unknown(ledger, ["paid-a", "paid-b", "lost-c", "odd-d", "paid-e"])
    record = sweep("once")
    record.refresh_from_db()
    assert (record.source, record.due, record.batches, record.batches_done) == ("once", 5, 3, 3)
    assert (record.committed, record.rearmed, record.escalated, record.expired) == (3, 1, 1, 0)
    assert (record.probes_happened, record.probes_not_happened) == (3, 1)
    assert (record.probes_inconclusive, record.probe_errors, record.lost_races) == (1, 0, 0)
    assert record.finished_at is not None and record.finished_at >= record.started_at
    assert record.oldest_unknown_age is not None and record.oldest_unknown_age >= 0

    from ledger.models import Effect, JournalEntry

    assert dict(Effect.objects.filter(id__in=ids.values()).values_list("id", "state")) == {
        ids["paid-a"]: "committed",
        ids["paid-b"]: "committed",
        ids["lost-c"]: "planned",
        ids["odd-d"]: "human_review",
        ids["paid-e"]: "committed",
    }
    leaving = JournalEntry.objects.filter(effect_id__in=ids.values(), from_state="unknown")
    assert leaving.count() == 5 and set(leaving.values_list("actor", flat=True)) == {ACTOR}

    empty = sweep("once")
    assert (empty.due, empty.batches) == (0, 0)
    assert empty.finished_at == empty.started_at  # nothing to wait for
    assert Sweep.objects.count() == 2


def test_sweep_expires_a_lapsed_lease_and_the_late_receipt_still_commits(ledger) -> None:
    from reconciler.sweep import sweep

    # A stopped agent: its lease is not renewed, so it runs out while the call is in flight.
    oo = stop_heartbeat(OpenOnce(ledger, migrate=False))
    seen: dict[str, Any] = {}
    try:

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order, lease_seconds=0.05)
        def charge(order: str) -> dict[str, str]:
            time.sleep(0.1)  # the lease runs out while the call is in flight
            seen["record"] = sweep("once")
            return {"stripe_id": "pi_" + order}

        assert charge("paid-lease") == {"stripe_id": "pi_paid-lease"}
        effect = oo.store.find("stripe.charge", "paid-lease")
        assert effect is not None
        journal = oo.journal(effect.id)
    finally:
        oo.close()
    record = seen["record"]
    record.refresh_from_db()
    assert (record.due, record.expired, record.committed) == (1, 1, 0)
    assert effect.state == "committed"
    moves = [(j.from_state, j.to_state) for j in journal]
    assert ("started", "unknown") in moves and moves[-1] == ("unknown", "committed")


def test_probe_errors_back_off_then_escalate_with_the_error(ledger, settings, monkeypatch) -> None:
    from ledger import clients as site_ledger
    from reconciler.sweep import sweep

    prober = RaisingProber("stripe search returned 503")
    settings.OPENONCE_PROBERS = {"stripe.charge": prober}
    settings.OPENONCE_PROBE_RETRIES = 2
    # Backoffs of 60 s, then 120 s, passed by moving the ledger's clock by hand: a loaded
    # machine can neither make a look inside a backoff late nor one past it early.
    settings.OPENONCE_PROBE_RETRY_BACKOFF = 60.0
    eid = make_unknown(ledger, ["paid-x"])["paid-x"]
    clock = site_ledger.get_reconciler().clock
    assert clock is site_ledger.get_openonce().clock  # one clock for backoff and ledger
    passed = [0.0]
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + passed[0])

    first = sweep("once")
    first.refresh_from_db()
    assert (first.due, first.retried, first.probe_errors, first.escalated) == (1, 1, 1, 0)
    # Inside the backoff (60 s after the first failure) the effect is not due.
    waiting = sweep("once")
    assert waiting.due == 0 and prober.calls == 1
    passed[0] += 61
    second = sweep("once")
    second.refresh_from_db()
    assert (second.due, second.retried) == (1, 1) and prober.calls == 2
    # The backoff doubles: 120 s after the second failure, so not due 61 s after it.
    passed[0] += 61
    assert sweep("once").due == 0 and prober.calls == 2
    passed[0] += 60
    third = sweep("once")
    third.refresh_from_db()
    assert (third.due, third.retried, third.escalated, third.probe_errors) == (1, 0, 1, 1)
    assert prober.calls == 3

    oo = OpenOnce(ledger, migrate=False)
    try:
        effect = oo.get(eid)
        journal = oo.journal(eid)
    finally:
        oo.close()
    assert effect.state == "human_review"
    retries = [j for j in journal if j.from_state == j.to_state == "unknown"]
    assert [j.actor for j in retries] == [ACTOR, ACTOR]
    assert "probe failed (1/2)" in retries[0].reason and "asking again in 60s" in retries[0].reason
    assert "probe failed (2/2)" in retries[1].reason and "asking again in 120s" in retries[1].reason
    assert all("stripe search returned 503" in (j.evidence or {}).get("probe_error", "")
               for j in retries)  # fmt: skip
    last = journal[-1]
    assert (last.from_state, last.to_state, last.actor) == ("unknown", "human_review", ACTOR)
    assert "prober raised ConnectionError: stripe search returned 503" in last.reason


def test_a_probe_that_times_out_counts_as_an_error(ledger, settings, monkeypatch) -> None:
    import tests.support.probers as fake_probers
    from reconciler import probes
    from reconciler.sweep import sweep

    # The probe hangs until the test lets it go: its thread outlives the sweep, and the
    # sample it records when it ends must not land in a later test's sweep.
    release = threading.Event()
    monkeypatch.setattr(fake_probers, "time", SimpleNamespace(sleep=lambda _: release.wait(30)))
    settings.OPENONCE_PROBE_TIMEOUT = 0.2
    settings.OPENONCE_PROBE_RETRIES = 0
    eid = make_unknown(ledger, ["paid-slow"])["paid-slow"]
    oo = OpenOnce(ledger, migrate=False)
    try:
        started = time.monotonic()
        record = sweep("once")
        # The held probe is let go after 30 s at the latest: a sweep that waited for it
        # takes that long; one that did not takes well under a second when idle.
        assert time.monotonic() - started < 20  # the sweep did not wait for the held probe
        record.refresh_from_db()
        # A timeout is the provider being slow, not an answer: asked again later, nobody paged.
        assert (record.probe_errors, record.retried, record.escalated) == (1, 1, 0)
        assert oo.get(eid).state == "unknown"
        line = oo.journal(eid)[-1]
        assert line.action == "reprobe"
        assert "provider unavailable (1/8): probe timed out after 0.2s" in line.reason
    finally:
        oo.close()
        before = len(probes.pending())
        release.set()
        recorded = _await_samples(probes, before + 1)
        probes.flush_discard()
    assert recorded, "the abandoned probe's thread recorded no sample within 30 s"


def _await_samples(probes: Any, count: int) -> bool:
    """Until the abandoned probe's thread has recorded its sample (at most 30 s)."""
    deadline = time.monotonic() + 30
    while len(probes.pending()) < count:
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


def test_health_judged_by_recorded_sweeps(ledger, settings) -> None:
    from django.utils import timezone

    from reconciler.health import reconciler_health
    from reconciler.models import Sweep

    now = timezone.now()
    health = reconciler_health(at=now)
    assert not health.healthy and health.reasons == ["no sweep has run yet"]

    Sweep.objects.create(source="beat", started_at=now, finished_at=now, due=0)
    assert reconciler_health(at=now).healthy
    assert reconciler_health(at=now + timedelta(seconds=2)).healthy  # exactly 2x interval
    late = reconciler_health(at=now + timedelta(seconds=2.6))
    assert not late.healthy
    assert late.reasons == [
        "last sweep started 3s ago; sweeps run every 1s (beat or workers stopped)"
    ]

    # A sweep whose batches never all reported back within 2x interval + the task time limit.
    old = now - timedelta(seconds=2 + settings.CELERY_TASK_TIME_LIMIT + 5)
    stuck = Sweep.objects.create(source="beat", started_at=old, batches=4, batches_done=1)
    health = reconciler_health(at=now)
    assert not health.healthy
    assert health.reasons == [
        f"sweep {stuck.pk} from {old:%H:%M:%S} UTC has 1/4 batches done"
        " (workers are not draining the queue)"
    ]

    make_unknown(ledger, ["odd-age"])
    assert reconciler_health().oldest_unknown_age is not None


def test_health_endpoint_returns_200_or_503(ledger, client, settings) -> None:
    from reconciler.sweep import sweep

    settings.OPENONCE_HEALTH_TOKEN = "t" * 20
    token = {"HTTP_AUTHORIZATION": "Bearer " + "t" * 20}  # details need the token
    empty = client.get("/health/", **token)
    assert empty.status_code == 503
    assert empty["Content-Type"] == "application/json"
    assert empty.json()["healthy"] is False
    assert empty.json()["reasons"] == ["no sweep has run yet"]
    assert client.get("/health/").json() == {"healthy": False}  # the public answer

    make_unknown(ledger, ["paid-endpoint"])
    sweep("once")
    ok = client.get("/health/", **token)
    assert ok.status_code == 200
    body = ok.json()
    assert body["healthy"] is True and body["reasons"] == []
    assert body["last_sweep"]["committed"] == 1 and body["last_sweep"]["batches"] == "1/1"
    assert body["interval_seconds"] == 1.0 and body["oldest_unknown_age_seconds"] is None
    assert client.post("/health/").status_code == 405  # read-only
