"""The reconciler's envelope in-process, on the pytest-django test database: the per-batch
deadline, poison-message quarantine, failing probers and start-up grace on health, the
Celery configuration, and /livez, /readyz, /metrics (scraped and checked against the
ledger) and JSON logs.

The worker-and-beat versions of these run in test_daemon_providers.py."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from openonce_core import OpenOnce
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._records import Effect
from openonce_core.errors import ProbeCredentialError, ProbeTransientError
from tests.support.daemon import make_unknown, manage

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger(transactional_db, settings) -> Iterator[str]:
    """The test database's ledger, emptied; the reconciler wired to the test probers."""
    from django.db import connection

    from ledger import clients as site_ledger
    from reconciler import probes

    site_ledger.reset()
    probes.flush_discard()
    settings.OPENONCE_PROBERS = "tests.support.probers:PROBERS"
    settings.OPENONCE_GRACE_SECONDS = 0.0
    settings.OPENONCE_SWEEP_INTERVAL = 1.0
    target = site_ledger.ledger_target()
    assert connection.vendor == "postgresql"
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("TRUNCATE openonce_effects, openonce_journal, openonce_approvals")
    yield target
    site_ledger.reset()
    probes.flush_discard()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ClockedProber:
    """Each probe 'takes' ``seconds`` on the test's clock; every effect happened."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.probed: list[str] = []

    def probe(self, effect: Effect) -> ProbeResult:
        self.probed.append(effect.id)
        self.clock.now += self.seconds
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_" + effect.id},
            detail="found", provider_reference=effect.provider_key,
        )  # fmt: skip


def states(target: str, ids: list[str]) -> dict[str, str]:
    oo = OpenOnce(target, migrate=False)
    try:
        return {e.id: str(e.state) for e in oo.store.get_many(ids)}
    finally:
        oo.close()


def journal_lengths(target: str, ids: list[str]) -> dict[str, int]:
    oo = OpenOnce(target, migrate=False)
    try:
        return {i: len(oo.journal(i)) for i in ids}
    finally:
        oo.close()


# -- the per-batch deadline ---------------------------------------------------------------


def test_a_batch_stops_before_its_deadline_and_hands_the_rest_back(ledger, settings) -> None:
    from reconciler.models import Sweep
    from reconciler.sweep import run_batch

    clock = Clock()
    prober = ClockedProber(clock, seconds=1.0)  # every probe uses its whole timeout
    settings.OPENONCE_PROBERS = {"stripe.charge": prober}
    settings.OPENONCE_PROBE_TIMEOUT = 1.0  # budget per effect: 1.5 s
    ids = list(make_unknown(ledger, [f"paid-{n}" for n in range(10)]).values())
    before = journal_lengths(ledger, ids)
    sweep = Sweep.objects.create(source="beat", started_at=timezone.now(), batches=1)
    handed_back: list[list[str]] = []

    report = run_batch(
        ids, sweep.pk, "task-1", deadline=clock() + 5.0, on_leftover=handed_back.append,
        clock=clock,
    )  # fmt: skip

    # 5 s of deadline at 1.5 s per effect: 3 effects (3 s used), then 1 more (2 s left),
    # then none fits in the last second: stop, with 6 handed back untouched.
    assert prober.probed == ids[:4]
    assert sorted(report.committed) == sorted(ids[:4])
    assert handed_back == [ids[4:]]
    after = states(ledger, ids)
    assert {after[i] for i in ids[:4]} == {"committed"}
    assert {after[i] for i in ids[4:]} == {"unknown"}
    assert journal_lengths(ledger, ids[4:]) == {i: before[i] for i in ids[4:]}
    sweep.refresh_from_db()
    # The continuation counts as one more batch of the sweep, so it is not finished yet.
    assert (sweep.batches, sweep.batches_done, sweep.committed) == (2, 1, 4)
    assert sweep.finished_at is None


def test_without_a_deadline_the_whole_batch_runs(ledger, settings) -> None:
    from reconciler.sweep import run_batch

    clock = Clock()
    settings.OPENONCE_PROBERS = {"stripe.charge": ClockedProber(clock, seconds=100.0)}
    ids = list(make_unknown(ledger, [f"paid-{n}" for n in range(3)]).values())
    report = run_batch(ids, None, clock=clock)
    assert sorted(report.committed) == sorted(ids)


def test_soft_time_limit_propagates_out_of_a_batch(ledger, monkeypatch) -> None:
    from ledger.clients import get_reconciler
    from reconciler.sweep import run_batch

    ids = list(make_unknown(ledger, ["paid-soft"]).values())

    def hit_the_limit(*args: Any, **kwargs: Any) -> Any:
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(get_reconciler(), "reconcile_ids", hit_the_limit)
    with pytest.raises(SoftTimeLimitExceeded):
        run_batch(ids, None, "task-soft", deadline=time.monotonic() + 100)
    assert states(ledger, ids) == {ids[0]: "unknown"}


def test_a_probe_timeout_that_leaves_no_room_in_the_soft_limit_stops_start_up(tmp_path) -> None:
    from tests.support.daemon import daemon_env

    env = daemon_env(
        str(tmp_path / "l.db"), OPENONCE_PROBE_TIMEOUT="30", OPENONCE_TASK_SOFT_TIME_LIMIT="20",
        OPENONCE_TASK_TIME_LIMIT="25",
    )  # fmt: skip
    done = manage(env, "check")
    assert done.returncode != 0
    assert "OPENONCE_PROBE_TIMEOUT=30 leaves a batch no room" in done.stderr
    bad = manage({**env, "OPENONCE_PROBE_TIMEOUT": "1", "OPENONCE_TASK_TIME_LIMIT": "10"}, "check")
    assert "must be below OPENONCE_TASK_TIME_LIMIT" in bad.stderr


# -- the Celery configuration -------------------------------------------------------------


def test_celery_envelope_settings() -> None:
    import psycopg as pg

    from openonce_site.celery import app
    from reconciler.tasks import reconcile_batch

    conf = app.conf
    assert {q.name for q in conf.task_queues} == {
        "openonce.tick",
        "openonce.notify",
        "openonce.batches",
    }
    assert app.amqp.router.route({}, "openonce.tick")["queue"].name == "openonce.tick"
    assert app.amqp.router.route({}, "openonce.notify")["queue"].name == "openonce.notify"
    assert app.amqp.router.route({}, "openonce.reconcile_batch")["queue"].name == (
        "openonce.batches"
    )
    assert conf.worker_send_task_events is True and conf.task_send_sent_event is True
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.task_soft_time_limit < conf.task_time_limit < 3600
    # The core's database errors are retried, not only Django's.
    retried = reconcile_batch.autoretry_for
    for error in (pg.OperationalError("x"), pg.InterfaceError("x"), OSError("x")):
        assert isinstance(error, retried)
    assert not isinstance(ProbeTransientError("stripe", "429"), retried)


# -- poison messages ------------------------------------------------------------------------


def test_a_message_that_keeps_killing_workers_is_split_then_quarantined(ledger, settings) -> None:
    from reconciler import deliveries
    from reconciler.health import reconciler_health
    from reconciler.sweep import sweep

    settings.OPENONCE_TASK_MAX_DELIVERIES = 2
    # The sweep's dispatch claim on a held effect lapses at once here (60 s in production),
    # so the sweep after the release can hand it out again without waiting.
    settings.OPENONCE_DISPATCH_TTL = 0.0
    ids = list(make_unknown(ledger, ["odd-poison", "paid-fine"]).values())
    # A delivery that finishes clears its count: a task can run any number of times.
    for _ in range(5):
        assert deliveries.begin("batch-ok", "openonce.reconcile_batch", ids, 0)
        deliveries.finish("batch-ok")
    # Deliveries that never finish are workers that died with the message.
    assert deliveries.begin("batch-1", "openonce.reconcile_batch", ids, 0)
    assert deliveries.begin("batch-1", "openonce.reconcile_batch", ids, 0)
    # A Celery retry of the task (the database was down) is a new attempt, not a death.
    assert deliveries.begin("batch-1", "openonce.reconcile_batch", ids, 1)
    assert deliveries.begin("batch-1", "openonce.reconcile_batch", ids, 1)
    assert not deliveries.begin("batch-1", "openonce.reconcile_batch", ids, 1)
    # A quarantined batch of several effects is split in the same commit: never held
    # against health, not even between the quarantine and the split messages going out.
    assert deliveries.quarantined() == []
    # The single-effect message that kills its worker stays quarantined.
    poison = [ids[0]]
    for _ in range(2):
        assert deliveries.begin("single-1", "openonce.reconcile_batch", poison, 0)
    assert not deliveries.begin("single-1", "openonce.reconcile_batch", poison, 0)
    assert not deliveries.begin("single-1", "openonce.reconcile_batch", poison, 0)

    health = reconciler_health()
    assert not health.healthy
    assert any(
        "message single-1 (effects " + ids[0] + ") killed its worker 2 times" in r
        and "reconciler_quarantine --release single-1" in r
        for r in health.reasons
    ), health.reasons
    assert health.quarantined[0]["task_id"] == "single-1"
    # The sweep no longer hands the poison effect out; the other one is resolved.
    record = sweep("once")
    assert record.due == 1
    assert states(ledger, ids) == {ids[0]: "unknown", ids[1]: "committed"}

    listed = manage_in_process("reconciler_quarantine")
    assert "single-1" in listed and ids[0] in listed
    assert "not quarantined: nope" in manage_in_process(
        "reconciler_quarantine", "--release", "nope"
    )
    assert deliveries.quarantined() != []  # a bad release changed nothing
    released = manage_in_process("reconciler_quarantine", "--release", "single-1")
    assert "released 1 message" in released
    assert deliveries.quarantined() == [] and reconciler_health().quarantined == []
    assert sweep("once").due == 1  # handed out again (and escalated: "odd" is inconclusive)
    assert states(ledger, ids)[ids[0]] == "human_review"


def manage_in_process(*args: str) -> str:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = io.StringIO()
    try:
        call_command(*args, stdout=out)
    except CommandError as exc:
        return str(exc)
    return out.getvalue()


# -- failing probers and start-up grace on health --------------------------------------------


class Refused:
    provider = "stripe"

    def __init__(self) -> None:
        self.refuse = True

    def probe(self, effect: Effect) -> ProbeResult:
        if self.refuse:
            raise ProbeCredentialError(
                "stripe", "Stripe answered HTTP 401: Invalid API Key", status=401
            )
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_ok"}, detail="found",
            provider_reference=effect.provider_key,
        )  # fmt: skip


def test_a_prober_refused_on_credentials_turns_health_red_until_it_answers(
    ledger, settings
) -> None:
    from ledger import clients as site_ledger
    from reconciler.health import reconciler_health
    from reconciler.sweep import sweep

    prober = Refused()
    settings.OPENONCE_PROBERS = {"stripe.charge": prober}
    settings.OPENONCE_PROBE_RETRIES = 5
    settings.OPENONCE_PROBE_RETRY_BACKOFF = 0.0
    site_ledger.reset()
    ids = list(make_unknown(ledger, ["paid-a", "paid-b"]).values())
    sweep("once")
    health = reconciler_health()
    assert not health.healthy
    [reason] = [r for r in health.reasons if "prober failing" in r]
    assert reason.startswith("stripe prober failing since ")
    assert "HTTP 401: Invalid API Key" in reason
    assert health.probers[0]["provider"] == "stripe" and health.probers[0]["failing"]
    assert health.probers[0]["tools"] == ["stripe.charge"]
    assert set(states(ledger, ids).values()) == {"unknown"}  # waiting, not with a person

    prober.refuse = False  # the key was fixed
    sweep("once")
    health = reconciler_health()
    assert health.healthy, health.reasons
    assert health.probers[0]["failing"] is False and health.probers[0]["reason"] == ""
    assert set(states(ledger, ids).values()) == {"committed"}


def test_start_up_grace_then_red_when_no_sweep_follows(ledger, settings) -> None:
    from reconciler.health import reconciler_health
    from reconciler.models import DaemonStart, Sweep
    from reconciler.tasks import record_start

    settings.OPENONCE_HEALTH_STARTUP_GRACE = 30.0
    now = timezone.now()
    assert reconciler_health(at=now).reasons == ["no sweep has run yet"]
    record_start("beat")
    start = DaemonStart.objects.get()
    fresh = reconciler_health(at=start.started_at + timedelta(seconds=5))
    assert fresh.healthy and fresh.reasons == []
    assert fresh.notes == ["beat started 5s ago; no sweep since yet (start-up grace 30s)"]
    late = reconciler_health(at=start.started_at + timedelta(seconds=31))
    assert late.reasons == ["no sweep has run yet"]

    # A restart after a long stop: the old sweep does not make the new start red...
    old = start.started_at - timedelta(hours=2)
    Sweep.objects.create(source="beat", started_at=old, finished_at=old)
    assert reconciler_health(at=start.started_at + timedelta(seconds=5)).healthy
    # ...until the grace is over with still no sweep.
    stale = reconciler_health(at=start.started_at + timedelta(seconds=40))
    assert not stale.healthy and "beat or workers stopped" in stale.reasons[0]


def test_health_json_names_probers_quarantine_and_start(ledger, client, settings) -> None:
    from reconciler.tasks import record_start

    settings.OPENONCE_HEALTH_TOKEN = "t" * 20
    record_start("beat")
    body = client.get("/health/", HTTP_AUTHORIZATION="Bearer " + "t" * 20).json()
    assert body["healthy"] is True and body["started_at"] is not None
    assert body["probers"] == [] and body["quarantined"] == []


# -- /livez, /readyz -------------------------------------------------------------------------


def test_livez_and_readyz(ledger, client, monkeypatch) -> None:
    from ledger.clients import get_openonce
    from openonce_core._schema import SCHEMA_VERSION

    live = client.get("/livez")
    assert (live.status_code, live.json()) == (200, {"alive": True})
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json()
    checks = ready.json()["checks"]
    assert checks["database"] == "ok" and checks["migrations"] == "ok"
    assert checks["ledger_schema"].startswith("ok (version ")

    store = get_openonce().store
    monkeypatch.setattr(store, "schema_version", lambda: 0)
    old = client.get("/readyz")
    assert old.status_code == 503 and old.json()["ready"] is False
    assert "run manage.py migrate" in old.json()["checks"]["ledger_schema"]
    # A newer release migrated the ledger: ready while it says this code may use it.
    monkeypatch.setattr(store, "schema_version", lambda: SCHEMA_VERSION + 1)
    monkeypatch.setattr(store, "schema_readable_from", lambda: SCHEMA_VERSION)
    newer = client.get("/readyz")
    assert newer.status_code == 200, newer.json()
    assert "which can still use it" in newer.json()["checks"]["ledger_schema"]
    monkeypatch.setattr(store, "schema_readable_from", lambda: SCHEMA_VERSION + 1)
    beyond = client.get("/readyz")
    assert beyond.status_code == 503
    said = beyond.json()["checks"]["ledger_schema"]
    assert "deploy the newer release" in said and "run manage.py migrate" not in said
    assert client.get("/livez").status_code == 200  # alive all the same
    assert client.post("/readyz").status_code == 405


# -- /metrics --------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
        assert match, line
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def test_metrics_match_the_ledger(ledger, client, settings) -> None:
    from reconciler.sweep import sweep

    ids = make_unknown(ledger, ["paid-1", "paid-2", "lost-1", "odd-1", "odd-2"])
    oo = OpenOnce(ledger, migrate=False)

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge: charge)
    def refund(charge: str) -> dict[str, str]:
        return {"stripe_id": "re_1"}

    gated = OpenOnce(
        ledger, migrate=False,
        policy=__import__("openonce_core").require_approval_for(["stripe.refund"]),
    )  # fmt: skip
    try:
        gated_refund = gated.effect(tool="stripe.refund", idempotency_key=lambda c: c)(
            lambda c: {"stripe_id": "re_2"}
        )
        with pytest.raises(Exception, match="needs approval"):
            gated_refund("ch_wait")
        sweep("once")
        counts = oo.store.count_by_state()
        oldest_approval = oo.store.oldest_change("requires_approval")
    finally:
        oo.close()
        gated.close()

    page = client.get("/metrics")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/plain")
    m = parse_metrics(page.content.decode())

    for state in ("committed", "planned", "human_review", "requires_approval", "unknown"):
        assert m[("openonce_effects", (("state", state),))] == counts.get(state, 0)
    assert counts["committed"] == 2 and counts["human_review"] == 2
    assert m[("openonce_human_queue", (("kind", "human_review"),))] == 2
    assert m[("openonce_human_queue", (("kind", "requires_approval"),))] == 1
    assert m[("openonce_human_queue", (("kind", "unknown_past_grace"),))] == 0
    assert m[("openonce_oldest_unknown_age_seconds", ())] == 0
    assert m[("openonce_approval_oldest_wait_seconds", ())] == pytest.approx(
        time.time() - oldest_approval, abs=5
    )
    probes = {
        dict(labels)["outcome"]: value
        for (name, labels), value in m.items()
        if name == "openonce_probes_total"
    }
    assert probes == {"happened": 2, "not_happened": 1, "inconclusive": 2}
    key = (("outcome", "happened"), ("status", "ok"), ("tool", "stripe.charge"))
    assert m[("openonce_probe_duration_seconds_count", key)] == 2
    assert m[("openonce_probe_duration_seconds_bucket", (("le", "+Inf"), *key))] == 2
    assert m[("openonce_sweep_due", ())] == len(ids)
    assert m[("openonce_sweep_age_seconds", ())] < 60
    assert m[("openonce_quarantined_messages", ())] == 0

    settings.OPENONCE_METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    authed = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert authed.status_code == 200


def test_every_metric_the_alert_rules_use_is_exported(ledger, client) -> None:
    rules = yaml.safe_load((REPO / "deploy/prometheus/openonce-alerts.yml").read_text())
    text = client.get("/metrics").content.decode()
    declared = re.findall(r"^# TYPE (\w+) (\w+)$", text, flags=re.M)
    exported = set()
    for name, kind in declared:  # what a family exports even before it has samples
        exported.add(name)
        if kind == "counter":
            exported.add(name.removesuffix("_total") + "_total")
        if kind == "histogram":
            exported |= {name + "_bucket", name + "_count", name + "_sum"}
    used = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"]
            used |= set(re.findall(r"\bopenonce_\w+", str(rule["expr"])))
    assert used and used <= exported, used - exported


# -- JSON logs --------------------------------------------------------------------------------


def test_json_log_lines_carry_the_effect_id(ledger, settings) -> None:
    from reconciler.logs import EffectIdFilter, JsonFormatter
    from reconciler.sweep import sweep

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(EffectIdFilter())

    class Chatty:
        def probe(self, effect: Effect) -> ProbeResult:
            logging.getLogger("some.http.library").info("GET /v1/payment_intents/search")
            return ProbeResult(
                ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_1"}, detail="found",
                provider_reference=effect.provider_key,
            )  # fmt: skip

    settings.OPENONCE_PROBERS = {"stripe.charge": Chatty()}
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        [eid] = make_unknown(ledger, ["paid-log"]).values()
        sweep("once")
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    about = [line for line in lines if line.get("effect_id") == eid]
    messages = {line["logger"]: line["message"] for line in about}
    # The prober's own library line, the probe line and the decision, each with the id.
    assert messages["some.http.library"] == "GET /v1/payment_intents/search"
    assert messages["openonce.probe"].startswith(f"probe stripe.charge {eid}: happened (ok)")
    assert any(line["message"] == f"effect {eid} committed" for line in about)
    probe_line = next(line for line in about if line["logger"] == "openonce.probe")
    assert probe_line["outcome"] == "happened" and probe_line["tool"] == "stripe.charge"
    assert {"at", "level", "logger", "message"} <= set(probe_line)


def test_a_quarantined_delivery_still_reports_to_its_sweep(ledger, monkeypatch) -> None:
    from reconciler import tasks
    from reconciler.models import Sweep

    queued: list[list[str]] = []
    monkeypatch.setattr(tasks.reconcile_batch, "delay", lambda ids, sweep_id: queued.append(ids))
    split = Sweep.objects.create(source="beat", started_at=timezone.now(), batches=1)
    tasks._quarantine("batch-x", ["eff_a", "eff_b"], split.pk)
    split.refresh_from_db()
    # One batch reported (the quarantined one), two single-effect batches to come.
    assert (split.batches, split.batches_done, split.finished_at) == (3, 1, None)
    assert queued == [["eff_a"], ["eff_b"]]
    single = Sweep.objects.create(source="beat", started_at=timezone.now(), batches=1)
    tasks._quarantine("single-x", ["eff_a"], single.pk)
    single.refresh_from_db()
    assert (single.batches, single.batches_done) == (1, 1) and single.finished_at is not None
    assert queued == [["eff_a"], ["eff_b"]]  # a single effect is held, not requeued


# -- telemetry never costs a batch its report ------------------------------------------------


def test_two_workers_first_probes_of_a_provider_both_report_to_their_sweep(ledger) -> None:
    """Two workers probing a provider for the first time both find no ProberStatus row and
    both create it. The loser's create fails; that must not fail its batch (a retried batch
    finds its effects resolved and reports none of them), so its sweep still counts them."""
    from django.db.models.signals import pre_save

    from reconciler.models import ProberStatus
    from reconciler.sweep import sweep

    def other_worker_creates_it_first(sender: Any, instance: ProberStatus, **_: Any) -> None:
        if instance._state.adding:
            with psycopg.connect(ledger, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO reconciler_proberstatus (provider, failing, reason, tools)"
                    " VALUES (%s, false, '', '[]') ON CONFLICT DO NOTHING",
                    (instance.provider,),
                )

    ids = list(make_unknown(ledger, ["paid-a", "paid-b"]).values())
    pre_save.connect(other_worker_creates_it_first, sender=ProberStatus)
    try:
        record = sweep("once")
    finally:
        pre_save.disconnect(other_worker_creates_it_first, sender=ProberStatus)
    assert set(states(ledger, ids).values()) == {"committed"}
    assert record.committed == 2
    assert record.batches_done == record.batches and record.finished_at is not None
    [status] = ProberStatus.objects.all()
    assert status.last_success_at is not None and not status.failing


def test_a_batch_whose_tally_write_fails_still_reports_and_keeps_the_samples(
    ledger, monkeypatch, caplog
) -> None:
    from django.db import OperationalError

    from reconciler import probes
    from reconciler.models import ProbeTally
    from reconciler.sweep import sweep

    real_write = probes._write

    def ledger_went_away(samples: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    ids = list(make_unknown(ledger, ["paid-a", "paid-b"]).values())
    monkeypatch.setattr(probes, "_write", ledger_went_away)
    with caplog.at_level(logging.WARNING, logger="openonce.reconciler"):
        record = sweep("once")
    assert set(states(ledger, ids).values()) == {"committed"}
    assert record.committed == 2 and record.finished_at is not None
    assert "could not write probe tallies (kept for the next batch)" in caplog.text
    assert not ProbeTally.objects.exists()
    monkeypatch.setattr(probes, "_write", real_write)
    assert probes.flush() == 2  # the next batch's flush writes them
    assert sum(t.count for t in ProbeTally.objects.all()) == 2
