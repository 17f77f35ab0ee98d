"""Being told when you are needed: when an effect starts waiting for approval or enters
human review, the notifier (reading the journal from its durable cursor, off the agent's
hot path) owes one message per transition and channel, and sends it as a signed generic
webhook, Slack incoming-webhook JSON or email, with retries and a growing pause.

The receivers are real sockets on this machine (so the channels allow private
destinations, which the notifier refuses by default: test_notify_ssrf.py): an HTTP server
that checks nothing itself and can answer 500 on cue, and an SMTP server that can refuse
on cue. Time is
injected (``now=``): no test waits for a backoff to pass.
"""

from __future__ import annotations

import email
import hashlib
import hmac
import json
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.urls import reverse
from test_console_views import Agent, client_for, decide, fresh_ledger, html, make_users

from notifications import dispatch
from notifications.config import channels
from notifications.models import Delivery, JournalCursor
from tests.support.fake_http import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "s3cret-for-signing-webhooks"


# -- receivers ----------------------------------------------------------------------------


Receiver = WebhookReceiver  # an HTTP server on 127.0.0.1 recording every request


class SmtpReceiver:
    """A minimal SMTP server on 127.0.0.1: enough of the dialogue for smtplib; refuses
    the message with 451 while ``refuse`` is set."""

    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []
        self.refuse = False
        receiver = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                def say(line: str) -> None:
                    self.wfile.write((line + "\r\n").encode())

                say("220 test ESMTP")
                while True:
                    line = self.rfile.readline().decode(errors="replace").strip()
                    verb = line.split(" ", 1)[0].upper()
                    if not line or verb == "QUIT":
                        say("221 bye")
                        return
                    if verb in ("EHLO", "HELO"):
                        say("250 test")
                    elif verb in ("MAIL", "RCPT", "RSET", "NOOP"):
                        say("250 ok")
                    elif verb == "DATA":
                        say("354 go on")
                        data = b""
                        while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                            data += chunk
                        if receiver.refuse:
                            say("451 try again later")
                        else:
                            receiver.messages.append(email.message_from_bytes(data))
                            say("250 queued")
                    else:
                        say("502 no")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def smtp() -> Iterator[SmtpReceiver]:
    s = SmtpReceiver()
    yield s
    s.close()


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


def configure(*chans: dict[str, Any]) -> Any:
    return override_settings(
        OPENONCE_NOTIFY=json.dumps(list(chans)),
        OPENONCE_CONSOLE_URL="https://console.test",
        OPENONCE_NOTIFY_ALLOW_PRIVATE=True,  # the receivers listen on 127.0.0.1
    )


def webhook(receiver: Receiver, **more: Any) -> dict[str, Any]:
    return {
        "name": "hook",
        "kind": "webhook",
        "url": receiver.url + "/hook",
        "secret": SECRET,
        **more,
    }


def verify(request: dict[str, Any], secret: str = SECRET) -> bool:
    """What a receiver does: recompute the HMAC over "<t>." + body and compare."""
    header = request["headers"]["openonce-signature"]
    parts = dict(p.split("=", 1) for p in header.split(","))
    mac = hmac.new(secret.encode(), parts["t"].encode() + b"." + request["body"], hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest(), parts["v1"])


# -- the webhook --------------------------------------------------------------------------


def test_a_refund_waiting_for_approval_is_announced_once_signed(
    agent: Agent, receiver: Receiver
) -> None:
    with configure(webhook(receiver)):
        dispatch.tick()  # the notifier starts before the agent: it reads from here on
        effect_id = agent.pending(charge="ch_n1", amount=500)
        report = dispatch.tick()
        assert (report.owed, report.sent, report.failed) == (1, 1, 0)
        dispatch.tick()  # a later tick, and a tick that reads the same lines again ...
        JournalCursor.objects.update(seq=0)
        dispatch.tick()

    assert len(receiver.requests) == 1  # ... send nothing twice
    request = receiver.requests[0]
    assert verify(request)
    assert not verify(request, "another-secret-entirely")
    body = receiver.json(0)
    assert body["type"] == "effect.requires_approval"
    assert body["effect_id"] == effect_id and body["tool"] == "stripe.refund"
    assert body["link"] == f"https://console.test/effects/{effect_id}/"
    assert request["headers"]["openonce-delivery"] == str(body["delivery_id"])
    signed_at = int(request["headers"]["openonce-signature"].split(",")[0][2:])
    assert abs(signed_at - time.time()) < 120


def test_one_message_per_transition_and_none_for_a_replay(agent: Agent, receiver: Receiver):
    with configure(webhook(receiver)):
        dispatch.tick()
        refund = agent.oo.effect(
            lambda charge, amount: {"ok": True},
            tool="stripe.refund",
            idempotency_key=lambda charge, amount: f"re-{charge}",
        )
        first = pending_id(refund, charge="ch_a", amount=1)
        second = pending_id(refund, charge="ch_b", amount=2)
        review = agent.human_review(order="hr-1")  # enters human review
        assert pending_id(refund, charge="ch_a", amount=1) == first  # the agent retries
        dispatch.tick()

    events = sorted(
        (b["effect_id"], b["type"]) for b in map(json.loads, (r["body"] for r in receiver.requests))
    )
    assert events == sorted(
        [
            (first, "effect.requires_approval"),
            (second, "effect.requires_approval"),
            (review, "effect.human_review"),
        ]
    )


def pending_id(fn: Any, **args: Any) -> str:
    from openonce_core import ApprovalPending

    with pytest.raises(ApprovalPending) as pending:
        fn(**args)
    return pending.value.effect_id


def test_a_500_is_retried_after_a_growing_pause(agent: Agent, receiver: Receiver) -> None:
    receiver.fail_next = 2
    t0 = time.time()
    with configure(webhook(receiver)):
        dispatch.tick(now=t0)
        effect_id = agent.pending()
        assert dispatch.tick(now=t0 + 1).failed == 1  # 500
        [delivery] = Delivery.objects.all()
        assert (delivery.status, delivery.attempts, delivery.last_status) == ("pending", 1, 500)
        assert delivery.next_attempt_at == pytest.approx(t0 + 1 + dispatch.BACKOFF_SECONDS)
        assert dispatch.tick(now=t0 + 2).failed == 0  # not due yet: nothing sent
        assert len(receiver.requests) == 1
        assert dispatch.tick(now=t0 + 1 + dispatch.BACKOFF_SECONDS).failed == 1  # 500 again
        delivery.refresh_from_db()
        assert delivery.next_attempt_at == pytest.approx(
            t0 + 1 + dispatch.BACKOFF_SECONDS + 2 * dispatch.BACKOFF_SECONDS
        )
        assert dispatch.tick(now=delivery.next_attempt_at).sent == 1  # third time: 200

    assert len(receiver.requests) == 3
    # The same delivery each time, signed each time.
    assert {r["headers"]["openonce-delivery"] for r in receiver.requests} == {str(delivery.id)}
    assert all(verify(r) for r in receiver.requests)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("sent", 3, "")
    assert agent.state(effect_id) == "requires_approval"  # notifying changed no effect


def test_it_gives_up_after_the_last_attempt_and_says_so_on_the_page(
    agent: Agent, users, receiver: Receiver, monkeypatch
) -> None:
    monkeypatch.setattr(dispatch, "MAX_ATTEMPTS", 2)
    receiver.fail_next = 99
    with configure(webhook(receiver)):
        dispatch.tick(now=1000.0)
        effect_id = agent.pending()
        dispatch.tick(now=time.time())
        dispatch.tick(now=time.time() + 3600)
        dispatch.tick(now=time.time() + 7200)  # given up: not tried a third time
    assert len(receiver.requests) == 2
    [delivery] = Delivery.objects.all()
    assert (delivery.status, delivery.attempts) == ("failed", 2)

    page = html(client_for(users["viewer"]).get(reverse("effect", args=[effect_id])))
    assert "hook" in page and "delivery-failed" in page
    assert "the receiver answered 500" in page
    assert "127.0.0.1" in page and "/hook" not in page  # the path may be a secret


def test_nothing_is_sent_for_other_tools_or_events(agent: Agent, receiver: Receiver) -> None:
    chan = webhook(receiver, tools=["wire.*"], events=["requires_approval"])
    with configure(chan):
        dispatch.tick()
        agent.pending()  # stripe.refund: not this channel's tool
        agent.human_review()  # not this channel's event
        wire = agent.pending("wire.transfer", account="acc", amount=9)
        dispatch.tick()
    assert [receiver.json(i)["effect_id"] for i in range(len(receiver.requests))] == [wire]


def test_a_second_approval_of_two_is_not_a_new_wait(agent: Agent, users, receiver: Receiver):
    with configure(webhook(receiver)):
        dispatch.tick()
        wire = agent.pending("wire.transfer", account="acc", amount=9)  # needs 2 approvers
        first = decide(client_for(users["approver"]), "approve", wire, agent.fence(wire))
        assert first.status_code == 302 and agent.state(wire) == "requires_approval"
        dispatch.tick()
    assert len(receiver.requests) == 1


def test_the_cursor_waits_for_a_line_still_being_committed(agent: Agent, receiver: Receiver):
    """Sequence numbers are handed out before commit: a visible line 11 with 10 missing
    may mean 10 commits in a moment. Until the gap is SETTLE_SECONDS old, stop before it."""
    with configure(webhook(receiver)):
        dispatch.tick()
        effect_id = agent.pending()
        cursor = JournalCursor.objects.get()
        first_seq = agent_lines(effect_id)[0]
        JournalCursor.objects.update(seq=first_seq - 2)  # as if first_seq - 1 were in flight
        assert dispatch.scan(now=time.time()) == (0, 0)  # young gap: wait
        assert JournalCursor.objects.get().seq == first_seq - 2
        _, owed = dispatch.scan(now=time.time() + dispatch.SETTLE_SECONDS + 1)
        assert owed == 1 and JournalCursor.objects.get().seq >= first_seq
    assert cursor.name == "notify"


def agent_lines(effect_id: str) -> list[int]:
    from ledger.models import JournalEntry

    return list(JournalEntry.objects.filter(effect_id=effect_id).values_list("seq", flat=True))


# -- Slack and email ----------------------------------------------------------------------


def test_slack_gets_its_incoming_webhook_format(agent: Agent, receiver: Receiver) -> None:
    with configure({"name": "slack", "kind": "slack", "url": receiver.url + "/services/T/B/x"}):
        dispatch.tick()
        effect_id = agent.pending()
        dispatch.tick()
    body = receiver.json(0)
    assert set(body) == {"text", "unfurl_links"}
    assert "*stripe.refund is waiting for approval*" in body["text"]
    assert f"<https://console.test/effects/{effect_id}/|Open {effect_id}>" in body["text"]
    assert "openonce-signature" not in receiver.requests[0]["headers"]


def test_email_goes_through_django_mail_and_a_refusal_is_retried(
    agent: Agent, smtp: SmtpReceiver
) -> None:
    smtp.refuse = True
    t0 = time.time()
    mailers = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": smtp.port, "timeout": 10},
        }
    }
    with (
        override_settings(MAILERS=mailers),
        configure({"name": "mail", "kind": "email", "to": ["oncall@example.com"]}),
    ):
        dispatch.tick(now=t0)
        effect_id = agent.human_review(order="hr-mail")
        assert dispatch.tick(now=t0 + 1).failed == 1
        [delivery] = Delivery.objects.all()
        assert "451" in delivery.last_error
        smtp.refuse = False
        assert dispatch.tick(now=delivery.next_attempt_at).sent == 1
    [message] = smtp.messages
    assert message["To"] == "oncall@example.com"
    assert message["Subject"] == "[OpenOnce] stripe.charge needs a person: in human review"
    text = message.get_payload(decode=True).decode()
    assert f"https://console.test/effects/{effect_id}/" in text


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ("{not json", "not JSON"),
        ('{"a": 1}', "a JSON list"),
        ('[{"name": "x", "kind": "pager"}]', "kind"),
        (
            '[{"name": "x", "kind": "webhook", "url": "ftp://x", "secret": "0123456789abcdef"}]',
            "url",
        ),
        ('[{"name": "x", "kind": "webhook", "url": "https://x"}]', "secret"),
        ('[{"name": "x", "kind": "email", "to": []}]', "to"),
        ('[{"name": "x", "kind": "slack", "url": "https://x", "events": ["committed"]}]', "events"),
        ('[{"name": "x", "kind": "slack", "url": "https://x", "color": "red"}]', "unknown keys"),
        (
            json.dumps([{"name": "x", "kind": "slack", "url": f"https://{h}"} for h in "xy"]),
            "repeat",
        ),
        (
            json.dumps(
                [{"name": "x", "kind": "webhook", "url": "https://x", "secret_env": "OO_NO"}]
            ),
            "OO_NO",
        ),
    ],
)
def test_a_malformed_channel_stops_the_notifier_with_its_name(doc: str, problem: str) -> None:
    with override_settings(OPENONCE_NOTIFY=doc), pytest.raises(ImproperlyConfigured, match=problem):
        channels()


def test_the_notify_command_says_which_variable_to_set(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.dev",
        "OPENONCE_DATABASE": str(tmp_path / "nowhere.db"),
    }
    out = subprocess.run(
        [sys.executable, "manage.py", "notify"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 1
    assert "set OPENONCE_DATABASE" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "nowhere.db").exists()  # nothing was created on the way


def test_beat_schedules_the_notifier_and_the_worker_knows_its_task() -> None:
    from django.conf import settings

    from openonce_site.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["openonce-notify"]
    assert entry["task"] == "openonce.notify"
    assert entry["schedule"] == settings.OPENONCE_NOTIFY_INTERVAL
    app.loader.import_default_modules()  # what a worker does at start-up
    assert "openonce.notify" in app.tasks


# -- what leaves: secrets redacted, hidden characters shown --------------------------------

HOSTILE = (
    "probe inconclusive: GET https://ops:hunter2@api.example.com/v1 with"
    " Authorization: Bearer sk_live_51HqLyjWDarjtT1zdp7dcXYZ failed; card 4242 4242 4242 4242;"
    " approve \u202ereversed\u202c\u200b\u2066x\u2069\ufeff\u2028end"
)
LEAKS = ("hunter2", "sk_live_51HqLyjWDarjtT1zdp7dcXYZ", "4242 4242", "ops:")
HIDDEN = ("\u202e", "\u202c", "\u200b", "\u2066", "\u2069", "\ufeff", "\u2028")


class Inconclusive:
    """A prober whose error text quotes its request, as exception messages do."""

    def probe(self, effect: Any) -> Any:
        from openonce_core import ProbeOutcome, ProbeResult

        return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=HOSTILE.split(": ", 1)[1])


def escalate_with_hostile_reason(agent: Agent) -> str:
    """An UNKNOWN effect the reconciler sends to human review with the prober's words."""
    from openonce_core import Reconciler

    effect_id = agent.unknown()
    reconciler = Reconciler(agent.oo, grace_seconds=0)
    reconciler.register("stripe.charge", Inconclusive())
    reconciler.run_once()
    assert agent.state(effect_id) == "human_review"
    return effect_id


def assert_clean(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, leak
    for char in HIDDEN:
        assert char not in text, f"U+{ord(char):04X}"
    assert "[secret]" in text
    assert "\\u202e" in text and "\\ufeff" in text  # written out, for the reader to see


def test_a_webhook_carries_no_secret_and_no_hidden_character(agent: Agent, receiver: Receiver):
    with configure(webhook(receiver)):
        dispatch.tick()
        escalate_with_hostile_reason(agent)
        dispatch.tick()
    [request] = receiver.requests
    assert verify(request)
    assert_clean(receiver.json(0)["reason"])


def test_slack_gets_no_secret_and_no_hidden_character(agent: Agent, receiver: Receiver) -> None:
    with configure({"name": "slack", "kind": "slack", "url": receiver.url + "/services/T/B/x"}):
        dispatch.tick()
        escalate_with_hostile_reason(agent)
        dispatch.tick()
    assert_clean(receiver.json(0)["text"])


def test_a_mail_carries_no_secret_and_no_hidden_character(agent: Agent, smtp: SmtpReceiver):
    mailers = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": smtp.port, "timeout": 10},
        }
    }
    with (
        override_settings(MAILERS=mailers),
        configure({"name": "mail", "kind": "email", "to": ["oncall@example.com"]}),
    ):
        dispatch.tick()
        escalate_with_hostile_reason(agent)
        assert dispatch.tick().sent == 1
    [message] = smtp.messages
    assert_clean(message.get_payload(decode=True).decode())


def test_the_ledger_keeps_the_reason_as_it_was_written(agent: Agent, receiver: Receiver) -> None:
    """Redaction is for what leaves; the journal is evidence and is not rewritten."""
    with configure(webhook(receiver)):
        dispatch.tick()
        effect_id = escalate_with_hostile_reason(agent)
        dispatch.tick()
    reasons = [line.reason for line in agent.journal(effect_id)]
    assert any("\u202e" in r for r in reasons)


def test_the_notify_task_has_a_queue_of_its_own_that_workers_consume() -> None:
    """Routed to openonce.notify, never behind a backlog of batches; a worker started
    without -Q (compose's, the tests') consumes every declared queue, this one too."""
    from openonce_site.celery import app

    assert app.amqp.router.route({}, "openonce.notify")["queue"].name == "openonce.notify"
    declared = [q.name for q in app.conf.task_queues]
    assert "openonce.notify" in declared
    # A worker that frees up looks at the queues in this order (queue_order_strategy).
    assert declared.index("openonce.notify") < declared.index("openonce.batches")


def _cursor_set(dsn: str) -> bool:
    """Whether the notifier's first tick has set its journal cursor in that database."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        return bool(conn.execute("SELECT count(*) FROM notifications_journalcursor").fetchone()[0])


@pytest.mark.slow
def test_a_worker_started_without_queues_sends_notifications_from_their_own_queue(
    tmp_path, receiver: Receiver
) -> None:
    """Real processes: the beat's message lands in openonce.notify (not behind the
    batches), and a worker started as compose starts it, without -Q, consumes it."""
    from celery import Celery
    from django.conf import settings

    from openonce_core import ApprovalPending, OpenOnce, require_approval_for
    from tests.support import daemon

    name, dsn = daemon.create_database()
    redis_db, broker = daemon.pick_redis_db()
    worker = None
    try:
        env = daemon.daemon_env(
            dsn, broker,
            OPENONCE_NOTIFY=json.dumps([webhook(receiver)]),
            OPENONCE_NOTIFY_ALLOW_PRIVATE="true",
            OPENONCE_CONSOLE_URL="https://console.test",
        )  # fmt: skip
        daemon.migrate(env)
        # The project's Celery settings (its routes), but this test's broker: the settings'
        # CELERY_BROKER_URL would win over the constructor's broker on Celery 5.6.
        sender = Celery("sender")
        sender.config_from_object(
            {k.removeprefix("CELERY_").lower(): getattr(settings, k) for k in dir(settings)
             if k.startswith("CELERY_")} | {"broker_url": broker}
        )  # fmt: skip
        redis = daemon.redis_client(redis_db)

        def notify() -> None:
            sender.send_task("openonce.notify")

        notify()  # the first tick sets the cursor: notify from now on
        assert (redis.llen("openonce.notify"), redis.llen("openonce.batches")) == (1, 0)

        worker = daemon.start_worker("worker", env, tmp_path, concurrency=1, loglevel="warning")
        # Until that tick has run (not merely been taken from the queue), a line written now
        # may land before its cursor, and be skipped as history.
        daemon.wait_until(
            lambda: _cursor_set(dsn), 30, "the worker's first tick sets the cursor",
            on_timeout=worker.output,
        )  # fmt: skip
        assert redis.llen("openonce.notify") == 0
        oo = OpenOnce(dsn, migrate=False, policy=require_approval_for(["stripe.refund"]))
        refund = oo.effect(
            lambda charge: None, tool="stripe.refund", idempotency_key=lambda charge: charge
        )
        with pytest.raises(ApprovalPending):
            refund("ch_worker")
        oo.close()
        daemon.wait_until(
            lambda: notify() or receiver.requests, 30, "a delivery from the worker",
            interval=1.0, on_timeout=worker.output,
        )  # fmt: skip
        assert receiver.json(0)["tool"] == "stripe.refund"
        redis.close()
    finally:
        if worker is not None:
            worker.stop(grace=5)
        daemon.redis_client(redis_db).flushdb()
        daemon.drop_database(name)
