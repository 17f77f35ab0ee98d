"""Sign-in, throttled so that guessing is slow and a stranger cannot lock anyone out.

Failed sign-ins are counted over a window (OPENONCE_SIGNIN_WINDOW) three ways:

* per name **at one address**: OPENONCE_SIGNIN_USER_LIMIT failures lock that name at
  that address for OPENONCE_SIGNIN_LOCKOUT. The owner elsewhere is not affected;
* per address: OPENONCE_SIGNIN_ADDRESS_LIMIT failures lock the address for every name;
* per name, from everywhere: beyond OPENONCE_SIGNIN_USER_CAP failures, each further
  one makes the name wait before its next try from an address it never signed in from
  — 1 s, 2 s, 4 s, … up to OPENONCE_SIGNIN_SLOWDOWN_MAX. It slows a guesser spread over
  many addresses to one try per that many seconds, but it is never a lock a stranger
  can hold: the owner's own addresses (where the name last signed in) do not wait, and
  a new address waits at most that maximum.

A refusal happens before any password is hashed: a flood of guesses costs the attacker
requests, not us a second of CPU each. ``clear_lockout NAME`` (and ``create_operator
NAME``) ends a name's lockout and slowdown: every counter of a name carries the name's
generation, and clearing moves it on.

The counters live in Django's cache, which production points at Redis so that every
gunicorn worker sees the same counts. Losing them (a Redis restart) only shortens a
lockout; no ledger decision depends on them. No cache key holds what a person typed or
the address they came from: only digests.

Time comes from ``clock`` (seconds), which tests replace to move time instead of
sleeping. Windows are fixed buckets; a count is this bucket's plus the last one's, so a
burst that straddles a bucket boundary is still counted together.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters

from . import views as console_views
from .access import client_address, security_log

clock: Callable[[], float] = time.time

_PREFIX = "signin"
# How long a name remembers an address it signed in from (where it is never slowed).
KNOWN_ADDRESS_SECONDS = 90 * 24 * 3600


def user_cap() -> int:
    return int(getattr(settings, "OPENONCE_SIGNIN_USER_CAP", 20))


def slowdown_max() -> int:
    return int(getattr(settings, "OPENONCE_SIGNIN_SLOWDOWN_MAX", 60))


def _normal_username(username: str) -> str:
    # Lookalike spellings of one name share one counter (over-counting is the safe side).
    return unicodedata.normalize("NFKC", username).casefold().strip()


def _throttled_address(request: HttpRequest) -> str:
    return _counted_address(client_address(request))


def _counted_address(address: str) -> str:
    """The address as counted: an IPv6 client usually holds a whole /64, so one is
    counted as its /64, or every guess could come from a fresh address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return address


def _digest(*parts: object) -> str:
    text = "\0".join(str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _generation_key(name: str) -> str:
    return f"{_PREFIX}:generation:{_digest(name)}"


@dataclass(frozen=True)
class _Subject:
    kind: str  # "address"; "user": the name at this address; "name": the name anywhere
    digest: str
    limit: int  # failures that lock it ("name": failures after which it slows down)

    def counter(self, bucket: int) -> str:
        return f"{_PREFIX}:{self.kind}:{self.digest}:{bucket}"

    @property
    def until(self) -> str:
        return f"{_PREFIX}:{self.kind}:{self.digest}:until"


def _subjects(request: HttpRequest, username: str) -> list[_Subject]:
    return _subjects_at(_throttled_address(request), username)


def _subjects_at(address: str, username: str) -> list[_Subject]:
    subjects = [_Subject("address", _digest(address), settings.OPENONCE_SIGNIN_ADDRESS_LIMIT)]
    if username:
        name = _normal_username(username)
        generation = int(cache.get(_generation_key(name), 0))
        subjects += [
            _Subject(
                "user", _digest(generation, name, address), settings.OPENONCE_SIGNIN_USER_LIMIT
            ),
            _Subject("name", _digest(generation, name), user_cap()),
        ]
    return subjects


def _known_key(request: HttpRequest, username: str) -> str:
    return f"{_PREFIX}:known:{_digest(_normal_username(username), _throttled_address(request))}"


@dataclass(frozen=True)
class Refusal:
    seconds: int
    slowed: bool  # the name is slowed for new addresses, not locked


def refusal(request: HttpRequest, username: str) -> Refusal | None:
    """Why sign-in for this name from this address must wait now, or None."""
    now = clock()
    subjects = _subjects(request, username)
    if username and cache.get(_known_key(request, username)):
        subjects = [s for s in subjects if s.kind != "name"]  # the owner's own address
    found = cache.get_many([s.until for s in subjects])
    locked = slowed = 0.0
    for subject in subjects:
        until = float(found.get(subject.until, 0.0))
        if subject.kind == "name":
            slowed = until
        else:
            locked = max(locked, until)
    if locked > now:
        return Refusal(math.ceil(locked - now), slowed=False)
    if slowed > now:
        return Refusal(math.ceil(slowed - now), slowed=True)
    return None


@dataclass(frozen=True)
class Lockout:
    """What the throttle holds against a name now, as the console's lockouts page shows
    it. A name is locked per address, and only digests are kept, so the addresses where
    it is locked cannot be listed: only asked about, one at a time."""

    failures: int  # failed sign-ins for the name from everywhere, this window and the last
    slowed_for: int  # seconds a new address must still wait (0: not slowed)
    address: str  # the address asked about, as counted ("": none asked about)
    locked_for: int  # seconds the name is locked at that address (0: not locked)
    address_locked_for: int  # seconds the address is locked for every name


def lockout(username: str, address: str = "") -> Lockout:
    """Read, never change: the name's lockout and slowdown, at ``address`` if given (an
    address as the security log shows it)."""
    now = clock()
    bucket = int(now // settings.OPENONCE_SIGNIN_WINDOW)
    counted = _counted_address(address) if address else ""
    subjects = {s.kind: s for s in _subjects_at(counted, username)}

    def left(subject: _Subject) -> int:
        return max(0, math.ceil(float(cache.get(subject.until, 0.0)) - now))

    name = subjects["name"]
    failures = sum(int(cache.get(name.counter(b), 0)) for b in (bucket, bucket - 1))
    return Lockout(
        failures=failures,
        slowed_for=left(name),
        address=counted,
        locked_for=left(subjects["user"]) if address else 0,
        address_locked_for=left(subjects["address"]) if address else 0,
    )


def _count(subject: _Subject, bucket: int, window: int) -> int:
    key = subject.counter(bucket)
    cache.add(key, 0, timeout=2 * window)
    try:
        count = cache.incr(key)
    except ValueError:  # it expired between add and incr
        cache.set(key, count := 1, timeout=2 * window)
    return count + int(cache.get(subject.counter(bucket - 1), 0))


def record_failure(request: HttpRequest, username: str) -> None:
    now = clock()
    window = settings.OPENONCE_SIGNIN_WINDOW
    bucket = int(now // window)
    for subject in _subjects(request, username):
        count = _count(subject, bucket, window)
        if subject.kind == "name":
            if count > subject.limit:
                _slow_down(request, username, subject, count - subject.limit, now)
            continue
        if count >= subject.limit:
            lockout = settings.OPENONCE_SIGNIN_LOCKOUT
            cache.set(subject.until, now + lockout, timeout=lockout + window)
            # A fresh allowance after the lockout, not an instant second one.
            cache.delete_many([subject.counter(bucket), subject.counter(bucket - 1)])
            security_log.warning(
                "sign-in locked: %s limit of %d failures reached (username=%r from %s);"
                " refused for %ds",
                subject.kind, subject.limit, username[:150], client_address(request), lockout,
            )  # fmt: skip


def _slow_down(
    request: HttpRequest, username: str, subject: _Subject, beyond: int, now: float
) -> None:
    # Doubling from one second; the exponent is bounded so a long attack cannot overflow.
    delay = min(slowdown_max(), 2 ** min(beyond - 1, 30))
    cache.set(subject.until, now + delay, timeout=delay + 60)
    security_log.warning(
        "sign-in slowed: %d failures for username=%r within the window (latest from %s);"
        " new addresses wait %ds",
        subject.limit + beyond, username[:150], client_address(request), delay,
    )  # fmt: skip


def forget_failures(request: HttpRequest, username: str) -> None:
    """A successful sign-in clears the name's failures at this address and remembers the
    address as the name's own. Not the address's count (one person signing in must not
    wipe out a guesser's count from the same network), nor the name's count from
    everywhere (the owner signing in must not hand the guessers a fresh allowance)."""
    bucket = int(clock() // settings.OPENONCE_SIGNIN_WINDOW)
    for subject in _subjects(request, username):
        if subject.kind == "user":
            cache.delete_many([subject.counter(bucket), subject.counter(bucket - 1)])
    cache.set(_known_key(request, username), 1, timeout=KNOWN_ADDRESS_SECONDS)


def clear_lockout(username: str) -> None:
    """End the name's lockouts (at every address) and its slowdown: its counters are
    keyed by a generation, which this moves on, so the old ones are never read again."""
    key = _generation_key(_normal_username(username))
    cache.add(key, 0, timeout=None)
    try:
        cache.incr(key)
    except ValueError:  # evicted between add and incr
        cache.set(key, 1, timeout=None)


def clear_address(address: str) -> None:
    """End the lockout of one client address (as the security log shows it)."""
    counted = address
    ip = ipaddress.ip_address(address)
    if ip.version == 6:
        counted = str(ipaddress.ip_network(f"{ip}/64", strict=False))
    subject = _Subject("address", _digest(counted), 0)
    bucket = int(clock() // settings.OPENONCE_SIGNIN_WINDOW)
    cache.delete_many([subject.until, subject.counter(bucket), subject.counter(bucket - 1)])


@receiver(user_login_failed, dispatch_uid="openonce-signin-throttle-failure")
def _count_failure(
    sender: object, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any
) -> None:
    if request is not None:
        record_failure(request, str(credentials.get("username", "")))


@receiver(user_logged_in, dispatch_uid="openonce-signin-throttle-success")
def _clear_failures(sender: object, request: HttpRequest | None, user: Any, **_: Any) -> None:
    if request is not None:
        forget_failures(request, user.get_username())


def _refuse(request: HttpRequest, username: str, refused: Refusal) -> HttpResponse:
    seconds = refused.seconds
    security_log.warning(
        "sign-in refused while %s: username=%r from %s, %ds left",
        "slowed" if refused.slowed else "locked out",
        username[:150], client_address(request), seconds,
    )  # fmt: skip
    template = "registration/slowed.html" if refused.slowed else "429.html"
    response = render(
        request,
        template,
        {"retry_after": seconds, "minutes": max(1, math.ceil(seconds / 60))},
        status=429,
    )
    response["Retry-After"] = str(seconds)
    return response


@sensitive_post_parameters("password")
@csrf_protect
@never_cache
def sign_in(request: HttpRequest) -> HttpResponse:
    """The console's sign-in page (console.views.sign_in), behind the throttle."""
    username = request.POST.get("username", "") if request.method == "POST" else ""
    if request.method == "POST":
        refused = refusal(request, username)
        if refused:
            return _refuse(request, username, refused)
    response = console_views.sign_in(request)  # type: ignore[arg-type]
    if request.method == "POST" and response.status_code == 200:
        # This very failure may have reached a limit: say so now, not on the next try.
        refused = refusal(request, username)
        if refused:
            return _refuse(request, username, refused)
    return response
