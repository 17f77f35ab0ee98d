"""Store fixtures, and the markers ``make check`` selects by.

Store fixtures: the behavioural suite runs on every store. Postgres is required, never
skipped: set OPENONCE_TEST_PG (``make test`` does) to a database the tests may create
schemas in. Each test gets a schema of its own. psycopg is imported only by a test that
uses Postgres, so the tests that do not run where it is not installed.

Markers, put on each test here by what it uses (no test file has to say it):

* ``postgres``: needs a Postgres server — a store or target parametrized ``"postgres"``,
  the ``pg_dsn`` fixture, a Django database (the test settings keep Django's tables and
  the console's ledger on OPENONCE_DATABASE, Postgres in CI), or a module that connects
  on its own (``POSTGRES_MODULES``).
* ``browser``: drives Chromium through Playwright.
* ``stack``: needs processes beyond pytest — a Celery worker or beat, Redis, Caddy,
  pgbouncer or promtool (``STACK_FIXTURES``, ``STACK_MODULES``, ``STACK_TESTS``).
* ``process``: runs the product as a user does, in child processes (the ``openonce``
  command, manage.py, the examples, the demo, pytest itself): a second or more per test,
  most of it starting Python (``PROCESS_MODULES``).
* ``slow`` (pyproject.toml): multi-process and kill -9 tests, marked in their files.

``make test`` runs them all (nothing is skipped for a missing server: it fails).
``make check`` deselects the five with ``-m`` and says how many it left out, also when
its tests run in pytest-xdist workers (``-n``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from openonce_core import InMemoryStore, SQLiteStore, Store
from openonce_core.testing import FakeClock

PG_DSN = os.environ.get("OPENONCE_TEST_PG", "postgresql://root@127.0.0.1:5432/test")
STORES = ["memory", "sqlite", "postgres"]
DURABLE_STORES = ["sqlite", "postgres"]

TESTS = Path(__file__).resolve().parent
MARKERS = {
    "postgres": "needs a Postgres server (OPENONCE_TEST_PG, OPENONCE_DATABASE)",
    "browser": "drives Chromium through Playwright",
    "stack": "needs a Celery worker, Redis, Caddy, pgbouncer or promtool",
    "process": "runs the product in child processes, as a user does",
}
# A fixture that reaches Postgres; django_db_setup is under pytest-django's db,
# transactional_db and live_server (a test file's own "db" fixture is not).
POSTGRES_FIXTURES = {"pg_dsn", "django_db_setup", "live_server", "direct_dsn"}
# Modules whose tests connect to Postgres without a fixture saying so.
POSTGRES_MODULES = {
    "bench/test_ledger_gap.py",
    "bench/test_volume_smoke.py",
    "core/test_due_indexed.py",
    "core/test_schema_upgrade.py",
}
BROWSER_FIXTURES = {"chromium", "open_page", "axe_source", "browser"}
STACK_FIXTURES = {"daemon", "stack", "running", "redis_broker", "bouncer", "bounced"}
STACK_MODULES = {
    "core/test_pgbouncer.py",
    "daemon/test_daemon_integration.py",
    "daemon/test_daemon_providers.py",
    "daemon/test_shared_limiter.py",
    "deploy/test_ops_defaults_alerts.py",
    "deploy/test_ops_defaults_caddy.py",
    "deploy/test_stack.py",
}
# Single tests that talk to Redis (they skip themselves when it is down).
STACK_TESTS = {"review/test_round3_probers.py::test_an_endless_pause_is_an_hour_for_every_worker"}
PROCESS_MODULES = {
    "core/test_check_target.py",
    "core/test_cli.py",
    "core/test_retention_cli.py",
    "daemon/test_reconciler_django.py",
    "product/test_demo.py",
    "product/test_examples.py",
    "providers/test_harness.py",
    "providers/test_providers_cli.py",
    "reconcile/test_reconcile_cli.py",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning} (tests/conftest.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in needs(item):
            item.add_marker(marker)


def needs(item: pytest.Item) -> set[str]:
    """What a test needs beyond a Python process: a subset of ``MARKERS``."""
    fixtures = set(getattr(item, "fixturenames", ()))
    module = _module(item)
    test = f"{module}::{getattr(item, 'originalname', item.name)}"
    found = set()
    if (
        "postgres" in _param_values(item)
        or fixtures & POSTGRES_FIXTURES
        or item.get_closest_marker("django_db")
        or module in POSTGRES_MODULES
    ):
        found.add("postgres")
    if fixtures & BROWSER_FIXTURES:
        found.add("browser")
    if fixtures & STACK_FIXTURES or module in STACK_MODULES or test in STACK_TESTS:
        found.add("stack")
    if module in PROCESS_MODULES:
        found.add("process")
    return found


def _module(item: pytest.Item) -> str:
    """The test's file relative to tests/ (``core/test_cli.py``), as the sets name it."""
    path = item.path.resolve()
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else str(path)


def _param_values(item: pytest.Item) -> list[object]:
    callspec = getattr(item, "callspec", None)
    return list(callspec.params.values()) if callspec else []


_left_out: list[int] = []
# Under pytest-xdist (make check's -n) the workers collect and deselect, each the same
# tests; each hands its count back to the process that prints the summary.
_left_out_by_workers: list[int] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _left_out.append(len(items))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # this process is an xdist worker
        workeroutput["left_out"] = sum(_left_out)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    _left_out_by_workers.append(getattr(node, "workeroutput", {}).get("left_out", 0))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    expression = terminalreporter.config.getoption("markexpr")
    left_out = sum(_left_out) or max(_left_out_by_workers, default=0)
    if expression and left_out:
        terminalreporter.write_line(
            f"left out {left_out} tests by -m '{expression}' (make test runs them)"
        )


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped afterwards."""
    import psycopg  # here, not above: only the tests that use Postgres need it

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
