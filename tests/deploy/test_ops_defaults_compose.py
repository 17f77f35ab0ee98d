"""docker-compose.yml and .dockerignore as an operator meets them: every setting the app
reads reaches the app's containers from .env, worker and beat say whether they work, and
no secret is sent into the image build.

Docker cannot run here, so compose's own rules are applied to the parsed file: ``.env``
through ``env_file``, then ``environment`` on top with ``${VAR:-default}`` interpolated
from the same ``.env``.
"""

from __future__ import annotations

import re
import shlex
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command, get_commands
from django.utils import timezone

ROOT = Path(__file__).resolve().parents[2]
APP_SERVICES = ("web", "worker", "beat", "migrate")
# Set by compose itself, to values .env cannot change: the database is compose's postgres
# service, gunicorn sits behind compose's Caddy.
FIXED = {
    "OPENONCE_DB_HOST": "postgres",
    "OPENONCE_DB_PORT": "5432",
    "OPENONCE_DB_NAME": "openonce",
    "OPENONCE_DB_USER": "openonce",
    "OPENONCE_TLS": "proxy",
}
# The password postgres is created with, so that the two cannot disagree.
FROM_POSTGRES = {"OPENONCE_DB_PASSWORD"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def variables_the_app_reads() -> set[str]:
    """Every OPENONCE_* name in the settings and in env.py (grep, so a setting added
    tomorrow is checked tomorrow)."""
    sources = [*(ROOT / "openonce_site" / "settings").glob("*.py"), ROOT / "openonce_site/env.py"]
    names = set()
    for path in sources:
        names |= set(re.findall(r"[\"'](OPENONCE_[A-Z0-9_]+)[\"']", path.read_text()))
    return names


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation: $$, ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?error}, ${VAR?error}, with defaults nested."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            depth, j = 1, i + 2
            while depth:  # to the brace that closes this one, past nested ${...}
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                depth -= text[j] == "}"
                j += 1
            out.append(_substitute(text[i + 2 : j - 1], env))
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _substitute(body: str, env: dict[str, str]) -> str:
    match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])(.*))?", body, flags=re.S)
    assert match, body
    name, op, rest = match.groups()
    value = env.get(name)
    missing = value is None or (value == "" and op is not None and op.startswith(":"))
    if op in (":-", "-") and missing:
        return interpolate(rest, env)
    if op in (":?", "?") and missing:
        raise ValueError(f"compose refuses to start: {rest}")
    return value or ""


def effective_environment(service: dict[str, Any], dotenv: dict[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in service.get("env_file", []):
        path = entry["path"] if isinstance(entry, dict) else entry
        if path in (".env", "./.env"):
            env.update(dotenv)
    for name, value in (service.get("environment") or {}).items():
        env[name] = interpolate(str(value), dotenv)
    return env


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d}/${EMPTY:-d}/${EMPTY-d}/${NONE:-a${SET}b}/$$HOME", env) == (
        "x/d//axb/$HOME"
    )
    with pytest.raises(ValueError, match="say so"):
        interpolate("${EMPTY:?say so}", env)


def test_every_setting_in_dotenv_reaches_web_worker_and_beat() -> None:
    services = compose()["services"]
    names = variables_the_app_reads()
    assert {"OPENONCE_METRICS_TOKEN", "OPENONCE_LOG_FORMAT", "OPENONCE_NOTIFY",
            "OPENONCE_CSRF_TRUSTED_ORIGINS", "OPENONCE_SECRET_KEY"} <= names  # fmt: skip
    dotenv = {name: f"from .env: {name}" for name in names}
    dotenv |= {
        "POSTGRES_PASSWORD": "pg/pass#word",
        # A prober's provider key and a webhook's secret_env: names the app cannot list.
        "STRIPE_API_KEY": "sk_test_123",
        "OPENONCE_WEBHOOK_SECRET": "whsec",
    }
    for role in APP_SERVICES:
        env = effective_environment(services[role], dotenv)
        lost = {
            name: env.get(name)
            for name in names - set(FIXED) - FROM_POSTGRES
            if env.get(name) != dotenv[name]
        }
        assert not lost, f"{role}: .env does not reach these settings: {lost}"
        assert env["STRIPE_API_KEY"] == "sk_test_123"
        assert env["OPENONCE_WEBHOOK_SECRET"] == "whsec"
        assert {name: env[name] for name in FIXED} == FIXED
        assert env["OPENONCE_DB_PASSWORD"] == "pg/pass#word"
        assert env["DJANGO_SETTINGS_MODULE"] == "openonce_site.settings.production"


def test_compose_defaults_apply_without_dotenv_and_a_missing_dotenv_is_no_error() -> None:
    services = compose()["services"]
    for role in APP_SERVICES:
        assert {"path": ".env", "required": False} in services[role]["env_file"]
        env = effective_environment(services[role], {"POSTGRES_PASSWORD": "p"})
        assert env["OPENONCE_BROKER_URL"] == "redis://redis:6379/0"
        assert env["OPENONCE_ALLOWED_HOSTS"] == "localhost"
        assert env["OPENONCE_CONSOLE_URL"] == "https://localhost"
        # Empty, so that the _FILE form may be used instead; the settings refuse neither.
        assert env["OPENONCE_SECRET_KEY"] == "" and env["OPENONCE_SECRET_PEPPER"] == ""
    site = {"POSTGRES_PASSWORD": "p", "OPENONCE_SITE_ADDRESS": "console.example.com"}
    env = effective_environment(services["web"], site)
    assert env["OPENONCE_ALLOWED_HOSTS"] == "console.example.com"
    assert env["OPENONCE_CONSOLE_URL"] == "https://console.example.com"
    with pytest.raises(ValueError, match="POSTGRES_PASSWORD"):
        effective_environment(services["web"], {})


# -- healthchecks -------------------------------------------------------------------------


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    if test[0] == "CMD-SHELL":
        # Compose turns $$ into $ before the container's shell sees the command.
        return shlex.split(test[1].replace("$$", "$"))
    assert test[0] == "CMD"
    return list(test[1:])


def test_worker_healthcheck_pings_this_replica_through_the_broker() -> None:
    services = compose()["services"]
    worker = services["worker"]
    argv = healthcheck_argv(worker)
    command = worker["command"]
    # The same app as the worker runs, and the node name a worker without -n takes.
    assert argv[:3] == command[:3] == ["celery", "-A", "openonce_site"]
    assert "-n" not in command and "--hostname" not in command
    assert argv[3:5] == ["inspect", "ping"]
    assert argv[argv.index("--destination") + 1] == "celery@$HOSTNAME"
    timeout = float(argv[argv.index("--timeout") + 1])
    assert timeout < _seconds(worker["healthcheck"]["timeout"])


def test_beat_healthcheck_is_reconciler_health() -> None:
    beat = compose()["services"]["beat"]
    assert healthcheck_argv(beat) == ["django-admin", "reconciler_health"]
    assert get_commands()["reconciler_health"] == "reconciler"
    # Longer than the settings' start-up grace, so a fresh beat is not called stopped.
    assert _seconds(beat["healthcheck"]["start_period"]) >= 60


@pytest.mark.django_db
def test_reconciler_health_exits_1_without_a_recent_sweep_and_0_with_one(settings) -> None:
    from reconciler.models import Sweep

    settings.OPENONCE_SWEEP_INTERVAL = 5.0
    assert _exit_code("reconciler_health") == 1  # no sweep has run yet
    record = Sweep.objects.create(source="beat", started_at=timezone.now(), interval=5.0)
    assert _exit_code("reconciler_health") == 0
    record.started_at = timezone.now() - timedelta(seconds=30)  # beat stopped
    record.save()
    assert _exit_code("reconciler_health") == 1


def _exit_code(command: str) -> int:
    with pytest.raises(SystemExit) as exited:
        call_command(command)
    return int(exited.value.code or 0)


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match[1]) * (60 if match[2] == "m" else 1)


# -- .dockerignore --------------------------------------------------------------------------


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent folders
    decides; ``!`` re-includes; ``**`` spans folders."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _glob(pattern.removeprefix("!"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            result = not negate
    return result


def _glob(pattern: str) -> re.Pattern[str]:
    out = ""
    for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/")):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
            token, re.escape(token)
        )
    return re.compile(out)


def test_dockerignore_keeps_secrets_out_of_the_build() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for secret in (".env", ".env.production", ".env.local", "deploy/.env", "secrets/key",
                   "deploy/tls.key", "cert.pem", ".git/config"):  # fmt: skip
        assert excluded(secret, patterns), secret
    # What the Dockerfile's build needs, and the example the README tells you to copy.
    for needed in ("pyproject.toml", "deploy/constraints.txt", "openonce_site/env.py",
                   "templates/base.html", ".env.example", "deploy/env.example"):  # fmt: skip
        assert not excluded(needed, patterns), needed
