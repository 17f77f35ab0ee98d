"""The daily ``openonce.retention`` task (reconciler/retention.py) on the pytest-django
test database: the ledger's retention from settings, the notifier's deliveries kept in the
archive and deleted, expired console sessions cleared; off unless OPENONCE_RETENTION_DAYS
is set."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from openonce_core import OpenOnce
from openonce_core.errors import EffectArchivedError
from tests.support.retention import empty_ledger, old_and_new_refunds

_OPEN: list[OpenOnce] = []  # the tests' own clients, closed after each test


@pytest.fixture
def ledger(transactional_db, settings, tmp_path) -> Iterator[str]:
    """The test database's ledger, emptied; archives under the test's own folder."""
    from ledger import clients as site_ledger

    site_ledger.reset()
    settings.OPENONCE_RETENTION_ARCHIVE_DIR = tmp_path / "archive"
    target = site_ledger.ledger_target()
    empty_ledger(target)
    yield target
    for oo in _OPEN:
        oo.close()
    _OPEN.clear()
    site_ledger.reset()


def _refunds(ledger: str) -> tuple[Any, dict[str, str]]:
    """o-1 and o-2 ended 100 days ago; o-new just now. Returns the call and their ids."""
    made = old_and_new_refunds(ledger, migrate=False)
    _OPEN.append(made.oo)
    made.refund.calls = made.calls
    return made.refund, made.ids()


def _delivery(effect_id: str, seq: int, **more: Any) -> Any:
    from notifications.models import Delivery

    return Delivery.objects.create(
        effect_id=effect_id, journal_seq=seq, event="requires_approval", tool="stripe.refund",
        channel="ops", kind="webhook", destination="https://hooks.example.com/…",
        status="sent", attempts=1, next_attempt_at=0.0, created_at=1.0, sent_at=2.0, **more,
    )  # fmt: skip


def _sessions() -> tuple[str, str]:
    """An expired console session and a live one."""
    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session

    expired, live = SessionStore(), SessionStore()
    expired.create()
    live.create()
    Session.objects.filter(session_key=expired.session_key).update(
        expire_date=timezone.now() - timedelta(days=1)
    )
    return str(expired.session_key), str(live.session_key)


def test_the_task_archives_old_effects_with_their_deliveries(ledger, settings) -> None:
    from django.contrib.sessions.models import Session

    from notifications.models import Delivery
    from reconciler.retention import retention

    settings.OPENONCE_RETENTION_DAYS = 90
    refund, ids = _refunds(ledger)
    _delivery(ids["o-1"], 1)
    _delivery(ids["o-new"], 2)
    expired, live = _sessions()

    retention.apply()

    (path,) = (settings.OPENONCE_RETENTION_ARCHIVE_DIR).iterdir()
    with gzip.open(path, "rt") as f:
        lines = {json.loads(line)["effect"]["args"]["order"]: json.loads(line) for line in f}
    assert sorted(lines) == ["o-1", "o-2"]
    (kept,) = lines["o-1"]["deliveries"]
    assert (kept["channel"], kept["status"], kept["journal_seq"]) == ("ops", "sent", 1)
    assert lines["o-2"]["deliveries"] == []
    assert list(Delivery.objects.values_list("effect_id", flat=True)) == [ids["o-new"]]
    assert list(Session.objects.values_list("session_key", flat=True)) == [live]
    assert expired != live

    with pytest.raises(EffectArchivedError) as info:
        refund("o-1")
    assert info.value.effect_id == ids["o-1"] and info.value.archive == str(path)
    assert refund("o-new") == "re_o-new"  # replayed
    assert refund.calls == ["o-1", "o-2", "o-new"]


def test_the_task_is_off_by_default_and_still_clears_sessions(ledger, settings) -> None:
    from django.contrib.sessions.models import Session

    from reconciler.retention import retention

    assert settings.OPENONCE_RETENTION_DAYS == 0
    _, ids = _refunds(ledger)
    _, live = _sessions()

    retention.apply()

    assert not settings.OPENONCE_RETENTION_ARCHIVE_DIR.exists()
    from ledger.models import Effect

    assert Effect.objects.filter(id__in=ids.values()).count() == 3
    assert list(Session.objects.values_list("session_key", flat=True)) == [live]


def test_a_run_that_stops_at_its_limit_queues_the_rest(ledger, settings, monkeypatch) -> None:
    import reconciler.retention as task_module

    settings.OPENONCE_RETENTION_DAYS = 90
    settings.OPENONCE_RETENTION_BATCH = 1
    settings.CELERY_TASK_SOFT_TIME_LIMIT = 1e-9  # every run stops after its first batch
    _, ids = _refunds(ledger)
    queued: list[dict[str, Any]] = []
    monkeypatch.setattr(task_module.retention, "apply_async", lambda **kw: queued.append(kw))

    task_module.retention.apply()  # one batch (o-1), then out of time: the rest queued
    assert len(queued) == 1
    task_module.retention.apply()  # the queued run: o-2, and nothing left to queue
    assert len(queued) == 1

    from ledger.models import Effect

    assert list(Effect.objects.values_list("id", flat=True)) == [ids["o-new"]]


def _digest(window: int, created_at: float, status: str = "sent") -> Any:
    from notifications.models import Digest

    return Digest.objects.create(
        channel="ops", kind="webhook", destination="https://hooks.example.com/…",
        status=status, window=window, interval=300.0, count=1, attempts=1,
        next_attempt_at=created_at, created_at=created_at, sent_at=created_at + 1,
    )  # fmt: skip


def test_the_task_deletes_old_digests_that_no_delivery_names(ledger, settings) -> None:
    """A digest is one message about deliveries: once they are archived it tells nothing.
    One still sending, one a kept delivery names, and a young one stay."""
    import time

    from notifications.models import Digest
    from reconciler.retention import retention

    settings.OPENONCE_RETENTION_DAYS = 90
    _, ids = _refunds(ledger)
    old = time.time() - 100 * 86400
    gone = [_digest(1, old), _digest(2, old, status="failed")]
    archived_with_its_effect = _digest(3, old)
    _delivery(ids["o-1"], 1, digest=archived_with_its_effect)
    sending = _digest(4, old, status="pending")
    named = _digest(5, old)
    live = _delivery(ids["o-new"], 2, digest=named)
    young = _digest(6, time.time() - 3600)

    retention.apply()

    left = set(Digest.objects.values_list("pk", flat=True))
    assert left == {sending.pk, named.pk, young.pk}
    assert not left & {d.pk for d in [*gone, archived_with_its_effect]}
    live.refresh_from_db()
    assert live.digest_id == named.pk


def test_the_task_is_declared_once_in_the_beat_schedule(settings) -> None:
    from celery import current_app

    import reconciler.retention  # noqa: F401  (tasks.py imports it in the daemon)

    entries = [
        e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "openonce.retention"
    ]
    assert len(entries) == 1
    assert "openonce.retention" in current_app.tasks
