"""Clearing a sign-in lockout from the console (/lockouts/), for admins who have the
console and no shell.

* Only ``clear_lockout`` (the admin role) may look a name up or clear it: everyone else
  gets 403 on both, and the lockout stays.
* The page says whether the name is locked at an address, slowed, and for how long; a
  POST (CSRF-checked) clears it, and the clearing is recorded with who, which name, when
  and why, in a table the database keeps append-only.
* Bad input answers 4xx with a message and changes nothing.

Time is moved by replacing ``console.signin.clock``; nothing sleeps."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.test import Client, override_settings
from django.urls import reverse
from test_console_views import (
    CSRF,
    PASSWORD,
    Agent,
    client_for,
    fresh_ledger,
    html,
    make_users,
    post,
)

from console import lockouts, signin
from console.roles import ROLES
from ledger import clients as site_ledger

WRONG = "not the password at all"
OWNER_AT = "198.51.100.7"
START = 1_900_000_000.0

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> dict[str, User]:
    return make_users()


@pytest.fixture(autouse=True)
def empty_throttle_and_record() -> Iterator[None]:
    cache.clear()
    # The clearings table is the console's own, outside Django's flush; the database
    # refuses DELETE on it, so a test starts from an empty one by TRUNCATE.
    with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {lockouts.TABLE}")
    yield
    cache.clear()


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = START
        monkeypatch.setattr(signin, "clock", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def attempt(address: str, username: str, password: str) -> Any:
    return Client(REMOTE_ADDR=address).post(
        reverse("login"), {"username": username, "password": password}
    )


def lock_out(username: str, address: str = OWNER_AT) -> None:
    for _ in range(5):
        attempt(address, username, WRONG)
    assert attempt(address, username, PASSWORD).status_code == 429


def look_up(client: Client, **query: str) -> Any:
    return client.get(reverse("lockouts"), query)


def clear(client: Client, **fields: str) -> Any:
    return post(client, reverse("lockout-clear"), fields)


# -- an admin clears an owner's lockout --------------------------------------------------


def test_an_admin_sees_and_clears_a_lockout_and_the_owner_signs_in(
    users, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    lock_out("operator")
    admin = client_for(users["admin"])
    clock.advance(60)

    page = html(look_up(admin, name="operator", address=OWNER_AT))
    assert "locked at 198.51.100.7" in page
    assert "14m 0s" in page  # 900 s lockout, 60 s gone
    assert "5 failed sign-ins for this name" in page
    # Without an address the page cannot name one, but says clearing ends them all.
    assert "every address" in html(look_up(admin, name="operator"))

    with caplog.at_level(logging.WARNING, logger="openonce.security"):
        response = clear(admin, name="operator", address=OWNER_AT, reason="called me from her desk")
    assert response.status_code == 302
    assert response["Location"] == reverse("lockouts") + "?name=operator&address=198.51.100.7"
    after = admin.get(response["Location"])
    assert "Cleared the sign-in lockout of operator" in html(after)
    assert "not locked" in html(after)
    assert "sign-in lockout cleared: user='admin' cleared name='operator'" in caplog.text

    assert attempt(OWNER_AT, "operator", PASSWORD).status_code == 302


def test_the_clearing_is_recorded_with_who_which_name_when_and_why(users, clock: Clock) -> None:
    lock_out("viewer")
    admin = client_for(users["admin"])
    clear(admin, name="viewer", reason="locked herself out")
    clock.advance(30)
    clear(admin, name="Viewer")  # no reason: it is optional

    rows = lockouts.recent_clearings()
    assert [(r.actor, r.username, r.reason, r.at) for r in rows] == [
        ("operator:admin", "Viewer", "", START + 30),
        ("operator:admin", "viewer", "locked herself out", START),
    ]
    page = html(look_up(admin))
    assert "operator:admin" in page and "locked herself out" in page
    assert "2030-03-17 17:46:40 UTC" in page  # START, as the page writes times


def test_the_record_is_append_only(users, clock: Clock) -> None:
    clear(client_for(users["admin"]), name="viewer", reason="first")
    with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
        for statement in (
            f"UPDATE {lockouts.TABLE} SET reason = 'rewritten'",
            f"DELETE FROM {lockouts.TABLE}",
        ):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement)
    assert [r.reason for r in lockouts.recent_clearings()] == ["first"]


def test_the_operator_audit_log_page_shows_the_clearing(users, clock: Clock) -> None:
    admin = client_for(users["admin"])
    clear(admin, name="viewer", reason="locked herself out")
    page = html(admin.get(reverse("audit")))
    assert "locked herself out" in page and "Sign-in lockouts cleared" in page


@override_settings(OPENONCE_SIGNIN_USER_CAP=3)
def test_a_slowed_name_shows_its_wait_and_failures(users, clock: Clock) -> None:
    for n in range(5):
        clock.advance(1)  # past the 1 s the fourth failure makes new addresses wait
        assert attempt(f"203.0.113.{n}", "approver", WRONG).status_code in (200, 429)
    page = html(look_up(client_for(users["admin"]), name="APPROVER"))  # any spelling
    assert "slowed" in page and "5 failed sign-ins" in page
    assert "new addresses wait 2s" in page  # two failures beyond the cap of 3
    clear(client_for(users["admin"]), name="approver")
    assert attempt("192.0.2.1", "approver", PASSWORD).status_code == 302


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=3)
def test_an_address_lockout_is_shown_and_cleared_with_the_name(users, clock: Clock) -> None:
    for n in range(3):
        attempt("203.0.113.9", f"u{n}", WRONG)
    assert attempt("203.0.113.9", "viewer", PASSWORD).status_code == 429
    admin = client_for(users["admin"])
    assert "The address 203.0.113.9 is locked" in html(
        look_up(admin, name="viewer", address="203.0.113.9")
    )
    assert clear(admin, name="viewer", address="203.0.113.9").status_code == 302
    assert attempt("203.0.113.9", "viewer", PASSWORD).status_code == 302
    [row] = lockouts.recent_clearings()
    assert row.address == "203.0.113.9"


# -- who may ------------------------------------------------------------------------------


def test_only_admins_hold_the_permission() -> None:
    assert [role for role, perms in ROLES.items() if "clear_lockout" in perms] == ["admin"]


def test_the_migration_gave_the_permission_to_the_admin_group(agent: Agent) -> None:
    holders = Group.objects.filter(permissions__codename="clear_lockout")
    assert list(holders.values_list("name", flat=True)) == ["admin"]


@pytest.mark.parametrize("role", ["viewer", "operator", "approver", "norole"])
def test_anyone_else_gets_403_and_the_lockout_stays(users, clock: Clock, role: str) -> None:
    lock_out("admin")
    client = client_for(users[role])
    assert look_up(client, name="admin").status_code == 403
    assert clear(client, name="admin", reason="let me in").status_code == 403
    assert attempt(OWNER_AT, "admin", PASSWORD).status_code == 429
    assert lockouts.recent_clearings() == []


def test_an_anonymous_visitor_is_sent_to_sign_in(users, clock: Clock) -> None:
    lock_out("admin")
    client = client_for(None)
    for response in (look_up(client, name="admin"), clear(client, name="admin")):
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")
    assert attempt(OWNER_AT, "admin", PASSWORD).status_code == 429


def test_the_nav_link_is_shown_only_to_admins(users) -> None:
    link = f'href="{reverse("lockouts")}"'
    for role in ("viewer", "operator", "approver", "norole", "admin"):
        page = html(client_for(users[role]).get(reverse("capabilities")))
        if role == "norole":
            continue  # no page of the console is theirs to open
        assert (link in page) == (role == "admin"), role


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": ""}, "Type the name"),
        ({"name": "   "}, "Type the name"),
        ({"name": "x" * 151}, "at most 150 characters"),
        ({"name": "admin\x00"}, "Null characters are not allowed"),
        ({"name": "admin", "address": "nowhere"}, "not an IP address"),
        ({"name": "admin", "address": "10.0.0.0/8"}, "not an IP address"),
        ({"name": "admin", "address": "1" * 46}, "at most 45 characters"),
        ({"name": "admin", "address": "1.2.3.4\x00"}, "Null characters are not allowed"),
        ({"name": "admin", "reason": "r\x00"}, "Null characters are not allowed"),
        ({"name": "admin", "reason": "r" * 2001}, "at most 2000 characters"),
    ],
)
def test_bad_input_is_a_400_with_a_message_and_changes_nothing(
    users, clock: Clock, fields: dict[str, str], message: str
) -> None:
    lock_out("admin")
    admin = client_for(users["admin"])
    response = clear(admin, **fields)
    assert response.status_code == 400 and message in html(response)
    assert attempt(OWNER_AT, "admin", PASSWORD).status_code == 429
    assert lockouts.recent_clearings() == []
    lookup = {k: v for k, v in fields.items() if k != "reason"}
    if lookup != {"name": "admin"}:
        response = look_up(admin, **lookup)
        assert response.status_code == 400 and message in html(response)


def test_clearing_is_post_only_and_csrf_checked(users, clock: Clock) -> None:
    lock_out("admin")
    admin = client_for(users["admin"])
    response = admin.get(reverse("lockout-clear"), {"name": "admin"})
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert "Clearing a lockout is done with the form" in html(response)
    without_token = admin.post(reverse("lockout-clear"), {"name": "admin"})
    assert without_token.status_code == 403
    wrong_token = admin.post(reverse("lockout-clear"), {"name": "admin"}, HTTP_X_CSRFTOKEN="w" * 32)
    assert wrong_token.status_code == 403
    assert attempt(OWNER_AT, "admin", PASSWORD).status_code == 429
    assert lockouts.recent_clearings() == []


def test_a_name_no_account_holds_is_said_so(users) -> None:
    page = html(look_up(client_for(users["admin"]), name="nobody-here"))
    assert "No account is named nobody-here" in page


# -- in a browser -------------------------------------------------------------------------


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_in_a_browser_the_page_clears_passes_axe_and_fits_a_phone(
    open_page, users, axe_source: str, clock: Clock, width: str, dark: bool
) -> None:
    from conftest import DESKTOP, PHONE
    from playwright.sync_api import expect
    from test_console_ux_browser import overflow, serious_violations, sign_in

    lock_out("operator")
    page = open_page(PHONE if width == "phone" else DESKTOP, dark=dark)
    sign_in(page, "admin")
    page.get_by_role("link", name="Lockouts").click()
    page.get_by_label("Name:", exact=True).fill("operator")
    page.get_by_label("Address (optional):", exact=True).fill(OWNER_AT)
    # axe and the width are measured on the whole page (its stylesheet loaded), not on
    # the text alone: wait for the answer's load event.
    with page.expect_navigation():
        page.get_by_role("button", name="Look up").click()
    expect(page.locator("main")).to_contain_text("locked at 198.51.100.7")
    assert serious_violations(page, axe_source) == []
    assert overflow(page) <= 0
    header = page.locator("header.top").bounding_box()
    assert header is not None and header["height"] <= 120  # as on every console page
    page.get_by_label("Reason (optional):", exact=True).fill("on the phone with her")
    with page.expect_navigation():  # the POST, then the page it redirects to, loaded
        page.get_by_role("button", name="Clear the lockout of operator").click()
    expect(page.locator(".messages")).to_contain_text("Cleared the sign-in lockout of operator")
    expect(page.locator("main table")).to_contain_text("on the phone with her")
    # The message list keeps its list role (role="status" is on a wrapping <div>): axe
    # found "listitem" on every page showing a message while it sat on the <ul>.
    assert serious_violations(page, axe_source) == []
    assert overflow(page) <= 0
    assert attempt(OWNER_AT, "operator", PASSWORD).status_code == 302


def test_other_methods_are_405_with_a_message(users) -> None:
    admin = client_for(users["admin"])
    for response in (
        admin.put(reverse("lockouts"), HTTP_X_CSRFTOKEN=CSRF),
        admin.head(reverse("lockout-clear")),
        admin.delete(reverse("lockout-clear"), HTTP_X_CSRFTOKEN=CSRF),
    ):
        assert response.status_code == 405
    assert "answers GET only" in html(admin.put(reverse("lockouts"), HTTP_X_CSRFTOKEN=CSRF))


def test_the_page_says_when_counters_are_per_process(users) -> None:
    admin = client_for(users["admin"])
    assert "only the process that answered" in html(look_up(admin, name="admin"))  # locmem
    redis_like = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
    with override_settings(CACHES=redis_like):
        assert "only the process that answered" not in html(look_up(admin, name="admin"))
