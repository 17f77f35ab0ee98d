"""The three ways a message leaves: a signed generic webhook, Slack's incoming-webhook
JSON, and email through Django's mail. Each returns what happened; none raises for a
receiver that said no, so the caller can schedule the retry.

The webhook signature: header ``OpenOnce-Signature: t=<unix time>,v1=<hex>`` where hex
is HMAC-SHA256 over ``"<t>." + body`` with the channel's secret. A receiver recomputes
it, compares in constant time, and refuses a ``t`` older than a few minutes (replays).
``OpenOnce-Delivery`` carries the delivery id: the same id on a retried message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from .config import Channel

TIMEOUT = 10.0  # seconds for one attempt


@dataclass(frozen=True)
class Message:
    delivery_id: int
    effect_id: str
    tool: str
    event: str  # requires_approval or human_review
    reason: str
    link: str  # the effect's page in the console
    at: float  # when the effect entered the state (epoch seconds)
    journal_seq: int

    @property
    def headline(self) -> str:
        if self.event == "requires_approval":
            return f"{self.tool} is waiting for approval"
        return f"{self.tool} needs a person: in human review"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": f"effect.{self.event}",
            "delivery_id": self.delivery_id,
            "effect_id": self.effect_id,
            "tool": self.tool,
            "state": self.event,
            "reason": self.reason,
            "link": self.link,
            "at": self.at,
            "journal_seq": self.journal_seq,
        }


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None = None  # the receiver's HTTP status
    error: str = ""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def send(channel: Channel, message: Message, now: float) -> Outcome:
    if channel.kind == "email":
        return _email(channel, message)
    if channel.kind == "slack":
        body = json.dumps(_slack(message)).encode()
        return _post(channel.url, body, {})
    body = json.dumps(message.to_json(), sort_keys=True).encode()
    headers = {
        "OpenOnce-Signature": signature(channel.secret, int(now), body),
        "OpenOnce-Delivery": str(message.delivery_id),
    }
    return _post(channel.url, body, headers)


def _slack(message: Message) -> dict[str, Any]:
    def esc(text: str) -> str:  # Slack's mrkdwn: these three are control characters
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    reason = f"\n{esc(message.reason)}" if message.reason else ""
    text = f"*{esc(message.headline)}*{reason}\n<{message.link}|Open {message.effect_id}>"
    return {"text": text, "unfurl_links": False}


def _post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "openonce-notify", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return Outcome(True, response.status)
    except urllib.error.HTTPError as exc:
        return Outcome(False, exc.code, f"the receiver answered {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Outcome(False, None, f"could not deliver: {reason}"[:500])


def _email(channel: Channel, message: Message) -> Outcome:
    body = f"{message.headline}.\n\n{message.reason}\n\nOpen it in the console: {message.link}\n"
    try:
        send_mail(
            f"[OpenOnce] {message.headline}",
            body,
            settings.DEFAULT_FROM_EMAIL,
            list(channel.to),
        )
    except Exception as exc:  # smtplib, socket and backend errors alike: retried later
        return Outcome(False, None, f"mail not sent: {type(exc).__name__}: {exc}"[:500])
    return Outcome(True)
