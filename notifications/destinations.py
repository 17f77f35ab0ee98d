"""Where a notification may go: http or https, to a host the operator allows, never to
this machine or a private network unless the operator says so.

A webhook's URL is configuration, but the host behind it answers what it likes: a
receiver (or whoever took it over) could redirect the daemon to an internal service, or
its name could resolve to one, and the daemon would carry its signature there and show
the answer on the effect's page. So:

* redirects are never followed (``senders``);
* the name is resolved once, every address it resolves to is checked, and the connection
  is made to the checked address, with the URL's name kept for the Host header and the
  TLS certificate: resolving again to connect could answer differently (DNS rebinding);
* loopback, private, link-local, shared (100.64/10), multicast, unspecified and reserved
  addresses, IPv4 or IPv6 (an IPv4 address inside IPv6 is judged as IPv4), are refused
  unless ``OPENONCE_NOTIFY_ALLOW_PRIVATE`` is set or the channel says ``allow_private``;
* ``OPENONCE_NOTIFY_ALLOWED_HOSTS``, when set, names the only hosts a message may go to
  (``hooks.example.com``, or ``*.example.com`` for its subdomains).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import SplitResult

from django.conf import settings

SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """This destination is not allowed; the message says why and what to set."""


def allowed_hosts() -> tuple[str, ...]:
    return tuple(h.lower().rstrip(".") for h in settings.OPENONCE_NOTIFY_ALLOWED_HOSTS)


def host_allowed(host: str, patterns: tuple[str, ...]) -> bool:
    """No list allows every host; otherwise the host is listed, or a ``*.`` pattern names
    its parent domain."""
    if not patterns:
        return True
    host = host.lower().rstrip(".")
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern:
            return True
    return False


def literal_address(host: str) -> Address | None:
    """The address a host written as one means, in any form the resolver accepts: also
    ``2130706433``, ``0177.0.0.1`` and ``0x7f.1``, which all mean 127.0.0.1."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def address_problem(address: Address) -> str | None:
    """Why this address is not a public destination, or None when it is one."""
    if isinstance(address, ipaddress.IPv6Address):
        # An IPv4 address carried inside IPv6 reaches that IPv4 address.
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return address_problem(embedded)
    for problem, flagged in (
        ("an unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("a private address", address.is_private),
        ("a reserved address", address.is_reserved),
        ("not a public address", not address.is_global),
    ):
        if flagged:
            return problem
    return None


def check_url(parts: SplitResult, allow_private: bool) -> None:
    """What can be judged without the network: the scheme, the host's presence, the
    allow-list and a host written as an address. Raises Refused."""
    if parts.scheme not in SCHEMES:
        raise Refused(f"only http and https URLs are allowed, not {parts.scheme or 'none'}")
    host = parts.hostname
    if not host:
        raise Refused("the URL has no host")
    try:
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError as exc:
        raise Refused(f"the URL's port is not valid: {exc}") from None
    if not host_allowed(host, allowed_hosts()):
        raise Refused(f"{host} is not in OPENONCE_NOTIFY_ALLOWED_HOSTS")
    literal = literal_address(host)
    if literal is not None and not allow_private:
        problem = address_problem(literal)
        if problem:
            raise Refused(f"{host} is {problem}: {_HOW_TO_ALLOW}")


def resolve(parts: SplitResult, allow_private: bool) -> str:
    """The one address to connect to, after checking every address the host resolves
    to. Raises Refused, or OSError when the name does not resolve."""
    check_url(parts, allow_private)
    host = parts.hostname or ""
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    if not allow_private:
        for text in addresses:
            problem = address_problem(ipaddress.ip_address(text.split("%", 1)[0]))
            if problem:
                # One bad answer refuses the host: a name that also points inside is
                # not a receiver's, whichever address this attempt would have used.
                raise Refused(f"{host} resolves to {text}, {problem}: {_HOW_TO_ALLOW}")
    return addresses[0]


_HOW_TO_ALLOW = (
    "refused (set OPENONCE_NOTIFY_ALLOW_PRIVATE=1, or allow_private on the channel,"
    " to send inside your network)"
)
