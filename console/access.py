"""Access control for console views, and the security log it leaves.

Every denial and every failed sign-in is logged to ``openonce.security`` (OWASP ASVS
16.3.1, 16.3.2) with who, what and where — never a password or a form's contents.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

security_log = logging.getLogger("openonce.security")

View = Callable[..., HttpResponse]


def permission_required(perm: str) -> Callable[[View], View]:
    """Refuse (403, logged) a signed-in person without ``perm``.

    Stack it under ``@login_required``, which sends anonymous people to sign in. Pages
    with ledger data are never stored by shared caches.
    """

    def decorator(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            require(request, perm)
            response = view(request, *args, **kwargs)
            add_never_cache_headers(response)
            return response

        return wrapper

    return decorator


def require(request: HttpRequest, perm: str) -> None:
    """Raise PermissionDenied (and log it) unless the signed-in person holds ``perm``."""
    if not request.user.has_perm(perm):
        deny(request, perm)


def deny(request: HttpRequest, perm: str) -> None:
    security_log.warning(
        "permission denied: user=%r lacks %s for %s %s from %s",
        request.user.get_username(),
        perm,
        request.method,
        request.path,
        _client(request),
    )
    raise PermissionDenied(f"you need the {perm} permission")


@receiver(user_login_failed, dispatch_uid="openonce-console-login-failed")
def log_login_failure(
    sender: object, credentials: dict[str, Any], request: HttpRequest | None = None, **_: Any
) -> None:
    # Django has already masked the password in ``credentials``; log only the name tried.
    username = str(credentials.get("username", ""))[:150]
    security_log.warning(
        "sign-in failed: username=%r from %s",
        username,
        _client(request) if request is not None else "?",
    )


def _client(request: HttpRequest) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is whatever the client wants it to be unless a
    # trusted proxy rewrites it, and a log line must not be forgeable.
    return str(request.META.get("REMOTE_ADDR", "?"))
