"""Access control for console views, and the security log it leaves.

Every denial and every failed sign-in is logged to ``openonce.security`` (OWASP ASVS
16.3.1, 16.3.2) with who, what and where — never a password or a form's contents. Every
value taken from the request is escaped to one line (a ``%0A`` in a path decodes to a
newline), so a request cannot write a log line of its own.
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

from ledger.logsafe import one_line
from ledger.net import forwarded_client

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
        one_line(str(request.method)),
        one_line(request.path),
        client_address(request),
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
        client_address(request) if request is not None else "?",
    )


def client_address(request: HttpRequest) -> str:
    """The address a request came from, for logs and sign-in throttling.

    REMOTE_ADDR, unless the operator declared a reverse proxy in front (OPENONCE_TLS=proxy)
    and the request comes from one of OPENONCE_TRUSTED_PROXIES: then the client address
    those proxies wrote in X-Forwarded-For. From anyone else the header is whatever the
    client wants it to be, and believing it would let a guesser pick a fresh address for
    every try."""
    address = forwarded_client(request) or "?"
    return one_line(address[:100])
