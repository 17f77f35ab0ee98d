"""Tiers 2 and 3, a sender-controlled key: is there a sent copy with this Message-ID?

The handler sets a deterministic Message-ID, ``message_id_for(ctx.provider_key, domain)``
(``<{provider_key}@{domain}>``), so the prober can look the message up in the sender's
sent store. What a miss means depends on that store:

* a provider API whose sent store records every accepted message (``authoritative=True``,
  capability ``email_provider_api``): a miss is NOT_HAPPENED once the store has had its
  index lag to record the message. A younger miss is INCONCLUSIVE with ``retry_after``,
  the time until it matures: the reconciler asks again then, not a person now (see
  :class:`EmailMessageIdProber`);
* bare SMTP, with at best a copy the client appended to a Sent folder itself
  (``authoritative=False``, capability ``email_smtp``): the copy can fail after the
  message was delivered, so a miss proves nothing and stays INCONCLUSIVE, forever.

Either way a found copy is HAPPENED with receipt ``{"message_id": ...}``; a malformed
answer is INCONCLUSIVE; a store that could not be asked raises a ``ProbeError`` (a login
refused for its credentials is a ``ProbeCredentialError``, a dropped connection or a
timeout a ``ProbeTransientError``). Several copies with the same Message-ID (a Sent folder
and an "All Mail" label) are still one message: HAPPENED.

A server that turns a login away because it is busy is not refusing the password: RFC
5530's ``[UNAVAILABLE]`` (or ``[INUSE]``), Gmail's "Too many simultaneous connections",
Dovecot's "Maximum number of connections from user+IP exceeded" (often a ``* BYE``), "try
again later". Those are ``ProbeTransientError`` with ``retry_after`` (``LOGIN_BUSY_WAIT``),
unless the answer carries ``[AUTHENTICATIONFAILED]``, ``[AUTHORIZATIONFAILED]`` or
``[EXPIRED]``: the response code decides before the words do. So the server never has
cause to say it, :class:`ImapSentFolder` opens at most ``max_connections`` (default 2)
connections per account at once in a process (threads wait their turn, up to the
probe's ``timeout``; past that the probe is a ``ProbeTransientError`` with
``sent=False``: nothing was asked). The cap is per process: N worker processes may hold
N times as many, so keep N x ``max_connections`` under the server's limit (Gmail allows
15 per account, Dovecot 10 per user and address by default).

:meth:`EmailMessageIdProber.verify` checks a receipt a person gives (see there).

:class:`ImapSentFolder` verifies the server's certificate and host name (a custom CA can
be given) and finds the sent folder by its SPECIAL-USE ``\\Sent`` attribute (RFC 6154),
falling back to a configured name on servers that do not advertise one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import imaplib
import math
import os
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from email.parser import BytesHeaderParser
from typing import Any, Protocol

from .._probe import (
    MATURITY_MARGIN_SECONDS,
    ProbeOutcome,
    ProbeResult,
    age_words,
    attempt_ended_at,
    young_miss_wait,
)
from .._records import Effect
from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError
from ._http import transport_error

PROVIDER = "imap"
SENT = "\\Sent"
# Connections one process opens to one IMAP account at once (servers cap them per account).
MAX_CONNECTIONS = 2
# How long to leave a server alone that said it is busy: none of them says how long.
LOGIN_BUSY_WAIT = 60.0


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
    cannot re-arm on a miss the store had no time to record. Such a young miss in an
    authoritative store carries ``retry_after``: the lag left plus
    ``maturity_margin_seconds``, when the reconciler asks again instead of a person now.
    The age runs from when the effect went UNKNOWN (``probe.attempt_ended_at``).

    ``clock`` is the time that age is measured against. Leave it None: a
    :class:`~openonce_core._reconcile.Reconciler` binds its own (``bind_clock``), the clock
    the effect's timestamps were written with; unbound, this host's ``time.time``.
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
        maturity_margin_seconds: float = MATURITY_MARGIN_SECONDS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        message_id_for("x", domain)  # fail now, not at 3 a.m., on a domain that cannot work
        for name, seconds in (
            ("index_lag_seconds", index_lag_seconds),
            ("maturity_margin_seconds", maturity_margin_seconds),
        ):
            # NaN would make every miss mature at once (age < NaN is never true).
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, not {seconds!r}")
        self.client = client
        self.authoritative = authoritative
        self.domain = domain
        self.index_lag_seconds = index_lag_seconds
        self.maturity_margin_seconds = maturity_margin_seconds
        self.clock = clock
        self._bound: Callable[[], float] | None = None
        self.capability = "email_provider_api" if authoritative else "email_smtp"
        # Names this prober in health and metrics: the store's own name ("imap"), if any.
        provider = getattr(client, "provider", None)
        self.provider = provider if isinstance(provider, str) else "email"

    def bind_clock(self, now: Callable[[], float]) -> None:
        """Measure ages on ``now`` (the reconciler's clock) unless a clock was given."""
        self._bound = now

    def now(self) -> float:
        clock = self.clock or self._bound
        return clock() if clock is not None else time.time()

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
        max_connections: int = MAX_CONNECTIONS,
    ) -> EmailMessageIdProber:
        """A prober searching an IMAP sent folder. Say whether that folder is authoritative:
        a copy your own SMTP client appends is not; a server that files every message it
        accepts may be.

        ``mailbox`` None finds the folder the server marks ``\\Sent`` (else
        ``fallback_mailbox``); ``ca_file`` trusts a private CA, ``ssl_context`` replaces the
        default (verifying) context entirely; ``max_connections`` caps this process's
        connections to the account at once."""
        return cls(
            ImapSentFolder.over_ssl(
                host, username, password, mailbox=mailbox, fallback_mailbox=fallback_mailbox,
                port=port, timeout=timeout, ca_file=ca_file, ssl_context=ssl_context,
                max_connections=max_connections,
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
        # From when the effect went UNKNOWN: a reconciler's re-probe moves updated_at.
        age = self.now() - max(effect.created_at, attempt_ended_at(effect))
        observed["age_seconds"] = round(age, 3)
        lag = self.index_lag_seconds
        # Ask again once the lag has passed, plus a margin: the provider may have taken
        # the message a little after the attempt ended, and a clock not bound to the
        # ledger's may read a little behind it.
        wait = young_miss_wait(age, lag, self.maturity_margin_seconds)
        if wait is not None:
            return _inconclusive(
                f"young miss: no sent copy of {message_id} yet, but the attempt is"
                f" {age_words(age)} and the sent store may lag {lag:g}s; probe again in"
                f" {wait:.0f}s",
                observed,
                retry_after=wait,
            )
        return ProbeResult(
            ProbeOutcome.NOT_HAPPENED,
            detail=f"the authoritative sent store has no message {message_id}",
            provider_reference=effect.provider_key,
            observed=observed,
        )

    def verify(self, effect: Effect, receipt: dict[str, Any]) -> ProbeResult:
        """Check a receipt a person gives for this effect: it must name exactly one
        Message-ID (``receipt["message_id"]``), this effect's own
        (``message_id_for(effect.provider_key, domain)``, compared as the probe compares),
        and the sent store must hold it.

        A receipt naming another Message-ID, several, or none is INCONCLUSIVE without asking
        the store (it is not this effect's receipt). Otherwise the store is searched as a
        probe searches it, with the probe's rules: a copy is HAPPENED (receipt
        ``{"message_id", "store_id"}``, bound to the provider key), a miss is NOT_HAPPENED
        only in an authoritative store past its index lag (INCONCLUSIVE otherwise: a
        missing Sent copy proves nothing), a store that cannot be asked raises.
        """
        if not isinstance(receipt, dict):
            kind = type(receipt).__name__
            return _inconclusive(f"cannot verify: a receipt is an object, not {kind}")
        given = receipt.get("message_id")
        if not isinstance(given, str) or not given.strip():
            return _inconclusive(f"cannot verify this receipt: no message_id (got {given!r})")
        if given.count("<") > 1 or given.count(">") > 1 or len(given.split()) > 1:
            return _inconclusive(
                f"cannot verify this receipt: message_id {given!r} is not exactly one Message-ID"
            )
        try:
            expected = message_id_for(effect.provider_key, self.domain)
        except ValueError as exc:
            return _inconclusive(f"cannot form this effect's Message-ID: {exc}")
        if _normalized(given) != _normalized(expected):
            return _inconclusive(
                f"the receipt's Message-ID {given.strip()!r} is not this effect's {expected!r}:"
                " the receipt is not this effect's"
            )
        found = self.probe(effect)
        return dataclasses.replace(found, detail=f"receipt {expected}: {found.detail}")


def _login(conn: imaplib.IMAP4, host: str, username: str, password: str) -> None:
    """LOGIN, its failures as the reconciler reads them: busy or dropped is transient, a
    refusal of the credentials is not."""
    try:
        conn.login(username, password)
    except imaplib.IMAP4.abort as exc:  # the server hung up, perhaps with a BYE
        text = _text(exc)
        if _busy(text):
            raise _busy_error(f"{host} is busy, it turned the login away: {text}") from exc
        raise ProbeTransientError(PROVIDER, f"login to {host} dropped: {exc}") from exc
    except imaplib.IMAP4.error as exc:
        text = _text(exc)
        if _busy(text):
            raise _busy_error(f"{host} is busy, it turned the login away: {text}") from exc
        raise ProbeCredentialError(
            PROVIDER, f"{host} refused the login for {username!r}: {text}"
        ) from exc
    except OSError as exc:
        raise _connect_error(exc, f"logging in to {host}") from exc


class ImapSentFolder:
    """:class:`SentMailClient` over IMAP, standard library only, read-only (EXAMINE).

    IMAP's HEADER search matches substrings, so every hit is fetched and its Message-ID
    compared whole. ``connect`` returns a logged-in ``imaplib.IMAP4`` (or a stand-in).

    ``mailbox`` None: the folder is found once per client by the SPECIAL-USE ``\\Sent``
    attribute (``LIST "" "*" RETURN (SPECIAL-USE)`` where the server has LIST-EXTENDED,
    plain ``LIST`` otherwise, which most servers also mark); ``fallback_mailbox`` when no
    folder is marked.

    ``account`` names the mailbox account: every folder of the process with the same
    account shares ``max_connections`` connection slots, waited for up to ``slot_wait``
    seconds (``account`` None: no cap).
    """

    max_hits = 20
    provider = PROVIDER

    def __init__(
        self,
        connect: Callable[[], imaplib.IMAP4],
        *,
        mailbox: str | None = "Sent",
        fallback_mailbox: str = "Sent",
        account: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        slot_wait: float = 10.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {max_connections}")
        self._connect = connect
        self.mailbox = mailbox
        self.fallback_mailbox = fallback_mailbox
        self.account = account
        self.max_connections = max_connections
        self.slot_wait = slot_wait
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
        max_connections: int = MAX_CONNECTIONS,
    ) -> ImapSentFolder:
        """IMAP over TLS with the certificate and host name verified: Python's
        ``IMAP4_SSL`` without a context verifies neither, and the password would go to
        whoever answers. At most ``max_connections`` to this account at once in this
        process, each probe waiting up to ``timeout`` for its turn."""
        context = ssl_context or ssl.create_default_context(cafile=ca_file)

        def connect() -> imaplib.IMAP4:
            try:
                conn = imaplib.IMAP4_SSL(host, port, ssl_context=context, timeout=timeout)
            except (OSError, imaplib.IMAP4.error) as exc:
                raise _connect_error(exc, f"connecting to {host}:{port}") from exc
            try:
                _login(conn, host, username, password)
            except BaseException:
                # Refused, dropped or timed out: close it now. A socket left to the garbage
                # collector still counts against the server's connections per user.
                with contextlib.suppress(Exception):
                    conn.shutdown()
                raise
            return conn

        return cls(
            connect, mailbox=mailbox, fallback_mailbox=fallback_mailbox,
            account=f"{username}@{host.lower()}:{port}", max_connections=max_connections,
            slot_wait=timeout,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"ImapSentFolder(mailbox={self.mailbox!r})"

    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        with self._connection_slot():
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

    @contextlib.contextmanager
    def _connection_slot(self) -> Iterator[None]:
        """One of the account's connection slots in this process, for one session."""
        if self.account is None:
            yield
            return
        slots = _account_slots(self.account, self.max_connections)
        if not slots.acquire(timeout=self.slot_wait):
            # Opening one more would only get "too many connections" from the server.
            raise ProbeTransientError(
                PROVIDER,
                f"not asked: {self.max_connections} IMAP connection(s) to {self.account} are"
                f" already open in this process; waited {self.slot_wait:g}s for one",
                retry_after=max(1.0, self.slot_wait),
                sent=False,
            )
        try:
            yield
        finally:
            slots.release()

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


_slots: dict[str, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


def _account_slots(account: str, size: int) -> threading.BoundedSemaphore:
    """The process's connection slots for ``account``: the first folder to ask sizes them."""
    with _slots_lock:
        slots = _slots.get(account)
        if slots is None:
            slots = _slots[account] = threading.BoundedSemaphore(size)
        return slots


def _forget_slots_after_fork() -> None:
    # Slots held by the parent's threads are not held in the child: start with all free.
    global _slots_lock
    _slots_lock = threading.Lock()
    _slots.clear()


os.register_at_fork(after_in_child=_forget_slots_after_fork)

# RFC 5530 codes that say the credentials themselves were refused.
_CREDENTIAL_CODES = ("[AUTHENTICATIONFAILED]", "[AUTHORIZATIONFAILED]", "[EXPIRED]")
# A server turning the login away for load, in RFC 5530's codes and real servers' words.
_BUSY = re.compile(
    r"\[(?:UNAVAILABLE|INUSE)\]|too many (?:simultaneous |concurrent )?connections"
    r"|maximum number of connections|connection limit|try again later|server (?:is )?busy",
    re.IGNORECASE,
)


def _busy(text: str) -> bool:
    """Does a refusal say the server is busy, rather than that the credentials are wrong?"""
    if any(code in text.upper() for code in _CREDENTIAL_CODES):
        return False
    return _BUSY.search(text) is not None


def _busy_error(detail: str) -> ProbeTransientError:
    return ProbeTransientError(PROVIDER, detail, retry_after=LOGIN_BUSY_WAIT)


def _connect_error(exc: BaseException, what: str) -> ProbeError:
    if isinstance(exc, imaplib.IMAP4.error) and _busy(_text(exc)):
        return _busy_error(f"{what}: the server is busy: {_text(exc)}")
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


def _inconclusive(
    detail: str, observed: dict[str, Any] | None = None, *, retry_after: float | None = None
) -> ProbeResult:
    return ProbeResult(
        ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {}, retry_after=retry_after
    )
