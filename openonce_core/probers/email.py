"""Tiers 2 and 3, a sender-controlled key: is there a sent copy with this Message-ID?

The handler sets a deterministic Message-ID, ``message_id_for(ctx.provider_key, domain)``
(``<{provider_key}@{domain}>``), so the prober can look the message up in the sender's
sent store. What a miss means depends on that store:

* a provider API whose sent store records every accepted message (``authoritative=True``,
  capability ``email_provider_api``): a miss is NOT_HAPPENED;
* bare SMTP, with at best a copy the client appended to a Sent folder itself
  (``authoritative=False``, capability ``email_smtp``): the copy can fail after the
  message was delivered, so a miss proves nothing and stays INCONCLUSIVE, forever.

Either way a found copy is HAPPENED with receipt ``{"message_id": ...}``; a malformed
answer is INCONCLUSIVE; a store that could not be asked raises a ``ProbeError`` (a refused
login is a ``ProbeCredentialError``, a dropped connection or a timeout a
``ProbeTransientError``). Several copies with the same Message-ID (a Sent folder and an
"All Mail" label) are still one message: HAPPENED.

:class:`ImapSentFolder` verifies the server's certificate and host name (a custom CA can
be given) and finds the sent folder by its SPECIAL-USE ``\\Sent`` attribute (RFC 6154),
falling back to a configured name on servers that do not advertise one.
"""

from __future__ import annotations

import contextlib
import imaplib
import re
import ssl
import threading
import time
from collections.abc import Callable
from email.parser import BytesHeaderParser
from typing import Any, Protocol

from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError
from ..probe import ProbeOutcome, ProbeResult
from ..records import Effect
from ._http import transport_error

PROVIDER = "imap"
SENT = "\\Sent"


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


class MailStoreReadError(ProbeError):
    """The sent store could not be searched; the probe observed nothing."""

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(PROVIDER, detail, status=status)


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
        # Names this prober in health and metrics: the store's own name ("imap"), if any.
        provider = getattr(client, "provider", None)
        self.provider = provider if isinstance(provider, str) else "email"

    @classmethod
    def from_imap(
        cls,
        host: str,
        username: str,
        password: str,
        *,
        authoritative: bool,
        domain: str,
        mailbox: str | None = None,
        fallback_mailbox: str = "Sent",
        port: int = 993,
        timeout: float = 10.0,
        ca_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        index_lag_seconds: float = 120.0,
    ) -> EmailMessageIdProber:
        """A prober searching an IMAP sent folder. Say whether that folder is authoritative:
        a copy your own SMTP client appends is not; a server that files every message it
        accepts may be.

        ``mailbox`` None finds the folder the server marks ``\\Sent`` (else
        ``fallback_mailbox``); ``ca_file`` trusts a private CA, ``ssl_context`` replaces the
        default (verifying) context entirely."""
        return cls(
            ImapSentFolder.over_ssl(
                host, username, password, mailbox=mailbox, fallback_mailbox=fallback_mailbox,
                port=port, timeout=timeout, ca_file=ca_file, ssl_context=ssl_context,
            ),
            authoritative=authoritative,
            domain=domain,
            index_lag_seconds=index_lag_seconds,
        )  # fmt: skip

    def probe(self, effect: Effect) -> ProbeResult:
        try:
            message_id = message_id_for(effect.provider_key, self.domain)
        except ValueError as exc:
            return _inconclusive(f"cannot form this effect's Message-ID: {exc}")
        try:
            found = self.client.find_sent(message_id)
        except ProbeError:
            raise  # the store could not be asked: the reconciler decides when to ask again
        except (TimeoutError, ConnectionError, imaplib.IMAP4.abort) as exc:
            raise ProbeTransientError(
                PROVIDER, f"sent-store search for {message_id}: {type(exc).__name__}: {exc}"
            ) from exc
        except OSError as exc:
            raise transport_error(PROVIDER, exc, f"sent-store search for {message_id}") from exc
        except Exception as exc:  # a client's own bug: nothing observed, a person looks
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

    ``mailbox`` None: the folder is found once per client by the SPECIAL-USE ``\\Sent``
    attribute (``LIST "" "*" RETURN (SPECIAL-USE)`` where the server has LIST-EXTENDED,
    plain ``LIST`` otherwise, which most servers also mark); ``fallback_mailbox`` when no
    folder is marked.
    """

    max_hits = 20
    provider = PROVIDER

    def __init__(
        self,
        connect: Callable[[], imaplib.IMAP4],
        *,
        mailbox: str | None = "Sent",
        fallback_mailbox: str = "Sent",
    ) -> None:
        self._connect = connect
        self.mailbox = mailbox
        self.fallback_mailbox = fallback_mailbox
        self._found: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def over_ssl(
        cls,
        host: str,
        username: str,
        password: str,
        *,
        mailbox: str | None = None,
        fallback_mailbox: str = "Sent",
        port: int = 993,
        timeout: float = 10.0,
        ca_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> ImapSentFolder:
        """IMAP over TLS with the certificate and host name verified: Python's
        ``IMAP4_SSL`` without a context verifies neither, and the password would go to
        whoever answers."""
        context = ssl_context or ssl.create_default_context(cafile=ca_file)

        def connect() -> imaplib.IMAP4:
            try:
                conn = imaplib.IMAP4_SSL(host, port, ssl_context=context, timeout=timeout)
            except (OSError, imaplib.IMAP4.error) as exc:
                raise _connect_error(exc, f"connecting to {host}:{port}") from exc
            try:
                conn.login(username, password)
            except imaplib.IMAP4.abort as exc:
                raise ProbeTransientError(PROVIDER, f"login to {host} dropped: {exc}") from exc
            except imaplib.IMAP4.error as exc:
                with contextlib.suppress(Exception):
                    conn.shutdown()
                raise ProbeCredentialError(
                    PROVIDER, f"{host} refused the login for {username!r}: {_text(exc)}"
                ) from exc
            except OSError as exc:
                raise _connect_error(exc, f"logging in to {host}") from exc
            return conn

        return cls(connect, mailbox=mailbox, fallback_mailbox=fallback_mailbox)

    def __repr__(self) -> str:
        return f"ImapSentFolder(mailbox={self.mailbox!r})"

    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        conn = self._connect()
        try:
            return self._search(conn, message_id)
        except imaplib.IMAP4.abort as exc:
            raise ProbeTransientError(PROVIDER, f"the IMAP connection dropped: {exc}") from exc
        except imaplib.IMAP4.error as exc:
            raise MailStoreReadError(f"the IMAP server refused a read: {_text(exc)}") from exc
        except OSError as exc:  # timeouts included
            raise _connect_error(exc, "reading the sent folder") from exc
        finally:
            # The answer is already read; a failed goodbye changes nothing.
            with contextlib.suppress(Exception):
                conn.logout()

    def sent_mailbox(self, conn: imaplib.IMAP4) -> str:
        """The mailbox to search: configured, or the one marked ``\\Sent``, or the fallback."""
        if self.mailbox is not None:
            return self.mailbox
        with self._lock:
            if self._found is not None:
                return self._found
        capabilities = {str(c).upper() for c in getattr(conn, "capabilities", ())}
        if "LIST-EXTENDED" in capabilities and "SPECIAL-USE" in capabilities:
            status, data = conn.list('""', '"*" RETURN (SPECIAL-USE)')
        else:
            status, data = conn.list('""', '"*"')
        if status != "OK":
            raise MailStoreReadError("cannot list the mailboxes to find the sent folder")
        marked = [name for flags, name in _list_entries(data) if SENT.lower() in flags]
        found = marked[0] if marked else self.fallback_mailbox
        with self._lock:
            self._found = found
        return found

    def _search(self, conn: imaplib.IMAP4, message_id: str) -> list[dict[str, Any]]:
        mailbox = self.sent_mailbox(conn)
        status, _ = conn.select(_imap_quote(mailbox), readonly=True)
        if status != "OK":
            raise MailStoreReadError(f"cannot open mailbox {mailbox!r}")
        status, data = conn.uid("SEARCH", "HEADER", "Message-ID", _imap_quote(message_id))
        if status != "OK" or not data:
            raise MailStoreReadError(f"IMAP search in {mailbox!r} failed")
        uids = _as_bytes(data[0]).split()
        if len(uids) > self.max_hits:
            raise MailStoreReadError(f"{len(uids)} hits for one Message-ID; look by hand")
        found = []
        for uid in uids:
            header = self._message_id(conn, uid)
            found.append({"message_id": header, "id": uid.decode(), "mailbox": mailbox})
        return found

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


def _connect_error(exc: BaseException, what: str) -> ProbeError:
    if isinstance(exc, imaplib.IMAP4.abort):
        return ProbeTransientError(PROVIDER, f"{what}: the server hung up: {exc}")
    if isinstance(exc, imaplib.IMAP4.error):
        return MailStoreReadError(f"{what}: {_text(exc)}")
    return transport_error(PROVIDER, exc, what)


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return (arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg))[:200]


# (\\HasNoChildren \\Sent) "/" "Sent Mail"   -- the mailbox name quoted, an atom or a literal
_LIST_LINE = re.compile(rb'^\((?P<flags>[^)]*)\)\s+(?:NIL|"(?:[^"\\]|\\.)*")\s*(?P<name>.*)$')


def _list_entries(data: list[Any]) -> list[tuple[set[str], str]]:
    """(lower-cased attributes, mailbox name as the server spells it) per LIST line."""
    entries = []
    for item in data:
        if item is None:
            continue
        if isinstance(item, tuple):  # a name sent as a literal: (b'(\\Sent) "/" {9}', b'Sent Mail')
            line, name_bytes = _as_bytes(item[0]), _as_bytes(item[1])
            match = _LIST_LINE.match(line)
            name = name_bytes.decode("utf-8", "replace")
        else:
            match = _LIST_LINE.match(_as_bytes(item).strip())
            if match is None:
                continue
            raw = match.group("name").strip()
            if raw.startswith(b'"') and raw.endswith(b'"') and len(raw) >= 2:
                raw = re.sub(rb"\\(.)", rb"\1", raw[1:-1])
            name = raw.decode("utf-8", "replace")
        if match is None or not name:
            continue
        flags = {f.lower() for f in match.group("flags").decode("ascii", "replace").split()}
        entries.append((flags, name))
    return entries


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
