"""Tiers 2 and 3, a sender-controlled key: is there a sent copy with this Message-ID?

The handler sets a deterministic Message-ID, ``message_id_for(ctx.provider_key, domain)``
(``<{provider_key}@{domain}>``), so the prober can look the message up in the sender's
sent store. What a miss means depends on that store:

* a provider API whose sent store records every accepted message (``authoritative=True``,
  capability ``email_provider_api``): a miss is NOT_HAPPENED;
* bare SMTP, with at best a copy the client appended to a Sent folder itself
  (``authoritative=False``, capability ``email_smtp``): the copy can fail after the
  message was delivered, so a miss proves nothing and stays INCONCLUSIVE, forever.

Either way a found copy is HAPPENED with receipt ``{"message_id": ...}``, and an error or
malformed answer is INCONCLUSIVE. Several copies with the same Message-ID (a Sent folder
and an "All Mail" label) are still one message: HAPPENED.
"""

from __future__ import annotations

import contextlib
import imaplib
import time
from collections.abc import Callable
from email.parser import BytesHeaderParser
from typing import Any, Protocol

from ..probe import ProbeOutcome, ProbeResult
from ..records import Effect


def message_id_for(provider_key: str, domain: str) -> str:
    """The Message-ID header a handler sets for an effect: ``<{provider_key}@{domain}>``.

    ``domain`` is the sending domain, and must be the same one the prober is given."""
    for name, value in (("provider_key", provider_key), ("domain", domain)):
        if not value or any(c in value for c in '<>@"\\ \t\r\n'):
            raise ValueError(f"{name} {value!r} cannot go into a Message-ID")
    return f"<{provider_key}@{domain}>"


class SentMailClient(Protocol):
    """What :class:`EmailMessageIdProber` needs from the sender's mail store: one read.

    ``find_sent`` returns the sent messages whose Message-ID header is ``message_id``
    (angle brackets included), each a dict with at least ``"message_id"``, the header as
    stored, and optionally ``"id"``, the store's own id for the message. It must raise on
    any failure: returning ``[]`` for a search it could not run would read as a miss.
    """

    def find_sent(self, message_id: str) -> list[dict[str, Any]]: ...


class MailStoreReadError(Exception):
    """The sent store could not be searched; the probe stays inconclusive."""


class EmailMessageIdProber:
    """Probes ``email.send`` effects by their deterministic Message-ID (see module doc).

    ``index_lag_seconds`` holds a miss inconclusive while the attempt is younger than
    that: provider sent stores index asynchronously. It defaults to the email
    capabilities' 120 s grace, so a reconciler whose grace was overridden shorter still
    cannot re-arm on a miss the store had no time to record.
    """

    # The conservative default; an instance names the capability its flag selects.
    capability = "email_smtp"

    def __init__(
        self,
        client: SentMailClient,
        *,
        authoritative: bool,
        domain: str,
        index_lag_seconds: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        message_id_for("x", domain)  # fail now, not at 3 a.m., on a domain that cannot work
        if index_lag_seconds < 0:
            raise ValueError("index_lag_seconds must be >= 0")
        self.client = client
        self.authoritative = authoritative
        self.domain = domain
        self.index_lag_seconds = index_lag_seconds
        self.clock = clock
        self.capability = "email_provider_api" if authoritative else "email_smtp"

    @classmethod
    def from_imap(
        cls,
        host: str,
        username: str,
        password: str,
        *,
        authoritative: bool,
        domain: str,
        mailbox: str = "Sent",
        port: int = 993,
        timeout: float = 10.0,
    ) -> EmailMessageIdProber:
        """A prober searching an IMAP sent folder. Say whether that folder is authoritative:
        a copy your own SMTP client appends is not; a server that files every message it
        accepts may be."""
        return cls(
            ImapSentFolder.over_ssl(host, username, password, mailbox=mailbox, port=port,
                                    timeout=timeout),
            authoritative=authoritative,
            domain=domain,
        )  # fmt: skip

    def probe(self, effect: Effect) -> ProbeResult:
        try:
            message_id = message_id_for(effect.provider_key, self.domain)
        except ValueError as exc:
            return _inconclusive(f"cannot form this effect's Message-ID: {exc}")
        try:
            found = self.client.find_sent(message_id)
        except Exception as exc:
            return _inconclusive(
                f"sent-store search for {message_id} failed: {type(exc).__name__}: {exc}"[:500]
            )
        if not isinstance(found, list) or not all(isinstance(m, dict) for m in found):
            return _inconclusive(
                f"sent-store search returned {type(found).__name__}, not a list of messages"
            )
        wanted = _normalized(message_id)
        copies = [m for m in found if _normalized(m.get("message_id")) == wanted]
        ignored = len(found) - len(copies)
        observed: dict[str, Any] = {"copies": len(copies), "ignored_unrelated": ignored}
        if copies:
            receipt: dict[str, Any] = {"message_id": message_id}
            store_id = copies[0].get("id")
            if isinstance(store_id, str) and store_id:
                receipt["store_id"] = store_id
            unrelated = f"; ignored {ignored} unrelated message(s)" if ignored else ""
            return ProbeResult(
                ProbeOutcome.HAPPENED,
                receipt=receipt,
                detail=f"sent store holds {len(copies)} copy(ies) of {message_id}{unrelated}",
                provider_reference=effect.provider_key,
                observed=observed,
            )
        if ignored:
            return _inconclusive(
                f"sent-store search for {message_id} returned {ignored} message(s) with"
                " other Message-IDs: a suspicious read, not evidence",
                observed,
            )
        if not self.authoritative:
            return _inconclusive(
                f"no sent copy of {message_id}, but bare SMTP: a missing sent copy proves"
                " nothing (the copy can fail after delivery); check the recipient side",
                observed,
            )
        age = self.clock() - max(effect.created_at, effect.updated_at)
        observed["age_seconds"] = round(age, 3)
        if age < self.index_lag_seconds:
            return _inconclusive(
                f"young miss: no sent copy of {message_id} yet, but the attempt is {age:.0f}s"
                f" old and the sent store may lag {self.index_lag_seconds:g}s",
                observed,
            )
        return ProbeResult(
            ProbeOutcome.NOT_HAPPENED,
            detail=f"the authoritative sent store has no message {message_id}",
            provider_reference=effect.provider_key,
            observed=observed,
        )


class ImapSentFolder:
    """:class:`SentMailClient` over IMAP, standard library only, read-only (EXAMINE).

    IMAP's HEADER search matches substrings, so every hit is fetched and its Message-ID
    compared whole. ``connect`` returns a logged-in ``imaplib.IMAP4`` (or a stand-in).
    """

    max_hits = 20

    def __init__(self, connect: Callable[[], imaplib.IMAP4], *, mailbox: str = "Sent") -> None:
        self._connect = connect
        self.mailbox = mailbox

    @classmethod
    def over_ssl(
        cls,
        host: str,
        username: str,
        password: str,
        *,
        mailbox: str = "Sent",
        port: int = 993,
        timeout: float = 10.0,
    ) -> ImapSentFolder:
        def connect() -> imaplib.IMAP4:
            conn = imaplib.IMAP4_SSL(host, port, timeout=timeout)
            conn.login(username, password)
            return conn

        return cls(connect, mailbox=mailbox)

    def __repr__(self) -> str:
        return f"ImapSentFolder(mailbox={self.mailbox!r})"

    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        conn = self._connect()
        try:
            status, _ = conn.select(_imap_quote(self.mailbox), readonly=True)
            if status != "OK":
                raise MailStoreReadError(f"cannot open mailbox {self.mailbox!r}")
            status, data = conn.uid("SEARCH", "HEADER", "Message-ID", _imap_quote(message_id))
            if status != "OK" or not data:
                raise MailStoreReadError(f"IMAP search in {self.mailbox!r} failed")
            uids = _as_bytes(data[0]).split()
            if len(uids) > self.max_hits:
                raise MailStoreReadError(f"{len(uids)} hits for one Message-ID; look by hand")
            found = []
            for uid in uids:
                header = self._message_id(conn, uid)
                found.append({"message_id": header, "id": uid.decode(), "mailbox": self.mailbox})
            return found
        finally:
            # The answer is already read; a failed goodbye changes nothing.
            with contextlib.suppress(Exception):
                conn.logout()

    @staticmethod
    def _message_id(conn: imaplib.IMAP4, uid: bytes) -> str:
        status, data = conn.uid("FETCH", uid.decode(), "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
        if status != "OK":
            raise MailStoreReadError(f"cannot fetch message uid {uid.decode()}")
        for part in data:
            if isinstance(part, tuple) and len(part) == 2:
                headers = BytesHeaderParser().parsebytes(_as_bytes(part[1]))
                return str(headers.get("Message-ID", "")).strip()
        raise MailStoreReadError(f"no header block for message uid {uid.decode()}")


def _normalized(message_id: Any) -> tuple[str, str] | None:
    """A Message-ID for comparison: brackets and blanks off; the domain is case-blind."""
    if not isinstance(message_id, str):
        return None
    local, at, domain = message_id.strip().strip("<>").rpartition("@")
    return (local, domain.lower()) if at and local and domain else None


def _imap_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise MailStoreReadError(f"unexpected IMAP response part {type(value).__name__}")


def _inconclusive(detail: str, observed: dict[str, Any] | None = None) -> ProbeResult:
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {})
