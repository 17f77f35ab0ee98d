"""The notifier runs every 5 s all day: each query it sends is answered by an index range
of what is new or due, never by a walk through the journal's history (issue 19).

The notifier runs as beat runs it, over a ledger with a waiting effect; every statement it
sends is captured (``CaptureQueriesContext``) and explained on the same connection. On
Postgres with ``enable_seqscan = off`` a plan must still name the index expected for its
table (a query no index can answer shows a Seq Scan, whatever the setting); on SQLite no
table or index may be scanned whole and nothing sorted in a temporary b-tree. SQLite runs
in a subprocess: the test process's Django is on Postgres.

With no channel configured a tick reads one line of the journal, the newest, to move its
cursor there: a channel turned on later is told from then on, not flooded with history.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-for-signing-webhooks"

# The indexes each table's queries may use (Postgres); a plan naming none of them fails.
PG_INDEXES = {
    "openonce_journal": ("openonce_journal_seq", "openonce_journal_pkey"),
    "openonce_effects": ("openonce_effects_pkey", "openonce_effects_id_prefix"),  # by id
    # Its key, or the key's text_pattern_ops twin Django adds to a CharField key.
    "notifications_journalcursor": ("notifications_journalcursor_pkey", "_name_"),
    "notifications_delivery": (
        "delivery_due", "notifications_delivery_pkey", "delivery_once", "delivery_digest_waiting",
        "delivery_digest",
    ),
    "notifications_digest": ("digest_due", "notifications_digest_pkey", "digest_once"),
}  # fmt: skip


# -- what the notifier sends (run in this process on Postgres, in a subprocess on SQLite) --


def channel(url: str, **more: Any) -> Any:
    return override_settings(
        OPENONCE_NOTIFY=json.dumps(
            [{"name": "hook", "kind": "webhook", "url": url + "/hook", "secret": SECRET, **more}]
        ),
        OPENONCE_CONSOLE_URL="https://console.test",
        OPENONCE_NOTIFY_ALLOW_PRIVATE=True,  # the receiver listens on 127.0.0.1
    )


def no_channel() -> Any:
    return override_settings(OPENONCE_NOTIFY="")


def waiting_effects(n: int) -> None:
    """``n`` refunds waiting for approval, made as an agent makes them."""
    from ledger import clients as site_ledger
    from openonce_core import ApprovalPending, OpenOnce, require_approval_for

    oo = OpenOnce(site_ledger.get_openonce().store, policy=require_approval_for(["stripe.*"]))
    refund = oo.effect(
        lambda charge: None, tool="stripe.refund", idempotency_key=lambda charge: charge
    )
    for _ in range(n):
        with pytest.raises(ApprovalPending):
            refund(f"ch_{time.time_ns()}")


def delivered_long_ago(n: int) -> None:
    """``n`` messages sent long ago, and on Postgres the statistics autovacuum keeps: the
    planner then prices each query as it will in production, not on an empty table.
    (Nothing runs ANALYZE on a SQLite ledger; its planner goes by the schema alone.)"""
    from django.db import connection

    from notifications.models import Delivery

    Delivery.objects.bulk_create(
        Delivery(
            effect_id=f"eff_old_{i}", journal_seq=i, event="requires_approval", tool="t",
            channel="old", kind="webhook", destination="https://old.example/…",
            status=Delivery.SENT, next_attempt_at=i, created_at=i, sent_at=i,
        )
        for i in range(n)
    )  # fmt: skip
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def newest_seq() -> int:
    from ledger.models import JournalEntry

    return int(JournalEntry.objects.order_by("-seq").values_list("seq", flat=True)[0])


def cursor_seq() -> int:
    from notifications.models import JournalCursor

    return JournalCursor.objects.get(name="notify").seq


def captured(block: Any) -> list[str]:
    """The statements ``block()`` sent, transaction control left out."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        block()
    verbs = ("SELECT", "INSERT", "UPDATE", "DELETE")
    return [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().startswith(verbs)]


def explain(sql: str) -> str:
    """The plan of ``sql`` on the connection that sent it; on Postgres with sequential
    scans priced out, so only a query no index can serve still shows one."""
    from django.db import connection, transaction

    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return "\n".join(row[-1] for row in cursor.fetchall())
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def observe(url: str, later: float) -> dict[str, Any]:
    """Beat's ticks over a ledger with history, first without a channel and then with
    one; what each sent, its plans, and where the cursor stood."""
    from notifications import dispatch

    seen: dict[str, Any] = {}
    waiting_effects(3)  # history from before the notifier ran
    delivered_long_ago(2000)
    with no_channel():
        seen["idle_first"] = captured(lambda: dispatch.tick(now=later))
        seen["idle_first_cursor"], seen["idle_first_newest"] = cursor_seq(), newest_seq()
        waiting_effects(2)  # nobody listening yet
        seen["idle"] = captured(lambda: dispatch.tick(now=later))
        seen["idle_cursor"], seen["idle_newest"] = cursor_seq(), newest_seq()
    with channel(url):
        reports = []
        seen["on"] = captured(lambda: reports.append(dispatch.tick(now=later)))
        waiting_effects(1)
        seen["busy"] = captured(lambda: reports.append(dispatch.tick(now=later)))
    seen["reports"] = [[r.read, r.owed, r.sent, r.failed] for r in reports]
    from notifications.models import JournalCursor

    JournalCursor.objects.all().delete()  # a first run, with a channel
    with channel(url):
        seen["first"] = captured(lambda: dispatch.tick(now=later))
    with channel(url, digest=1):  # a digest: owed, then claimed and sent a second later
        waiting_effects(1)  # one: the plans of a burst's statements are the same
        seen["digest_owed"] = captured(lambda: dispatch.tick(now=later))
        seen["digest_sent"] = captured(lambda: reports.append(dispatch.tick(now=later + 2)))
    seen["digest_report"] = [reports[-1].owed, reports[-1].sent]
    phases = ("idle_first", "idle", "on", "busy", "first", "digest_owed", "digest_sent")
    statements = {sql for key in phases for sql in seen[key]}
    seen["plans"] = {sql: explain(sql) for sql in statements}
    return seen


SCRIPT = textwrap.dedent(
    """
    import json, sys, django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    from tests.support.fake_http import WebhookReceiver
    from tests.webconsole.test_notify_plans import observe
    receiver = WebhookReceiver()
    try:
        print(json.dumps(observe(receiver.url, float(sys.argv[1]))))
    finally:
        receiver.close()
    """
)


@pytest.fixture(scope="module")
def sqlite_seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.test",
        "OPENONCE_DATABASE": str(tmp_path_factory.mktemp("notify") / "ledger.db"),
        "PYTHONPATH": str(ROOT),
    }
    later = str(time.time() + 3600)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, later], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]), vendor="sqlite")


@pytest.fixture(params=["postgres", "sqlite"])
def seen(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_seen")
        return
    from test_console_views import fresh_ledger

    from tests.support.fake_http import WebhookReceiver

    request.getfixturevalue("transactional_db")
    receiver = WebhookReceiver()
    ledger = fresh_ledger()
    next(ledger)
    try:
        # An hour on: any gap in the journal's numbers has settled.
        yield dict(observe(receiver.url, time.time() + 3600), vendor="postgres")
    finally:
        receiver.close()
        next(ledger, None)


# -- the plans -----------------------------------------------------------------------------


def table_of(sql: str) -> str:
    for table in PG_INDEXES:
        if f'"{table}"' in sql:
            return table
    raise AssertionError(f"a statement on a table this test does not know: {sql}")


def assert_indexed(vendor: str, sql: str, plan: str) -> None:
    if vendor == "sqlite":
        lines = [line.strip() for line in plan.splitlines()]
        scans = [
            line
            for line in lines
            if (line.startswith("SCAN") and "INDEX delivery_digest_waiting" not in line)
            or "TEMP B-TREE" in line
        ]
        assert scans == [], f"{sql}\n{plan}"
        return
    # An index walked end to end (for its order, or to filter every entry) is a scan
    # too: each index node must have a range or an equality to start from.
    # Only delivery_due, digest_due and delivery_digest_waiting may be walked whole: they
    # hold what is pending or waits for a digest, and nothing else.
    nodes = re.split(r"\n\s*->", plan)
    walks = [
        n
        for n in nodes
        if "Seq Scan" in n
        or (
            "Index" in n
            and "Index Cond" not in n
            and "using delivery_due " not in n
            and "using digest_due " not in n
            and "using delivery_digest_waiting " not in n
        )
    ]
    assert walks == [], f"{sql}\n{plan}"
    if sql.startswith("INSERT"):
        return  # no read: a conflict is found through the unique index it names
    assert any(name in plan for name in PG_INDEXES[table_of(sql)]), f"{sql}\n{plan}"


def test_every_query_of_a_tick_is_answered_by_an_index(seen: dict[str, Any]) -> None:
    plans = seen["plans"]
    assert len(plans) >= 8  # cursor, newest line, new lines, effects, deliveries ...
    for sql, plan in plans.items():
        assert_indexed(seen["vendor"], sql, plan)


def test_the_new_lines_and_the_newest_line_are_read_through_seq(seen: dict[str, Any]) -> None:
    """``seq > cursor ORDER BY seq`` and the newest line: openonce_journal_seq on
    Postgres (schema v5), the rowid on SQLite."""
    journal = [sql for sql in seen["plans"] if '"openonce_journal"' in sql]
    new_lines = [sql for sql in journal if '"seq" >' in sql]
    newest = [sql for sql in journal if "MAX(" in sql.upper()]
    assert new_lines and newest
    for sql in new_lines + newest:
        plan = seen["plans"][sql]
        if seen["vendor"] == "postgres":
            assert "openonce_journal_seq" in plan, plan
        else:
            assert plan.strip().startswith("SEARCH openonce_journal"), plan


def test_a_message_reads_its_one_line_by_the_journal_key(seen: dict[str, Any]) -> None:
    """``_message`` looked its line up by seq alone: a walk through the journal per
    delivery on a Postgres without a seq index. It asks by (effect_id, seq)."""
    by_line = [sql for sql in seen["plans"] if '"openonce_journal"' in sql and '"seq" =' in sql]
    assert by_line
    for sql in by_line:
        assert '"effect_id" =' in sql
        plan = seen["plans"][sql]
        if seen["vendor"] == "postgres":  # the key (effect_id, seq), or the seq index
            assert re.search(r"Index Cond: .*\bseq = ", plan), plan
        else:
            assert "USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan


def test_a_digest_is_claimed_and_sent_through_its_indexes(seen: dict[str, Any]) -> None:
    """The waiting deliveries by delivery_digest_waiting (channel, created_at), the claim
    an insert checked by digest_once, the digest's deliveries by its key's index."""
    assert seen["digest_report"] == [0, 1]  # the waiting refund: one message
    sent = seen["digest_sent"]
    waiting = [sql for sql in sent if "\"status\" = 'digest'" in sql and "UPDATE" not in sql]
    assert waiting and all("delivery_digest_waiting" in seen["plans"][sql] for sql in waiting)
    assert any(sql.startswith('INSERT INTO "notifications_digest"') for sql in sent)
    # Its list, and its outcome written to its deliveries (not the claim's SET digest_id).
    listed = [sql for sql in sent if 'WHERE "notifications_delivery"."digest_id" =' in sql]
    assert len(listed) == 2
    assert all("delivery_digest " in seen["plans"][sql] for sql in listed)


def test_what_waits_for_a_digest_no_longer_configured_is_found_by_its_index(
    seen: dict[str, Any],
) -> None:
    """Every tick hands back what waits for a digest its channel no longer has: an
    update through delivery_digest_waiting, which holds only what waits, never a walk
    of the deliveries."""
    release = [
        sql for sql in seen["plans"]
        if sql.startswith("UPDATE") and '"status" = \'digest\'' in sql and "created_at" not in sql
    ]  # fmt: skip
    assert release
    for sql in release:
        assert "delivery_digest_waiting" in seen["plans"][sql], seen["plans"][sql]


def test_the_due_deliveries_are_read_through_delivery_due(seen: dict[str, Any]) -> None:
    due = [sql for sql in seen["plans"] if '"next_attempt_at" <=' in sql]
    assert {table_of(sql) for sql in due} == {"notifications_delivery", "notifications_digest"}
    for sql in due:
        index = "delivery_due" if table_of(sql) == "notifications_delivery" else "digest_due"
        assert index in seen["plans"][sql]


# -- no channel ----------------------------------------------------------------------------


def journal_reads(statements: list[str]) -> list[str]:
    return [sql for sql in statements if "openonce_journal" in sql]


def test_with_no_channel_a_tick_reads_only_the_newest_line(seen: dict[str, Any]) -> None:
    for key in ("idle_first", "idle"):
        [read] = journal_reads(seen[key])  # the first run too: one read, not two
        assert "MAX(" in read.upper() and '"seq" >' not in read
    # ... and moves the cursor to it.
    assert seen["idle_first_cursor"] == seen["idle_first_newest"]
    assert seen["idle_cursor"] == seen["idle_newest"] > seen["idle_first_newest"]


def test_a_channel_turned_on_later_is_told_from_then_on(seen: dict[str, Any]) -> None:
    """Five refunds waited while no channel was configured: the channel turned on is not
    flooded with them; the one that starts waiting afterwards is announced once."""
    on, busy = seen["reports"]
    assert on == [0, 0, 0, 0]  # read, owed, sent, failed
    assert busy[1:] == [1, 1, 0] and busy[0] >= 1


def test_a_first_run_with_a_channel_reads_the_newest_line_then_the_new_ones(
    seen: dict[str, Any],
) -> None:
    reads = journal_reads(seen["first"])
    assert len(reads) == 2
    assert "MAX(" in reads[0].upper() and '"seq" >' in reads[1]


# -- no channel, the edges (Postgres, in this process) -------------------------------------


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Any]:
    from test_console_views import fresh_ledger

    yield from fresh_ledger()


def test_an_idle_tick_never_moves_the_cursor_back(agent: Any) -> None:
    """Two ticks at once: the one that read an older newest line commits last."""
    from notifications import dispatch
    from notifications.models import JournalCursor

    waiting_effects(1)
    ahead = newest_seq() + 50
    JournalCursor.objects.create(name="notify", seq=ahead)
    with no_channel():
        dispatch.tick()
    assert cursor_seq() == ahead


def test_on_an_empty_journal_the_first_line_written_is_the_start(agent: Any) -> None:
    from notifications import dispatch
    from tests.support.fake_http import WebhookReceiver

    receiver = WebhookReceiver()
    try:
        with no_channel():
            dispatch.tick()
        assert cursor_seq() == -1
        waiting_effects(1)
        with channel(receiver.url):
            report = dispatch.tick(now=time.time() + 3600)
    finally:
        receiver.close()
    assert (report.owed, report.sent) == (1, 1)


def test_a_delivery_owed_to_a_channel_since_removed_is_given_up(agent: Any) -> None:
    """Turning the last channel off still settles what was owed, through delivery_due."""
    from notifications import dispatch
    from notifications.models import Delivery

    with channel("http://127.0.0.1:9"):
        dispatch.tick()
        waiting_effects(1)
        assert dispatch.scan(now=time.time() + 3600)[1] == 1
    with no_channel():
        statements = captured(lambda: dispatch.tick(now=time.time() + 3600))
    [delivery] = Delivery.objects.all()
    assert (delivery.status, delivery.last_error) == (
        "failed",
        "the channel is no longer configured",
    )
    assert len(journal_reads(statements)) == 1
