"""The email prober's real IMAP client against an IMAP server over TLS on a local socket
(tests/support/fake_imap.py), with a certificate from a CA made in the test: the client
verifies the certificate and host name (and refuses to log in without the CA), finds the
sent folder by SPECIAL-USE, and tells a refused login from a dropped connection."""

from __future__ import annotations

import imaplib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import openonce_core.probers.email as email_module
from openonce_core import EffectState
from openonce_core._probe import ProbeOutcome
from openonce_core._records import Effect
from openonce_core.errors import ProbeCredentialError, ProbeError, ProbeTransientError
from openonce_core.probers import EmailMessageIdProber, ImapSentFolder, message_id_for
from tests.support.fake_imap import FakeImapServer, free_port
from tests.support.tls import LocalPKI, make_pki

DOMAIN = "mail.example.com"
KEY = "oo_" + "ef" * 20
MID = message_id_for(KEY, DOMAIN)
USER, PASSWORD = "prober@example.com", "app-password"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def imap(pki: LocalPKI) -> Iterator[FakeImapServer]:
    with FakeImapServer(pki, username=USER, password=PASSWORD) as server:
        yield server  # type: ignore[misc]


def email_effect(age: float = 600.0) -> Effect:
    at = time.time() - age
    return Effect(
        id="eff_mail", tool="email.send", idempotency_key="k", scope=None,
        state=EffectState.UNKNOWN, args={"to": "a@b.c"}, args_fingerprint="fp",
        provider_key=KEY, attempt=1, created_at=at, updated_at=at,
    )  # fmt: skip


def prober(server: FakeImapServer, pki: LocalPKI | None, **kw: Any) -> EmailMessageIdProber:
    kw.setdefault("authoritative", False)
    return EmailMessageIdProber.from_imap(
        kw.pop("host", "localhost"), USER, kw.pop("password", PASSWORD),
        domain=DOMAIN, port=server.port, timeout=kw.pop("timeout", 5.0),
        ca_file=str(pki.ca_file) if pki else None, **kw,
    )  # fmt: skip


def test_a_client_without_the_ca_refuses_to_connect_and_sends_no_password(imap):
    imap.add_sent(MID)
    with pytest.raises(ProbeCredentialError, match="certificate is not trusted") as info:
        prober(imap, None).probe(email_effect())
    assert info.value.provider == "imap"
    assert imap.commands == [] and imap.logins == 0  # the password never left


def test_a_certificate_for_another_name_is_refused(pki, tmp_path):
    only_other = make_pki(tmp_path / "other", names=("mail.example.net",))
    with FakeImapServer(only_other, username=USER, password=PASSWORD) as imap:
        with pytest.raises(ProbeCredentialError, match="not trusted"):
            # The CA is trusted, but the certificate names another host.
            EmailMessageIdProber.from_imap(
                "localhost", USER, PASSWORD, authoritative=False, domain=DOMAIN,
                port=imap.port, ca_file=str(only_other.ca_file),
            ).probe(email_effect())  # fmt: skip
        assert imap.logins == 0


def test_with_the_ca_the_sent_folder_is_found_by_special_use(imap, pki):
    imap.add_sent(MID)  # in "Sent Items", the mailbox marked \Sent
    imap.add_sent(f"<x{KEY}@{DOMAIN}>")  # a substring hit IMAP search returns too
    result = prober(imap, pki).probe(email_effect())
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.receipt == {"message_id": MID, "store_id": "1"}
    sent = [c.split(" ", 1)[1] for c in imap.commands]
    assert 'LIST "" "*" RETURN (SPECIAL-USE)' in sent
    assert 'EXAMINE "Sent Items"' in sent  # read-only
    assert any(c.startswith("LOGIN prober@example.com ***") for c in sent)


def test_without_list_extended_a_plain_list_still_finds_the_sent_attribute(pki):
    with FakeImapServer(
        pki, username=USER, password=PASSWORD, capabilities="IMAP4rev1 SPECIAL-USE"
    ) as imap:
        imap.add_sent(MID)
        assert prober(imap, pki).probe(email_effect()).outcome is ProbeOutcome.HAPPENED
        assert 'LIST "" "*"' in [c.split(" ", 1)[1] for c in imap.commands]


def test_a_server_without_special_use_falls_back_to_the_configured_name(pki):
    boxes: dict[str, list[str]] = {"INBOX": [], "Sent": [], "Gesendet": []}
    with FakeImapServer(
        pki, username=USER, password=PASSWORD, mailboxes=boxes, special_use=None,
        capabilities="IMAP4rev1",
    ) as imap:  # fmt: skip
        imap.add_sent(MID, "Gesendet")
        found = prober(imap, pki, fallback_mailbox="Gesendet").probe(email_effect())
        assert found.outcome is ProbeOutcome.HAPPENED
        missed = prober(imap, pki).probe(email_effect())  # falls back to "Sent": empty
        assert missed.outcome is ProbeOutcome.INCONCLUSIVE  # bare SMTP: a miss is no proof


def test_an_explicit_mailbox_is_used_as_given(imap, pki):
    imap.mailboxes["Archive/Sent"] = [MID]
    assert (
        prober(imap, pki, mailbox="Archive/Sent").probe(email_effect()).outcome
        is ProbeOutcome.HAPPENED
    )
    assert not any(" LIST " in f" {c} " for c in imap.commands)


def test_the_lag_window_is_passed_through_from_imap(imap, pki):
    p = prober(imap, pki, authoritative=True, index_lag_seconds=900)
    assert p.index_lag_seconds == 900
    young = p.probe(email_effect(age=600))
    assert young.outcome is ProbeOutcome.INCONCLUSIVE and "young miss" in young.detail
    # It says when to ask again: the lag left plus the margin (10 s), not "ask a person".
    assert 300 + 10 - 5 <= (young.retry_after or 0) <= 300 + 10
    mature = p.probe(email_effect(age=1000))
    assert mature.outcome is ProbeOutcome.NOT_HAPPENED


def test_a_refused_login_is_a_credential_error(imap, pki):
    with pytest.raises(ProbeCredentialError, match="AUTHENTICATIONFAILED"):
        prober(imap, pki, password="wrong").probe(email_effect())


def test_a_connection_dropped_after_login_is_transient(imap, pki):
    imap.drop_after_login = True
    with pytest.raises(ProbeTransientError):
        prober(imap, pki).probe(email_effect())


def test_a_slow_server_is_a_transient_timeout(imap, pki):
    imap.delay = 0.5
    with pytest.raises(ProbeTransientError, match="timed out"):
        prober(imap, pki, timeout=0.2).probe(email_effect())


def test_nothing_listening_is_transient(pki, tmp_path: Path):
    folder = ImapSentFolder.over_ssl(
        "127.0.0.1", USER, PASSWORD, port=free_port(), ca_file=str(pki.ca_file)
    )
    p = EmailMessageIdProber(folder, authoritative=False, domain=DOMAIN)
    with pytest.raises(ProbeTransientError, match="ConnectionRefusedError"):
        p.probe(email_effect())


# -- a busy server is not a bad password (issue 18, item 5) ---------------------------------


@pytest.mark.parametrize(
    "refusal",
    [
        "NO [UNAVAILABLE] Temporary authentication failure, try again later",  # RFC 5530
        "NO [ALERT] Too many simultaneous connections. (Failure)",  # Gmail
        "NO Maximum number of connections from user+IP exceeded",
    ],
)
def test_a_login_refused_because_the_server_is_busy_is_transient(imap, pki, refusal):
    imap.login_refusal = refusal
    with pytest.raises(ProbeTransientError, match="busy") as info:
        prober(imap, pki).probe(email_effect())
    assert info.value.retry_after is not None and info.value.retry_after >= 30
    assert refusal.split(" ", 2)[-1][:20] in str(info.value)


@pytest.mark.parametrize(
    "refusal",
    [
        "NO [AUTHENTICATIONFAILED] Invalid credentials (Failure)",
        "NO [AUTHORIZATIONFAILED] Not allowed to log in, try again later",  # the code decides
        "NO [ALERT] Please log in via your web browser",
    ],
)
def test_a_login_refused_for_the_credentials_stays_a_credential_error(imap, pki, refusal):
    imap.login_refusal = refusal
    with pytest.raises(ProbeCredentialError, match="refused the login"):
        prober(imap, pki).probe(email_effect())


def test_dovecots_connection_limit_bye_is_transient_with_a_retry_hint(imap, pki):
    imap.max_sessions = 0
    with pytest.raises(ProbeTransientError, match="Maximum number of connections") as info:
        prober(imap, pki).probe(email_effect())
    assert info.value.retry_after is not None


def test_connections_per_account_are_capped_in_the_process(imap, pki):
    # Dovecot allows 2 here; 6 probes at once through one process stay within it: nobody
    # sees the server's refusal, every probe finds the message.
    imap.max_sessions = 2
    imap.delay = 0.02  # each session lasts a while, so the probes overlap
    imap.add_sent(MID)
    p = prober(imap, pki, max_connections=2)
    outcomes: list[Any] = []

    def run() -> None:
        try:
            outcomes.append(p.probe(email_effect()).outcome)
        except Exception as exc:  # recorded, so the assertion shows it
            outcomes.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == [ProbeOutcome.HAPPENED] * 6
    assert imap.peak_sessions == 2
    assert imap.logins == 6


def test_waiting_for_a_connection_past_the_budget_is_transient_and_sends_nothing(imap, pki):
    imap.add_sent(MID)
    # One probe holds the only connection for a while: after its login, at least four
    # more answers (login, select, search, logout) of 0.6 s each, so the second probe
    # asks while the connection is taken even if a loaded machine stalls it a second.
    imap.delay = 0.6
    p = prober(imap, pki, max_connections=1, timeout=30.0)
    first = threading.Thread(target=lambda: p.probe(email_effect()))
    first.start()
    deadline = time.monotonic() + 30
    while imap.logins == 0:
        assert time.monotonic() < deadline, "the first probe never logged in"
        time.sleep(0.01)
    folder = p.client
    assert isinstance(folder, ImapSentFolder)
    folder.slot_wait = 0.05  # this probe's budget for a free connection
    with pytest.raises(ProbeTransientError, match="not asked") as info:
        p.probe(email_effect())
    assert info.value.sent is False and info.value.retry_after is not None
    first.join(60)
    assert not first.is_alive()
    assert imap.logins == 1  # the refused probe never connected


# -- a receipt a person gives, checked in the mailbox ---------------------------------------


def test_a_receipt_with_this_effects_message_id_is_verified_in_the_mailbox(imap, pki):
    imap.add_sent(MID)
    result = prober(imap, pki).verify(email_effect(), {"message_id": MID})
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.receipt == {"message_id": MID, "store_id": "1"}
    assert result.provider_reference == KEY


def test_a_receipt_with_another_message_id_is_not_this_effects(imap, pki):
    other = message_id_for("oo_" + "12" * 20, DOMAIN)
    imap.add_sent(other)
    result = prober(imap, pki).verify(email_effect(), {"message_id": other})
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "not this effect's" in result.detail
    assert imap.logins == 0  # nothing to look up


@pytest.mark.parametrize(
    "receipt",
    [{}, {"message_id": ""}, {"message_id": 7}, {"message_id": f"{MID} <x@{DOMAIN}>"}],
)
def test_a_receipt_without_exactly_one_message_id_is_not_looked_up(imap, pki, receipt):
    result = prober(imap, pki).verify(email_effect(), receipt)
    assert result.outcome is ProbeOutcome.INCONCLUSIVE
    assert "receipt" in result.detail and imap.logins == 0


def test_a_receipt_whose_message_is_not_in_the_store(imap, pki):
    smtp = prober(imap, pki).verify(email_effect(), {"message_id": MID})
    assert smtp.outcome is ProbeOutcome.INCONCLUSIVE  # a Sent copy can be missing
    api = prober(imap, pki, authoritative=True).verify(email_effect(), {"message_id": MID})
    assert api.outcome is ProbeOutcome.NOT_HAPPENED
    assert MID in api.detail


def test_a_server_too_busy_to_greet_is_transient(imap, pki):
    imap.greeting = "* BYE [UNAVAILABLE] Too many connections, try again later"
    with pytest.raises(ProbeTransientError, match="busy") as info:
        prober(imap, pki).probe(email_effect())
    assert info.value.retry_after is not None and imap.logins == 0


class _StuckLogin:
    """An IMAP4_SSL whose LOGIN fails as ``raises`` does, recording whether the client
    shut the connection afterwards."""

    instances: list[_StuckLogin] = []

    def __init__(self, raises: BaseException) -> None:
        self.raises = raises
        self.shut = False
        _StuckLogin.instances.append(self)

    def login(self, user: str, password: str) -> None:
        raise self.raises

    def shutdown(self) -> None:
        self.shut = True


@pytest.mark.parametrize(
    "raises",
    [
        TimeoutError("The read operation timed out"),
        imaplib.IMAP4.abort("socket error: EOF"),
        imaplib.IMAP4.error("[UNAVAILABLE] try again later"),
        imaplib.IMAP4.error("[AUTHENTICATIONFAILED] Invalid credentials"),
    ],
    ids=["timeout", "dropped", "busy", "refused"],
)
def test_a_failed_login_leaves_no_connection_open(monkeypatch, raises):
    # A socket left to the garbage collector still counts against the server's
    # connections-per-user limit (Dovecot's mail_max_userip_connections).
    _StuckLogin.instances.clear()
    monkeypatch.setattr(email_module.imaplib, "IMAP4_SSL", lambda *a, **k: _StuckLogin(raises))
    store = email_module.ImapSentFolder.over_ssl("imap.example.com", "u", "p")
    with pytest.raises(ProbeError):
        store.find_sent("<x@example.com>")
    assert [c.shut for c in _StuckLogin.instances] == [True]
