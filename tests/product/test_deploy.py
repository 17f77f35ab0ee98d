"""docker-compose.yml and the Dockerfile as written. Docker cannot run here, so the
commands themselves are run by tests/deploy/test_stack.py (outside Docker, against the
installed wheel); this file checks what only the files can tell: which service trusts
what, which ports are published, how credentials and grace periods are passed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from openonce_site import env
from openonce_site.settings import base

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_declares_every_role_with_one_beat(compose) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "beat", "proxy"}
    assert "noeviction" in services["redis"]["command"]
    assert services["migrate"]["command"] == ["django-admin", "migrate", "--noinput"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "openonce_site", "beat"]
    assert "deploy" not in services["beat"]  # never replicated
    for role in ("web", "worker", "beat"):
        assert services[role]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
    assert services["proxy"]["depends_on"]["web"] == {"condition": "service_healthy"}


def test_only_the_tls_proxy_is_published_and_only_it_is_believed(compose) -> None:
    services = compose["services"]
    published = {name for name, service in services.items() if "ports" in service}
    assert published == {"proxy"}
    assert services["proxy"]["ports"] == ["80:80", "443:443"]
    assert services["web"]["expose"] == ["8000"]
    # The proxy header is trusted because the operator says a proxy is in front.
    env = services["web"]["environment"]
    assert env["OPENONCE_TLS"] == "proxy"
    assert env["DJANGO_SETTINGS_MODULE"] == "openonce_site.settings.production"


def test_credentials_reach_the_ledger_as_parts_never_inside_a_url(compose) -> None:
    env = compose["services"]["web"]["environment"]
    assert "OPENONCE_DATABASE" not in env
    assert env["OPENONCE_DB_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert {env[k] for k in ("OPENONCE_DB_HOST", "OPENONCE_DB_NAME", "OPENONCE_DB_USER")} == {
        "postgres",
        "openonce",
    }
    # Given here or as NAME_FILE (a mounted secret), so compose cannot require either form;
    # production settings refuse to start without a key (tests/deploy/test_hardening.py).
    for name in ("OPENONCE_SECRET_KEY", "OPENONCE_SECRET_PEPPER"):
        assert env[name] == f"${{{name}:-}}", f"{name} must come from the operator, not a default"


def test_postgres_readiness_is_checked_over_tcp(compose) -> None:
    check = compose["services"]["postgres"]["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"]
    assert check[check.index("--host") + 1] == "127.0.0.1"  # not the initdb-time socket


def test_the_web_healthcheck_sends_an_allowed_host(compose) -> None:
    web = compose["services"]["web"]
    assert web["healthcheck"]["test"] == ["CMD", "python", "-m", "openonce_site.healthcheck"]
    # The check names the first allowed host, which compose sets to the site's address.
    hosts = web["environment"]["OPENONCE_ALLOWED_HOSTS"]
    assert hosts.startswith("${OPENONCE_ALLOWED_HOSTS:-${OPENONCE_SITE_ADDRESS")


def test_stops_are_graceful_and_outlast_a_task(compose) -> None:
    services = compose["services"]

    def seconds(value: str) -> int:
        match = re.fullmatch(r"(\d+)s", value)
        assert match, value
        return int(match.group(1))

    worker = services["worker"]
    assert worker["stop_signal"] == "SIGTERM"  # Celery's warm shutdown
    assert seconds(worker["stop_grace_period"]) > base.CELERY_TASK_TIME_LIMIT
    web = services["web"]
    graceful = int(web["command"][web["command"].index("--graceful-timeout") + 1])
    assert seconds(web["stop_grace_period"]) > graceful


def test_the_image_is_reproducible_and_production_by_default() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "--constraint /dist/constraints.txt" in text
    assert "ENV PYTHONDONTWRITEBYTECODE=1" in text
    assert "DJANGO_SETTINGS_MODULE=openonce_site.settings.production" in text
    assert "settings.dev" not in text
    assert "USER openonce" in text
    assert "COPY deploy/constraints.txt" in text


def test_the_connection_budget_fits_postgres(compose) -> None:
    """Every process's two pools at their maximum, for the shape the README scales to
    (``--scale worker=2``), stay under the max_connections compose gives Postgres."""
    services = compose["services"]
    postgres = services["postgres"]["command"]
    limit = int(next(a for a in postgres if a.startswith("max_connections=")).split("=")[1])
    web = services["web"]["command"]
    worker = services["worker"]["command"]
    processes = (
        int(web[web.index("--workers") + 1])
        + 2 * int(worker[worker.index("--concurrency") + 1])
        + 1  # beat
    )
    django_pool = int(env._pg_options()["pool"]["max_size"])  # type: ignore[index]
    per_process = django_pool + base.OPENONCE_LEDGER_POOL_MAX
    assert processes * per_process < limit, (processes, per_process, limit)
