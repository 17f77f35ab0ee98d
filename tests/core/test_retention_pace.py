"""The retention's pace beside live agents (issue 19: "bounded batches that never block the
hot path"). Between two batches a run rests long enough that it archives at most
``max_rate`` effects a second and spends at most ``max_busy`` of its time in batches
(``RetentionPolicy.pause_after``); the run's own time is a FakeClock here, its batches
made to take a known time, so the pauses it asks for and the rate they give are exact.

And the cause of the hot path's slowdown on Postgres: a session that planned the insert's
tombstone check while the table was empty kept scanning the whole table as the run
filled it (10 ms a new effect at 20,000 tombstones); the run re-plans those checks."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest

from openonce_core._retention import RetentionPolicy
from openonce_core.stores.postgres import PostgresStore
from openonce_core.testing import FakeClock
from tests.support.retention import DAY, Agent, age, run

OLD = 10  # old effects: five batches of two, four rests between them


class Timer(FakeClock):
    """The run's own time: records every pause it asks for."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        super().sleep(seconds)


def paced_run(store: Any, tmp_path: Any, batch_takes: float, **pace: Any) -> tuple[Any, Timer]:
    """OLD old refunds archived in batches of two, each batch taking ``batch_takes`` seconds
    of the run's time (its deliveries are read inside the batch's transaction)."""
    agent = Agent(store, FakeClock())
    for n in range(OLD):
        agent.refund(f"o-{n}")
    age(agent)
    timer = Timer()

    def slow_batch(ids: list[str]) -> dict[str, list[Any]]:
        timer.advance(batch_takes)
        return {}

    policy = RetentionPolicy(older_than=90 * DAY, batch_size=2, **pace)
    report = run(store, agent.clock, tmp_path, policy=policy, timer=timer, deliveries=slow_batch)
    assert (report.effects, report.batches) == (OLD, OLD // 2)
    return report, timer


def test_fast_batches_rest_until_the_rate_is_max_rate(store, tmp_path) -> None:
    # 2 effects at 4/s is half a second a batch: 0.1 s of work, then 0.4 s of rest.
    report, timer = paced_run(store, tmp_path, 0.1, max_rate=4.0, max_busy=0.5)
    assert timer.pauses == pytest.approx([0.4] * 4)
    assert report.seconds == pytest.approx(5 * 0.1 + 4 * 0.4)  # no rest after the last
    assert (report.effects - 2) / (report.seconds - 0.1) == pytest.approx(4.0)


def test_slow_batches_rest_as_long_as_they_took_so_agents_keep_half_the_time(
    store, tmp_path
) -> None:
    # A machine too busy for max_rate: 2 s a batch (1/s flat out); the run works half the time.
    report, timer = paced_run(store, tmp_path, 2.0, max_rate=4.0, max_busy=0.5)
    assert timer.pauses == pytest.approx([2.0] * 4)
    assert (report.effects - 2) / (report.seconds - 2.0) == pytest.approx(0.5)


def test_a_busier_share_rests_less(store, tmp_path) -> None:
    report, timer = paced_run(store, tmp_path, 0.3, max_rate=None, max_busy=0.75)
    assert timer.pauses == pytest.approx([0.1] * 4)  # 0.3 s of work is 3/4 of 0.4 s
    assert report.seconds == pytest.approx(5 * 0.3 + 4 * 0.1)


def test_pause_is_the_least_rest_and_no_pace_is_flat_out(store, tmp_path) -> None:
    _, timer = paced_run(store, tmp_path, 0.1, max_rate=None, max_busy=1.0, pause=0.25)
    assert timer.pauses == pytest.approx([0.25] * 4)


def test_unpaced_run_never_rests(store, tmp_path) -> None:
    report, timer = paced_run(store, tmp_path, 0.1, max_rate=None, max_busy=1.0)
    assert timer.pauses == []
    assert report.effects / report.seconds == pytest.approx(OLD / 0.5)


def test_the_default_pace_keeps_four_times_the_budget_and_half_the_machine() -> None:
    policy = RetentionPolicy(older_than=90 * DAY)
    budget = 10_000_000 / DAY  # issue 19: 10M effects a day, 116/s
    assert policy.max_rate is not None and policy.max_rate >= 4 * budget
    # A batch of 500 in 0.18 s (2,767/s flat out on a quiet machine): 500/s.
    rest = policy.pause_after(500, 0.18)
    assert 500 / (0.18 + rest) == pytest.approx(policy.max_rate)
    # The same batch in 1.5 s on a loaded machine: it rests 1.5 s, half the time.
    assert policy.pause_after(500, 1.5) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "bad",
    [
        dict(max_rate=0),
        dict(max_rate=-5.0),
        dict(max_rate=math.nan),
        dict(max_rate=math.inf),
        dict(max_busy=0),
        dict(max_busy=1.5),
        dict(max_busy=math.nan),
    ],
)
def test_a_pace_that_means_nothing_is_refused(bad: dict[str, float]) -> None:
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        RetentionPolicy(older_than=90 * DAY, **bad)  # type: ignore[arg-type]


def test_a_session_that_planned_the_tombstone_check_on_an_empty_table_uses_its_index_after_a_run(
    pg_dsn, tmp_path
) -> None:
    """An agent's insert is a prepared statement; its tombstone check is planned once.
    ``VACUUM ANALYZE`` (an operator's, or after an upgrade) while the table is empty makes
    that plan a scan of the table, and nothing re-planned it while a run filled the table.
    The session here prepares the insert's check, as the agent's statement holds it."""
    store = PostgresStore(pg_dsn)
    store.migrate()
    agent_session = psycopg.connect(pg_dsn, autocommit=True)
    try:
        agent_session.execute("VACUUM ANALYZE openonce_tombstones")
        agent_session.execute(
            "PREPARE check_key (text, text) AS SELECT 1 WHERE NOT EXISTS"
            " (SELECT 1 FROM openonce_tombstones WHERE tool = $1 AND idempotency_key = $2)"
        )
        for n in range(8):  # past the custom plans Postgres tries first: the kept plan
            agent_session.execute(f"EXECUTE check_key ('stripe.refund', 'k-{n}')")
        agent = Agent(store, FakeClock())
        for n in range(300):
            agent.refund(f"o-{n}")
        age(agent)
        policy = RetentionPolicy(older_than=90 * DAY, batch_size=300, max_rate=None, max_busy=1)

        report = run(store, agent.clock, tmp_path, policy=policy)

        assert report.tombstones == 300
        plan = "\n".join(
            r[0] for r in agent_session.execute("EXPLAIN EXECUTE check_key ('stripe.refund', 'x')")
        )
        assert "Seq Scan" not in plan and "openonce_tombstones_pkey" in plan, plan
    finally:
        agent_session.close()
        store.close()
