"""The daemon for real (Celery worker and beat subprocesses on Redis, a Postgres ledger)
against providers that misbehave: a Stripe-like server on a local socket
(tests/support/fake_stripe.py) probed by the real StripeProber and its HTTP client.

* a backlog of 1,000 UNKNOWN effects against a provider that allows 20 requests/s and
  answers 429 above it: drained, none to a person, the rate at the provider never above;
* a revoked key: health red naming the provider within two sweep intervals;
* a probe slower than the task's soft time limit: the batch stops cleanly before it and
  its effects are re-probed;
* a message that kills its worker: split, then quarantined, and shown on health;
* a 429 storm with Retry-After, and a revoked key: nobody is paged, everything commits
  once the provider answers again;
* task events on the broker.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from celery import Celery

from tests.daemon.test_daemon_integration import Daemon
from tests.daemon.test_daemon_integration import daemon as daemon  # the fixture
from tests.support.daemon import log, make_unknown, manage, wait_until
from tests.support.fake_stripe import FakeStripeServer

pytestmark = pytest.mark.slow


@pytest.fixture
def stripe() -> Iterator[FakeStripeServer]:
    with FakeStripeServer() as server:
        yield server  # type: ignore[misc]


def stripe_env(d: Daemon, stripe: FakeStripeServer, **extra: str) -> dict[str, str]:
    return d.env_with(
        OPENONCE_PROBERS="tests.support.provider_probers:PROBERS",
        OPENONCE_TEST_STRIPE_URL=stripe.url,
        OPENONCE_TEST_STRIPE_KEY="sk_test_good",
        **extra,
    )


def stamp_all(d: Daemon, stripe: FakeStripeServer, ids: list[str]) -> None:
    """The provider took every charge (the replies were lost): stamp them at the fake."""
    rows = d.ledger.conn.execute(
        "SELECT id, provider_key FROM openonce_effects WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    for effect_id, provider_key in rows:
        stripe.add("payment_intents", provider_key, effect_id=effect_id)


def count_states(d: Daemon, ids: list[str]) -> Counter[str]:
    return Counter(d.ledger.states(ids).values())


# -- a backlog under the provider's rate limit ----------------------------------------------


def test_a_thousand_unknown_effects_drain_under_a_20_per_second_limit(
    daemon: Daemon, stripe: FakeStripeServer
) -> None:
    stripe.rate_limit = 20  # 429 above 20 requests in any second
    t0 = time.monotonic()
    ids = list(make_unknown(daemon.dsn, [f"paid-{n}" for n in range(1000)]).values())
    stamp_all(daemon, stripe, ids)
    log(f"1000 UNKNOWN effects parked and stamped in {time.monotonic() - t0:.1f}s")
    # Two worker processes, each its share of the limit with a margin for the jitter of
    # requests in flight: 2 x 8/s.
    env = stripe_env(daemon, stripe, OPENONCE_TEST_STRIPE_RPS="8")
    daemon.worker("worker", env=env, concurrency=2, loglevel="warning")
    # A dedicated tick worker (README): sweeps go on while both batch processes are busy.
    daemon.worker("tick-worker", env=env, concurrency=1, loglevel="warning", queues="openonce.tick")
    daemon.beat("beat", env=env)
    started = time.monotonic()
    wait_until(
        lambda: not daemon.unresolved(ids), 240, "1000 effects resolved",
        interval=1.0, on_timeout=daemon.logs,
    )  # fmt: skip
    drained = time.monotonic() - started
    states = count_states(daemon, ids)
    requests = stripe.seen("/v1/payment_intents/search")
    peak = stripe.max_in_window(1.0)
    log(
        f"drained in {drained:.1f}s: {len(requests)} requests, peak {peak} in one second,"
        f" {len(requests) / drained:.1f}/s on average; statuses {stripe.statuses()}"
    )
    assert states == Counter({"committed": 1000})
    sweeps = [s for s in daemon.ledger.sweeps() if s["source"] == "beat"]
    log(f"{len(sweeps)} sweeps recorded during the {drained:.0f}s drain")
    assert len(sweeps) >= drained / 3  # ticks every second did not wait behind batches
    assert peak <= 20
    assert stripe.statuses().get(429, 0) == 0  # the client kept under the limit
    assert daemon.ledger.count_state("human_review") == 0


def test_429s_with_retry_after_send_nobody_to_a_person(
    daemon: Daemon, stripe: FakeStripeServer
) -> None:
    ids = list(make_unknown(daemon.dsn, [f"paid-{n}" for n in range(60)]).values())
    stamp_all(daemon, stripe, ids)
    # The workers share one limiter (Redis), so each 429 pauses them all for its 2 s:
    # 20 of them in a row hold probing for 40 s, as the provider asked.
    stripe.fail_next(429, count=20, headers={"Retry-After": "2"},
                     body={"error": {"message": "Too many requests"}})  # fmt: skip
    env = stripe_env(daemon, stripe, OPENONCE_TEST_STRIPE_RPS="9", OPENONCE_PROBE_RETRIES="2")
    daemon.worker("worker", env=env, concurrency=2, loglevel="warning")
    daemon.beat("beat", env=env)
    wait_until(lambda: not daemon.unresolved(ids), 120, "60 effects resolved after 429s",
               on_timeout=daemon.logs)  # fmt: skip
    assert count_states(daemon, ids) == Counter({"committed": 60})
    assert stripe.statuses().get(429, 0) >= 1


# -- a revoked key ------------------------------------------------------------------------


def prober_status(d: Daemon) -> dict[str, bool]:
    rows = d.ledger.conn.execute("SELECT provider, failing FROM reconciler_proberstatus")
    return dict(rows.fetchall())


def test_a_revoked_key_turns_health_red_within_two_intervals(
    daemon: Daemon, stripe: FakeStripeServer
) -> None:
    stripe.accept_keys("sk_test_rotated")  # the daemon's key was revoked
    ids = list(make_unknown(daemon.dsn, ["paid-k1", "paid-k2"]).values())
    stamp_all(daemon, stripe, ids)
    env = stripe_env(daemon, stripe, OPENONCE_SWEEP_INTERVAL="2")
    daemon.worker("worker", env=env, concurrency=1, loglevel="warning")
    daemon.beat("beat", env=env)
    wait_until(lambda: stripe.seen(), 60, "the first probe reaches Stripe", interval=0.1,
               on_timeout=daemon.logs)  # fmt: skip
    wait_until(lambda: prober_status(daemon).get("stripe"), 60,
               "health records the stripe prober failing", interval=0.1,
               on_timeout=daemon.logs)  # fmt: skip
    # Within two sweeps, counted in probes rather than seconds (a loaded machine runs the
    # sweeps late, it does not add probes): Stripe answered at most two sweeps' probes of
    # the two effects before the prober was marked failing. The fake stamps requests on
    # this host's monotonic clock; the status row on its wall clock.
    row = daemon.ledger.conn.execute(
        "SELECT since FROM reconciler_proberstatus WHERE provider = 'stripe'"
    ).fetchone()
    assert row is not None and row[0] is not None
    wall = time.time() - time.monotonic()
    before = [r for r in stripe.seen() if r.at + wall <= row[0].timestamp()]
    log(f"{len(before)} requests answered before the prober was marked failing")
    assert 1 <= len(before) <= 2 * len(ids), [(r.path, r.status) for r in stripe.seen()]
    health = manage(env, "reconciler_health", "--json")
    report = json.loads(health.stdout)
    assert health.returncode == 1 and report["healthy"] is False
    [reason] = [r for r in report["reasons"] if "prober failing" in r]
    assert reason.startswith("stripe prober failing") and "HTTP 401" in reason
    assert stripe.statuses()[401] >= 1

    stripe.accept_keys("sk_test_good")  # the key is fixed
    fresh = list(make_unknown(daemon.dsn, ["paid-k3"]).values())
    stamp_all(daemon, stripe, fresh)
    wait_until(
        lambda: prober_status(daemon).get("stripe") is False, 30,
        "a probe succeeds and health forgets the failure", on_timeout=daemon.logs,
    )  # fmt: skip
    wait_until(lambda: not daemon.unresolved(fresh), 30, "the new effect commits",
               on_timeout=daemon.logs)  # fmt: skip
    assert daemon.ledger.states(fresh)[fresh[0]] == "committed"


def test_a_revoked_key_files_no_human_tickets_and_resolves_after_the_fix(
    daemon: Daemon, stripe: FakeStripeServer
) -> None:
    stripe.accept_keys("sk_test_rotated")
    ids = list(make_unknown(daemon.dsn, [f"paid-r{n}" for n in range(5)]).values())
    stamp_all(daemon, stripe, ids)
    env = stripe_env(daemon, stripe)
    daemon.worker("worker", env=env, concurrency=1, loglevel="warning")
    daemon.beat("beat", env=env)
    wait_until(lambda: prober_status(daemon).get("stripe"), 60, "prober marked failing",
               on_timeout=daemon.logs)  # fmt: skip
    wait_until(lambda: len(stripe.seen()) >= 10, 60, "several sweeps probe and are refused",
               on_timeout=daemon.logs)  # fmt: skip
    assert daemon.ledger.count_state("human_review") == 0
    assert set(daemon.ledger.states(ids).values()) == {"unknown"}
    stripe.accept_keys("sk_test_good")
    wait_until(lambda: not daemon.unresolved(ids), 120, "resolved after the key is fixed",
               on_timeout=daemon.logs)  # fmt: skip
    assert count_states(daemon, ids) == Counter({"committed": 5})


# -- a probe slower than the soft time limit ----------------------------------------------------


def test_a_probe_slower_than_the_soft_limit_stops_the_batch_cleanly(
    daemon: Daemon, stripe: FakeStripeServer
) -> None:
    ids = list(make_unknown(daemon.dsn, [f"paid-s{n}" for n in range(12)]).values())
    stamp_all(daemon, stripe, ids)
    stripe.delay = 30.0  # every answer takes longer than the 6 s soft limit
    env = stripe_env(
        daemon, stripe,
        OPENONCE_TASK_SOFT_TIME_LIMIT="6", OPENONCE_TASK_TIME_LIMIT="9",
        OPENONCE_PROBE_TIMEOUT="1", OPENONCE_TEST_STRIPE_TIMEOUT="30",
        OPENONCE_PROBE_RETRIES="50", OPENONCE_SWEEP_SPREAD="1",
    )  # fmt: skip
    worker = daemon.worker("worker", env=env, concurrency=1)
    daemon.beat("beat", env=env)
    wait_until(lambda: "batch stopped before its deadline" in worker.output(), 60,
               "the slow batch stops at its deadline", on_timeout=daemon.logs)  # fmt: skip
    stripe.delay = 0.0  # the provider recovers
    wait_until(lambda: not daemon.unresolved(ids), 90, "every effect re-probed and resolved",
               on_timeout=daemon.logs)  # fmt: skip
    output = worker.output()
    assert "SoftTimeLimitExceeded" not in output
    assert "Hard time limit" not in output and "WorkerLostError" not in output
    assert count_states(daemon, ids) == Counter({"committed": 12})
    for eid in ids:
        assert len(daemon.leaving_unknown(eid)) >= 1
        moves = [(j["from_state"], j["to_state"]) for j in daemon.leaving_unknown(eid)]
        assert moves.count(("unknown", "receipt_recorded")) == 1
    sweeps = daemon.ledger.sweeps()
    assert any(s["batches"] > 1 for s in sweeps)  # the rest went out as a new batch


# -- a message that kills its worker -----------------------------------------------------------


def test_a_message_that_kills_its_worker_is_split_then_quarantined(daemon: Daemon) -> None:
    ids = make_unknown(daemon.dsn, ["poison-1", "paid-q1", "paid-q2"])
    env = daemon.env_with(
        OPENONCE_PROBERS="tests.support.provider_probers:KILLING_PROBERS",
        OPENONCE_TASK_MAX_DELIVERIES="2", OPENONCE_SWEEP_SPREAD="1",
    )  # fmt: skip
    worker = daemon.worker("worker", env=env, concurrency=1)
    daemon.beat("beat", env=env)

    def quarantined() -> list[tuple[str, list[str]]]:
        rows = daemon.ledger.conn.execute(
            "SELECT task_id, effect_ids FROM reconciler_taskdelivery"
            " WHERE quarantined_at IS NOT NULL AND NOT split"
        ).fetchall()
        return [(t, e if isinstance(e, list) else json.loads(e)) for t, e in rows]

    wait_until(quarantined, 120, "the poison message is quarantined", on_timeout=daemon.logs)
    [(task_id, effect_ids)] = quarantined()
    assert effect_ids == [ids["poison-1"]]
    wait_until(
        lambda: not daemon.unresolved([ids["paid-q1"], ids["paid-q2"]]), 60,
        "the healthy effects of the split batch resolve", on_timeout=daemon.logs,
    )  # fmt: skip
    states = daemon.ledger.states(ids.values())
    assert states[ids["paid-q1"]] == states[ids["paid-q2"]] == "committed"
    assert states[ids["poison-1"]] == "unknown"  # held for a person, not guessed at
    assert worker.alive()
    health = json.loads(manage(env, "reconciler_health", "--json").stdout)
    assert health["healthy"] is False
    assert health["quarantined"][0]["task_id"] == task_id
    assert any(f"message {task_id}" in r for r in health["reasons"])


# -- task events ---------------------------------------------------------------------------------


def test_workers_send_task_events(daemon: Daemon) -> None:
    eid = make_unknown(daemon.dsn, ["paid-ev"])["paid-ev"]
    daemon.worker("worker", concurrency=1)
    app = Celery("test-events", broker=daemon.broker_url)
    seen: list[str] = []
    ready = threading.Event()

    def listen() -> None:
        with app.connection() as conn:
            recv = app.events.Receiver(
                conn, handlers={"*": lambda event: seen.append(event["type"])}
            )
            ready.set()
            with contextlib.suppress(Exception):  # the capture's timeout ends it
                recv.capture(limit=None, timeout=60, wakeup=False)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(30), "the event receiver did not start"
    # The receiver may bind a moment after it is created: send (harmless repeats of one
    # batch) until an event shows up, at most one a second.
    deadline = time.monotonic() + 60
    while "task-succeeded" not in seen:
        assert time.monotonic() < deadline, f"no task-succeeded; saw {seen}\n{daemon.logs()}"
        app.send_task("openonce.reconcile_batch", args=[[eid], None], queue="openonce.batches")
        wait_until(
            lambda: "task-succeeded" in seen or daemon.ledger.states([eid])[eid] != "unknown",
            30, "the batch ran", on_timeout=daemon.logs,
        )  # fmt: skip
        end = time.monotonic() + 1
        while "task-succeeded" not in seen and time.monotonic() < end:
            time.sleep(0.05)
    assert "task-received" in seen and "task-started" in seen
    assert daemon.ledger.states([eid])[eid] == "committed"
    app.close()
