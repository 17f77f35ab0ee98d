"""docker-compose.yml cannot run here (no Docker engine), so its commands are run as they
are, outside it: migrate, gunicorn serving the health endpoint with production settings,
and the Celery entry points loading the app."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG = os.environ.get("OPENONCE_TEST_PG", "postgresql://root@127.0.0.1:5432/test")


@pytest.fixture
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture
def fresh_db():
    name = "oo_deploy_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield PG.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _env(db: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.production",
        "OPENONCE_DATABASE": db,
        "OPENONCE_SECRET_KEY": secrets.token_urlsafe(64),
        "OPENONCE_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PYTHONPATH": str(ROOT),
    }


def test_compose_declares_every_role_with_one_beat(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "beat"}
    assert "noeviction" in services["redis"]["command"]
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "openonce_site", "beat"]
    assert "deploy" not in services["beat"]  # never replicated
    for role in ("web", "worker", "beat"):
        assert services[role]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_migrate_then_gunicorn_serves_health_with_production_settings(fresh_db):
    env = _env(fresh_db)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr
    assert "Applying console.0001_initial... OK" in migrate.stdout
    check = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr

    port = _free_port()
    web = subprocess.Popen(
        [str(BIN / "gunicorn"), "openonce_site.wsgi", "--bind", f"127.0.0.1:{port}",
         "--workers", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        status, body = None, b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/") as r:
                    status, body = r.status, r.read()
                break
            except urllib.error.HTTPError as err:  # 503: no sweep has run yet
                status, body = err.code, err.read()
                break
            except OSError:
                time.sleep(0.2)
        assert status == 503
        assert b"no sweep has run yet" in body
    finally:
        web.terminate()
        web.wait(10)


def test_celery_entry_points_load_the_app_and_its_schedule(fresh_db):
    env = _env(fresh_db)
    result = subprocess.run(
        [str(BIN / "celery"), "-A", "openonce_site", "inspect", "registered", "--help"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    probe = subprocess.run(
        [sys.executable, "-c",
         "from openonce_site.celery import app; app.loader.import_default_modules();"
         "print(sorted(t for t in app.tasks if t.startswith('openonce')));"
         "print(app.conf.beat_schedule['openonce-sweep']['task'])"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert "['openonce.notify', 'openonce.reconcile_batch', 'openonce.tick']" in probe.stdout
    assert "openonce.tick" in probe.stdout
