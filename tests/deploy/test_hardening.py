"""Hardening of the deployment, each bullet as the attack a request makes and the
refusal it meets: sign-in throttling (per username, per address, before any password is
hashed), CSP and Permissions-Policy, log lines that request data cannot forge,
create_operator's password validators, debug pages that mask every credential, entry
points that never fall back to the dev settings, and the product's own error pages.

Time is moved by replacing ``console.signin.clock``; nothing sleeps."""

from __future__ import annotations

import io
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse
from django.views.debug import ExceptionReporter

from console import signin
from console.roles import sync_roles

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"
WRONG = "not the password at all"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_throttle() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1_900_000_000.0
        monkeypatch.setattr(signin, "clock", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


@pytest.fixture
def approver() -> User:
    sync_roles()
    user = User.objects.create_user("approver", password=PASSWORD)
    user.groups.add(Group.objects.get(name="approver"))
    return user


def attempt(client: Client, username: str, password: str, **extra: Any) -> Any:
    return client.post(reverse("login"), {"username": username, "password": password}, **extra)


def signed_in(client: Client) -> bool:
    return client.get(reverse("queue")).status_code == 200


def failure_lines(caplog: pytest.LogCaptureFixture) -> int:
    return sum("sign-in failed" in r.getMessage() for r in caplog.records)


# -- sign-in throttling --------------------------------------------------------------------


def test_thirty_wrong_passwords_lock_the_name_and_the_right_one_is_refused_too(
    approver: User, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="openonce.security")
    client = Client()
    answers = [attempt(client, "approver", WRONG).status_code for _ in range(30)]
    # Four ordinary refusals; the fifth failure reaches the limit and says so; every
    # later try is refused without being checked.
    assert answers == [200] * 4 + [429] * 26
    assert failure_lines(caplog) == 5  # the password was checked five times, not thirty
    assert any("sign-in locked: user limit of 5" in r.getMessage() for r in caplog.records)

    right = attempt(client, "approver", PASSWORD)
    assert right.status_code == 429
    assert int(right["Retry-After"]) == 900
    assert "Too many failed sign-ins" in right.content.decode()
    assert "Nothing was checked this time" in right.content.decode()
    assert failure_lines(caplog) == 5
    assert not signed_in(client)

    clock.advance(899)
    assert attempt(client, "approver", PASSWORD).status_code == 429
    assert int(attempt(client, "approver", PASSWORD)["Retry-After"]) == 1
    clock.advance(1)
    response = attempt(client, "approver", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/"
    assert signed_in(client)


def test_a_lookalike_spelling_of_the_name_shares_its_lockout(approver: User, clock: Clock) -> None:
    client = Client()
    for _ in range(5):
        attempt(client, "approver", WRONG)
    assert attempt(client, "APPROVER", WRONG).status_code == 429
    fullwidth = "".join(chr(ord(c) + 0xFEE0) for c in "approver")
    assert attempt(client, fullwidth, WRONG).status_code == 429


def test_a_success_clears_the_names_failures(approver: User, clock: Clock) -> None:
    client = Client()
    for _ in range(4):
        assert attempt(client, "approver", WRONG).status_code == 200
    assert attempt(client, "approver", PASSWORD).status_code == 302
    client.post(reverse("logout"))
    for _ in range(4):
        assert attempt(client, "approver", WRONG).status_code == 200  # counted afresh


def test_failures_age_out_of_the_window(approver: User, clock: Clock) -> None:
    client = Client()
    for _ in range(4):
        attempt(client, "approver", WRONG)
    clock.advance(2 * 900)  # two windows later: those four no longer count
    for _ in range(4):
        assert attempt(client, "approver", WRONG).status_code == 200
    assert attempt(client, "approver", PASSWORD).status_code == 302


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=6)
def test_one_address_guessing_many_names_is_locked_out_for_every_name(
    approver: User, clock: Clock
) -> None:
    guesser = Client(REMOTE_ADDR="203.0.113.9")
    answers = [attempt(guesser, f"user{n}", WRONG).status_code for n in range(8)]
    assert answers == [200] * 5 + [429] * 3
    # Even the real account's right password, from that address.
    assert attempt(guesser, "approver", PASSWORD).status_code == 429
    assert not signed_in(guesser)
    # The person at another address is not locked out with the guesser.
    colleague = Client(REMOTE_ADDR="198.51.100.7")
    assert attempt(colleague, "approver", PASSWORD).status_code == 302


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=6)
def test_a_forged_x_forwarded_for_does_not_buy_fresh_addresses(
    approver: User, clock: Clock
) -> None:
    guesser = Client(REMOTE_ADDR="203.0.113.9")
    answers = [
        attempt(guesser, f"user{n}", WRONG, HTTP_X_FORWARDED_FOR=f"10.0.0.{n}").status_code
        for n in range(7)
    ]
    assert answers == [200] * 5 + [429] * 2


@override_settings(
    OPENONCE_SIGNIN_ADDRESS_LIMIT=3,
    OPENONCE_BEHIND_PROXY=True,
    OPENONCE_TRUSTED_PROXIES=["172.18.0.0/16"],  # the proxy must be named: not loopback
)
def test_behind_the_declared_proxy_the_address_it_wrote_is_counted(
    approver: User, clock: Clock
) -> None:
    proxy = "172.18.0.5"  # every request arrives from the proxy
    for n in range(3):
        attempt(
            Client(REMOTE_ADDR=proxy),
            f"u{n}",
            WRONG,
            HTTP_X_FORWARDED_FOR=f"1.1.1.1, 203.0.113.{9}",
        )
    # The client-chosen first entry differs, the proxy's last entry is the same: locked.
    locked = attempt(
        Client(REMOTE_ADDR=proxy), "approver", PASSWORD, HTTP_X_FORWARDED_FOR="8.8.8.8, 203.0.113.9"
    )
    assert locked.status_code == 429
    # Another client behind the same proxy signs in.
    other = attempt(
        Client(REMOTE_ADDR=proxy), "approver", PASSWORD, HTTP_X_FORWARDED_FOR="198.51.100.7"
    )
    assert other.status_code == 302


def test_an_htmx_sign_in_during_lockout_is_refused_too(approver: User, clock: Clock) -> None:
    client = Client()
    for _ in range(5):
        attempt(client, "approver", WRONG)
    response = attempt(client, "approver", PASSWORD, HTTP_HX_REQUEST="true")
    assert response.status_code == 429 and not signed_in(client)


# -- headers -------------------------------------------------------------------------------


def test_every_page_carries_csp_and_permissions_policy(approver: User) -> None:
    client = Client()
    # Static files are answered by WhiteNoise before the CSP middleware: a stylesheet
    # runs nothing, and keeps nosniff.
    assert client.get("/static/console/console.css")["X-Content-Type-Options"] == "nosniff"
    pages = [client.get(reverse("login"))]
    client.force_login(approver)
    pages += [client.get(reverse("queue")), client.get("/no-such-page/")]
    for response in pages:
        csp = response["Content-Security-Policy"]
        assert "default-src 'none'" in csp
        assert "script-src 'self'" in csp and "style-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp and "form-action 'self'" in csp
        policy = response["Permissions-Policy"]
        assert "camera=()" in policy and "geolocation=()" in policy and "payment=()" in policy
        assert response["X-Content-Type-Options"] == "nosniff"


def test_the_console_templates_hold_no_inline_script_or_style() -> None:
    # The CSP forbids them; a template that used one would break in the browser.
    for template in (ROOT / "templates").rglob("*.html"):
        text = template.read_text()
        assert "<style" not in text and " style=" not in text, template
        assert "<script>" not in text and " on" + "click=" not in text, template


# -- log lines cannot be forged ------------------------------------------------------------


FORGED = "/effects/x%0A2026-01-01 WARNING openonce.security sign-in ok: user='admin'/approve/"


def test_a_newline_in_a_path_does_not_forge_a_security_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sync_roles()
    viewer = User.objects.create_user("viewer", password=PASSWORD)
    viewer.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(viewer)
    caplog.set_level(logging.WARNING, logger="openonce.security")
    response = client.post(FORGED)
    assert response.status_code in (403, 404)
    messages = [r.getMessage() for r in caplog.records if r.name == "openonce.security"]
    assert messages, "the denial was logged"
    for message in messages:
        assert "\n" not in message and "\r" not in message
    assert any("x\\x0a2026-01-01 WARNING" in m for m in messages)


def test_the_log_handler_keeps_every_record_on_one_line() -> None:
    handler = next(
        h
        for h in logging.getLogger().handlers
        if any(type(f).__name__ == "OneLineFilter" for f in h.filters)
    )
    stream = io.StringIO()
    old = handler.setStream(stream)  # type: ignore[attr-defined]
    try:
        logging.getLogger("django.request").warning("Not Found: %s", "/a\nINFO forged\u202e")
        logging.getLogger("openonce.test").warning("reason=%s", "line1\r\nline2")
    finally:
        handler.setStream(old)  # type: ignore[attr-defined]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("/a\\x0aINFO forged\\u202e")
    assert lines[1].endswith("reason=line1\\x0d\\x0aline2")


# -- create_operator -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("1", "too short"),
        ("password1234", "too common"),
        ("849302718465", "entirely numeric"),
        ("newoperator1", "too similar to the username"),
    ],
)
def test_create_operator_applies_the_password_validators(password: str, why: str) -> None:
    with pytest.raises(CommandError, match=f"password refused, nothing changed: .*{why}"):
        call_command("create_operator", "newoperator", "--role", "viewer", "--password", password)
    assert not User.objects.filter(username="newoperator").exists()


def test_a_refused_reset_keeps_the_old_password(approver: User) -> None:
    with pytest.raises(CommandError, match="too short"):
        call_command("create_operator", "approver", "--role", "admin", "--password", "1")
    approver.refresh_from_db()
    assert approver.check_password(PASSWORD)
    assert list(approver.groups.values_list("name", flat=True)) == ["approver"]


def test_create_operator_with_a_strong_or_random_password(capsys: pytest.CaptureFixture) -> None:
    call_command("create_operator", "eric", "--role", "approver", "--password", PASSWORD)
    assert User.objects.get(username="eric").check_password(PASSWORD)
    call_command("create_operator", "dana", "--role", "viewer")
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    password = printed.rsplit("password: ", 1)[1]
    assert len(password) >= 16 and User.objects.get(username="dana").check_password(password)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OPENONCE_", "DJANGO_"))}


def _manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT, env={**_clean_env(), "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_commands_on_a_ledger_never_set_up_say_what_to_do(tmp_path: Path) -> None:
    empty = tmp_path / "never-migrated.db"
    done = _manage(tmp_path, "reconciler_health", OPENONCE_DATABASE=str(empty))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "the ledger has no tables yet" in done.stderr
    assert f"ledger: {empty}" in done.stderr
    assert "set OPENONCE_DATABASE" in done.stderr and "make demo" in done.stderr

    made = _manage(
        tmp_path, "create_operator", "x", "--role", "viewer", OPENONCE_DATABASE=str(empty)
    )
    assert made.returncode == 1 and "Traceback" not in made.stderr
    assert f"cannot read accounts from the ledger '{empty}'" in made.stderr
    assert "Run migrate first" in made.stderr and "set OPENONCE_DATABASE" in made.stderr


def test_the_dev_settings_find_the_demo_ledger_of_the_checkout() -> None:
    done = subprocess.run(
        [sys.executable, "-c",
         "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE',"
         " 'openonce_site.settings.dev'); django.setup();"
         "from django.conf import settings; print(settings.DATABASES['default']['NAME'])"],
        cwd="/", env={**_clean_env(), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "demo.db")


# -- debug pages mask every credential ------------------------------------------------------


# Built from pieces, so that the page's source excerpts of this file cannot contain them.
BROKER_PASSWORD, DB_PASSWORD, CONNINFO_PASSWORD = (
    "br0ker" + "-pa55",
    "db%2F" + "pa55%23word",
    "s3" + "cr3t",
)
BROKER = f"redis://:{BROKER_PASSWORD}@redis:6379/0"
DSN = f"postgresql://openonce:{DB_PASSWORD}@postgres:5432/openonce"


@override_settings(
    DEBUG=True, CELERY_BROKER_URL=BROKER, OPENONCE_DATABASE=DSN, OPENONCE_CACHE_URL=BROKER
)
def test_the_debug_page_masks_dsns_and_broker_urls(rf: Any) -> None:
    request = rf.get("/")

    def connect(conninfo: str) -> None:
        raise RuntimeError("could not connect")

    try:
        connect(f"host=postgres password={CONNINFO_PASSWORD} broker={BROKER}")
    except RuntimeError:
        html = ExceptionReporter(request, *sys.exc_info()).get_traceback_html()
    for secret in (BROKER_PASSWORD, DB_PASSWORD, CONNINFO_PASSWORD):
        assert secret not in html
    assert "CELERY_BROKER_URL" in html and "OPENONCE_DATABASE" in html  # listed, masked
    assert "********************" in html


# -- entry points choose production ---------------------------------------------------------


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, env={**_clean_env(), "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


PROBE = "from django.conf import settings; print(settings.SETTINGS_MODULE, settings.DEBUG)"


@pytest.mark.parametrize(
    "entry",
    [
        "import openonce_site.wsgi",
        "import openonce_site.asgi",
        "from openonce_site.celery import app; app.loader.import_default_modules()",
        "import openonce_site; from openonce_site import celery_app",  # as `celery -A` loads it
    ],
)
def test_every_server_entry_point_runs_production_never_debug(entry: str) -> None:
    # No secret key: production refuses to start, naming the variable.
    refused = _python(f"{entry}; {PROBE}", OPENONCE_DEBUG="true")
    assert refused.returncode != 0
    assert "OPENONCE_SECRET_KEY must be set" in refused.stderr
    # With one (and DEBUG asked for in the environment): production, DEBUG off.
    ran = _python(
        f"{entry}; {PROBE}",
        OPENONCE_DEBUG="true",
        OPENONCE_SECRET_KEY=secrets.token_urlsafe(64),
        OPENONCE_DATABASE="postgresql://root@127.0.0.1:5432/test",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[-2:] == ["openonce_site.settings.production", "False"]


def test_production_refuses_to_start_without_a_ledger() -> None:
    done = _python(PROBE, DJANGO_SETTINGS_MODULE="openonce_site.settings.production",
                   OPENONCE_SECRET_KEY=secrets.token_urlsafe(64))  # fmt: skip
    assert done.returncode != 0 and "set OPENONCE_DATABASE" in done.stderr


def test_a_dsn_that_cannot_be_parsed_is_refused_without_echoing_its_password() -> None:
    done = _python(
        PROBE,
        DJANGO_SETTINGS_MODULE="openonce_site.settings.production",
        OPENONCE_SECRET_KEY=secrets.token_urlsafe(64),
        OPENONCE_DATABASE="postgresql://openonce:pa/ss#w:rd@postgres:5432/openonce",
    )
    assert done.returncode != 0
    assert "percent-encode" in done.stderr and "pa/ss#w:rd" not in done.stderr


def test_database_parts_carry_any_password_to_the_ledger_unchanged() -> None:
    password = "p/a#s@s:w ord'"
    code = (
        "import django; django.setup();"
        "from django.conf import settings; from ledger.clients import ledger_target;"
        "from psycopg.conninfo import conninfo_to_dict;"
        "print(repr(settings.DATABASES['default']['PASSWORD']));"
        "print(repr(conninfo_to_dict(ledger_target())['password']))"
    )
    done = _python(
        code,
        DJANGO_SETTINGS_MODULE="openonce_site.settings.production",
        OPENONCE_SECRET_KEY=secrets.token_urlsafe(64),
        OPENONCE_DB_NAME="openonce", OPENONCE_DB_USER="openonce", OPENONCE_DB_HOST="postgres",
        OPENONCE_DB_PASSWORD=password,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [repr(password), repr(password)]


# -- the product's own error pages -----------------------------------------------------------


@override_settings(DEBUG=False)
def test_not_found_and_server_error_are_the_products_pages(approver: User, monkeypatch) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(approver)
    missing = client.get("/no-such-page/")
    assert missing.status_code == 404
    body = missing.content.decode()
    assert "Not found" in body and "URLconf" not in body and "Traceback" not in body

    from console import views

    def broken(request: Any) -> Any:
        raise RuntimeError("secret internals: postgresql://u:pw@h/db")

    monkeypatch.setattr(views.selectors, "human_queue", broken)
    failed = client.get(reverse("queue"))
    assert failed.status_code == 500
    body = failed.content.decode()
    assert "Something went wrong" in body
    assert "secret internals" not in body and "Traceback" not in body


# -- malformed sign-in forms -----------------------------------------------------------------


@pytest.mark.parametrize(
    "form",
    [
        {"username": "approver\x00", "password": PASSWORD},
        {"username": "a" * 10_000, "password": WRONG},
        {"username": "approver"},
        {"password": PASSWORD},
        {},
        {"username": "\u202eapprover", "password": "x" * 100_000},
        {"username": ["approver", "admin"], "password": [WRONG, PASSWORD]},
    ],
)
def test_a_malformed_sign_in_form_is_refused_not_a_500(
    approver: User, clock: Clock, form: dict[str, Any]
) -> None:
    client = Client(raise_request_exception=False)
    response = client.post(reverse("login"), form)
    assert response.status_code in (200, 429)
    assert "Please enter a correct username and password" in response.content.decode() or (
        "This field is required" in response.content.decode()
        or "Null characters are not allowed" in response.content.decode()
    )
    assert not signed_in(client)


def test_sign_in_rejects_a_lone_surrogate_in_raw_bytes(approver: User, clock: Clock) -> None:
    client = Client(raise_request_exception=False)
    response = client.post(
        reverse("login"),
        data=b"username=%ED%A0%80approver&password=x",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 200 and not signed_in(client)
