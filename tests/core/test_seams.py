"""The promise at the seams real deployments have: forked workers, nested effects, a probe
racing a person, live leases and skewed clocks, an async burst on a small pool, lost and
restarted database connections, a COMMIT that fails.

Each test reproduces a way the promise — never a second provider call for one key, never a
recorded outcome lost, UNKNOWN never a retry without evidence — broke before, and checks
what a user sees: handler runs (counted across processes in files), states, journal lines.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from openonce_core import (
    ApprovalPending,
    EffectState,
    HandlerNotStartedError,
    OpenOnce,
    OutcomeUnknownError,
    ProbeOutcome,
    ProbeResult,
    Reconciler,
    SQLiteStore,
    current_effect,
    require_approval_for,
)
from openonce_core._clock import DatabaseClock
from openonce_core.stores.postgres import PostgresStore
from openonce_core.testing import FakeClock
from tests.support.workers import append_line, read_lines

S = EffectState
ROOT = Path(__file__).resolve().parents[2]


def wait_until(check: Any, what: str, timeout: float = 15.0) -> None:
    """Wait (real time, bounded) for another thread or process to get somewhere."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _tag(dsn: str, name: str) -> str:
    """``dsn`` with an application_name, so the test can find its connections."""
    return psycopg.conninfo.make_conninfo(dsn, application_name=name)


def _backends(dsn: str, name: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchall()
    return [r[0] for r in rows]


# -- 1. fork with a client already in use -------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")  # as in production
def test_forked_children_sharing_a_used_client_never_run_a_key_twice(durable_target, tmp_path):
    """A module-level client used once, then ``fork`` (Celery prefork, gunicorn --preload):
    8 children x 40 keys, all children calling every key. Each key runs once; no child
    reads another's replies (no false mismatch, no hang), and each child owns its leases
    under its own name."""
    oo = OpenOnce(durable_target, migrate=True)
    runs = tmp_path / "runs"

    @oo.effect(tool="fork.charge", idempotency_key=lambda n: f"k{n}")
    def charge(n: int) -> dict[str, Any]:
        append_line(runs, f"{n} {os.getpid()} {current_effect().effect_id}")
        return {"n": n, "by": os.getpid()}

    assert charge(-1)["n"] == -1  # the parent uses its connection (and pool) first
    parent_owner = oo.owner
    children = []
    for c in range(8):
        pid = os.fork()
        if pid == 0:  # the child: report through a file, never return into pytest
            code = 0
            try:
                results = {n: charge(n)["n"] for n in range((c * 7) % 40, 40)}
                results.update({n: charge(n)["n"] for n in range(0, (c * 7) % 40)})
                assert oo.owner != parent_owner and str(os.getpid()) in oo.owner
                assert results == {n: n for n in range(40)}
            except BaseException as exc:
                (tmp_path / f"child-{c}.err").write_text(repr(exc))
                code = 1
            os._exit(code)
        children.append(pid)
    deadline = time.monotonic() + 120
    for pid in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"child {pid} hung")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0, [
            p.read_text() for p in tmp_path.glob("child-*.err")
        ]
    lines = read_lines(runs)
    per_key: dict[int, int] = {}
    for line in lines:
        n = int(line.split()[0])
        per_key[n] = per_key.get(n, 0) + 1
    assert per_key == {n: 1 for n in range(-1, 40)}
    # The parent's client still works after its children used their own connections.
    assert charge(-1)["n"] == -1
    assert charge(41)["n"] == 41
    # Each key the children ran was claimed under the name of the child that ran it.
    ran_by = {int(line.split()[0]): int(line.split()[1]) for line in lines}
    for n in range(40):
        effect = oo.store.find("fork.charge", f"k{n}")
        assert effect is not None
        claim = oo.journal(effect.id)[0]
        assert claim.actor != f"agent:{parent_owner}"
        assert claim.actor.startswith(f"agent:{socket.gethostname()}:{ran_by[n]}:")
        assert ran_by[n] in children
    oo.close()


# -- 3. nested effects --------------------------------------------------------------------


def _nested(oo: OpenOnce, inner_raises: str) -> tuple[Any, dict[str, int]]:
    runs = {"outer": 0, "inner": 0}

    @oo.effect(tool="stripe.refund", idempotency_key=lambda order: f"refund-{order}")
    def refund(order: str) -> dict[str, str]:
        runs["inner"] += 1
        if inner_raises == "unknown" and runs["inner"] == 1:
            raise TimeoutError("read timed out")
        return {"refund": f"re_{order}"}

    @oo.effect(tool="support.resolve_ticket", idempotency_key=lambda order: f"ticket-{order}")
    def resolve_ticket(order: str) -> dict[str, Any]:
        runs["outer"] += 1
        return {"ticket": "closed", "refund": refund(order)}

    return resolve_ticket, runs


def test_an_inner_approval_leaves_the_outer_effect_re_runnable(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    resolve_ticket, runs = _nested(oo, "approval")
    with pytest.raises(ApprovalPending) as pending:
        resolve_ticket("o1")
    outer = oo.store.find("support.resolve_ticket", "ticket-o1")
    assert outer is not None and outer.state == S.PLANNED  # not FAILED: nothing happened
    line = oo.journal(outer.id)[-1]
    assert (line.from_state, line.to_state, line.action) == (S.STARTED, S.PLANNED, "suspend")
    assert line.evidence["inner_effect"] == pending.value.effect_id
    oo.approve(pending.value.effect_id, by="ann", reason="customer asked")
    assert resolve_ticket("o1") == {"ticket": "closed", "refund": {"refund": "re_o1"}}
    assert resolve_ticket("o1") == {"ticket": "closed", "refund": {"refund": "re_o1"}}
    assert runs == {"outer": 2, "inner": 1}
    assert oo.get(outer.id).state == S.COMMITTED


def test_an_inner_unknown_outcome_propagates_as_itself_and_resolves_later(store):
    oo = OpenOnce(store, retry_delay=0)
    resolve_ticket, runs = _nested(oo, "unknown")
    with pytest.raises(OutcomeUnknownError) as unknown:
        resolve_ticket("o2")
    inner_id = unknown.value.effect_id
    assert oo.get(inner_id).tool == "stripe.refund"  # the inner effect's own error
    outer = oo.store.find("support.resolve_ticket", "ticket-o2")
    assert outer is not None and outer.state == S.PLANNED
    with pytest.raises(OutcomeUnknownError):
        resolve_ticket("o2")  # still unknown: the inner is never re-run blindly
    oo.resolve_happened(inner_id, receipt={"refund": "re_o2"}, by="ann", reason="in Stripe")
    assert resolve_ticket("o2") == {"ticket": "closed", "refund": {"refund": "re_o2"}}
    assert runs == {"outer": 3, "inner": 1}


# -- 4. a probe that loses its race against a person --------------------------------------


def test_a_probe_that_finds_the_charge_after_a_person_re_armed_it_escalates(store):
    clock = FakeClock()
    oo = OpenOnce(store, retry_delay=0, clock=clock)
    charges: list[str] = []

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, str]:
        charges.append(order)
        raise TimeoutError("read timed out")  # Stripe took the money, the reply was lost

    with pytest.raises(OutcomeUnknownError) as unknown:
        charge("o1")
    effect_id = unknown.value.effect_id
    probing, answer = threading.Event(), threading.Event()

    def probe(effect: Any) -> ProbeResult:
        probing.set()
        assert answer.wait(10)
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_1"},
            provider_reference=effect.provider_key,
        )  # fmt: skip

    rec = Reconciler(oo, grace_seconds=0, probe_timeout=30)
    rec.register("stripe.charge", probe)
    sweep = threading.Thread(target=rec.run_once)
    sweep.start()
    assert probing.wait(10)
    # While the probe is out, a person looks at the dashboard too early and re-arms it.
    oo.resolve_not_happened(effect_id, by="eve", reason="not in the dashboard yet")
    answer.set()
    sweep.join(10)
    effect = oo.get(effect_id)
    assert effect.state == S.HUMAN_REVIEW  # the receipt contradicts the re-arm
    escalation = oo.journal(effect_id)[-1]
    assert (escalation.from_state, escalation.action) == (S.PLANNED, "contradict")
    assert escalation.evidence["observation"]["receipt"] == {"stripe_id": "pi_1"}
    with pytest.raises(OutcomeUnknownError):
        charge("o1")  # the next call does not charge again
    assert charges == ["o1"]
    rec.close()


# -- 5. live leases, and one clock --------------------------------------------------------


@pytest.mark.slow
def test_a_stopped_call_past_its_lease_is_never_re_armed_by_a_young_miss(durable_target, tmp_path):
    """SIGSTOP an agent mid-call past its lease while a reconciler sweeps: the lease runs
    out (UNKNOWN), the provider shows no PR yet (GitHub's grace is 0), and still nothing is
    re-armed — the call may still be running. SIGCONT: it finishes, its late result stands,
    the handler ran once."""
    marker, release = tmp_path / "marker", tmp_path / "release"
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "workers.py"), "stoppable",
         json.dumps({"target": durable_target, "marker": str(marker), "release": str(release),
                     "lease_seconds": 3.0})],
    )  # fmt: skip
    try:
        wait_until(lambda: marker.exists() and read_lines(marker), "the handler to start")
        [effect_id] = read_lines(marker)
        os.kill(child.pid, signal.SIGSTOP)
        oo = OpenOnce(durable_target)
        misses: list[str] = []

        def no_pr_yet(effect: Any) -> ProbeResult:
            misses.append(effect.id)
            return ProbeResult(
                ProbeOutcome.NOT_HAPPENED, detail="no open PR for acme:fix",
                provider_reference=effect.provider_key,
            )  # fmt: skip

        rec = Reconciler(oo, grace_seconds=None, stale_call_grace=300)
        rec.register("github.create_pr", no_pr_yet)
        wait_until(lambda: rec.run_once().expired == [effect_id], "the lease to run out", 20)
        assert oo.get(effect_id).state == S.UNKNOWN
        for _ in range(3):
            rec.run_once()
            rec.reconcile_ids([effect_id])
        effect = oo.get(effect_id)
        assert effect.state == S.UNKNOWN, oo.journal(effect_id)  # not re-armed
        assert len(misses) == 1  # probed once, then waits out the stale-call window
        assert "may still be running" in oo.journal(effect_id)[-1].reason
        os.kill(child.pid, signal.SIGCONT)
        release.write_text("go")
        assert child.wait(20) == 0
        effect = oo.get(effect_id)
        assert effect.state == S.COMMITTED and effect.verification_status == "late_receipt"
        assert read_lines(marker) == [effect_id]
        rec.close()
        oo.close()
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()


def test_a_reconciler_on_a_fast_host_clock_does_not_expire_a_healthy_call(pg_dsn, monkeypatch):
    """Leases are judged by the database's clock, not each host's: a reconciler host whose
    clock runs 301 s fast sees a live 300 s lease as live."""
    agent = OpenOnce(pg_dsn, migrate=True, lease_seconds=300)
    entered, release = threading.Event(), threading.Event()
    runs: list[int] = []

    @agent.effect(tool="github.create_pr", idempotency_key=lambda head: head)
    def create_pr(head: str) -> dict[str, Any]:
        runs.append(1)
        entered.set()
        assert release.wait(10)
        return {"number": 7, "head": head}

    worker = threading.Thread(target=create_pr, args=("fix",))
    worker.start()
    assert entered.wait(10)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 301)  # this host is 5 min fast
    reconciler_side = OpenOnce(pg_dsn)
    assert isinstance(reconciler_side.clock, DatabaseClock)
    assert abs(reconciler_side.clock.offset + 301) < 5  # it knows how wrong its host is
    rec = Reconciler(reconciler_side, grace_seconds=0)
    rec.register("github.create_pr", lambda e: ProbeResult(ProbeOutcome.NOT_HAPPENED))
    report = rec.run_once()
    assert report.expired == [] and report.rearmed == []
    assert reconciler_side.expire_leases() == []
    release.set()
    worker.join(10)
    monkeypatch.undo()
    assert runs == [1]
    assert agent.store.list_effects()[0].state == S.COMMITTED
    rec.close()
    reconciler_side.close()
    agent.close()


# -- 6. an async burst on a small pool ----------------------------------------------------


def test_fifty_concurrent_async_calls_share_a_small_pool(pg_dsn):
    name = "oo-burst"
    store = PostgresStore(_tag(pg_dsn, name), max_size=4)
    store.migrate()
    oo = OpenOnce(store)
    started = 0
    all_in = asyncio.Event()

    @oo.effect(tool="email.send", idempotency_key=lambda to: to)
    async def send(to: str) -> str:
        nonlocal started
        started += 1
        if started == 50:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 30)  # all 50 are in flight at once
        return f"sent to {to}"

    async def burst() -> list[Any]:
        return await asyncio.gather(*(send(f"u{i}@x") for i in range(50)), return_exceptions=True)

    results = asyncio.run(burst())
    assert results == [f"sent to u{i}@x" for i in range(50)]
    assert store.pool.size <= 4
    assert len(_backends(pg_dsn, name)) <= 4
    # ... and the process is not left unable to reach its ledger.
    assert asyncio.run(send("u0@x")) == "sent to u0@x"
    assert store.count([S.COMMITTED]) == 50
    oo.close()


# -- 7. connections the server dropped ----------------------------------------------------


def _dropping_handler(oo: OpenOnce, entered: threading.Event, release: threading.Event) -> Any:
    runs: list[int] = []

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, str]:
        runs.append(1)
        entered.set()
        assert release.wait(20)
        return {"stripe_id": f"pi_{order}"}

    return charge, runs


@pytest.mark.parametrize("drop", ["idle_session_timeout", "pg_terminate_backend"])
def test_a_dropped_connection_during_the_handler_loses_no_success(pg_dsn, drop):
    name = f"oo-drop-{drop[:8]}"
    dsn = _tag(pg_dsn, name)
    if drop == "idle_session_timeout":
        options = psycopg.conninfo.conninfo_to_dict(dsn).get("options", "")
        dsn = psycopg.conninfo.make_conninfo(dsn, options=f"{options} -c idle_session_timeout=300")
    store = PostgresStore(dsn, max_size=2)
    store.migrate()
    oo = OpenOnce(store)
    entered, release = threading.Event(), threading.Event()
    charge, runs = _dropping_handler(oo, entered, release)
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(charge("o1")))
    worker.start()
    assert entered.wait(10)
    if drop == "pg_terminate_backend":
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            )
    # Either way the pooled connection the finish will borrow is dead on the server now.
    wait_until(lambda: _backends(pg_dsn, name) == [], "the server to drop the connections")
    release.set()
    worker.join(20)
    assert result == [{"stripe_id": "pi_o1"}]
    assert runs == [1]
    effect = store.list_effects()[0]
    assert effect.state == S.COMMITTED
    assert charge("o1") == {"stripe_id": "pi_o1"}  # and it replays: the pool healed
    assert runs == [1]
    oo.close()


def test_a_restarted_connection_is_not_a_lost_write(pg_dsn):
    """A write whose reply is lost (the server dropped the connection right after the
    COMMIT) is recognised as ours when re-read, not retried into a 'lost race'."""
    store = PostgresStore(pg_dsn, max_size=2)
    store.migrate()
    oo = OpenOnce(store)
    real = store._with_cursor
    armed: list[str] = []
    dropped: list[str] = []

    def commit_then_drop(work: Any) -> Any:
        result = real(work)
        if armed and not dropped:  # the first statement after the handler: the finish
            dropped.append(armed[0])
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    store._with_cursor = commit_then_drop  # type: ignore[method-assign]

    @oo.effect(tool="email.send", idempotency_key=lambda to: to)
    def send(to: str) -> str:
        armed.append(current_effect().effect_id)
        return "sent"

    assert send("a@b.c") == "sent"
    store._with_cursor = real  # type: ignore[method-assign]
    assert dropped  # the finish committed and its reply was lost ...
    effect = oo.get(dropped[0])
    assert effect.state == S.COMMITTED  # ... and it counted as done, once
    assert [j.to_state for j in oo.journal(effect.id)] == [S.STARTED, S.COMMITTED]
    oo.close()


def test_connections_per_process_stay_within_the_pool_and_one_listener(pg_dsn):
    name = "oo-count"
    store = PostgresStore(_tag(pg_dsn, name), max_size=3)
    store.migrate()
    oo = OpenOnce(store, wait_seconds=10)
    gate = threading.Barrier(20)

    @oo.effect(tool="t", idempotency_key=lambda n: f"k{n}")
    def work(n: int) -> int:
        return n

    def call(n: int) -> None:
        gate.wait(10)
        for i in range(10):
            work(n * 10 + i)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert store.count([S.COMMITTED]) == 200
    assert len(_backends(pg_dsn, name)) <= 3
    oo.close()


# -- suspected holes, proven closed -------------------------------------------------------


def test_a_failed_sqlite_commit_leaves_the_connection_usable(tmp_path):
    """A COMMIT that fails (here: a deferred constraint checked at COMMIT) must not leave the
    transaction open, or every later BEGIN IMMEDIATE on the connection fails."""
    path = str(tmp_path / "ledger.db")
    store = SQLiteStore(path)
    oo = OpenOnce(store)
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.executescript(
            """
            CREATE TABLE poison (id INTEGER PRIMARY KEY,
                ref INTEGER REFERENCES nowhere(id) DEFERRABLE INITIALLY DEFERRED);
            CREATE TABLE nowhere (id INTEGER PRIMARY KEY);
            CREATE TRIGGER poison_once AFTER INSERT ON openonce_journal
                WHEN NEW.to_state = 'committed' AND NOT EXISTS (SELECT 1 FROM poison)
                BEGIN INSERT INTO poison (id, ref) VALUES (1, 42); END;
            """
        )
    with store._use() as conn:
        conn.execute("PRAGMA foreign_keys=ON")

    @oo.effect(tool="t", idempotency_key=lambda n: f"k{n}")
    def work(n: int) -> int:
        return n

    with pytest.raises(Exception, match="FOREIGN KEY"):
        work(1)  # the finish's COMMIT fails: recorded as a LedgerWriteError
    with store._use() as conn:
        assert not conn.in_transaction
        conn.execute("DROP TRIGGER poison_once")
    assert work(2) == 2  # the same connection writes again
    assert oo.store.find("t", "k2").state == S.COMMITTED


def test_a_handler_whose_loop_closed_before_it_started_is_given_back(store):
    oo = OpenOnce(store)
    runs: list[int] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: to)
    async def send(to: str) -> str:
        runs.append(1)
        return "sent"

    loop = asyncio.new_event_loop()
    loop.close()
    spec_call = oo._prepare(send.openonce_spec, ("a@b.c",), {})
    with pytest.raises(HandlerNotStartedError):
        oo._execute(spec_call, loop, contextvars.copy_context())
    effect = store.list_effects()[0]
    assert effect.state == S.PLANNED and runs == []  # nothing ran: not FAILED
    assert oo.journal(effect.id)[-1].action == "suspend"
    assert asyncio.run(send("a@b.c")) == "sent"
    assert runs == [1]
