"""Who sent a request: the client's address behind the reverse proxies the operator
trusts (``OPENONCE_TRUSTED_PROXIES``, believed only with ``OPENONCE_TLS=proxy``).

Shared by the project's ``ForwardedHeadersMiddleware`` (which drops forwarded headers
from anyone else) and the console's sign-in throttle and logs, so both read one rule.
"""

from __future__ import annotations

import functools
import ipaddress

from django.conf import settings
from django.http import HttpRequest

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def from_trusted_proxy(request: HttpRequest) -> bool:
    """Whether this request's peer is one of the declared proxies, whose forwarded
    headers may be believed."""
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
