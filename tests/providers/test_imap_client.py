"""The email prober's real IMAP client against an IMAP server over TLS on a local socket
(tests/support/fake_imap.py), with a certificate from a CA made in the test: the client
verifies the certificate and host name (and refuses to log in without the CA), finds the
sent folder by SPECIAL-USE, and tells a refused login from a dropped connection."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openonce_core import EffectState
from openonce_core.errors import ProbeCredentialError, ProbeTransientError
from openonce_core.probe import ProbeOutcome
from openonce_core.probers import EmailMessageIdProber, ImapSentFolder, message_id_for
from openonce_core.records import Effect
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
