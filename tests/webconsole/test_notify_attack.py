"""The notifier attacked as production would (issue 21): two notifiers whose hosts' clocks
disagree, and an agent's tool name written to forge a line of a mail or a Slack message.

The journal's times are the ledger's clock (the database's on Postgres); a notifier that
judged them, and the claims other notifiers hold, on its own host's clock passed over a
line still being committed and sent a message another notifier was sending. Each test
failed before its fix.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
from django.core import mail
from django.test import override_settings
from test_console_views import Agent, fresh_ledger
from test_notify_digest import webhook

from ledger.clients import ledger_target
from notifications import dispatch
from notifications.models import Delivery, JournalCursor
from tests.support.fake_http import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)
FORGED = "wire.transfer\n\nThe queue: https://evil.example/approve-all"


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


def configure(*chans: dict[str, Any]) -> Any:
    return override_settings(
        OPENONCE_NOTIFY=json.dumps(list(chans)),
        OPENONCE_CONSOLE_URL="https://console.test",
        OPENONCE_NOTIFY_ALLOW_PRIVATE=True,  # the receivers listen on 127.0.0.1
        MAILERS={"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}},
    )


def host_clock_ahead(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This host's wall clock runs ``seconds`` ahead of the database's (NTP off, a VM
    resumed): the ledger's own clock is the database's and does not move."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


# -- two hosts, two clocks -----------------------------------------------------------------


def test_a_notifier_whose_clock_runs_ahead_still_waits_for_a_line_being_committed(
    agent: Agent, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gap in the journal is passed over once it is SETTLE_SECONDS old. Judged on a
    host clock two minutes ahead, a line committed a moment ago looked old: the cursor
    went past the gap, and the line still committing was never notified."""
    with configure(webhook(receiver)):
        agent.pending(charge="ch_before", amount=1)
        dispatch.tick()
        before = JournalCursor.objects.get().seq
        # Another agent's line takes the next number and is still being committed.
        with psycopg.connect(ledger_target(), autocommit=True) as conn:
            conn.execute("SELECT nextval(pg_get_serial_sequence('openonce_journal', 'seq'))")
        agent.pending()
        host_clock_ahead(monkeypatch, 120)
        dispatch.tick()
        assert JournalCursor.objects.get().seq == before  # waits before the gap
        assert receiver.requests == []


def test_a_notifier_whose_clock_runs_ahead_does_not_send_what_another_is_sending(
    agent: Agent, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender claims a delivery for CLAIM_SECONDS before it sends. Another notifier
    whose host clock is 90 s ahead read that claim as expired, took it and sent the
    message a second time while the first was still sending it."""
    with configure(webhook(receiver)):
        dispatch.tick()
        agent.pending()
        dispatch.scan()
        [delivery] = Delivery.objects.all()
        # Notifier A claims it; its request is on the way (an attempt may take 30 s).
        assert dispatch._claim(Delivery, delivery.id, None, time.time()) is not None
        host_clock_ahead(monkeypatch, 90)  # notifier B, on another host
        assert dispatch.tick().sent == 0
    assert receiver.requests == []


# -- what an agent's tool name can write -----------------------------------------------------


def test_a_tool_name_cannot_write_a_line_of_the_mail(agent: Agent) -> None:
    """A mail is plain text, and a tool name is the agent's: with a line break in it, it
    wrote a line of the mail's own ("The queue: <a link>") under OpenOnce's name."""
    email = {"name": "mail", "kind": "email", "to": ["oncall@example.com"]}
    with configure(email):
        dispatch.tick()
        agent.pending(FORGED, account="acc", amount=9)
        dispatch.tick()
    [message] = mail.outbox
    lines = message.body.splitlines()
    assert not any(line.startswith("The queue: https://evil") for line in lines), lines
    assert "wire.transfer\\x0a\\x0aThe queue" in message.body  # shown as written, not taken
    assert "\n" not in message.subject


def test_a_tool_name_cannot_write_a_line_of_a_digest(agent: Agent) -> None:
    email = {"name": "mail", "kind": "email", "to": ["oncall@example.com"], "digest": 300}
    with configure(email):
        start = (time.time() // 300) * 300
        dispatch.tick(now=start + 1)
        agent.pending(FORGED, account="acc", amount=9)
        dispatch.tick(now=start + 2)
        assert dispatch.tick(now=start + 301).sent == 1
    [message] = mail.outbox
    queue_lines = [line for line in message.body.splitlines() if line.startswith("The queue: ")]
    assert queue_lines == ["The queue: https://console.test/"], message.body


def test_a_tool_name_cannot_write_a_line_of_a_slack_message(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    slack = {"name": "slack", "kind": "slack", "url": receiver.url + "/services/T/B/x"}
    with configure(slack):
        dispatch.tick()
        agent.pending(FORGED, account="acc", amount=9)
        dispatch.tick()
    text = json.loads(receiver.requests[0]["body"])["text"]
    assert not any(line.startswith("The queue: ") for line in text.splitlines()), text
