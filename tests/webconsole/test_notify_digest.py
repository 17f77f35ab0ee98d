"""Being told once for a burst, and told what failed: a channel with ``"digest"`` gets one
message per interval listing what waits (a count, the first few effects with tool, amount
and link, "and K more"), delivered once however many notifiers race for the interval,
retried and signed like any delivery. Every failed attempt of a delivery (or of its
digest) stays listed on the effect's page after a retry succeeds. And ``make demo`` runs
the notifier, to a receiver on this machine.

The receivers are real sockets on 127.0.0.1; time is injected (``now=``), so no test
waits for an interval or a backoff to pass.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.test import override_settings
from django.urls import reverse
from test_console_views import Agent, client_for, fresh_ledger, make_users

from notifications import dispatch, senders
from notifications.config import channels
from notifications.models import Delivery, Digest
from tests.support.fake_http import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-for-signing-webhooks"
INTERVAL = 300.0  # "5m"


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


def configure(*chans: dict[str, Any]) -> Any:
    return override_settings(
        OPENONCE_NOTIFY=json.dumps(list(chans)),
        OPENONCE_CONSOLE_URL="https://console.test",
        OPENONCE_NOTIFY_ALLOW_PRIVATE=True,  # the receivers listen on 127.0.0.1
    )


def webhook(receiver: WebhookReceiver, **more: Any) -> dict[str, Any]:
    return {
        "name": "hook",
        "kind": "webhook",
        "url": receiver.url + "/hook",
        "secret": SECRET,
        **more,
    }


def verify(request: dict[str, Any], secret: str = SECRET) -> bool:
    import hashlib
    import hmac

    parts = dict(p.split("=", 1) for p in request["headers"]["openonce-signature"].split(","))
    mac = hmac.new(secret.encode(), parts["t"].encode() + b"." + request["body"], hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest(), parts["v1"])


def interval_start() -> float:
    """The start of the current 5-minute interval: the ticks below are placed in it and
    in the next ones, whatever the wall clock says."""
    return math.floor(time.time() / INTERVAL) * INTERVAL


def refunds(agent: Agent, n: int) -> list[str]:
    return [agent.pending(charge=f"ch_{i}", amount=1250 + i, currency="usd") for i in range(n)]


def page_deliveries(effect_id: str) -> list[Any]:
    """What the effect's page is given to show under Notifications."""
    from django.contrib.auth.models import User

    viewer = User.objects.filter(username="viewer").first() or make_users()["viewer"]
    response = client_for(viewer).get(reverse("effect", args=[effect_id]))
    assert response.status_code == 200
    return list(response.context["deliveries"])


# -- every failure stays listed ------------------------------------------------------------


def test_every_failed_attempt_stays_listed_after_a_retry_succeeds(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    receiver.fail_next = 2
    t0 = time.time()
    with configure(webhook(receiver)):
        dispatch.tick(now=t0)
        effect_id = agent.pending()
        assert dispatch.tick(now=t0 + 1).failed == 1
        second = t0 + 1 + dispatch.BACKOFF_SECONDS
        assert dispatch.tick(now=second).failed == 1
        third = second + 2 * dispatch.BACKOFF_SECONDS
        assert dispatch.tick(now=third).sent == 1
    assert len(receiver.requests) == 3

    [shown] = page_deliveries(effect_id)
    assert (shown.status, shown.attempts, shown.sent_at) == ("sent", 3, third)
    assert [(f["at"], f["status"]) for f in shown.failures] == [(t0 + 1, 500), (second, 500)]
    assert all(
        f["error"] == "the receiver answered 500 Internal Server Error" for f in shown.failures
    )


def test_a_delivery_given_up_lists_each_attempt(
    agent: Agent, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "MAX_ATTEMPTS", 3)
    receiver.fail_next = 99
    t = time.time()
    with configure(webhook(receiver)):
        dispatch.tick(now=t)
        effect_id = agent.pending()
        for _ in range(5):
            t += 3600
            dispatch.tick(now=t)
    [shown] = page_deliveries(effect_id)
    assert (shown.status, shown.attempts, len(shown.failures)) == ("failed", 3, 3)
    assert len(receiver.requests) == 3


# -- the digest ----------------------------------------------------------------------------


def test_a_burst_of_110_waiting_effects_is_one_message_per_channel(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    start = interval_start()
    hook = webhook(receiver, digest="5m")
    slack = {"name": "slack", "kind": "slack", "url": receiver.url + "/slack", "digest": 300}
    with configure(hook, slack):
        dispatch.tick(now=start + 1)
        ids = refunds(agent, 110)
        report = dispatch.tick(now=start + 2)
        assert (report.owed, report.sent) == (220, 0)  # owed, each waiting for its digest
        assert dispatch.tick(now=start + 200).sent == 0  # still this interval: nothing
        assert receiver.requests == []

        assert dispatch.tick(now=start + INTERVAL + 1).sent == 2  # the next: one each
        for later in (start + INTERVAL + 2, start + INTERVAL + 250, start + 3 * INTERVAL):
            assert dispatch.tick(now=later).sent == 0

    by_path = {r["path"]: r for r in receiver.requests}
    assert len(receiver.requests) == 2 and set(by_path) == {"/hook", "/slack"}
    hooked = by_path["/hook"]
    assert verify(hooked)  # signed as a single message is
    body = json.loads(hooked["body"])
    [digest] = Digest.objects.filter(channel="hook")
    assert hooked["headers"]["openonce-delivery"] == f"digest-{digest.id}"
    assert (body["type"], body["count"], body["more"]) == ("digest", 110, 100)
    first = body["effects"][0]
    assert first["effect_id"] == ids[0] and first["tool"] == "stripe.refund"
    assert first["amount"] == "12.50 USD"
    assert first["link"] == f"https://console.test/effects/{ids[0]}/"
    assert [e["effect_id"] for e in body["effects"]] == ids[: dispatch.DIGEST_LISTED]
    assert body["link"] == "https://console.test/"

    text = json.loads(by_path["/slack"]["body"])["text"]
    assert text.startswith("*110 effects wait for a person*")
    assert "and 100 more: <https://console.test/|Open the queue>" in text
    assert f"<https://console.test/effects/{ids[1]}/|{ids[1]}>" in text

    assert set(Delivery.objects.values_list("status", flat=True)) == {"sent"}
    [shown] = page_deliveries(ids[-1])[:1]
    assert (shown.status, shown.in_digest) == ("sent", 110)


def test_without_a_digest_each_event_is_its_own_message(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    with configure(webhook(receiver)):
        dispatch.tick()
        refunds(agent, 3)
        dispatch.tick()
    assert len(receiver.requests) == 3
    assert {receiver.json(i)["type"] for i in range(3)} == {"effect.requires_approval"}


def test_what_arrives_during_an_interval_waits_for_the_next(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    start = interval_start()
    with configure(webhook(receiver, digest=INTERVAL)):
        dispatch.tick(now=start + 1)
        refunds(agent, 2)
        dispatch.tick(now=start + 2)
        assert dispatch.tick(now=start + INTERVAL + 1).sent == 1  # the two
        late = agent.pending(charge="ch_late", amount=1)
        dispatch.tick(now=start + INTERVAL + 5)  # owed in this interval: it waits
        [shown] = page_deliveries(late)
        assert (shown.status, shown.digest_waiting) == ("pending", True)
        assert dispatch.tick(now=start + 2 * INTERVAL + 1).sent == 1  # the late one
    assert [receiver.json(i)["count"] for i in range(2)] == [2, 1]
    assert receiver.json(1)["effects"][0]["effect_id"] == late


def test_turning_a_digest_off_sends_what_waited_one_by_one(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    start = interval_start()
    with configure(webhook(receiver, digest="5m")):
        dispatch.tick(now=start + 1)
        ids = refunds(agent, 3)
        dispatch.tick(now=start + 2)
    assert receiver.requests == []
    with configure(webhook(receiver)):  # the operator takes the digest out
        assert dispatch.tick(now=start + 3).sent == 3
    assert sorted(receiver.json(i)["effect_id"] for i in range(3)) == sorted(ids)
    assert Digest.objects.count() == 0


def test_what_waited_for_a_removed_channels_digest_is_given_up_on_the_page(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    start = interval_start()
    other = {"name": "other", "kind": "slack", "url": receiver.url + "/other"}
    with configure(webhook(receiver, digest="5m"), other):
        dispatch.tick(now=start + 1)
        effect_id = agent.pending()
        dispatch.tick(now=start + 2)
    with configure(other):  # the digest's channel is removed
        dispatch.tick(now=start + 3)
    [hook, slack] = page_deliveries(effect_id)
    assert (hook.channel, hook.status, hook.last_error) == (
        "hook",
        "failed",
        "the channel is no longer configured",
    )
    assert [f["error"] for f in hook.failures] == ["the channel is no longer configured"]
    assert (slack.channel, slack.status) == ("other", "sent")
    assert [r["path"] for r in receiver.requests] == ["/other"]


def test_two_notifiers_racing_for_one_interval_send_one_digest(
    agent: Agent, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two beats (or workers) tick at the same moment: both see the burst waiting, both
    try to claim the interval; the database lets one. A gate holds each at the start of
    its claim until the other has arrived, so both race for real."""
    start = interval_start()
    gate = threading.Barrier(2, timeout=30)

    class Gated:
        @staticmethod
        def atomic(*args: Any, **kwargs: Any) -> Any:
            gate.wait()
            return transaction.atomic(*args, **kwargs)

    reports: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def notifier() -> None:
        try:
            reports.append(dispatch.deliver(now=start + INTERVAL + 1))
        except BaseException as exc:  # shown by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    with configure(webhook(receiver, digest="5m")):
        dispatch.tick(now=start + 1)
        refunds(agent, 110)
        dispatch.scan(now=start + 2)
        monkeypatch.setattr(dispatch, "transaction", Gated)
        threads = [threading.Thread(target=notifier) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert sorted(sent for sent, _ in reports) == [0, 1]
    assert len(receiver.requests) == 1
    assert receiver.json(0)["count"] == 110
    assert Digest.objects.count() == 1
    assert set(Delivery.objects.values_list("status", flat=True)) == {"sent"}


def test_a_digest_that_fails_is_retried_and_its_failures_listed(
    agent: Agent, receiver: WebhookReceiver
) -> None:
    start = interval_start()
    receiver.fail_next = 1
    with configure(webhook(receiver, digest="5m")):
        dispatch.tick(now=start + 1)
        ids = refunds(agent, 12)
        dispatch.tick(now=start + 2)
        failed_at = start + INTERVAL + 1
        assert dispatch.tick(now=failed_at).failed == 1
        [digest] = Digest.objects.all()
        assert (digest.status, digest.attempts) == ("pending", 1)
        [shown] = page_deliveries(ids[3])
        assert (shown.status, shown.attempts, shown.in_digest) == ("pending", 1, 12)
        assert [(f["at"], f["status"]) for f in shown.failures] == [(failed_at, 500)]
        assert "next try" not in shown.last_error  # the page adds that itself
        assert dispatch.tick(now=failed_at + 1).sent == 0  # not due yet
        assert dispatch.tick(now=digest.next_attempt_at).sent == 1
        dispatch.tick(now=start + 2 * INTERVAL + 1)  # nothing is sent twice
    assert len(receiver.requests) == 2
    assert {r["headers"]["openonce-delivery"] for r in receiver.requests} == {f"digest-{digest.id}"}
    assert all(verify(r) for r in receiver.requests)
    assert receiver.json(0) == receiver.json(1)  # the same message, sent again
    [shown] = page_deliveries(ids[3])
    assert (shown.status, shown.attempts) == ("sent", 2)
    assert [(f["at"], f["status"]) for f in shown.failures] == [(failed_at, 500)]
    row = Delivery.objects.get(effect_id=ids[3])
    assert (row.status, row.attempts, len(row.failures)) == ("sent", 2, 1)  # for the archive


def test_a_digest_goes_by_mail_too(agent: Agent) -> None:
    from django.core import mail

    start = interval_start()
    mailers = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
    chan = {"name": "mail", "kind": "email", "to": ["oncall@example.com"], "digest": "1m"}
    with override_settings(MAILERS=mailers), configure(chan):
        dispatch.tick(now=start + 1)
        ids = refunds(agent, 13)
        dispatch.tick(now=start + 2)
        assert dispatch.tick(now=start + INTERVAL + 1).sent == 1
    [message] = mail.outbox
    assert message.subject == "[OpenOnce] 13 effects wait for a person"
    assert f"* stripe.refund 12.50 USD: https://console.test/effects/{ids[0]}/" in message.body
    assert "and 3 more." in message.body


@pytest.mark.parametrize(
    ("given", "seconds"), [("5m", 300.0), ("90s", 90.0), ("1h", 3600.0), ("45", 45.0), (30, 30.0)]
)
def test_a_digest_interval_is_seconds_or_a_duration(given: Any, seconds: float) -> None:
    doc = json.dumps([{"name": "m", "kind": "email", "to": ["a@example.com"], "digest": given}])
    with override_settings(OPENONCE_NOTIFY=doc):
        [channel] = channels()
    assert channel.digest == seconds


@pytest.mark.parametrize("given", ["soon", "0", -5, "2d", True, "", 90000, "nan"])
def test_a_bad_digest_interval_stops_the_notifier_with_its_name(given: Any) -> None:
    doc = json.dumps([{"name": "m", "kind": "email", "to": ["a@example.com"], "digest": given}])
    with (
        override_settings(OPENONCE_NOTIFY=doc),
        pytest.raises(ImproperlyConfigured, match=r"OPENONCE_NOTIFY\[0\]\.digest"),
    ):
        channels()


# -- the demo runs the notifier ------------------------------------------------------------


def test_the_demo_runs_the_notifier_to_a_receiver_on_this_machine() -> None:
    from examples import demo

    assert demo.processes(8000)["notifier"][1:] == ["manage.py", "notify", "--watch"]
    inbox = demo.Inbox(secrets.token_hex(16))
    try:
        env = demo.notify_env(inbox.url, inbox.secret, 8000)
        assert env["OPENONCE_CONSOLE_URL"] == "http://127.0.0.1:8000"
        # Valid as the notifier reads it, with private addresses refused by default.
        with override_settings(
            OPENONCE_NOTIFY=env["OPENONCE_NOTIFY"], OPENONCE_NOTIFY_ALLOW_PRIVATE=False
        ):
            [channel] = channels()
        assert channel.url.startswith(inbox.url) and channel.allow_private
        message = senders.Message(
            delivery_id=1, effect_id="eff_x", tool="stripe.refund", event="requires_approval",
            reason="", link="http://127.0.0.1:8000/effects/eff_x/", at=0.0, journal_seq=1,
        )  # fmt: skip
        assert senders.send(channel, message, time.time()).ok
        forged = channel.__class__(**{**channel.__dict__, "secret": "x" * 32})
        assert senders.send(forged, message, time.time()).status == 401
    finally:
        inbox.close()
    assert [m["effect_id"] for m in inbox.received] == ["eff_x"]  # the forged one refused


@pytest.mark.slow
def test_make_demo_announces_the_refund_and_the_review(tmp_path: Path) -> None:
    env = {**os.environ, "OPENONCE_DEMO_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("OPENONCE_DATABASE", None)
    run = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--no-serve"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    told = [line for line in run.stdout.splitlines() if line.startswith("== notification")]
    assert len(told) == 2, run.stdout
    assert "stripe.refund waits for approval: http://127.0.0.1:8000/effects/eff_" in told[0]
    assert "email.send needs a person" in told[1]
