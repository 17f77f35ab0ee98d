"""Notification channels, from ``OPENONCE_NOTIFY``: a JSON list, or ``@/path/to/file.json``.

Each channel::

    {"name": "payments-oncall",          # unique; names the channel on the effect's page
     "kind": "webhook",                  # webhook (signed JSON), slack, or email
     "url": "https://hooks.example.com/openonce",   # webhook and slack
     "secret_env": "OPENONCE_WEBHOOK_SECRET",       # webhook: the HMAC key's variable
     "to": ["oncall@example.com"],       # email
     "tools": ["stripe.*"],              # tool globs (default: every tool)
     "events": ["requires_approval", "human_review"]}   # (default: both)

A malformed channel stops the notifier with ImproperlyConfigured naming it, rather than
silently notifying nobody.
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

EVENTS = ("requires_approval", "human_review")
KINDS = ("webhook", "slack", "email")


@dataclass(frozen=True)
class Channel:
    name: str
    kind: str
    url: str = ""
    secret: str = ""
    to: tuple[str, ...] = ()
    tools: tuple[str, ...] = ("*",)
    events: tuple[str, ...] = EVENTS

    def wants(self, tool: str, event: str) -> bool:
        return event in self.events and any(fnmatch.fnmatchcase(tool, p) for p in self.tools)

    @property
    def destination(self) -> str:
        """Where it goes, as people may see it: a webhook URL's path can be its secret
        (Slack's is), so only the scheme and host are shown."""
        if self.kind == "email":
            return ", ".join(self.to)
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}/…"


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
    known = {"name", "kind", "url", "secret", "secret_env", "to", "tools", "events"}
    unknown = sorted(set(item) - known)
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
    if kind == "email":
        to = _strings(item.get("to"), f"{where}.to")
        return Channel(name, kind, to=to, tools=tools, events=events)
    url = item.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise ImproperlyConfigured(f"{where}.url: an http(s) URL")
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
    return Channel(name, kind, url=url, secret=secret, tools=tools, events=events)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ImproperlyConfigured(f"{where}: a non-empty list of strings")
    return tuple(value)
