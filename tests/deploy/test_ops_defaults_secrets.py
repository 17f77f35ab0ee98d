"""Secrets from files (Docker and Kubernetes secrets): ``NAME_FILE=/run/secrets/...`` in
place of ``NAME``, through one helper, ``openonce_site.env.env_secret``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from openonce_site.env import database_from_parts, env_secret

ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 20 + "3xQ-9_vZ" * 6  # 68 characters, many distinct


@pytest.fixture
def secret_file(tmp_path: Path):
    def write(text: str | bytes) -> str:
        path = tmp_path / "secret"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return str(path)

    return write


def test_the_value_comes_from_the_file_without_its_trailing_newline(
    monkeypatch, secret_file
) -> None:
    monkeypatch.delenv("OPENONCE_X", raising=False)
    monkeypatch.setenv("OPENONCE_X_FILE", secret_file("s3cret value\n"))
    assert env_secret("OPENONCE_X") == "s3cret value"
    monkeypatch.setenv("OPENONCE_X_FILE", secret_file("s3cret\r\n"))  # written on Windows
    assert env_secret("OPENONCE_X") == "s3cret"
    monkeypatch.setenv("OPENONCE_X_FILE", secret_file("no newline"))
    assert env_secret("OPENONCE_X") == "no newline"


def test_without_a_file_it_is_the_variable_or_the_default(monkeypatch) -> None:
    monkeypatch.delenv("OPENONCE_X_FILE", raising=False)
    monkeypatch.setenv("OPENONCE_X", "plain")
    assert env_secret("OPENONCE_X") == "plain"
    monkeypatch.delenv("OPENONCE_X")
    assert env_secret("OPENONCE_X", "") == ""
    with pytest.raises(ImproperlyConfigured, match="set the environment variable OPENONCE_X"):
        env_secret("OPENONCE_X")
    # Compose passes an unset secret as an empty variable: the file form still works.
    monkeypatch.setenv("OPENONCE_X", "")
    assert env_secret("OPENONCE_X", "d") == "d"


def test_both_set_is_refused(monkeypatch, secret_file) -> None:
    monkeypatch.setenv("OPENONCE_X", "from-env")
    monkeypatch.setenv("OPENONCE_X_FILE", secret_file("from-file\n"))
    with pytest.raises(ImproperlyConfigured, match="set OPENONCE_X or OPENONCE_X_FILE, not both"):
        env_secret("OPENONCE_X")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty"),
        ("\n", "is empty"),
        ("   \n", "is empty"),
        ("first\nsecond\n", "holds more than one line"),
        (b"\xff\xfe\x00", "is not UTF-8 text"),
    ],
)
def test_a_bad_file_stops_start_up_without_showing_its_content(
    monkeypatch, secret_file, content, message
) -> None:
    monkeypatch.delenv("OPENONCE_X", raising=False)
    monkeypatch.setenv("OPENONCE_X_FILE", secret_file(content))
    with pytest.raises(ImproperlyConfigured, match=message) as refused:
        env_secret("OPENONCE_X")
    assert "second" not in str(refused.value)


def test_an_unreadable_file_names_the_variable_and_the_reason(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("OPENONCE_X", raising=False)
    monkeypatch.setenv("OPENONCE_X_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match=r"OPENONCE_X_FILE=.*missing.* cannot be read"):
        env_secret("OPENONCE_X")
    monkeypatch.setenv("OPENONCE_X_FILE", str(tmp_path))  # a folder
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        env_secret("OPENONCE_X")


def test_the_database_password_uses_the_same_rules(monkeypatch, secret_file) -> None:
    monkeypatch.setenv("OPENONCE_DB_NAME", "openonce")
    monkeypatch.delenv("OPENONCE_DB_PASSWORD", raising=False)
    monkeypatch.setenv("OPENONCE_DB_PASSWORD_FILE", secret_file("any/char#acters@are:fine\n"))
    entry = database_from_parts()
    assert entry is not None and entry["PASSWORD"] == "any/char#acters@are:fine"
    monkeypatch.setenv("OPENONCE_DB_PASSWORD", "other")
    with pytest.raises(ImproperlyConfigured, match="not both"):
        database_from_parts()


def production(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The production settings in a fresh process, printing the secrets they loaded."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENONCE_", "DJANGO_"))}
    code = (
        "import django; django.setup(); from django.conf import settings;"
        " print(settings.SECRET_KEY); print(settings.OPENONCE_SECRET_PEPPER)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **clean,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "openonce_site.settings.production",
            "OPENONCE_DATABASE": "postgresql://u@127.0.0.1:5432/nowhere",
            "OPENONCE_CACHE_URL": "locmem",
            **env,
        },
    )


def test_production_reads_the_secret_key_and_the_pepper_from_files(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    (tmp_path / "pepper").write_text("p" * 40 + "\n")
    done = production(
        {
            "OPENONCE_SECRET_KEY": "",  # as compose passes it when .env leaves it out
            "OPENONCE_SECRET_KEY_FILE": str(tmp_path / "key"),
            "OPENONCE_SECRET_PEPPER_FILE": str(tmp_path / "pepper"),
        }
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [KEY, "p" * 40]


def test_production_refuses_a_key_given_twice_and_a_short_pepper_file(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    twice = production(
        {"OPENONCE_SECRET_KEY": KEY, "OPENONCE_SECRET_KEY_FILE": str(tmp_path / "key")}
    )
    assert twice.returncode != 0
    assert "set OPENONCE_SECRET_KEY or OPENONCE_SECRET_KEY_FILE, not both" in twice.stderr
    (tmp_path / "pepper").write_text("short\n")
    short = production(
        {"OPENONCE_SECRET_KEY": KEY, "OPENONCE_SECRET_PEPPER_FILE": str(tmp_path / "pepper")}
    )
    assert short.returncode != 0
    assert "OPENONCE_SECRET_PEPPER must be at least 32 characters" in short.stderr
