"""Request checks and response headers Django has no setting for."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from ledger.net import from_trusted_proxy

# Headers a reverse proxy writes; from anyone else they are the client's own claims.
FORWARDED = (
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_FORWARDED_HOST",
    "HTTP_X_FORWARDED_PORT",
)


class ForwardedHeadersMiddleware:
    """X-Forwarded-* are kept only when the operator declared a proxy (OPENONCE_TLS=proxy)
    and this request comes from one of OPENONCE_TRUSTED_PROXIES. Otherwise they are
    removed before anything reads them: reaching gunicorn directly, a client could claim
    HTTPS (Django's SECURE_PROXY_SSL_HEADER) or a fresh address for every sign-in guess."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not from_trusted_proxy(request):
            for header in FORWARDED:
                request.META.pop(header, None)
        return self.get_response(request)


class RequestCharsetMiddleware:
    """A request naming any charset but UTF-8 is refused with 400 before its form or
    query string is read. Django reads a form only as UTF-8 and raises on anything else;
    raised inside the CSRF check, before any view, that was a 500. A codec that is not
    a text encoding (``rot13``) failed on the query string the same way."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        charset = (request.content_params or {}).get("charset")
        if charset is not None and charset.lower() != "utf-8":
            shown = charset[:40].encode("ascii", "backslashreplace").decode("ascii")
            return HttpResponseBadRequest(
                f"The request's charset {shown!r} is not supported: send UTF-8.\n",
                content_type="text/plain; charset=utf-8",
            )
        return self.get_response(request)


class PermissionsPolicyMiddleware:
    """``Permissions-Policy`` from ``settings.PERMISSIONS_POLICY``: feature -> allowed
    origins (an empty list switches the feature off, ``["self"]`` keeps it for the console)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        policy: dict[str, list[str]] = getattr(settings, "PERMISSIONS_POLICY", {})
        self.header = ", ".join(
            f"{feature}=({' '.join(_origin(o) for o in origins)})"
            for feature, origins in policy.items()
        )

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.header:
            response.headers.setdefault("Permissions-Policy", self.header)
        return response


def _origin(origin: str) -> str:
    return origin if origin in ("self", "*") else f'"{origin}"'
