"""What is due, read by index, on every store (openonce_core/_due.py; issue 19).

An UNKNOWN effect is due at its next probe time: ``next_probe_at`` once the reconciler asked
again later, else its last change plus its tool's grace. The sweep finds due effects through
partial indexes of UNKNOWN rows, so thousands of effects in probe backoff cost nothing: the
store hands back the due rows and only those (counted here by wrapping the store's reads).
The console's count uses the same rule, with no cap.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from openonce_core import EffectState, OpenOnce, Store
from openonce_core._due import Grace, count_overdue_unknown, overdue_unknown
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._providers import CapabilityMatrix
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect, JournalEntry, new_effect_id
from openonce_core.errors import ProbeTransientError
from openonce_core.stores.sql import SELECT_COLUMNS
from openonce_core.testing import FakeClock

S = EffectState
FRESH = "openonce_effects_unknown_fresh"
NEXT = "openonce_effects_unknown_next"
FRESH_TOOL = "openonce_effects_unknown_fresh_tool"


@pytest.fixture
def oo(store: Store, clock: FakeClock) -> Iterator[OpenOnce]:
    client = OpenOnce(store, retry_delay=0, clock=clock)
    yield client
    client.close()


@pytest.fixture
def reconcilers(oo: OpenOnce) -> Iterator[list[Reconciler]]:
    made: list[Reconciler] = []
    yield made
    for rec in made:
        rec.close()


def reconciler(oo: OpenOnce, made: list[Reconciler], **options: Any) -> Reconciler:
    rec = Reconciler(oo, owner="sweeper", **options)
    made.append(rec)
    return rec


def park(
    oo: OpenOnce,
    tool: str,
    changed_at: float,
    next_probe_at: float | None = None,
    state: EffectState = S.UNKNOWN,
) -> str:
    """An UNKNOWN effect written straight into the ledger, last changed at ``changed_at``;
    with ``next_probe_at``, as a reconciler's re-probe leaves it (in backoff until then)."""
    effect = Effect(
        id=new_effect_id(), tool=tool, idempotency_key=uuid.uuid4().hex, scope=None,
        state=state, args={}, args_fingerprint="fp", provider_key="pk-" + uuid.uuid4().hex,
        attempt=1, created_at=changed_at, updated_at=changed_at,
    )  # fmt: skip
    lines = [
        JournalEntry(effect.id, S.PLANNED, S.STARTED, "agent:test", at=changed_at, action="claim"),
        JournalEntry(effect.id, S.STARTED, state, "agent:test", at=changed_at, action="finish"),
    ]
    assert oo.store.insert(effect, lines)
    if next_probe_at is not None:
        assert oo.ledger.move(
            effect, "reprobe", S.UNKNOWN, actor="reconciler:test", reason="provider busy",
            changes={"next_probe_at": next_probe_at}, at=changed_at,
        )  # fmt: skip
    return effect.id


def copies(oo: OpenOnce, effect_id: str, n: int) -> set[str]:
    """``n`` copies of a parked effect, written in one statement (a row each, no journal:
    only the effects table is read here)."""
    renamed = {"id", "idempotency_key", "provider_key"}
    columns = ", ".join(
        f"e.{c} || '-' || n.i" if c in renamed else f"e.{c}" for c in SELECT_COLUMNS.split(", ")
    )
    stmt = (
        f"INSERT INTO openonce_effects ({SELECT_COLUMNS}) WITH RECURSIVE n(i) AS"
        " (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
        f" SELECT {columns} FROM n, openonce_effects e WHERE e.id = ?"
    )
    store: Any = oo.store
    if store.dialect == "postgres":
        store._with_cursor(lambda cur: cur.execute(stmt.replace("?", "%s"), (n, effect_id)))
    else:
        store._write(lambda conn: conn.execute(stmt, (n, effect_id)) is not None)
    return {f"{effect_id}-{i}" for i in range(1, n + 1)}


class Reads:
    """Counts the statements a store runs and the effects they hand back."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        self.sql: list[tuple[str, tuple[Any, ...]]] = []
        real_all, real_one = store._all, store._one  # type: ignore[attr-defined]

        def all_rows(query: str, params: Any) -> list[Any]:
            self.sql.append((query, tuple(params)))
            found = real_all(query, params)
            if query.startswith(f"SELECT {SELECT_COLUMNS} "):
                self.rows += len(found)
            return found

        def one_row(query: str, params: Any) -> Any:
            self.sql.append((query, tuple(params)))
            return real_one(query, params)

        monkeypatch.setattr(store, "_all", all_rows)
        monkeypatch.setattr(store, "_one", one_row)

    def reset(self) -> None:
        self.rows = 0
        self.sql.clear()


# -- behaviour ----------------------------------------------------------------------------


def test_thousands_in_backoff_cost_nothing_to_the_sweep(
    oo: OpenOnce, clock: FakeClock, reconcilers: list[Reconciler], monkeypatch
) -> None:
    now = clock.now()
    first = park(oo, "acme.ship", now - 10, next_probe_at=now + 600)
    waiting = {first} | copies(oo, first, 1999)
    backoff_due = {park(oo, "acme.ship", now - 100, next_probe_at=now - 1) for _ in range(3)}
    past_grace = {park(oo, "acme.ship", now - 120) for _ in range(2)}
    in_grace = {park(oo, "acme.ship", now - 10) for _ in range(2)}
    rec = reconciler(oo, reconcilers, grace_seconds=60)
    reads = Reads(oo.store, monkeypatch)

    found = rec.due()

    assert {e.id for e in found} == backoff_due | past_grace
    assert reads.rows == 5  # the due rows, not the 2,000 waiting behind them
    assert count_overdue_unknown(oo.store, rec.grace, clock, now) == 5

    # Ten minutes on, everything is due: longest overdue first, across both indexes.
    clock.advance(600)
    found = rec.due(limit=500)
    assert len(found) == 500
    assert [e.id in past_grace for e in found[:2]] == [True, True]
    assert {e.id for e in found[2:5]} == backoff_due
    assert {e.id for e in found[5:7]} == in_grace
    assert {e.id for e in found[7:]} < waiting
    assert count_overdue_unknown(oo.store, rec.grace, clock, clock.now()) == 2007


def test_a_young_effect_of_a_tool_without_grace_is_due_before_old_ones_in_grace(
    oo: OpenOnce, clock: FakeClock, reconcilers: list[Reconciler], monkeypatch
) -> None:
    now = clock.now()
    first = park(oo, "slow.sync", now - 600)  # an hour's grace
    slow = {first} | copies(oo, first, 49)
    fast = park(oo, "fast.sync", now - 1)  # no grace
    rec = reconciler(oo, reconcilers, grace_overrides={"slow.sync": 3600})
    reads = Reads(oo.store, monkeypatch)

    assert [e.id for e in rec.due()] == [fast]
    assert reads.rows == 1  # the old rows of the slow tool stay in the database
    assert count_overdue_unknown(oo.store, rec.grace, clock, now) == 1
    clock.advance(3000)
    assert {e.id for e in rec.due()} == {fast, *slow}


def test_capability_graces_apply_per_tool_without_a_reconciler(oo: OpenOnce, clock) -> None:
    now = clock.now()
    charge = park(oo, "stripe.charge", now - 100)  # Stripe's grace: 120 s
    sync = park(oo, "ledger.sync", now - 100)  # no capability: no grace
    grace = Grace(CapabilityMatrix())
    assert grace.for_tool("stripe.charge") == 120 and grace.for_tool("ledger.sync") == 0

    assert [e.id for e in overdue_unknown(oo.store, grace, clock, now, 10)] == [sync]
    clock.advance(20)
    assert {e.id for e in overdue_unknown(oo.store, grace, clock, clock.now(), 10)} == {
        sync,
        charge,
    }


def test_a_failed_probe_writes_when_the_effect_is_next_due(
    oo: OpenOnce, clock: FakeClock, reconcilers: list[Reconciler]
) -> None:
    effect_id = park(oo, "acme.ship", clock.now() - 60)
    answers: list[Any] = [ProbeTransientError("acme", "429 slow down", status=429, retry_after=300)]

    def prober(effect: Effect) -> ProbeResult:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    rec = reconciler(oo, reconcilers, grace_seconds=60, transient_retries=3)
    rec.register("acme.ship", prober)
    at = clock.now()
    report = rec.run_once()

    assert report.retried == [effect_id]
    effect = oo.get(effect_id)
    assert effect.state == S.UNKNOWN and effect.next_probe_at == at + 300
    assert "asking again in 300s" in oo.journal(effect_id)[-1].reason
    clock.advance(299)
    assert rec.due() == []
    clock.advance(1)
    assert [e.id for e in rec.due()] == [effect_id]

    answers.append(
        ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"id": "sh_1"}, provider_reference=effect.provider_key
        )
    )
    rec.run_once()
    done = oo.get(effect_id)
    assert done.state == S.COMMITTED and done.next_probe_at is None


def test_a_young_miss_is_due_when_it_matures_not_after_the_grace(
    oo: OpenOnce, clock: FakeClock, reconcilers: list[Reconciler]
) -> None:
    effect_id = park(oo, "acme.ship", clock.now() - 60)
    rec = reconciler(oo, reconcilers, grace_seconds=60)
    rec.register(
        "acme.ship",
        lambda effect: ProbeResult(
            ProbeOutcome.INCONCLUSIVE, detail="not indexed yet", retry_after=20
        ),
    )
    at = clock.now()
    rec.run_once()

    assert oo.get(effect_id).next_probe_at == at + 20
    clock.advance(19)
    assert rec.due() == []
    clock.advance(1)
    assert [e.id for e in rec.due()] == [effect_id]


def test_every_other_move_forgets_the_next_probe(oo: OpenOnce, clock: FakeClock) -> None:
    effect_id = park(oo, "acme.ship", clock.now(), next_probe_at=clock.now() + 900)
    # A probe claim (a reconciler asking now, or its rate limit holding it back) is no move.
    assert oo.ledger.claim_for_probe([effect_id], "reconciler:x", clock.now() + 30)
    assert oo.get(effect_id).next_probe_at == clock.now() + 900

    assert oo.ledger.move(oo.get(effect_id), "escalate", S.HUMAN_REVIEW, actor="reconciler:x")
    assert oo.get(effect_id).next_probe_at is None


def test_an_effect_changed_by_a_clock_that_stepped_back_waits_its_pause(
    oo: OpenOnce, clock: FakeClock, reconcilers: list[Reconciler]
) -> None:
    # Written by a reconciler whose clock ran an hour ahead: "changed in an hour".
    ahead = clock.now() + 3600
    fresh = park(oo, "acme.ship", ahead)
    backoff = park(oo, "acme.ship", ahead, next_probe_at=ahead + 30)
    rec = reconciler(oo, reconcilers, grace_seconds=60)

    def due_now() -> set[str]:
        found = {e.id for e in rec.due()}
        assert count_overdue_unknown(oo.store, rec.grace, clock, clock.now()) == len(found)
        return found

    assert due_now() == set()
    clock.advance(30)  # its pause, on this process's monotonic clock, not the hour
    assert due_now() == {backoff}
    clock.advance(30)
    assert due_now() == {fresh, backoff}


def test_the_fresh_tools_cost_one_read_per_tool_not_per_effect(
    oo: OpenOnce, clock: FakeClock, monkeypatch
) -> None:
    # A provider down: thousands of UNKNOWN effects of one tool, read by the sweep, every
    # /metrics scrape and every poll of the console's queue.
    now = clock.now()
    copies(oo, park(oo, "acme.ship", now - 600), 2000)
    park(oo, "slow.sync", now - 10)  # the newest
    park(oo, "held.back", now - 10, next_probe_at=now + 600)  # in backoff: not fresh
    reads = Reads(oo.store, monkeypatch)
    assert oo.store.fresh_unknown_tools() == ["acme.ship", "slow.sync"]
    assert len(reads.sql) == 3  # two tools and the read that finds no third
    grace = Grace(CapabilityMatrix(), overrides={"slow.sync": 3600})
    assert count_overdue_unknown(oo.store, grace, clock, now) == 2001


def test_an_empty_ledger_has_nothing_due(oo: OpenOnce, clock: FakeClock) -> None:
    for grace in (Grace(CapabilityMatrix()), Grace(CapabilityMatrix(), grace_seconds=5)):
        assert overdue_unknown(oo.store, grace, clock, clock.now(), 10) == []
        assert count_overdue_unknown(oo.store, grace, clock, clock.now()) == 0


# -- query plans ----------------------------------------------------------------------------


def due_statements(oo: OpenOnce, clock: FakeClock, monkeypatch) -> list[tuple[str, tuple]]:
    """The statements a sweep and a count run to find what is due, per-tool grace on."""
    now = clock.now()
    copies(oo, park(oo, "acme.ship", now - 9999, state=S.COMMITTED), 5000)  # history
    copies(oo, park(oo, "acme.ship", now - 10, next_probe_at=now + 600), 300)
    park(oo, "acme.ship", now - 120)
    park(oo, "slow.sync", now - 120)
    grace = Grace(CapabilityMatrix(), overrides={"slow.sync": 3600})
    reads = Reads(oo.store, monkeypatch)
    overdue_unknown(oo.store, grace, clock, now, 100)
    count_overdue_unknown(oo.store, grace, clock, now)
    return list(reads.sql)


BY_ID = "by id"  # a fresh effect's tool, read by primary key


def index_for(query: str) -> str:
    if "WHERE id IN (" in query:
        return BY_ID
    if "ORDER BY tool" in query:
        return FRESH_TOOL
    if "next_probe_at IS NULL" in query:
        return FRESH
    if "next_probe_at IS NOT NULL" in query:
        return NEXT
    assert "updated_at > ?" in query  # changed "after now": the clock stepped back
    return "openonce_effects_state_updated"


def test_sqlite_reads_what_is_due_through_the_partial_indexes(
    tmp_path, clock: FakeClock, monkeypatch
) -> None:
    import sqlite3

    from openonce_core import SQLiteStore

    path = str(tmp_path / "ledger.db")
    store = SQLiteStore(path)
    store.migrate()
    oo = OpenOnce(store, clock=clock)
    statements = due_statements(oo, clock, monkeypatch)
    conn = sqlite3.connect(path)
    for query, params in statements:
        plan = " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query, params))
        if index_for(query) == BY_ID:
            assert "(id=?)" in plan, (query, plan)
            continue
        assert f"USING INDEX {index_for(query)}" in plan or (
            f"USING COVERING INDEX {index_for(query)}" in plan
        ), (query, plan)
        assert "TEMP B-TREE FOR ORDER BY" not in plan, (query, plan)
    conn.close()
    oo.close()


def test_postgres_reads_what_is_due_through_the_partial_indexes(
    pg_dsn: str, clock: FakeClock, monkeypatch
) -> None:
    from openonce_core.stores.postgres import PostgresStore

    store = PostgresStore(pg_dsn)
    store.migrate()
    oo = OpenOnce(store, clock=clock)
    statements = due_statements(oo, clock, monkeypatch)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ANALYZE openonce_effects")
        for n, (query, params) in enumerate(statements):
            # The plan the pool's prepared statements end up with: generic, for any values.
            text = numbered(query)
            conn.execute(f"PREPARE due_{n} AS {text}")
            conn.execute("SET plan_cache_mode = force_generic_plan")
            values = ", ".join(_literal(v) for v in params)
            run = f"EXECUTE due_{n}({values})" if params else f"EXECUTE due_{n}"
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + run))
            if index_for(query) == BY_ID:
                assert "Index Cond: (id = ANY" in plan and "Seq Scan" not in plan, plan
                continue
            if index_for(query) == FRESH_TOOL:  # one probe of the tools' index
                assert "Index Only Scan" in plan and "Limit" in plan, plan
            assert index_for(query) in plan, (query, plan)
            assert "Seq Scan" not in plan and "Sort" not in plan.replace("Sort Key", ""), plan
    oo.close()


def numbered(query: str) -> str:
    """``?`` placeholders as Postgres's ``$1``, ``$2`` ... for PREPARE."""
    count = iter(range(1, query.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(count)}", query)


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if value == float("-inf"):
        return "'-Infinity'"
    return repr(value)
