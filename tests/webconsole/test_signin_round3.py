"""Sign-in throttling that a stranger cannot turn against the owner, and forwarded headers
believed only from the proxies the operator named.

* With OPENONCE_TLS=proxy, X-Forwarded-For and X-Forwarded-Proto count only when the
  request arrives from an address in OPENONCE_TRUSTED_PROXIES; the chain is read right
  to left, past the trusted hops, to the first address nobody trusted wrote.
* Failures lock a name at one address (and an address for every name); failures for a
  name from many addresses only slow it down for addresses it never signed in from.
* ``clear_lockout NAME`` and ``create_operator NAME`` end a name's lockout.

Time is moved by replacing ``console.signin.clock``; nothing sleeps."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse

from console import signin
from console.access import client_address
from console.roles import sync_roles

PASSWORD = "correct horse battery staple"
WRONG = "not the password at all"
OWNER_AT = "198.51.100.7"

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
def owner() -> User:
    sync_roles()
    user = User.objects.create_user("approver", password=PASSWORD)
    user.groups.add(Group.objects.get(name="approver"))
    return user


def attempt(address: str, username: str, password: str, **extra: Any) -> Any:
    return Client(REMOTE_ADDR=address).post(
        reverse("login"), {"username": username, "password": password}, **extra
    )


def address_seen(remote: str, **headers: str) -> str:
    """The address the console counts and logs for a request from ``remote``."""
    from django.test import RequestFactory

    return client_address(RequestFactory().get("/", REMOTE_ADDR=remote, **headers))


# -- forwarded headers ----------------------------------------------------------------------


@override_settings(OPENONCE_BEHIND_PROXY=True)
def test_a_forwarded_address_from_a_peer_that_is_no_proxy_is_ignored() -> None:
    # gunicorn reached directly (bound to 0.0.0.0): the header is the client's own claim.
    assert address_seen("203.0.113.9", HTTP_X_FORWARDED_FOR="10.0.0.1") == "203.0.113.9"
    # From the proxy on loopback (the default trusted set) it is believed.
    assert address_seen("127.0.0.1", HTTP_X_FORWARDED_FOR="10.0.0.1") == "10.0.0.1"
    assert address_seen("::1", HTTP_X_FORWARDED_FOR="2001:db8::5") == "2001:db8::5"


@override_settings(
    OPENONCE_BEHIND_PROXY=True, OPENONCE_TRUSTED_PROXIES=["127.0.0.1", "172.18.0.0/16"]
)
def test_the_chain_is_read_right_to_left_past_the_trusted_proxies() -> None:
    chain = "6.6.6.6, 203.0.113.9, 172.18.0.3"  # client-written, client, inner proxy
    assert address_seen("127.0.0.1", HTTP_X_FORWARDED_FOR=chain) == "203.0.113.9"
    # Every hop trusted: the leftmost is as far as anyone can see.
    assert address_seen("172.18.0.9", HTTP_X_FORWARDED_FOR="172.18.0.4") == "172.18.0.4"
    # A peer outside the set: nothing forwarded counts.
    assert address_seen("172.19.0.9", HTTP_X_FORWARDED_FOR=chain) == "172.19.0.9"
    # An IPv4 peer written as IPv6 (gunicorn bound to [::]) is the same peer.
    assert address_seen("::ffff:127.0.0.1", HTTP_X_FORWARDED_FOR="10.1.1.1") == "10.1.1.1"


def test_without_a_declared_proxy_no_forwarded_address_is_believed() -> None:
    assert address_seen("127.0.0.1", HTTP_X_FORWARDED_FOR="10.0.0.1") == "127.0.0.1"


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=3, OPENONCE_BEHIND_PROXY=True)
def test_a_guesser_reaching_gunicorn_directly_cannot_pick_fresh_addresses(
    owner: User, clock: Clock
) -> None:
    answers = [
        attempt("203.0.113.9", f"user{n}", WRONG, HTTP_X_FORWARDED_FOR=f"10.0.0.{n}").status_code
        for n in range(5)
    ]
    assert answers == [200, 200, 429, 429, 429]


@override_settings(
    OPENONCE_BEHIND_PROXY=True,
    SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"),
    SECURE_SSL_REDIRECT=True,
)
def test_a_forwarded_scheme_counts_only_from_a_trusted_proxy() -> None:
    direct = Client(REMOTE_ADDR="203.0.113.9").get(reverse("login"), HTTP_X_FORWARDED_PROTO="https")
    assert direct.status_code == 301 and direct["Location"].startswith("https://")
    proxied = Client(REMOTE_ADDR="127.0.0.1").get(reverse("login"), HTTP_X_FORWARDED_PROTO="https")
    assert proxied.status_code == 200


@pytest.mark.parametrize("value", ["10.0.0.0/33", "localhost", "10.0.0.1/8x", "1.2.3"])
def test_a_malformed_trusted_proxy_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from openonce_site.env import env_networks

    monkeypatch.setenv("OPENONCE_TRUSTED_PROXIES", f"127.0.0.1,{value}")
    with pytest.raises(ImproperlyConfigured, match="OPENONCE_TRUSTED_PROXIES"):
        env_networks("OPENONCE_TRUSTED_PROXIES", [])
    monkeypatch.setenv("OPENONCE_TRUSTED_PROXIES", " 10.0.0.0/8, ::1 ,192.168.1.7")
    assert env_networks("OPENONCE_TRUSTED_PROXIES", []) == [
        "10.0.0.0/8",
        "::1/128",
        "192.168.1.7/32",
    ]


# -- a stranger cannot lock the owner out -----------------------------------------------------


def test_a_strangers_failures_from_elsewhere_do_not_lock_the_owner_out(
    owner: User, clock: Clock
) -> None:
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 302  # the owner's address
    # Five wrong passwords every fifteen minutes, each from another address: enough to
    # keep a name-wide lockout going for ever.
    for round_ in range(8):
        clock.advance(900)
        for n in range(5):
            attempt(f"203.0.113.{round_ * 5 + n}", "approver", WRONG)
        assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 302
        Client().post(reverse("logout"))


def test_failures_lock_the_name_at_that_address_only(owner: User, clock: Clock) -> None:
    answers = [attempt("203.0.113.9", "approver", WRONG).status_code for _ in range(6)]
    assert answers == [200] * 4 + [429] * 2
    assert attempt("203.0.113.9", "approver", PASSWORD).status_code == 429
    assert attempt("192.0.2.44", "approver", PASSWORD).status_code == 302  # a new address


@override_settings(OPENONCE_SIGNIN_USER_CAP=10, OPENONCE_SIGNIN_SLOWDOWN_MAX=60)
def test_many_addresses_guessing_one_name_slow_it_down_but_never_lock_it(
    owner: User, clock: Clock
) -> None:
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 302
    for n in range(10):  # up to the cap: ordinary refusals
        assert attempt(f"203.0.113.{n}", "approver", WRONG).status_code == 200
    # Beyond the cap each failure from an address the name never signed in from makes
    # the next one wait longer: 1 s, 2 s, 4 s, ... up to the maximum.
    waits = []
    for n in range(10, 20):
        response = attempt(f"203.0.113.{n}", "approver", WRONG)
        assert response.status_code == 429
        waits.append(int(response["Retry-After"]))
        # Refused without a password check while it waits, from any new address.
        early = attempt(f"192.0.2.{n}", "approver", PASSWORD)
        assert early.status_code == 429 and "slowed" in early.content.decode()
        clock.advance(waits[-1])
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    # The wait is over: the right password from a new address signs in.
    assert attempt("192.0.2.200", "approver", PASSWORD).status_code == 302
    # The owner's own address never waited.
    attempt("203.0.113.250", "approver", WRONG)
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 302
    # Other names are not slowed by this one's guessers.
    assert attempt("192.0.2.201", "nobody", WRONG).status_code == 200


# -- clearing a lockout ---------------------------------------------------------------------


def test_create_operator_clears_the_names_lockout(owner: User, clock: Clock) -> None:
    for _ in range(5):
        attempt(OWNER_AT, "approver", WRONG)
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 429
    out = io.StringIO()
    call_command(
        "create_operator", "approver", "--role", "approver", "--password", PASSWORD, stdout=out
    )
    assert "sign-in lockout" in out.getvalue()
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 302


@override_settings(OPENONCE_SIGNIN_USER_CAP=6)
def test_clear_lockout_ends_a_names_lockout_and_slowdown(owner: User, clock: Clock) -> None:
    for _ in range(5):
        attempt(OWNER_AT, "approver", WRONG)
    for n in range(4):
        attempt(f"203.0.113.{n}", "approver", WRONG)
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 429
    assert attempt("192.0.2.1", "approver", PASSWORD).status_code == 429  # slowed
    out = io.StringIO()
    call_command("clear_lockout", "APPROVER", stdout=out)  # any spelling of the name
    assert "cleared" in out.getvalue()
    assert attempt(OWNER_AT, "approver", PASSWORD).status_code == 302
    assert attempt("192.0.2.1", "approver", PASSWORD).status_code == 302


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=3)
def test_clear_lockout_for_an_address(owner: User, clock: Clock) -> None:
    for n in range(3):
        attempt("203.0.113.9", f"u{n}", WRONG)
    assert attempt("203.0.113.9", "approver", PASSWORD).status_code == 429
    call_command("clear_lockout", "--address", "203.0.113.9", stdout=io.StringIO())
    assert attempt("203.0.113.9", "approver", PASSWORD).status_code == 302


def test_clear_lockout_refuses_nothing_to_clear() -> None:
    with pytest.raises(CommandError, match="name"):
        call_command("clear_lockout", stdout=io.StringIO())
    with pytest.raises(CommandError, match="not an IP address"):
        call_command("clear_lockout", "--address", "nowhere", stdout=io.StringIO())


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=3)
def test_an_ipv6_client_is_counted_by_its_64(owner: User, clock: Clock) -> None:
    # One home network holds 2^64 addresses: a fresh one per guess must not help.
    answers = [attempt(f"2001:db8:1:2::{n:x}", f"u{n}", WRONG).status_code for n in range(4)]
    assert answers == [200, 200, 429, 429]
    assert attempt("2001:db8:1:3::1", "approver", PASSWORD).status_code == 302  # next /64


@override_settings(OPENONCE_SIGNIN_ADDRESS_LIMIT=3)
def test_ipv4_clients_of_a_server_bound_to_ipv6_are_counted_apart(
    owner: User, clock: Clock
) -> None:
    # gunicorn bound to [::] sees every IPv4 client as ::ffff:a.b.c.d; counted as IPv6,
    # they would all share one /64 and one guesser would lock everybody out.
    for n in range(3):
        attempt("::ffff:203.0.113.9", f"u{n}", WRONG)
    assert attempt("::ffff:203.0.113.9", "approver", PASSWORD).status_code == 429
    assert address_seen("::ffff:203.0.113.9") == "203.0.113.9"
    assert attempt("::ffff:198.51.100.7", "approver", PASSWORD).status_code == 302
