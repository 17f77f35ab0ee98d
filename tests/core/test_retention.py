"""The retention (openonce_core/_retention.py), on every store: old terminal effects are
archived to a gzip JSON lines file, then deleted with their journal lines and approvals;
their keys leave tombstones, so a duplicate after archival is refused, never run again;
an import puts everything back and replays work again."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import sqlite3
from typing import Any

import psycopg
import pytest

from openonce_core import (
    ApprovalPending,
    BusinessError,
    EffectState,
    IdempotencyMismatchError,
    OpenOnce,
    OutcomeUnknownError,
    require_approval_for,
)
from openonce_core._retention import (
    ArchiveError,
    RetentionPolicy,
    find_tombstone,
    import_archive,
)
from openonce_core.errors import EffectArchivedError
from openonce_core.testing import FakeClock
from tests.support.retention import (
    DAY,
    Agent,
    age,
    archive_lines,
    raw_connection,
    run,
    statement_held,
)

S = EffectState


def test_old_terminal_effects_are_archived_deleted_and_leave_tombstones(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-committed")
    with pytest.raises(BusinessError):
        agent.refund("o-failed", "declined")
    with pytest.raises(OutcomeUnknownError):
        agent.refund("o-unknown", "lost")
    old = {e.args["order"]: e for e in store.list_effects(limit=100)}
    clock.advance(91 * DAY)
    agent.refund("o-young")  # committed, but only just

    report = run(store, clock, tmp_path)

    assert (report.effects, report.journal_lines, report.approvals) == (2, 4, 0)
    assert report.tombstones == 2 and len(report.archives) == 1
    for order in ("o-committed", "o-failed"):
        effect = old[order]
        assert store.get(effect.id) is None
        assert store.journal(effect.id) == []
        stone = find_tombstone(store, "stripe.refund", effect.idempotency_key)
        assert stone is not None and stone.effect_id == effect.id
        assert stone.archive == report.archives[0]
    # An UNKNOWN effect is never archived, however old; a young committed one stays too.
    assert store.get(old["o-unknown"].id).state == S.UNKNOWN
    assert len(store.journal(old["o-unknown"].id)) == 2
    assert {e.args["order"] for e in store.list_effects(limit=100)} == {"o-unknown", "o-young"}


def test_a_duplicate_after_archival_is_refused_and_never_runs_again(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock)
    assert agent.refund("o-1") == {"refund": "re_o-1"}
    effect = store.list_effects(limit=10)[0]
    age(agent)
    report = run(store, clock, tmp_path)
    assert report.effects == 1

    for _ in range(2):  # this process remembers the key: the second call reads first
        with pytest.raises(EffectArchivedError) as info:
            agent.refund("o-1")
        err = info.value
        assert (err.effect_id, err.state, err.archive) == (
            effect.id,
            "committed",
            report.archives[0],
        )
        assert err.archived_at == clock.now()
        assert "nothing was run" in str(err) and effect.id in str(err)
    # A fresh process (no remembered keys) is refused the same way.
    newcomer = Agent(store, clock)
    with pytest.raises(EffectArchivedError):
        newcomer.refund("o-1")
    assert agent.calls == [("refund", "o-1"), ("refund", "young-1")] and newcomer.calls == []
    assert [e.args["order"] for e in store.list_effects()] == ["young-1"]  # none inserted


def test_a_duplicate_with_other_arguments_after_archival_is_a_mismatch(store, tmp_path) -> None:
    clock = FakeClock()
    oo = OpenOnce(store, retry_delay=0, clock=clock)
    calls = []

    @oo.effect(tool="mail.send", idempotency_key=lambda to, body: "k-" + to)
    def send(to: str, body: str) -> str:
        calls.append(body)
        return "sent"

    send("a@example.com", "hello")
    clock.advance(91 * DAY)
    send("young@example.com", "young")
    run(store, clock, tmp_path)
    with pytest.raises(IdempotencyMismatchError):
        send("a@example.com", "other text")
    with pytest.raises(EffectArchivedError):
        send("a@example.com", "hello")
    assert calls == ["hello", "young"]


def test_a_released_effect_leaves_no_tombstone_and_its_key_runs_anew(store, tmp_path) -> None:
    clock = FakeClock()
    waiting = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    with pytest.raises(ApprovalPending) as info:
        waiting.refund("o-r")
    released = waiting.oo.release_unstarted(info.value.effect_id, by="maria", reason="wrong")
    assert released.state == S.RELEASED
    age(Agent(store, clock))

    report = run(store, clock, tmp_path)

    assert (report.effects, report.tombstones) == (1, 0)
    assert store.get(released.id) is None
    assert find_tombstone(store, "stripe.refund", released.idempotency_key) is None
    agent = Agent(store, clock)
    assert agent.refund("o-r") == {"refund": "re_o-r"}
    assert agent.calls == [("refund", "o-r")]


def test_effects_waiting_for_people_are_never_archived(store, tmp_path) -> None:
    clock = FakeClock()
    waiting = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    with pytest.raises(ApprovalPending):
        waiting.refund("o-wait")
    agent = Agent(store, clock)
    with pytest.raises(OutcomeUnknownError):
        agent.refund("o-lost", "lost")
    lost = next(e for e in store.list_effects(limit=10) if e.state == S.UNKNOWN)
    agent.oo.ledger.move(lost, "escalate", S.HUMAN_REVIEW, actor="reconciler")
    clock.advance(3650 * DAY)

    report = run(store, clock, tmp_path)

    assert (report.effects, report.archives) == (0, [])
    states = sorted(str(e.state) for e in store.list_effects(limit=10))
    assert states == ["human_review", "requires_approval"]


def test_a_change_after_selection_keeps_the_row_its_journal_and_no_tombstone(
    store, tmp_path, monkeypatch
) -> None:
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-a")
    agent.refund("o-b")
    a, b = sorted(store.list_effects(limit=10), key=lambda e: e.args["order"])
    age(agent)

    # Between the batch's selection (and tombstones) and its delete, a late result
    # contradicts o-a: the effect goes to a person and must not be archived.
    def contradict_meanwhile(timeout: float) -> bool:
        assert find_tombstone(store, "stripe.refund", a.idempotency_key) is not None
        agent.oo.ledger.move(
            store.get(a.id), "contradict", S.HUMAN_REVIEW, actor="openonce", reason="late"
        )
        return True

    monkeypatch.setattr(store, "wait_for_older_statements", contradict_meanwhile)
    report = run(store, clock, tmp_path)

    assert (report.effects, report.kept) == (1, 1)
    kept = store.get(a.id)
    assert kept is not None and kept.state == S.HUMAN_REVIEW
    assert [j.action for j in store.journal(a.id)] == ["claim", "finish", "contradict"]
    assert find_tombstone(store, "stripe.refund", a.idempotency_key) is None
    assert store.get(b.id) is None
    assert [doc["effect"]["id"] for doc in archive_lines(report.archives[0])] == [b.id]


def test_the_archive_reads_with_gzip_and_json_and_imports_back(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    with pytest.raises(ApprovalPending) as info:
        agent.refund("o-1")
    agent.oo.approve(info.value.effect_id, by="maria", reason="ok")
    assert agent.refund("o-1") == {"refund": "re_o-1"}
    with pytest.raises(ApprovalPending) as info:
        agent.refund("o-2", "declined")
    agent.oo.approve(info.value.effect_id, by="maria")
    with pytest.raises(BusinessError):
        agent.refund("o-2", "declined")
    before = {e.id: (e, store.journal(e.id), store.approvals(e.id)) for e in store.list_effects()}
    age(Agent(store, clock))
    report = run(store, clock, tmp_path)
    assert (report.effects, report.approvals) == (2, 2)
    assert [e.args["order"] for e in store.list_effects()] == ["young-1"]

    lines = archive_lines(report.archives[0])
    assert sorted(doc["effect"]["id"] for doc in lines) == sorted(before)
    for doc in lines:
        effect, journal, approvals = before[doc["effect"]["id"]]
        assert doc["effect"]["state"] == str(effect.state)
        assert doc["effect"]["args"] == effect.args
        assert [j["seq"] for j in doc["journal"]] == [j.seq for j in journal]
        assert [a["by"] for a in doc["approvals"]] == [a.by for a in approvals]

    imported = import_archive(store, report.archives[0])

    assert (imported.effects, imported.journal_lines, imported.approvals) == (2, 8, 2)
    for effect_id, (effect, journal, approvals) in before.items():
        assert store.get(effect_id) == effect
        assert store.journal(effect_id) == journal  # the same seq, the same lines
        assert store.approvals(effect_id) == approvals
        assert find_tombstone(store, "stripe.refund", effect.idempotency_key) is None
    # Replays work again: the recorded outcome, no second run.
    assert agent.refund("o-1") == {"refund": "re_o-1"}
    with pytest.raises(BusinessError):
        agent.refund("o-2", "declined")
    assert agent.calls == [("refund", "o-1"), ("refund", "o-2")]

    again = import_archive(store, report.archives[0])
    assert (again.effects, sorted(again.skipped)) == (0, sorted(before))
    assert "skipped 2 effect(s) already in the ledger" in str(again)


def _archive_one(store: Any, tmp_path: Any) -> tuple[Agent, FakeClock, str, dict[str, Any]]:
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-1")
    age(Agent(store, clock))
    path = run(store, clock, tmp_path).archives[0]
    with gzip.open(path, "rt") as f:
        doc = json.loads(f.readline())
    return agent, clock, path, doc


def _write_archive(path: Any, docs: list[dict[str, Any]]) -> str:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return str(path)


def test_an_import_that_would_shadow_the_ledger_is_refused_and_changes_nothing(
    store, tmp_path
) -> None:
    agent, _, _, doc = _archive_one(store, tmp_path)
    agent.refund("o-2")
    live = agent.effect_of("o-2")
    # A second effect holding o-2's key, and a copy of the live one that differs from it.
    shadow = json.loads(json.dumps(doc))
    shadow["effect"].update(id="eff_" + "1" * 32, idempotency_key=live.idempotency_key)
    for line in shadow["journal"]:
        line["seq"] += 1000
    differing = json.loads(json.dumps(doc))
    differing["effect"].update({**{k: v for k, v in dataclasses.asdict(live).items()}})
    differing["effect"]["state"] = "committed"
    differing["effect"]["fence"] = live.fence + 5
    differing["journal"] = []
    for bad, says in ((shadow, "is held by effect"), (differing, "differs from the archive")):
        crafted = _write_archive(tmp_path / "crafted.jsonl.gz", [doc, bad])
        with pytest.raises(ArchiveError, match=says):
            import_archive(store, crafted)
        # Nothing changed: the good first line was not imported either.
        assert store.get(doc["effect"]["id"]) is None
        assert find_tombstone(store, "stripe.refund", doc["effect"]["idempotency_key"])
        assert store.get(live.id) == live


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"not gzip at all", "not a gzip archive"),
        (gzip.compress(b"{not json\n"), "line 1 is not JSON"),
        (gzip.compress(b'{"archive_format": 2}\n'), "not an OpenOnce archive line"),
    ],
    ids=["not-gzip", "not-json", "not-an-archive-line"],  # gzip's header holds the time
)
def test_a_bad_archive_is_refused_and_changes_nothing(store, tmp_path, content, says) -> None:
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(content)
    with pytest.raises(ArchiveError, match=says):
        import_archive(store, bad)
    with pytest.raises(ArchiveError, match="cannot read"):
        import_archive(store, tmp_path / "missing.jsonl.gz")
    assert store.list_effects() == []


@pytest.mark.parametrize(
    "bad_id", ["eff_" + "1" * 31 + "/", "eff_" + "A" * 32, "../etc", "", "eff_" + "1" * 4000]
)
def test_an_archive_line_with_an_id_openonce_never_makes_is_refused(
    store, tmp_path, bad_id
) -> None:
    """A foreign or edited archive: an id with a slash would come back as an effect that
    no console link can name (the effects list would fail to render)."""
    _, _, _, doc = _archive_one(store, tmp_path)
    forged = json.loads(json.dumps(doc))
    forged["effect"]["id"] = bad_id
    crafted = _write_archive(tmp_path / "forged.jsonl.gz", [doc, forged])
    with pytest.raises(ArchiveError, match=r"line 2: effect id .* is not one OpenOnce makes"):
        import_archive(store, crafted)
    assert store.get(doc["effect"]["id"]) is None  # the good first line was not imported


def test_an_archive_cut_short_imports_its_whole_lines(store, tmp_path) -> None:
    _, _, path, doc = _archive_one(store, tmp_path)
    with open(path, "rb") as f:
        whole = f.read()
    cut = tmp_path / "cut.jsonl.gz"
    # A second batch whose write was cut short by a crash: its delete never committed.
    cut.write_bytes(whole + gzip.compress(b'{"archive_format": 1, "effect"')[:-9])
    report = import_archive(store, cut)
    assert (report.effects, report.truncated) == (1, True)
    assert store.get(doc["effect"]["id"]) is not None


def test_a_dry_run_counts_and_changes_nothing(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-1")
    agent.refund("o-2")
    age(agent)
    before = store.list_effects()
    report = run(store, clock, tmp_path / "never", dry_run=True)
    assert (report.effects, report.journal_lines, report.dry_run) == (2, 4, True)
    assert "would archive 2 effect(s)" in str(report)
    assert store.list_effects() == before
    assert not (tmp_path / "never").exists()
    assert find_tombstone(store, "stripe.refund", before[0].idempotency_key) is None


def test_a_run_stops_at_its_limit_and_says_more_is_left(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock)
    for n in range(5):
        agent.refund(f"o-{n}")
    clock.advance(91 * DAY)
    agent.refund("o-newest")  # holds the newest journal line (SQLite keeps it)
    policy = RetentionPolicy(older_than=90 * DAY, batch_size=2, max_batches=2)
    first = run(store, clock, tmp_path, policy=policy)
    assert (first.effects, first.batches, first.more) == (4, 2, True)
    rest = run(store, clock, tmp_path, policy=policy)
    assert (rest.effects, rest.more) == (1, False)
    assert [e.args["order"] for e in store.list_effects()] == ["o-newest"]


def test_bad_policies_and_an_unwritable_folder_change_nothing(store, tmp_path) -> None:
    for bad in (
        dict(older_than=0),
        dict(older_than=-1.0),
        dict(older_than=float("nan")),
        dict(older_than=DAY, batch_size=0),
        dict(older_than=DAY, batch_size=10**6),
        dict(older_than=DAY, pause=-1),
    ):
        with pytest.raises(ValueError):
            RetentionPolicy(**bad)  # type: ignore[arg-type]
    clock = FakeClock()
    Agent(store, clock).refund("o-1")
    clock.advance(91 * DAY)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ArchiveError, match="cannot create the archive folder"):
        run(store, clock, blocker / "sub")
    (effect,) = store.list_effects()
    assert find_tombstone(store, "stripe.refund", effect.idempotency_key) is None


def test_an_empty_ledger_archives_nothing(store, tmp_path) -> None:
    report = run(store, FakeClock(), tmp_path / "archives")
    assert (report.effects, report.batches, report.archives, report.more) == (0, 0, [], False)
    assert os.listdir(tmp_path / "archives") == []


# -- the SQL stores' own rules ----------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"], indirect=True)
def test_the_journal_stays_append_only_outside_the_retention(store, tmp_path) -> None:
    clock = FakeClock()
    agent = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    with pytest.raises(ApprovalPending) as info:
        agent.refund("o-1")
    agent.oo.approve(info.value.effect_id, by="maria")
    agent.refund("o-1")
    errors = (sqlite3.DatabaseError, psycopg.Error)
    conn = raw_connection(store)
    try:
        for stmt in (
            "DELETE FROM openonce_journal",
            "UPDATE openonce_journal SET reason = 'x'",
            "DELETE FROM openonce_approvals",
        ):
            with pytest.raises(errors, match="append-only"):
                conn.execute(stmt)
    finally:
        conn.close()

    # Inside the retention's own transaction an UPDATE is refused all the same.
    with pytest.raises(errors, match="append-only"):
        store.retention_write(lambda cur: cur.run("UPDATE openonce_journal SET reason = 'x'"))
    (effect,) = store.list_effects()
    assert len(store.journal(effect.id)) == 4 and len(store.approvals(effect.id)) == 1
    if store.dialect != "postgres":
        # The grant row never outlives the retention's transaction.
        conn = raw_connection(store)
        assert conn.execute("SELECT count(*) FROM openonce_retention_grant").fetchone() == (0,)
        conn.close()


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"], indirect=True)
def test_sqlite_keeps_the_effect_holding_the_newest_journal_line(store, tmp_path) -> None:
    # The newest line is old only after the clock stepped back (ages are measured from
    # the ledger's newest change): o-2 is written last, 91 days before young-1.
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-1")
    clock.advance(91 * DAY)
    agent.refund("young-1")
    clock.step(-91 * DAY)
    agent.refund("o-2")
    newest = agent.effect_of("o-2")
    top = store.journal(newest.id)[-1].seq
    clock.step(91 * DAY)

    first = run(store, clock, tmp_path)
    assert (first.effects, first.kept) == (1, 1)
    assert store.get(newest.id) is not None
    assert find_tombstone(store, "stripe.refund", newest.idempotency_key) is None

    agent.refund("o-3")  # a new line above the kept one: its number was never handed out
    assert store.journal(agent.effect_of("o-3").id)[0].seq == top + 1
    clock.advance(91 * DAY)
    second = run(store, clock, tmp_path)
    assert (second.effects, second.kept) == (1, 0)  # o-3 is young beside young-1
    assert store.get(newest.id) is None


def test_candidates_are_read_through_the_state_index(store) -> None:
    query = (
        "SELECT id, tool, idempotency_key, fence, updated_at FROM openonce_effects"
        " WHERE state = ? AND updated_at < ? AND (updated_at, id) > (?, ?)"
        " ORDER BY updated_at, id LIMIT ?"
    )
    params = ("committed", 1.0, float("-inf"), "", 500)
    if store.dialect == "postgres":
        conn = raw_connection(store)
        try:
            conn.execute("SET enable_seqscan = off")  # an empty table: ask what it can use
            plan = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + query.replace("?", "%s"), params)
            )
        finally:
            conn.close()
        assert "openonce_effects_state_updated" in plan and "Sort" not in plan
    else:
        plan = "\n".join(str(r[-1]) for r in store._all("EXPLAIN QUERY PLAN " + query, params))
        assert "openonce_effects_state_updated" in plan and "TEMP B-TREE" not in plan


@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)
def test_postgres_deletes_only_after_older_statements_end(store, tmp_path) -> None:
    """An insert that took its snapshot before the tombstones committed could miss them,
    wait for the delete, and go through: the batch waits for such statements first, and
    leaves its effects for a later run when they outlast the wait."""
    clock = FakeClock()
    agent = Agent(store, clock)
    agent.refund("o-1")
    age(agent)
    holder, waiter = raw_connection(store), raw_connection(store)
    try:
        with statement_held(holder, waiter, 4242):
            assert store.wait_for_older_statements(0.05) is False
            import openonce_core._retention as retention

            original, retention.BARRIER_SECONDS = retention.BARRIER_SECONDS, 0.05
            try:
                report = run(store, clock, tmp_path)
            finally:
                retention.BARRIER_SECONDS = original
            assert (report.effects, report.kept) == (0, 1)
            effect = agent.effect_of("o-1")
            assert find_tombstone(store, "stripe.refund", effect.idempotency_key) is None
        assert store.wait_for_older_statements(10) is True
        assert run(store, clock, tmp_path).effects == 1
    finally:
        holder.close()
        waiter.close()
