"""`openonce retention`, run as a user runs it: a subprocess against a real ledger."""

from __future__ import annotations

import gzip
import json

import pytest

from openonce_core import RetentionPolicy, open_store
from openonce_core.cli import build_parser
from openonce_core.cli._retention import policy_of
from openonce_core.errors import EffectArchivedError
from tests.core.test_cli import openonce
from tests.support.retention import Refunds, old_and_new_refunds


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "cli.db")
    return request.getfixturevalue("pg_dsn")


def _history(db: str) -> Refunds:
    assert openonce(db, "migrate").returncode == 0
    return old_and_new_refunds(db)


def test_archives_then_imports_back(db, tmp_path) -> None:
    made = _history(db)
    oo, calls = made.oo, made.calls
    archives = tmp_path / "archives"

    dry = openonce(db, "retention", "--older-than", "90d", "--archive-dir", str(archives),
                   "--dry-run")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "would archive 2 effect(s), 4 journal line(s)" in dry.stdout
    assert not archives.exists() and len(oo.store.list_effects()) == 3

    done = openonce(db, "retention", "--older-than", "90d", "--archive-dir", str(archives),
                    "--batch", "1", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["effects"], report["journal_lines"], report["batches"]) == (2, 4, 2)
    (path,) = report["archives"]
    with gzip.open(path, "rt") as f:
        assert sorted(json.loads(line)["effect"]["args"]["order"] for line in f) == ["o-1", "o-2"]
    with pytest.raises(EffectArchivedError):
        made.refund("o-1")

    back = openonce(db, "retention", "import", path)
    assert back.returncode == 0, back.stderr
    assert "imported 2 effect(s), 4 journal line(s), 0 approval(s)" in back.stdout
    assert made.refund("o-1") == "re_o-1"
    assert calls == ["o-1", "o-2", "o-new"]
    again = openonce(db, "retention", "import", path)
    assert "skipped 2 effect(s) already in the ledger" in again.stdout
    oo.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--older-than", "90", "--archive-dir", "A"], "is not a duration"),
        (["--older-than", "90x", "--archive-dir", "A"], "is not a duration"),
        (["--older-than", "0d", "--archive-dir", "A"], "more than 0"),
        (["--older-than=-5d", "--archive-dir", "A"], "more than 0"),
        (["--older-than", "nand", "--archive-dir", "A"], "more than 0"),
        (["--older-than", "90d", "--archive-dir", "A", "--batch", "0"], "1 to 10000"),
        (["--older-than", "90d", "--archive-dir", "A", "--rate", "0"], "or 'none' for no cap"),
        (["--older-than", "90d", "--archive-dir", "A", "--rate", "inf"], "more than 0"),
        (["--older-than", "90d", "--archive-dir", "A", "--busy", "0"], "at most 1"),
        (["--older-than", "90d", "--archive-dir", "A", "--busy", "1.5"], "at most 1"),
        (["--older-than", "90d"], "required: --archive-dir"),
        (["--archive-dir", "A"], "required: --older-than"),
        (["import"], "FILE"),
    ],
)
def test_bad_input_is_refused_with_exit_2_and_changes_nothing(tmp_path, args, says) -> None:
    db = str(tmp_path / "cli.db")  # argument checks come before any store is opened
    oo = _history(db).oo
    args = [str(tmp_path / "A") if a == "A" else a for a in args]
    done = openonce(db, "retention", *args)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(oo.store.list_effects()) == 3 and not (tmp_path / "A").exists()
    oo.close()


@pytest.mark.parametrize(
    ("flags", "rate", "busy"),
    [
        ([], 500.0, 0.5),
        (["--rate", "40", "--busy", "0.2"], 40.0, 0.2),
        (["--rate", "none"], None, 0.5),
    ],
)
def test_the_pace_flags_set_the_policy_the_run_takes(flags, rate, busy) -> None:
    args = build_parser().parse_args(
        ["--db", "x.db", "retention", "--older-than", "90d", "--archive-dir", "A", *flags]
    )
    policy = policy_of(args)
    assert (policy.max_rate, policy.max_busy, policy.older_than) == (rate, busy, 90 * 86400)
    assert policy == RetentionPolicy(older_than=90 * 86400, max_rate=rate, max_busy=busy)


def test_an_archive_that_cannot_be_imported_is_refused_with_exit_1(db, tmp_path) -> None:
    oo = _history(db).oo
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"plain text")
    done = openonce(db, "retention", "import", str(bad))
    assert done.returncode == 1
    assert "not a gzip archive" in done.stderr
    store = open_store(db)
    assert len(store.list_effects()) == 3
    store.close()
    oo.close()


def test_a_ledger_never_migrated_is_named_and_left_alone(tmp_path) -> None:
    """A new SQLite file: every command says to migrate it; retention and import too, and
    neither creates the archive folder or the ledger's tables."""
    db = str(tmp_path / "new.db")
    folder = tmp_path / "archive"
    for args in (
        ["--older-than", "30d", "--archive-dir", str(folder)],
        ["import", str(tmp_path / "missing.jsonl.gz")],
    ):
        done = openonce(db, "retention", *args)
        assert done.returncode == 1, done.stderr
        assert "ledger schema is at version 0" in done.stderr
        assert "openonce --db DSN migrate" in done.stderr
    assert not folder.exists()
    store = open_store(db)  # opening does not migrate: still version 0
    assert store.schema_version() == 0
    store.close()
