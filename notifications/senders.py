"""The three ways a message leaves: a signed generic webhook, Slack's incoming-webhook
JSON, and email through Django's mail. Each returns what happened; none raises for a
receiver that said no, so the caller can schedule the retry.

The webhook signature: header ``OpenOnce-Signature: t=<unix time>,v1=<hex>`` where hex
is HMAC-SHA256 over ``"<t>." + body`` with the channel's secret. A receiver recomputes
it, compares in constant time, and refuses a ``t`` older than a few minutes (replays).
``OpenOnce-Delivery`` carries the delivery id: the same id on a retried message.

What leaves is cleaned first (``Message.outgoing``): credentials and card numbers in the
reason (a prober's exception text can quote a request) become ``[secret]``, and characters
that hide or reorder text (bidi controls, zero-width and other format characters, line
separators) are written out as ``\\u202e`` so a reader of Slack or a mail sees them.

A webhook goes only where ``destinations`` allows, to the address it checked, and a
redirect is a failed delivery that is never followed. What the receiver answered is kept
to its status code and the standard phrase for it: its own words and body, which could be
an internal service's, are never recorded or shown.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
import http.client
import json
import socket
import ssl
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from django.conf import settings
from django.core.mail import send_mail

from ledger.logsafe import one_line
from openonce_core._redact import redact_text
from openonce_core._textsafe import has_hidden, is_hidden

from . import destinations
from .config import Channel

TIMEOUT = 10.0  # seconds for one read or write of an attempt
# The whole attempt, however the receiver paces its answer: well inside the delivery's
# claim (dispatch.CLAIM_SECONDS), or a slow receiver would be sent the message twice.
ATTEMPT_SECONDS = 30.0


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

    def outgoing(self) -> Message:
        """The message as it may leave: secrets in the reason redacted, hidden characters
        in every text written out."""
        return dataclasses.replace(
            self,
            effect_id=shown(self.effect_id),
            tool=shown(self.tool),
            event=shown(self.event),
            reason=shown(redact_text(self.reason)),
            link=shown(self.link),
        )

    @property
    def delivery_header(self) -> str:
        return str(self.delivery_id)


@dataclass(frozen=True)
class DigestItem:
    effect_id: str
    tool: str
    event: str
    amount: str  # "25.00 USD", or "" when the call has no amount
    link: str
    at: float  # when the delivery was owed


@dataclass(frozen=True)
class DigestMessage:
    """One message for a channel's interval: how many wait, the first few, and how many
    more (``more``), with a link to the queue."""

    digest_id: int
    channel: str
    count: int
    items: tuple[DigestItem, ...]
    link: str  # the console's queue
    at: float  # when the digest was claimed

    @property
    def more(self) -> int:
        return max(0, self.count - len(self.items))

    @property
    def headline(self) -> str:
        effects = "1 effect waits" if self.count == 1 else f"{self.count} effects wait"
        return f"{effects} for a person"

    @property
    def delivery_header(self) -> str:
        return f"digest-{self.digest_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "digest",
            "digest_id": self.digest_id,
            "channel": self.channel,
            "count": self.count,
            "effects": [
                {
                    "effect_id": i.effect_id,
                    "tool": i.tool,
                    "state": i.event,
                    "amount": i.amount,
                    "link": i.link,
                    "at": i.at,
                }
                for i in self.items
            ],
            "more": self.more,
            "link": self.link,
            "at": self.at,
        }

    def outgoing(self) -> DigestMessage:
        """Hidden characters in every text written out, as for one message."""
        items = tuple(
            dataclasses.replace(
                i,
                effect_id=shown(i.effect_id),
                tool=shown(i.tool),
                event=shown(i.event),
                amount=shown(i.amount),
                link=shown(i.link),
            )
            for i in self.items
        )
        return dataclasses.replace(
            self, channel=shown(self.channel), items=items, link=shown(self.link)
        )


def shown(text: str) -> str:
    """``text`` with every hidden character (``openonce_core._textsafe``, the console's and
    the CLI's definition) written as its escape (``\\u202e``)."""
    if not has_hidden(text):
        return text
    return "".join(_escaped(c) if is_hidden(c) else c for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None = None  # the receiver's HTTP status
    error: str = ""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def send(channel: Channel, message: Message | DigestMessage, now: float) -> Outcome:
    """One attempt: a webhook signed, Slack's incoming-webhook JSON, or a mail."""
    message = message.outgoing()
    if channel.kind == "email":
        return _email(channel, message)
    if channel.kind == "slack":
        body = json.dumps(_slack(message)).encode()
        return _post(channel, body, {})
    body = json.dumps(message.to_json(), sort_keys=True).encode()
    headers = {
        "OpenOnce-Signature": signature(channel.secret, int(now), body),
        "OpenOnce-Delivery": message.delivery_header,
    }
    return _post(channel, body, headers)


def line(text: str) -> str:
    """``text`` on one line: a line break, tab or other control written out (``\\x0a``).
    A mail and a Slack message are text a person reads line by line, and a tool name or
    a reason is the agent's: with a line break in it, it wrote a line of the message's
    own ("The queue: <a link>") under OpenOnce's name."""
    return one_line(text)


def _slack(message: Message | DigestMessage) -> dict[str, Any]:
    def esc(text: str) -> str:  # Slack's mrkdwn: these three are control characters
        return line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    if isinstance(message, DigestMessage):
        lines = [f"*{esc(message.headline)}*"]
        for item in message.items:
            amount = f" {esc(item.amount)}" if item.amount else ""
            lines.append(f"• {esc(item.tool)}{amount}: <{item.link}|{item.effect_id}>")
        if message.more:
            lines.append(f"and {message.more} more: <{message.link}|Open the queue>")
        return {"text": "\n".join(lines), "unfurl_links": False}
    reason = f"\n{esc(message.reason)}" if message.reason else ""
    text = f"*{esc(message.headline)}*{reason}\n<{message.link}|Open {message.effect_id}>"
    return {"text": text, "unfurl_links": False}


def _post(channel: Channel, body: bytes, headers: dict[str, str]) -> Outcome:
    """POST once, to the checked address, following nothing."""
    parts = urlsplit(channel.url)
    try:
        address = destinations.resolve(parts, channel.allow_private)
    except destinations.Refused as exc:
        return Outcome(False, None, str(exc))
    except OSError as exc:  # the name does not resolve
        return Outcome(False, None, f"could not deliver: {parts.hostname} does not resolve ({exc})")
    headers = {"Content-Type": "application/json", "User-Agent": "openonce-notify", **headers}
    if parts.username is not None or parts.password is not None:
        user_password = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(user_password.encode()).decode()
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = _connection(parts, address)
    # A receiver answering a byte at a time keeps every read inside TIMEOUT: past the
    # attempt's deadline its socket is shut, which ends whatever read is waiting.
    cut = threading.Event()
    deadline = threading.Timer(ATTEMPT_SECONDS, _cut_off, (connection, cut))
    deadline.daemon = True
    deadline.start()
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        status, location = response.status, response.getheader("Location") or ""
    except (http.client.HTTPException, OSError, ValueError) as exc:
        if cut.is_set():
            return Outcome(
                False, None, f"could not deliver: no complete answer within {ATTEMPT_SECONDS:g}s"
            )
        if isinstance(exc, http.client.HTTPException):
            # Its message can quote what the other end sent: only the kind is kept.
            kind = type(exc).__name__
            return Outcome(False, None, f"could not deliver: the answer was not HTTP ({kind})")
        # refused, reset, timed out, a bad certificate
        return Outcome(False, None, shown(f"could not deliver: {exc}")[:300])
    finally:
        deadline.cancel()
        connection.close()
    if 200 <= status < 300:
        return Outcome(True, status)
    answered = f"the receiver answered {status} {_phrase(status)}".rstrip()
    if 300 <= status < 400:
        target = _host_of(location)
        return Outcome(False, status, f"{answered}: redirect refused, not followed (to {target})")
    return Outcome(False, status, answered)


def _cut_off(connection: http.client.HTTPConnection, cut: threading.Event) -> None:
    cut.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: the attempt ended on its own
            sock.shutdown(socket.SHUT_RDWR)


def _host_of(location: str) -> str:
    """Where a redirect pointed, for the operator: its host only (a path or query can
    hold anything), written so that nothing in it hides."""
    try:
        host = urlsplit(location).hostname
    except ValueError:
        host = None
    return shown(host or "nowhere")[:100]


def _phrase(status: int) -> str:
    """The standard phrase for a status, never the receiver's own words."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _connection(parts: SplitResult, address: str) -> http.client.HTTPConnection:
    """A connection to ``address`` for the URL's host: the Host header and the TLS name
    (SNI, and the certificate check) are the URL's host; the TCP connection goes to the
    address that was checked, not to whatever the name resolves to a moment later."""

    def connect_checked(
        _where: tuple[str, int], timeout: float | None, source: tuple[str, int] | None = None
    ) -> socket.socket:
        return socket.create_connection((address, port), timeout, source)

    host = parts.hostname or ""
    port = parts.port or destinations.DEFAULT_PORTS[parts.scheme]
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            host, port, timeout=TIMEOUT, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    connection._create_connection = connect_checked  # type: ignore[attr-defined]
    return connection


def _email(channel: Channel, message: Message | DigestMessage) -> Outcome:
    if isinstance(message, DigestMessage):
        listed = "".join(
            f"* {line(item.tool)}{' ' + line(item.amount) if item.amount else ''}: {item.link}\n"
            for item in message.items
        )
        more = f"and {message.more} more.\n" if message.more else ""
        body = f"{message.headline}.\n\n{listed}{more}\nThe queue: {message.link}\n"
    else:
        body = (
            f"{line(message.headline)}.\n\n{line(message.reason)}\n\n"
            f"Open it in the console: {message.link}\n"
        )
    subject = line(message.headline)  # a header: no line breaks
    try:
        send_mail(
            f"[OpenOnce] {subject}",
            body,
            settings.DEFAULT_FROM_EMAIL,
            list(channel.to),
        )
    except Exception as exc:  # smtplib, socket and backend errors alike: retried later
        return Outcome(False, None, f"mail not sent: {type(exc).__name__}: {exc}"[:500])
    return Outcome(True)
