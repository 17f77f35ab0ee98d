"""``make check``: the tests it selects need nothing but Python, and it says what it left out.

tests/conftest.py marks each test by what it uses (``postgres``, ``browser``, ``stack``,
``process``); these run pytest as ``make check`` does, in a subprocess, on a few files
whose needs are known, with the databases pointed where nothing listens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
NO_PG = "postgresql://make-check@127.0.0.1:9/make-check-uses-no-postgres"
CHECK_MARKERS = "not slow and not postgres and not browser and not stack and not process"
# Loaded with -p before any conftest: ``import psycopg`` then raises ImportError.
BLOCK_PSYCOPG = 'import sys\nsys.modules["psycopg"] = None\n'
# Prints each collected test with the markers conftest gave it.
SHOW_MARKERS = """
def pytest_collection_finish(session):
    for item in session.items:
        names = sorted(m.name for m in item.iter_markers() if m.name in {MARKERS})
        print("MARKED", item.nodeid, ",".join(names))
"""


def pytest_run(tmp_path: Path, plugin: str, *args: str, **env: str):
    (tmp_path / "check_plugin.py").write_text(plugin)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "check_plugin", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "OPENONCE_TEST_PG": NO_PG, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_makefile_deselects_what_conftest_marks():
    assert f"CHECK_MARKERS := {CHECK_MARKERS}\n" in MAKEFILE
    assert f"NO_PG := {NO_PG}\n" in MAKEFILE


def test_the_sqlite_tests_run_where_psycopg_cannot_be_imported(tmp_path):
    # Django's database is SQLite here: its Postgres backend would import psycopg.
    django_db = str(tmp_path / "django.db")
    replay = "tests/core/behaviour/test_replay.py"
    result = pytest_run(
        tmp_path, BLOCK_PSYCOPG, "-q", "-m", CHECK_MARKERS, replay, OPENONCE_DATABASE=django_db
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # 6 tests on memory and SQLite run; their 6 Postgres runs are left out, and said so.
    assert "12 passed, 6 deselected" in result.stdout
    assert f"left out 6 tests by -m '{CHECK_MARKERS}' (make test runs them)" in result.stdout


def test_in_worker_processes_it_still_says_what_it_left_out(tmp_path):
    # make check runs pytest-xdist workers (-n): they collect and deselect, not the
    # process that prints the summary.
    assert '-n $(CHECK_WORKERS) -m "$(CHECK_MARKERS)"' in MAKEFILE
    django_db = str(tmp_path / "django.db")
    replay = "tests/core/behaviour/test_replay.py"
    result = pytest_run(
        tmp_path, "", "-q", "-n", "2", "-m", CHECK_MARKERS, replay, OPENONCE_DATABASE=django_db
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 passed" in result.stdout
    assert f"left out 6 tests by -m '{CHECK_MARKERS}' (make test runs them)" in result.stdout


def test_tests_are_marked_by_the_store_fixtures_and_services_they_use(tmp_path):
    files = {
        "tests/core/behaviour/test_replay.py": "store: memory, sqlite, postgres",
        "tests/core/test_cli.py": "its own db fixture: sqlite, postgres; subprocesses",
        "tests/webconsole/test_console_views.py": "a Django database (Postgres)",
        "tests/webconsole/test_console_browser.py": "Chromium and the live server",
        "tests/daemon/test_shared_limiter.py": "Redis",
    }
    plugin = SHOW_MARKERS.replace("{MARKERS}", repr({"postgres", "browser", "stack", "process"}))
    result = pytest_run(tmp_path, plugin, "--collect-only", "-q", *files, OPENONCE_DATABASE=NO_PG)
    assert result.returncode == 0, result.stdout + result.stderr
    marks: dict[str, set[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("MARKED "):
            _, nodeid, *names = line.split(" ")
            test_file = nodeid.split("::")[0]
            kind = "postgres" if nodeid.endswith("[postgres]") else "other"
            marks.setdefault(f"{test_file} {kind}", set()).add(",".join(names))
    assert marks == {
        "tests/core/behaviour/test_replay.py postgres": {"postgres"},
        "tests/core/behaviour/test_replay.py other": {""},
        "tests/core/test_cli.py postgres": {"postgres,process"},
        "tests/core/test_cli.py other": {"process"},
        "tests/webconsole/test_console_views.py other": {"postgres"},
        "tests/webconsole/test_console_browser.py other": {"browser,postgres"},
        "tests/daemon/test_shared_limiter.py other": {"stack"},
    }
