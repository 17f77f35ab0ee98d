"""Notification channels, from ``OPENONCE_NOTIFY``: a JSON list, or ``@/path/to/file.json``.

Each channel::

    {"name": "payments-oncall",          # unique; names the channel on the effect's page
     "kind": "webhook",                  # webhook (signed JSON), slack, or email
     "url": "https://hooks.example.com/openonce",   # webhook and slack
     "secret_env": "OPENONCE_WEBHOOK_SECRET",       # webhook: the HMAC key's variable
     "to": ["oncall@example.com"],       # email
     "tools": ["stripe.*"],              # tool globs (default: every tool)
     "events": ["requires_approval", "human_review"],   # (default: both)
     "allow_private": false,             # webhook and slack: may go inside (default no)
     "digest": "5m"}                     # one message per interval listing what waits:
                                         # seconds, or "90s", "5m", "1h" (default: one
                                         # message per event)

A malformed channel stops the notifier with ImproperlyConfigured naming it, rather than
silently notifying nobody. So does a URL the notifier would refuse to send to
(``destinations``): a scheme other than http(s), a host off OPENONCE_NOTIFY_ALLOWED_HOSTS,
or an address inside (loopback, private, link-local...) without OPENONCE_NOTIFY_ALLOW_PRIVATE
or the channel's ``allow_private``. A name that resolves inside is refused when sending.

A URL may carry ``user:password@``: it is sent as Basic authorization and never shown.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from . import destinations

EVENTS = ("requires_approval", "human_review")
KINDS = ("webhook", "slack", "email")
KEYS = (
    "name", "kind", "url", "secret", "secret_env", "to", "tools", "events", "allow_private",
    "digest",
)  # fmt: skip
DIGEST_UNITS = {"s": 1, "m": 60, "h": 3600}
DIGEST_SHORTEST = 1.0  # seconds
DIGEST_LONGEST = 86400.0


@dataclass(frozen=True)
class Channel:
    name: str
    kind: str
    url: str = ""
    secret: str = ""
    to: tuple[str, ...] = ()
    tools: tuple[str, ...] = ("*",)
    events: tuple[str, ...] = EVENTS
    allow_private: bool = False  # may send to loopback and private addresses
    digest: float | None = None  # seconds per digest; None: one message per event

    def wants(self, tool: str, event: str) -> bool:
        return event in self.events and any(fnmatch.fnmatchcase(tool, p) for p in self.tools)

    @property
    def destination(self) -> str:
        """Where it goes, as people may see it: a webhook URL's path can be its secret
        (Slack's is), so only the scheme and host are shown."""
        if self.kind == "email":
            return ", ".join(self.to)
        return public_destination(self.url)


def public_destination(url: str) -> str:
    """``scheme://host[:port]/…``: never the user information (``user:password@``), the
    path or the query, which may each hold a secret."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}/…"


def channels() -> list[Channel]:
    raw = getattr(settings, "OPENONCE_NOTIFY", "") or ""
    if not raw.strip():
        return []
    if raw.startswith("@"):
        try:
            raw = Path(raw[1:]).read_text()
        except OSError as exc:
            raise ImproperlyConfigured(f"OPENONCE_NOTIFY: cannot read {raw[1:]}: {exc}") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"OPENONCE_NOTIFY is not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise ImproperlyConfigured("OPENONCE_NOTIFY must be a JSON list of channels")
    found = [_channel(item, i) for i, item in enumerate(doc)]
    names = [c.name for c in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ImproperlyConfigured(f"OPENONCE_NOTIFY: channel names repeat: {duplicates}")
    return found


def _channel(item: Any, i: int) -> Channel:
    where = f"OPENONCE_NOTIFY[{i}]"
    if not isinstance(item, dict):
        raise ImproperlyConfigured(f"{where} must be an object")
    unknown = sorted(set(item) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(f"{where}: unknown keys {unknown}")
    name, kind = item.get("name"), item.get("kind")
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ImproperlyConfigured(f"{where}.name: a non-empty name of at most 100 characters")
    if kind not in KINDS:
        raise ImproperlyConfigured(f"{where}.kind: one of {', '.join(KINDS)}")
    tools = _strings(item.get("tools", ["*"]), f"{where}.tools")
    events = _strings(item.get("events", list(EVENTS)), f"{where}.events")
    bad = sorted(set(events) - set(EVENTS))
    if bad:
        raise ImproperlyConfigured(f"{where}.events: unknown {bad}; known: {list(EVENTS)}")
    digest = _digest(item.get("digest"), f"{where}.digest")
    if kind == "email":
        to = _strings(item.get("to"), f"{where}.to")
        return Channel(name, kind, to=to, tools=tools, events=events, digest=digest)
    allow_private = item.get("allow_private", False)
    if not isinstance(allow_private, bool):
        raise ImproperlyConfigured(f"{where}.allow_private: true or false")
    allow_private = allow_private or bool(settings.OPENONCE_NOTIFY_ALLOW_PRIVATE)
    url = item.get("url")
    if not isinstance(url, str):
        raise ImproperlyConfigured(f"{where}.url: an http(s) URL")
    if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
        raise ImproperlyConfigured(
            f"{where}.url: %-encode spaces, control and non-ASCII characters"
            " (and write an international host name in its xn-- form)"
        )
    try:
        destinations.check_url(urlsplit(url), allow_private)
    except (destinations.Refused, ValueError) as exc:
        # The message names the host at most: the URL's path and credentials stay out.
        raise ImproperlyConfigured(f"{where}.url: {exc}") from None
    secret = ""
    if kind == "webhook":
        if "secret_env" in item:
            secret = os.environ.get(str(item["secret_env"]), "")
            if not secret:
                raise ImproperlyConfigured(f"{where}: set the variable {item['secret_env']}")
        else:
            secret = item.get("secret") or ""
        if not isinstance(secret, str) or len(secret) < 16:
            raise ImproperlyConfigured(
                f"{where}: a webhook needs a secret of at least 16 characters to sign with"
            )
    return Channel(
        name, kind, url=url, secret=secret, tools=tools, events=events,
        allow_private=allow_private, digest=digest,
    )  # fmt: skip


def _digest(value: Any, where: str) -> float | None:
    """Seconds (a number, or text: ``"300"``, ``"90s"``, ``"5m"``, ``"1h"``), or None."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().lower()
        unit = DIGEST_UNITS.get(text[-1])
        number = text[:-1] if unit else text
        try:
            seconds = float(number) * (unit or 1)
        except ValueError:
            seconds = None
    if seconds is None or not DIGEST_SHORTEST <= seconds <= DIGEST_LONGEST:
        raise ImproperlyConfigured(
            f"{where}: an interval from {DIGEST_SHORTEST:g} s to a day, in seconds or as"
            f' "90s", "5m", "1h" (leave it out for one message per event), not {value!r:.40}'
        )
    return seconds


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ImproperlyConfigured(f"{where}: a non-empty list of strings")
    return tuple(value)
