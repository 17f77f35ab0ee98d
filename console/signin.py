"""Sign-in, throttled per username and per client address.

Failed sign-ins are counted per username and per client address over a window
(OPENONCE_SIGNIN_WINDOW). Once either count reaches its limit
(OPENONCE_SIGNIN_USER_LIMIT, OPENONCE_SIGNIN_ADDRESS_LIMIT), sign-in for that name or
from that address is refused with 429 until the lockout (OPENONCE_SIGNIN_LOCKOUT) ends
— even with the right password — and the refusal happens before any password is
hashed: a flood of guesses costs the attacker requests, not us a second of CPU each.

The counters live in Django's cache, which production points at Redis so that every
gunicorn worker sees the same counts. Losing them (a Redis restart) only shortens a
lockout; no ledger decision depends on them.

Time comes from ``clock`` (seconds), which tests replace to move time instead of
sleeping. Windows are fixed buckets; a count is this bucket's plus the last one's, so a
burst that straddles a bucket boundary is still counted together.
"""

from __future__ import annotations

import hashlib
import math
import time
import unicodedata
from collections.abc import Callable
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


def _normal_username(username: str) -> str:
    # Lookalike spellings of one name share one counter (over-counting is the safe side).
    return unicodedata.normalize("NFKC", username).casefold().strip()


def _subjects(request: HttpRequest, username: str) -> list[tuple[str, str, int]]:
    """(kind, digest, limit) for the name tried and the address it came from. Digests,
    so no cache key holds what a person typed."""
    subjects = [("address", client_address(request), settings.OPENONCE_SIGNIN_ADDRESS_LIMIT)]
    if username:
        subjects.append(("user", _normal_username(username), settings.OPENONCE_SIGNIN_USER_LIMIT))
    return [
        (kind, hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest(), limit)
        for kind, value, limit in subjects
    ]


def _counter(kind: str, digest: str, bucket: int) -> str:
    return f"{_PREFIX}:{kind}:{digest}:{bucket}"


def _lock(kind: str, digest: str) -> str:
    return f"{_PREFIX}:{kind}:{digest}:locked-until"


def locked_for(request: HttpRequest, username: str) -> int:
    """Seconds until sign-in for this name from this address is allowed again (0: now)."""
    now = clock()
    keys = [_lock(kind, digest) for kind, digest, _ in _subjects(request, username)]
    until = max((float(v) for v in cache.get_many(keys).values()), default=0.0)
    return max(0, math.ceil(until - now))


def record_failure(request: HttpRequest, username: str) -> None:
    now = clock()
    window = settings.OPENONCE_SIGNIN_WINDOW
    bucket = int(now // window)
    for kind, digest, limit in _subjects(request, username):
        key = _counter(kind, digest, bucket)
        cache.add(key, 0, timeout=2 * window)
        try:
            count = cache.incr(key)
        except ValueError:  # it expired between add and incr
            cache.set(key, count := 1, timeout=2 * window)
        count += int(cache.get(_counter(kind, digest, bucket - 1), 0))
        if count >= limit:
            lockout = settings.OPENONCE_SIGNIN_LOCKOUT
            cache.set(_lock(kind, digest), now + lockout, timeout=lockout + window)
            # A fresh allowance after the lockout, not an instant second one.
            cache.delete_many([key, _counter(kind, digest, bucket - 1)])
            security_log.warning(
                "sign-in locked: %s limit of %d failures reached (username=%r from %s);"
                " refused for %ds",
                kind, limit, username[:150], client_address(request), lockout,
            )  # fmt: skip


def forget_failures(request: HttpRequest, username: str) -> None:
    """A successful sign-in clears the name's failures (not the address's: one person
    signing in must not wipe out a guesser's count from the same network)."""
    bucket = int(clock() // settings.OPENONCE_SIGNIN_WINDOW)
    for kind, digest, _ in _subjects(request, username):
        if kind == "user":
            cache.delete_many([_counter(kind, digest, b) for b in (bucket, bucket - 1)])


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


def _refuse(request: HttpRequest, username: str, seconds: int) -> HttpResponse:
    security_log.warning(
        "sign-in refused while locked out: username=%r from %s, %ds left",
        username[:150], client_address(request), seconds,
    )  # fmt: skip
    response = render(
        request,
        "429.html",
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
        seconds = locked_for(request, username)
        if seconds:
            return _refuse(request, username, seconds)
    response = console_views.sign_in(request)  # type: ignore[arg-type]
    if request.method == "POST" and response.status_code == 200:
        # This very failure may have reached the limit: say so now, not on the next try.
        seconds = locked_for(request, username)
        if seconds:
            return _refuse(request, username, seconds)
    return response
