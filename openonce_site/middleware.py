"""Request checks and response headers Django has no setting for."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

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


def from_trusted_proxy(request: HttpRequest) -> bool:
    if not getattr(settings, "OPENONCE_BEHIND_PROXY", False):
        return False
    return _trusted(_ip(str(request.META.get("REMOTE_ADDR", ""))))


def forwarded_client(request: HttpRequest) -> str:
    """The client's address as the trusted proxies report it: X-Forwarded-For read from
    the right (the entry the nearest proxy appended) past every trusted proxy, to the
    first address none of them is. Entries further left were written by the client.
    REMOTE_ADDR when the request did not come from a trusted proxy."""
    peer = str(request.META.get("REMOTE_ADDR", ""))
    client = peer
    if from_trusted_proxy(request):
        for entry in reversed(str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")):
            entry = entry.strip()
            if not entry:
                continue
            client = entry
            if not _trusted(_ip(entry)):
                break
    # One spelling per address: ::ffff:192.0.2.1 (an IPv4 client of a server bound to
    # [::]) is 192.0.2.1, or every IPv4 client would share one IPv6 /64 in the throttle.
    address = _ip(client)
    return str(address) if address is not None else client


def _ip(text: str) -> Address | None:
    text = text.strip()
    # Some proxies write the client's port too ("192.0.2.1:51000", "[2001:db8::1]:51000");
    # a new connection has a new port, so the address alone is the client.
    if text.startswith("[") and "]" in text:
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # a bare IPv6 address has several colons
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    # An IPv4 peer of a server bound to [::] arrives as ::ffff:a.b.c.d.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _trusted(address: Address | None) -> bool:
    if address is None:
        return False
    networks = _networks(tuple(settings.OPENONCE_TRUSTED_PROXIES))
    return any(address in network for network in networks)


@functools.lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


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
