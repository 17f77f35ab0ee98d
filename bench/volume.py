"""Every loop that runs all day, on an empty ledger and on a year of history, in one run.

On this machine, in two Postgres databases of the script's own (``NAME_empty`` and ``NAME``,
``--database`` defaulting to ``openonce_volume``; dropped and created at the start,
dropped at the end unless ``--keep``), each migrated by Django's ``migrate``:

1. both get the *working set* every ledger has, young or old: ``--backoff`` (20,000)
   UNKNOWN ``stripe.charge`` effects in probe backoff (``next_probe_at`` ahead, the failed
   probes in their evidence, as the reconciler writes them), 150 refunds waiting for
   approval and 50 effects in human review;
2. the full one gets ``--effects`` (1,000,000) effects of history, written by
   ``INSERT ... SELECT`` over ``generate_series`` (never through the Python API) and shaped
   as the core writes them: 93.5% committed (claim and finish lines), 3% refunds approved
   by an operator then committed (4 lines, an approval), 2% failed, 1% released and 0.5%
   denied, created evenly over the last 365 days; then both get ``VACUUM (ANALYZE)`` and a
   ``CHECKPOINT``, and their working set's backoff is re-armed;
3. each figure is taken on the two ledgers in turns, so a busy moment of the machine lands
   on both: new effects/s through the real ``OpenOnce`` decorator (``bench/hotpath.py``'s),
   the notifier's tick (``notifications.dispatch.tick``, a few new effects before each),
   a ``/metrics`` scrape, the daemon's ``due()`` over the working set, the console's queue
   and two effect lists (``bench/console.py``'s timing), through Django in this process;
4. the full ledger's bytes per effect, per table and per index;
5. the retention (``openonce_core._retention``) archives the ``--archive`` (20,000) oldest
   effects of the full ledger in another process, with the daily task's default policy
   (paced), while this one creates new effects on both ledgers in turns: its effects
   archived per second, the hot path's rate meanwhile (pairs that ran wholly during it),
   and after it, through the same sessions.

The budget (issue 19): every figure on the full ledger within 1.2x of the empty one. Usage::

    python bench/volume.py [--effects N] [--quick] [--archive N] [--backoff N]
        [--pg-dsn DSN] [--database NAME] [--keep]

The Postgres DSN (a database to connect to for ``CREATE DATABASE``) defaults to
``$OPENONCE_BENCH_PG``, then to ``postgresql://root@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The project root before bench/: bench/console.py must not shadow the Django app of the
# same name.
sys.path.insert(0, ROOT)


def bench_module(name: str) -> ModuleType:
    """bench/NAME.py as ``bench_NAME``, leaving ``NAME`` to the project's app of that name."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(HERE, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BENCH_LEDGER = bench_module("hotpath")
Handler, Keys, open_pg = BENCH_LEDGER.Handler, BENCH_LEDGER.Keys, BENCH_LEDGER.open_pg
make_effect, ours_new = BENCH_LEDGER.make_effect, BENCH_LEDGER.ours_new
code_revision, say = BENCH_LEDGER.code_revision, BENCH_LEDGER.say
database_url = bench_module("daemon").database_url

DEFAULT_PG = "postgresql://root@127.0.0.1:5432/test"
DAY = 86400.0
SPAN = 365 * DAY  # the history was created over the last year ...
NEWEST = 3600.0  # ... up to an hour ago
BUDGET = 1.2  # full / empty, for every figure (a rate: empty / full)
INGEST = 10_000_000 / DAY  # effects per second at 10 million a day
RETENTION_DAYS = 90  # the policy the growth projection assumes
MAX_BACKOFF = 900.0  # openonce_core._reconcile.MAX_BACKOFF: the longest pause between probes
QUEUE_ROWS = 100  # console.selectors.QUEUE_LIMIT
LIST_ROWS = 50  # effects per list page
TABLES = ("openonce_effects", "openonce_journal", "openonce_approvals", "openonce_tombstones")
TERMINAL = ("committed", "failed", "denied", "cancelled", "released")  # states.TERMINAL


@dataclass
class Sizes:
    """How much of each measure a run takes."""

    calls: int  # new effects per hot-path round
    rounds: int  # hot-path rounds per ledger
    turns: int  # each other measure alternates between the two ledgers this many times ...
    runs: int  # ... timing this many ticks, scrapes, due() calls or page requests in all
    warmup: int = 2  # untimed calls before each turn's timed ones
    tick_effects: int = 5  # new effects before each timed notifier tick


# 160 timed runs a measure: its p95 is the 8th slowest, so one busy moment of the machine
# does not decide a verdict (at 40 runs, one in 20 did: a row of equal medians read 1.35x).
FULL = Sizes(calls=1000, rounds=4, turns=8, runs=160)
QUICK = Sizes(calls=100, rounds=2, turns=2, runs=4, warmup=1)


# -- filling --------------------------------------------------------------------------------

# One row per effect with everything its row, journal lines and approvals are made of.
# @...@ are replaced before the statement is sent (no parameters: the % of format() must
# reach Postgres untouched). @STATE@ picks each effect's state from i (its rank, 1..@N@) and
# k (n % 1000); @CREATED@ its creation time. stripe.refund waits for an approval.
SEED_SQL = """
CREATE TEMP TABLE seed AS
WITH b AS (
    SELECT i, @FIRST@ + i AS n, (@FIRST@ + i) % 1000 AS k,
        random() AS r1, random() AS r2, random() AS r3, random() AS r4
    FROM generate_series(1, @N@) AS i
), s AS (
    SELECT b.*, @STATE@ AS state FROM b
), t AS (
    SELECT s.*,
        CASE WHEN state IN ('requires_approval', 'released', 'denied', 'approved_committed')
                  THEN 'stripe.refund'
             WHEN state IN ('unknown', 'human_review') OR r1 < 0.40 THEN 'stripe.charge'
             WHEN r1 < 0.70 THEN 'email.send'
             WHEN r1 < 0.85 THEN 'github.create_pr'
             ELSE 'slack.post_message' END AS tool,
        @CREATED@ AS created_at,
        'eff_' || md5('effect:' || n) AS id,
        'agent:worker-' || (n % 6) || ':' || (4000 + (n / 20000) % 300) || ':4026531836.'
            || (900000 + n / 20000) || '.' || left(md5('token:' || (n / 20000)), 12) AS actor,
        (ARRAY['alice', 'bob', 'carol', 'dmitri'])[1 + n % 4] AS operator
    FROM s
), u AS (
    SELECT t.*,
        state = 'approved_committed' OR tool = 'stripe.refund' AS gated,
        CASE WHEN tool IN ('email.send', 'github.create_pr') OR r3 < 0.5
             THEN 'run_' || md5('run:' || (n / 25)) END AS scope,
        CASE tool
            WHEN 'stripe.charge' THEN format(
                '{"amount":%s,"currency":"usd","customer":"cus_%s","order_id":"ord_%s"}',
                500 + (r4 * 20000)::int, lpad((n % 50000)::text, 6, '0'), n)
            WHEN 'stripe.refund' THEN format(
                '{"charge":"ch_%s","amount":%s,"reason":"requested_by_customer"}',
                left(md5('ch:' || n), 24), 500 + (r4 * 5000)::int)
            WHEN 'email.send' THEN format(
                '{"to":"customer%s@example.com","subject":"Your receipt for order ord_%s",'
                '"template":"receipt"}', n % 50000, n)
            WHEN 'github.create_pr' THEN format(
                '{"owner":"acme","repo":"%s","head":"agent/fix-%s","base":"main",'
                '"title":"Fix flaky test #%s"}', (ARRAY['web', 'api', 'infra', 'docs'])[1 + n % 4],
                n, n)
            ELSE format('{"channel":"#ops","text":"Incident %s resolved"}', n)
        END AS args_json,
        created_at + 60 + r3 * 3600 AS approved_at,
        created_at + 300 + r3 * 7200 AS decided_at
    FROM t
), v AS (
    SELECT u.*,
        CASE tool
            WHEN 'stripe.charge' THEN 'charge:ord_' || n
            WHEN 'stripe.refund' THEN 'refund:ord_' || n
            WHEN 'slack.post_message' THEN 'incident-' || n
            -- derived from the run scope and the arguments' digest, as the core derives it
            ELSE encode(sha256(convert_to(coalesce(scope, ''), 'UTF8') || '\\x00'::bytea
                               || convert_to(args_json, 'UTF8')), 'hex')
        END AS idempotency_key,
        CASE WHEN gated THEN approved_at + 0.02 ELSE created_at + 0.001 END AS claim_at
    FROM u
)
SELECT v.*,
    'sha256:' || encode(sha256(convert_to(args_json, 'UTF8')), 'hex') AS fingerprint,
    'oo_' || left(encode(sha256(convert_to(tool, 'UTF8') || '\\x00'::bytea
                                || convert_to(idempotency_key, 'UTF8')), 'hex'), 40)
        AS provider_key,
    claim_at + CASE WHEN state IN ('committed', 'approved_committed') THEN 0.2 + r4 * 1.8
                    WHEN state = 'failed' THEN 0.1 + r4 ELSE 30.0 END AS finish_at,
    -- the working set's UNKNOWN effects were last asked about within the last 5 minutes
    @NOW@ - r3 * 300 AS reprobe_at
FROM v
"""

# History: by n % 1000, exact shares. The working set: by rank.
HISTORY_STATE = """CASE WHEN k < 20 THEN 'failed' WHEN k < 30 THEN 'released'
    WHEN k < 35 THEN 'denied' WHEN k < 65 THEN 'approved_committed' ELSE 'committed' END"""
HISTORY_CREATED = "@T0@ + (i - 1 + r2) * @STEP@"
WORKING_STATE = """CASE WHEN i <= @BACKOFF@ THEN 'unknown'
    WHEN i <= @BACKOFF@ + 150 THEN 'requires_approval' ELSE 'human_review' END"""
WORKING_CREATED = "@NOW@ - 7200 + r2 * 3600"

_TIMEOUT = (
    '{"type":"builtins.TimeoutError","message":"The read operation timed out",'
    '"args":["The read operation timed out"],"class":"unknown"}'
)
_FAILED = (
    '{"type":"stripe.error.CardError","message":"Your card was declined.",'
    '"args":["Your card was declined."],"class":"failed"}'
)
_RESULT = """CASE tool
    WHEN 'stripe.charge' THEN '{"stripe_id":"ch_' || left(md5('ch:' || n), 24)
        || '","status":"succeeded"}'
    WHEN 'stripe.refund' THEN '{"stripe_id":"re_' || left(md5('re:' || n), 24)
        || '","status":"succeeded"}'
    WHEN 'email.send' THEN '{"message_id":"<' || provider_key || '@mail.acme.example>"}'
    WHEN 'github.create_pr' THEN '{"number":' || (n % 100000) || ',"head":"agent/fix-' || n
        || '","url":"https://github.com/acme/web/pull/' || (n % 100000) || '"}'
    ELSE '{"ok":true,"channel":"C024BE91L","ts":"' || round(finish_at::numeric, 6) || '"}' END"""
# The evidence the reconciler keeps after a failed probe (reconcile.py, _reprobe).
_BACKOFF_EVIDENCE = (
    """'{"probe_failures":{"attempt":1,"count":8,"since":' || (finish_at + 120) || ',"wait":"""
    + f"{MAX_BACKOFF:g}"
    + """,'
    || '"attempts":[{"at":' || reprobe_at || ',"detail":"StripeProber: 503 Service Unavailable",'
    || '"provider":"stripe","status":503}]}}'"""
)

EFFECTS_SQL = f"""
INSERT INTO openonce_effects (id, tool, idempotency_key, scope, state, args_json,
    args_fingerprint, provider_key, attempt, max_attempts, fence, lease_owner, lease_expires_at,
    approvals_required, approval_ttl, execution_status, execution_evidence_json,
    verification_status, verification_evidence_json, result_json, error_json, created_at,
    updated_at, next_probe_at)
SELECT id, tool, idempotency_key, scope,
    CASE state WHEN 'approved_committed' THEN 'committed' ELSE state END,
    args_json, fingerprint, provider_key,
    CASE WHEN state IN ('requires_approval', 'released', 'denied') THEN 0 ELSE 1 END,
    3,
    -- a claim writes fence 1, an approval request fence 0; every later move adds one
    CASE state WHEN 'approved_committed' THEN 3 WHEN 'requires_approval' THEN 0
               WHEN 'released' THEN 1 WHEN 'denied' THEN 1 ELSE 2 END
        + CASE WHEN state IN ('unknown', 'human_review') THEN 1 ELSE 0 END,
    NULL, NULL,
    CASE WHEN gated THEN 1 ELSE 0 END,
    NULL,
    CASE WHEN state IN ('committed', 'approved_committed') THEN 'returned'
         WHEN state = 'failed' THEN 'failed'
         WHEN state IN ('unknown', 'human_review') THEN 'unknown' END,
    CASE WHEN state IN ('committed', 'approved_committed') THEN '{{"attempt":1}}'
         WHEN state = 'failed' THEN '{{"attempt":1,"error":{_FAILED}}}'
         WHEN state IN ('unknown', 'human_review') THEN '{{"attempt":1,"error":{_TIMEOUT}}}'
    END,
    CASE WHEN state = 'human_review' THEN 'needs_human' END,
    CASE WHEN state = 'unknown' THEN {_BACKOFF_EVIDENCE}
         WHEN state = 'human_review' THEN '{{"observations":[{{"prober":"StripeProber",'
             || '"outcome":"inconclusive","detail":"provider search index is lagging"}}]}}'
    END,
    CASE WHEN state IN ('committed', 'approved_committed') THEN {_RESULT} END,
    CASE WHEN state = 'failed' THEN '{_FAILED}'
         WHEN state IN ('unknown', 'human_review') THEN '{_TIMEOUT}' END,
    created_at,
    CASE WHEN state IN ('committed', 'approved_committed', 'failed') THEN finish_at
         WHEN state IN ('released', 'denied') THEN decided_at
         WHEN state = 'unknown' THEN reprobe_at
         WHEN state = 'human_review' THEN finish_at + 300
         ELSE created_at END,
    CASE WHEN state = 'unknown' THEN reprobe_at + {MAX_BACKOFF} END
FROM seed ORDER BY i
"""

# Every line the agent, an operator or the reconciler writes for these states, in time
# order, so seq follows at as it does in production.
JOURNAL_SQL = f"""
INSERT INTO openonce_journal (effect_id, at, from_state, to_state, actor, reason,
    evidence_json, action)
SELECT effect_id, at, from_state, to_state, actor, reason, evidence_json, action FROM (
    SELECT id AS effect_id, created_at AS at, 'planned' AS from_state,
        'requires_approval' AS to_state, actor, 'tool matches stripe.refund' AS reason,
        NULL::text AS evidence_json, 'request_approval' AS action
    FROM seed WHERE gated
    UNION ALL
    SELECT id, approved_at, 'requires_approval', 'approved', 'operator:' || operator, '',
        '{{"approvals":1,"required":1}}', 'approve'
    FROM seed WHERE state = 'approved_committed'
    UNION ALL
    SELECT id, claim_at, CASE WHEN gated THEN 'approved' ELSE 'planned' END, 'started', actor,
        '', '{{"attempt":1}}', CASE WHEN gated THEN 'start' ELSE 'claim' END
    FROM seed WHERE state IN ('committed', 'approved_committed', 'failed', 'unknown',
                              'human_review')
    UNION ALL
    SELECT id, finish_at, 'started',
        CASE WHEN state IN ('committed', 'approved_committed') THEN 'committed'
             WHEN state = 'failed' THEN 'failed' ELSE 'unknown' END,
        actor,
        CASE WHEN state IN ('committed', 'approved_committed') THEN ''
             WHEN state = 'failed' THEN 'stripe.error.CardError'
             ELSE 'may have happened: builtins.TimeoutError' END,
        CASE WHEN state IN ('committed', 'approved_committed') THEN '{{"attempt":1}}'
             WHEN state = 'failed' THEN '{{"attempt":1,"error":{_FAILED}}}'
             ELSE '{{"attempt":1,"error":{_TIMEOUT}}}' END,
        'finish'
    FROM seed WHERE state IN ('committed', 'approved_committed', 'failed', 'unknown',
                              'human_review')
    UNION ALL
    SELECT id, reprobe_at, 'unknown', 'unknown', 'reconciler:daemon',
        'provider unavailable (8/8): StripeProber: 503 Service Unavailable; asking again in '
            || {MAX_BACKOFF:g} || 's',
        '{{"probe_error":"StripeProber: 503 Service Unavailable","retry":8,"wait":'
            || {MAX_BACKOFF:g} || '}}',
        'reprobe'
    FROM seed WHERE state = 'unknown'
    UNION ALL
    SELECT id, finish_at + 300, 'unknown', 'human_review', 'reconciler:daemon',
        'probe inconclusive: provider search index is lagging',
        '{{"observations":[{{"prober":"StripeProber","outcome":"inconclusive"}}]}}', 'escalate'
    FROM seed WHERE state = 'human_review'
    UNION ALL
    SELECT id, decided_at, 'requires_approval', state, 'operator:' || operator,
        CASE state WHEN 'denied' THEN 'refund already issued by support'
                   ELSE 'agent run abandoned' END,
        NULL, CASE state WHEN 'denied' THEN 'deny' ELSE 'release' END
    FROM seed WHERE state IN ('released', 'denied')
) AS lines ORDER BY at
"""

APPROVALS_SQL = """
INSERT INTO openonce_approvals (effect_id, decision, decided_by, reason, args_fingerprint, at,
    expires_at)
SELECT effect_id, decision, decided_by, reason, fingerprint, at, NULL FROM (
    SELECT id AS effect_id, 'approve' AS decision, operator AS decided_by, '' AS reason,
        fingerprint, approved_at AS at
    FROM seed WHERE state = 'approved_committed'
    UNION ALL
    SELECT id, 'deny', operator, 'refund already issued by support', fingerprint, decided_at
    FROM seed WHERE state = 'denied'
) AS decisions ORDER BY at
"""

# Before each phase: the backoff starts again, so due() meets the same working set (in
# backoff for at least the next 10 minutes) whenever it runs.
REARM_SQL = f"""
UPDATE openonce_effects
SET updated_at = @NOW@ - random() * 300, next_probe_at = NULL
WHERE state = 'unknown';
UPDATE openonce_effects SET next_probe_at = updated_at + {MAX_BACKOFF} WHERE state = 'unknown'
"""


def _fill(sql: str, **values: float | int | str) -> str:
    for name, value in values.items():
        sql = sql.replace(f"@{name}@", value if isinstance(value, str) else repr(value))
    return sql


def seed(dsn: str, count: int, first: int, state: str, created: str, **values: float) -> float:
    """Add ``count`` effects, their journal lines and approvals; returns the seconds spent."""
    import psycopg

    now = time.time()
    values = {"N": count, "FIRST": first, "NOW": round(now, 3), **values}
    sql = _fill(SEED_SQL, STATE=_fill(state, **values), CREATED=_fill(created, **values))
    start = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        conn.execute("SET work_mem = '256MB'")
        conn.execute("SET synchronous_commit = off")  # the filling only; timings read
        for name, step in (("seed rows", sql), ("effects", EFFECTS_SQL),
                           ("journal", JOURNAL_SQL), ("approvals", APPROVALS_SQL)):  # fmt: skip
            began = time.perf_counter()
            rows = conn.execute(_fill(step, **values)).rowcount
            say(f"  {name}: {rows:,} rows, {time.perf_counter() - began:.1f} s")
        conn.execute("DROP TABLE seed")
    return time.perf_counter() - start


def settle(dsn: str, checkpoint: bool) -> float:
    """Re-arm the working set's backoff, then leave the tables as autovacuum would and
    write the dirty pages out before anything is timed."""
    import psycopg

    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_fill(REARM_SQL, NOW=round(time.time(), 3)))
        conn.execute("VACUUM (ANALYZE) " + ", ".join(TABLES))
        if checkpoint:
            conn.execute("CHECKPOINT")
    return time.perf_counter() - start


# -- measuring ------------------------------------------------------------------------------


@functools.cache
def console() -> ModuleType:
    """bench/console.py (``bench_console``)."""
    return bench_module("console")


@dataclass
class Row:
    """One measure on both ledgers: samples in ms (timings) or calls/s (rates)."""

    name: str
    unit: str  # "ms": its p95 counts (lower is better); "/s": its median (higher is better)
    samples: dict[str, list[float]] = field(default_factory=dict)  # phase -> samples

    def value(self, phase: str) -> float:
        values = self.samples.get(phase) or [math.nan]
        if self.unit == "ms":
            return float(console().percentile(values, 0.95))
        return statistics.median(values)

    @property
    def ratio(self) -> float:
        """How many times the empty ledger's cost the full ledger's is."""
        empty, full = self.value("empty"), self.value("full")
        return full / empty if self.unit == "ms" else empty / full


def timed(
    runs: int, call: Callable[[], Any], before: Callable[[], Any] | None = None, warmup: int = 2
) -> list[float]:
    """``runs`` timed calls (ms) after ``warmup`` untimed ones; ``before`` runs untimed
    before each."""
    samples = []
    for n in range(warmup + runs):
        if before is not None:
            before()
        gc.collect()
        start = time.perf_counter()
        call()
        if n >= warmup:
            samples.append((time.perf_counter() - start) * 1000)
    return samples


KEYS = Keys()  # one allocator for every client: no key is ever used twice


class HotPath:
    """New effects through the real decorator (bench/hotpath.py's handler and effect)."""

    def __init__(self, dsn: str) -> None:
        self.oo = open_pg(dsn)
        self.handler = Handler()
        self.send = make_effect(self.oo, self.handler)
        self.rate(50)  # warm-up: connections, prepared statements

    def rate(self, calls: int) -> float:
        return calls / ours_new(self.send, self.handler, KEYS.take(calls))

    def close(self) -> None:
        self.oo.close()


class Pages:
    """A signed-in viewer and bench/console.py's page timing."""

    def __init__(self, dsn: str) -> None:
        from django.contrib.auth.models import Group, User
        from django.test import Client

        from console.roles import sync_roles

        self.bench = console()
        group, _ = Group.objects.get_or_create(name="viewer")
        if not group.permissions.exists():
            sync_roles()
        user = User.objects.create_user("bench-viewer", password=uuid.uuid4().hex)
        user.groups.add(group)
        self.client = Client(SERVER_NAME="localhost")
        self.client.force_login(user)
        self.tick = self.bench.Ticker(dsn)  # a live reconciler for the health panel
        self.timer = self.bench.SqlTimer()

    def times(self, url: str, rows: int, runs: int, warmup: int) -> list[float]:
        from django.db import connection

        b = self.bench
        b.WARMUP = warmup  # type: ignore[attr-defined]  # its requests before the timed ones
        result = b.Result(url, "", url)
        check = b.rows_check(b.EFFECT_ROWS, rows)
        with connection.execute_wrapper(self.timer):
            b.measure(self.client, self.timer, self.tick, result, check, runs)
        return list(result.samples)

    def close(self) -> None:
        self.tick.close()


class Ledger:
    """One of the two databases and the clients that measure it. Django has one database,
    ``default``, and ``active`` points it here; the core's clients behind /metrics and
    due() (``ledger.clients``) are kept per database, so they follow."""

    def __init__(self, phase: str, name: str, admin_dsn: str) -> None:
        from psycopg.conninfo import make_conninfo

        self.phase, self.name = phase, name
        self.dsn = make_conninfo(admin_dsn, dbname=name)
        self._hot: HotPath | None = None
        self._pages: Pages | None = None

    @contextmanager
    def active(self) -> Iterator[Ledger]:
        from django.db import connections

        connection = connections["default"]
        if connection.settings_dict["NAME"] != self.name:
            connection.close()
            connection.close_pool()  # the pool (settings.base) would keep the old database
            connection.settings_dict["NAME"] = self.name
        yield self

    @property
    def hot(self) -> HotPath:
        if self._hot is None:
            self._hot = HotPath(self.dsn)
        return self._hot

    @property
    def pages(self) -> Pages:
        if self._pages is None:
            self._pages = Pages(self.dsn)
        return self._pages

    def close(self) -> None:
        for client in (self._hot, self._pages):
            if client is not None:
                client.close()
        self._hot = self._pages = None


def notifier_tick(ledger: Ledger, runs: int, warmup: int, effects: int) -> list[float]:
    """The beat's notifier tick, each after ``effects`` new effects (two lines each)."""
    from notifications import dispatch
    from notifications.models import JournalCursor

    # As if the notifier had kept up with the history: its first tick (untimed) starts at
    # the newest line.
    JournalCursor.objects.filter(name=dispatch.CURSOR).delete()
    read: list[int] = []
    samples = timed(
        runs, lambda: read.append(dispatch.tick().read), lambda: ledger.hot.rate(effects), warmup
    )
    if read[-1] != 2 * effects:
        raise AssertionError(f"a tick read {read[-1]} lines after {effects} new effects")
    return samples


def metrics_scrape(runs: int, warmup: int) -> list[float]:
    from django.conf import settings
    from django.test import Client

    client = Client(SERVER_NAME="localhost")
    headers = {"Authorization": f"Bearer {settings.OPENONCE_METRICS_TOKEN}"}

    def scrape() -> None:
        response = client.get("/metrics", headers=headers)
        if response.status_code != 200 or b"openonce_effects" not in response.content:
            raise AssertionError(f"/metrics answered {response.status_code}")

    return timed(runs, scrape, warmup=warmup)


def due_call(runs: int, warmup: int) -> list[float]:
    """The sweep's question, as the daemon asks it (its reconciler, its limit)."""
    from django.conf import settings

    from ledger.clients import get_reconciler

    reconciler = get_reconciler()
    found: list[int] = []
    limit = settings.OPENONCE_SWEEP_LIMIT
    samples = timed(runs, lambda: found.append(len(reconciler.due(limit))), warmup=warmup)
    if found[-1]:
        raise AssertionError(f"due() found {found[-1]} effects; the working set is in backoff")
    return samples


ROWS = {
    "new": "new effects/s (OpenOnce decorator)",
    "tick": "notifier tick p95",
    "metrics": "/metrics scrape p95",
    "due": "due() over {backoff} UNKNOWN in backoff p95",
    "queue": "console queue page p95",
    "list": "console effects list p95",
    "list_committed": "console list state=committed p95",
}
NOTIFY_CHANNEL = {
    "name": "bench",
    "kind": "email",
    "to": ["oncall@example.com"],
    "tools": ["stripe.*"],
}
DURING = "new effects/s while retention runs"
AFTER = "new effects/s after the retention"
RETENTION_RATE = "retention: effects archived/s"


def interleave(
    ledgers: list[Ledger], turns: int, one: Callable[[Ledger], list[float]]
) -> dict[str, list[float]]:
    """``turns`` turns per ledger, alternating which goes first: a busy moment of the
    machine (other work, a checkpoint) then lands on both ledgers, not on one."""
    samples: dict[str, list[float]] = {ledger.phase: [] for ledger in ledgers}
    for turn in range(turns):
        for ledger in ledgers if turn % 2 == 0 else ledgers[::-1]:
            with ledger.active():
                samples[ledger.phase] += one(ledger)
    return samples


def measure(ledgers: list[Ledger], sizes: Sizes, backoff: int) -> dict[str, Row]:
    runs, warm = max(1, sizes.runs // sizes.turns), sizes.warmup  # per turn

    def page(url: str, rows: int) -> Callable[[Ledger], list[float]]:
        return lambda ledger: ledger.pages.times(url, rows, runs, warm)

    steps: dict[str, tuple[int, Callable[[Ledger], list[float]]]] = {
        "new": (sizes.rounds, lambda ledger: [ledger.hot.rate(sizes.calls)]),
        "tick": (sizes.turns, lambda ledger: notifier_tick(ledger, runs, warm, sizes.tick_effects)),
        "metrics": (sizes.turns, lambda ledger: metrics_scrape(runs, warm)),
        "due": (sizes.turns, lambda ledger: due_call(runs, warm)),
        "queue": (sizes.turns, page("/", QUEUE_ROWS)),
        "list": (sizes.turns, page("/effects/", LIST_ROWS)),
        "list_committed": (sizes.turns, page("/effects/?state=committed", LIST_ROWS)),
    }
    rows = {}
    for key, (turns, one) in steps.items():
        rows[key] = Row(ROWS[key].format(backoff=f"{backoff:,}"), "/s" if key == "new" else "ms")
        say(f"  {rows[key].name} ...")
        rows[key].samples = interleave(ledgers, turns, one)
    return rows


# -- retention ------------------------------------------------------------------------------


@dataclass
class Retention:
    available: bool = False
    error: str = ""
    effects: int = 0
    journal_lines: int = 0
    seconds: float = 0.0  # wall clock of the whole run
    archive_bytes: int = 0
    during: Row = field(default_factory=lambda: Row(DURING, "/s"))
    # Through the sessions that ran beside it: a plan they kept from before it would show.
    after: Row = field(default_factory=lambda: Row(AFTER, "/s"))

    @property
    def rate(self) -> float:
        return self.effects / self.seconds if self.seconds else 0.0


def retention_api() -> tuple[Any, Any] | None:
    try:
        from openonce_core._retention import RetentionPolicy, run_retention
    except ImportError:
        return None
    return RetentionPolicy, run_retention


def retention_age(dsn: str, count: int) -> float:
    """The policy age that takes the ``count`` oldest terminal effects: a cutoff between the
    last change of the ``count``-th and the next one's (the history's changes are spread
    evenly over the year, half a minute apart at a million), measured back from the ledger's
    newest change. The retention counts age from that change when the clock reads past it
    (``_retention._cutoff``), so an age taken from this process's clock instead would move
    the cutoff back by the ledger's idle time, and leave one effect per half-minute of it."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT updated_at FROM openonce_effects WHERE state = ANY(%s)"
            " ORDER BY updated_at OFFSET %s LIMIT 2",
            (list(TERMINAL), max(0, count - 1)),
        ).fetchall()
        newest = conn.execute("SELECT max(updated_at) FROM openonce_effects").fetchone()
    if not rows or newest is None or newest[0] is None:
        return 0.0
    last = float(rows[0][0])
    cutoff = (last + float(rows[1][0])) / 2 if len(rows) > 1 else last + 1e-3
    return float(newest[0]) - cutoff


def retention_policy() -> Any:
    """The daily task's policy as the settings give it (``reconciler.retention``); the
    bench picks its age."""
    from reconciler.retention import retention_policy

    return retention_policy(DAY)


def _retention_child(
    dsn: str, policy: Any, folder: str, now: float, started: Any, out: Any
) -> None:
    """The retention in a process of its own, as the beat task runs it in production: a
    thread would share this interpreter's lock with the calls being timed. ``started`` is
    set once it is ready to run (imports and connections are not the retention's work);
    its answer carries the monotonic times (system-wide on Linux) the run began and ended."""
    from openonce_core._retention import run_retention
    from openonce_core.stores.postgres import PostgresStore

    store = PostgresStore(dsn)
    store.schema_version()  # connected before the run begins
    started.set()
    start = time.monotonic()
    try:
        report = run_retention(store, policy, archive_dir=folder, now=now)
        out.put(("ok", report.effects, report.journal_lines, start, time.monotonic()))
    except Exception as exc:  # shown in the table, not lost in the child
        out.put(("error", f"{type(exc).__name__}: {exc}", 0, start, time.monotonic()))
    finally:
        store.close()


def run_retention_during(
    empty: Ledger, full: Ledger, archive: int, sizes: Sizes, policy: Any
) -> Retention:
    """The retention on the full ledger in another process, with ``policy`` (its age set
    to take the ``archive`` oldest effects); this process creates new effects meanwhile, in
    blocks of a quarter round on the two ledgers, a pair at a time, the order alternating.
    Only pairs whose two blocks both ran while the retention did are counted: the child's
    start-up, and a block that ended after the run, would favour one side. Then new
    effects in rounds again, through the same sessions."""
    import multiprocessing

    if retention_api() is None:
        return Retention()
    now = time.time()
    older_than = retention_age(full.dsn, archive)
    folder = tempfile.mkdtemp(prefix="openonce-volume-archive-")
    out = Retention(available=True)
    context = multiprocessing.get_context("spawn")
    answers, started = context.Queue(), context.Event()
    child = context.Process(
        target=_retention_child, name="retention",
        args=(full.dsn, replace(policy, older_than=older_than), folder, now, started, answers),
    )  # fmt: skip
    try:
        child.start()
        while not started.wait(0.05):
            if not child.is_alive():
                break
        pairs, block = [], sizes.calls // 4
        while child.is_alive() and answers.empty():
            order = (full, empty) if len(pairs) % 2 == 0 else (empty, full)
            pairs.append([(ledger.phase, *timed_block(ledger, block)) for ledger in order])
        answer = answer_of(child, answers)
        out.during.samples = during(pairs, answer[3], answer[4])
        out.seconds = answer[4] - answer[3]
        if answer[0] == "error":
            out.error = answer[1]
            return out
        out.effects, out.journal_lines = answer[1], answer[2]
        out.after.samples = interleave(
            [empty, full], sizes.rounds, lambda ledger: [ledger.hot.rate(sizes.calls)]
        )
        out.archive_bytes = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files
        )
    finally:
        if child.is_alive():
            child.terminate()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def timed_block(ledger: Ledger, calls: int) -> tuple[float, float, float]:
    """``calls`` new effects on ``ledger``: their rate and the monotonic start and end."""
    start = time.monotonic()
    rate = ledger.hot.rate(calls)
    return rate, start, time.monotonic()


def answer_of(child: Any, answers: Any) -> tuple[Any, ...]:
    """The retention child's answer; one that died without answering is an error."""
    import queue

    child.join(timeout=600)
    try:
        return tuple(answers.get(timeout=5))
    except queue.Empty:
        return ("error", f"the retention process ended without an answer (exit code"
                f" {child.exitcode})", 0, 0.0, 0.0)  # fmt: skip


def during(pairs: list[list[tuple[str, float, float, float]]], begin: float, end: float
           ) -> dict[str, list[float]]:  # fmt: skip
    """Each ledger's rates from the pairs that ran wholly between ``begin`` and ``end``."""
    samples: dict[str, list[float]] = {"empty": [], "full": []}
    for pair in pairs:
        if all(begin <= start and stop <= end for _, _, start, stop in pair):
            for phase, rate, _, _ in pair:
                samples[phase].append(rate)
    return samples


# -- sizes ----------------------------------------------------------------------------------


@dataclass
class Bytes:
    effects: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    relations: list[tuple[str, str, int]] = field(default_factory=list)  # table, what, bytes
    totals: dict[str, int] = field(default_factory=dict)  # table -> heap + indexes + toast
    stats: list[tuple[Any, ...]] = field(default_factory=list)
    tombstone_bytes: float = 0.0  # per archived effect


def measure_bytes(dsn: str) -> Bytes:
    import psycopg

    out = Bytes()
    with psycopg.connect(dsn) as conn:
        for table in TABLES:
            (rows,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[misc]
            heap, total = conn.execute(
                "SELECT pg_relation_size(%s), pg_total_relation_size(%s)", (table, table)
            ).fetchone()  # type: ignore[misc]
            indexes = conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass"
                " ORDER BY 2 DESC",
                (table,),
            ).fetchall()
            out.rows[table], out.totals[table] = rows, total
            out.relations += [(table, "heap", heap), *((table, n, s) for n, s in indexes)]
            out.relations.append(
                (table, "toast, free space, visibility", total - heap - sum(s for _, s in indexes))
            )
    out.effects = out.rows["openonce_effects"]
    return out


def tombstone_bytes(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_total_relation_size('openonce_tombstones')").fetchone()
    return int(row[0]) if row else 0


def row_writes(dsn: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s) ORDER BY relname",
            (list(TABLES),),
        ).fetchall()


def reset_row_writes(dsn: str) -> None:
    """From here on, pg_stat_user_tables counts only what the measures write."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute("SELECT pg_stat_reset_single_table_counters(%s::regclass)", (table,))


def settled_row_writes(dsn: str) -> list[tuple[Any, ...]]:
    """Backends hand their counts to the statistics when they go idle or exit: read until
    two reads a second apart agree."""
    last = row_writes(dsn)
    for _ in range(10):
        time.sleep(1)
        now = row_writes(dsn)
        if now == last:
            break
        last = now
    return last


# -- report ---------------------------------------------------------------------------------


def _line(name: str, empty: str, full: str, ratio: float | None, budget: str, ok: bool) -> str:
    shown = f"{ratio:.2f}x" if ratio is not None else "-"
    return f"{name:<46}{empty:>13}{full:>13}{shown:>12}{budget:>9}  {'PASS' if ok else 'OVER'}"


def _value(row: Row, phase: str) -> str:
    if not row.samples.get(phase):
        return "-"
    value = row.value(phase)
    return f"{value:,.1f} ms" if row.unit == "ms" else f"{value:,.0f}/s"


def _row_line(row: Row) -> str:
    budget = f"<={BUDGET:g}x"
    return _line(row.name, _value(row, "empty"), _value(row, "full"), row.ratio, budget,
                 row.ratio <= BUDGET)  # fmt: skip


def render(rows: dict[str, Row], retention: Retention, sizes: Bytes, info: dict[str, Any]) -> str:
    out = [
        "OpenOnce on Postgres: an empty ledger and a year of history, same machine, same run,"
        " measured in turns",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; code: {info['revision']}",
        f"postgres {info['server_version']}: shared_buffers={info['shared_buffers']};"
        f" databases {info['databases']}",
        f"empty: the working set alone ({info['backoff']:,} UNKNOWN in probe backoff, 150"
        f" awaiting approval, 50 in human review); full: the same and {info['effects']:,}"
        " effects of history over 365 days",
        "",
    ]
    header = _line("measure", "empty", "full", None, "budget", True)
    header = header[: header.rindex("PASS")] + "verdict"
    out += [header.replace("        -", "full/empty"), "-" * len(header)]
    out += [_row_line(row) for row in rows.values()]
    if not retention.available:
        out.append("retention: not available (openonce_core._retention does not import)")
    elif retention.error:
        out.append(f"retention: failed: {retention.error}")
    else:
        out.append(_row_line(retention.during))
        out.append(_row_line(retention.after))
        out.append(
            _line(
                RETENTION_RATE,
                "-",
                f"{retention.rate:,.0f}/s",
                None,
                f">={INGEST:.0f}/s",
                retention.rate >= INGEST,
            )
        )
    out += [
        "full/empty: the full ledger's cost over the empty one's (the p95 of a time; for a",
        "rate, the empty ledger's median over the full one's). While the retention runs, both",
        "ledgers take new effects in turns, and after it, through the same sessions. The",
        f"retention's budget is 10M effects a day ({INGEST:.0f}/s): slower than that, it never",
        "catches up.",
        "",
        "details (empty | full):",
    ]
    every = [*rows.values(), *(r for r in (retention.during, retention.after) if r.samples)]
    for row in every:
        out.append(f"  {row.name}: {_detail(row, 'empty')} | {_detail(row, 'full')}")
    if retention.effects:
        out.append(
            f"  retention: {retention.effects:,} effects and {retention.journal_lines:,} journal"
            f" lines archived in {retention.seconds:.1f} s; archive"
            f" {retention.archive_bytes / retention.effects:,.0f} bytes per effect (gzip)"
        )
    out += ["", *render_bytes(sizes), "", *render_writes(sizes)]
    out.append("")
    out.append(
        "setup (not timed): " + ", ".join(f"{k} {v:.0f} s" for k, v in info["setup"].items())
    )
    out.append(f"took {info['elapsed']:.0f} s")
    return "\n".join(out)


def _detail(row: Row, phase: str) -> str:
    values = row.samples.get(phase) or []
    if not values:
        return "-"
    if row.unit == "/s":
        return f"{len(values)} rounds, {min(values):,.0f}-{max(values):,.0f}/s"
    p = console().percentile
    return f"p50 {p(values, 0.5):.1f}, max {max(values):.1f} ms, {len(values)} runs"


def render_bytes(sizes: Bytes) -> list[str]:
    n = max(sizes.effects, 1)
    out = [
        f"bytes per effect on the full ledger before the retention ({sizes.effects:,} effects; "
        + ", ".join(f"{t} {sizes.rows[t]:,} rows" for t in TABLES[1:])
        + "):"
    ]
    for table, what, size in sizes.relations:
        if size or what == "heap":
            out.append(f"  {table:<22}{what:<36}{size / 1e6:>10,.1f} MB{size / n:>9,.0f} B")
    per = {t: sizes.totals[t] / n for t in TABLES}
    ledger = per["openonce_effects"] + per["openonce_journal"] + per["openonce_approvals"]
    out.append(
        f"  per effect: effects {per['openonce_effects']:,.0f} B (heap and indexes), journal"
        f" {per['openonce_journal']:,.0f} B ({sizes.rows['openonce_journal'] / n:.2f} lines),"
        f" approvals {per['openonce_approvals']:,.0f} B: {ledger:,.0f} B"
    )
    day = ledger * INGEST * DAY / 1e9
    held = day * RETENTION_DAYS / 1e3
    tomb = sizes.tombstone_bytes * INGEST * DAY / 1e9
    out.append(
        f"  at 10M effects a day: {day:,.1f} GB a day; without retention {day * 365 / 1e3:,.1f}"
        f" TB after a year; with a {RETENTION_DAYS}-day retention {held:,.2f} TB held"
        + (
            f", plus tombstones ({sizes.tombstone_bytes:,.0f} B per archived effect):"
            f" {tomb:,.1f} GB a day"
            if sizes.tombstone_bytes
            else ""
        )
    )
    return out


def render_writes(sizes: Bytes) -> list[str]:
    out = [
        "row writes on the full ledger from the measures and the retention (pg_stat_user_tables):"
    ]
    for name, ins, upd, hot, deleted in sizes.stats:
        share = f" ({hot / upd:.0%})" if upd else ""
        out.append(
            f"  {name:<22}n_tup_ins {ins:>8,}  n_tup_upd {upd:>7,}  n_tup_hot_upd {hot:>7,}"
            f"{share:<7}  n_tup_del {deleted:>8,}"
        )
    return out


# -- main -----------------------------------------------------------------------------------


@contextmanager
def databases(admin_dsn: str, names: list[str], keep: bool) -> Iterator[None]:
    """Fresh databases on the server (dropped first if a run left them), dropped after."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield
    finally:
        if not keep:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                for name in names:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            say("databases " + ", ".join(names) + " dropped")


def django_setup(url: str) -> None:
    import django

    # Only what this script sets reaches Django (a stray OPENONCE_GRACE_SECONDS would
    # change what is due).
    for name in [k for k in os.environ if k.startswith(("OPENONCE_", "DJANGO_"))]:
        del os.environ[name]
    os.environ["DJANGO_SETTINGS_MODULE"] = "openonce_site.settings.test"
    os.environ["OPENONCE_DATABASE"] = url
    os.environ["OPENONCE_METRICS_TOKEN"] = uuid.uuid4().hex
    # A channel, so that the notifier reads every new line (with none it only moves its
    # cursor); it wants stripe.* effects entering a waiting state, which no timed call makes.
    os.environ["OPENONCE_NOTIFY"] = json.dumps([NOTIFY_CHANNEL])
    django.setup()


def prepare(empty: Ledger, full: Ledger, args: argparse.Namespace, setup: dict[str, float]) -> None:
    """Both ledgers migrated and given the working set; the full one its history."""
    from django.core.management import call_command

    for ledger in (empty, full):
        with ledger.active():
            start = time.perf_counter()
            call_command("migrate", verbosity=0, interactive=False)
            setup["migrate"] = setup.get("migrate", 0.0) + time.perf_counter() - start
        say(f"{ledger.name}: the working set ({args.backoff:,} UNKNOWN in backoff, 200 more) ...")
        working = _fill(WORKING_STATE, BACKOFF=args.backoff)
        spent = seed(ledger.dsn, args.backoff + 200, 0, working, WORKING_CREATED)
        setup["working sets"] = setup.get("working sets", 0.0) + spent
    say(f"{full.name}: {args.effects:,} effects of history over 365 days ...")
    now = time.time()
    setup["history"] = seed(
        full.dsn, args.effects, 10 * (args.backoff + 200), HISTORY_STATE, HISTORY_CREATED,
        T0=now - SPAN, STEP=(SPAN - NEWEST) / args.effects,
    )  # fmt: skip
    for ledger in (empty, full):
        start = time.perf_counter()
        settle(ledger.dsn, checkpoint=not args.quick)
        setup["vacuum, checkpoint"] = setup.get("vacuum, checkpoint", 0.0) + (
            time.perf_counter() - start
        )
    say(f"  vacuum (analyze) + checkpoint: {setup['vacuum, checkpoint']:.1f} s")


def run(args: argparse.Namespace) -> str:
    import psycopg

    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    setup: dict[str, float] = {}
    names = [args.database + "_empty", args.database]
    with databases(args.pg_dsn, names, args.keep):
        empty, full = Ledger("empty", names[0], args.pg_dsn), Ledger("full", names[1], args.pg_dsn)
        ledgers = [empty, full]
        django_setup(database_url(args.pg_dsn, full.name))
        try:
            prepare(empty, full, args, setup)
            reset_row_writes(full.dsn)
            say("measuring, the two ledgers in turns ...")
            rows = measure(ledgers, sizes, args.backoff)
            sizes_full = measure_bytes(full.dsn)
            say("retention on the full ledger, new effects on both meanwhile ...")
            retention = run_retention_during(
                empty, full, min(args.archive, args.effects), sizes, retention_policy()
            )
            if retention.effects:
                sizes_full.tombstone_bytes = tombstone_bytes(full.dsn) / retention.effects
        finally:
            from django.db import connections

            for ledger in ledgers:
                ledger.close()
            connections.close_all()
        sizes_full.stats = settled_row_writes(full.dsn)
        with psycopg.connect(full.dsn) as conn:
            info: dict[str, Any] = {
                key: str(conn.execute(f"SHOW {key}").fetchone()[0])  # type: ignore[index]
                for key in ("server_version", "shared_buffers")
            }
    info.update(
        revision=code_revision(), databases=", ".join(names), backoff=args.backoff,
        effects=args.effects, setup=setup, elapsed=time.monotonic() - started,
    )  # fmt: skip
    return render(rows, retention, sizes_full, info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000, help="effects of history")
    parser.add_argument(
        "--quick", action="store_true", help=f"a smoke run: {QUICK.calls} calls x"
        f" {QUICK.rounds} rounds, {QUICK.runs} runs of each other measure",
    )  # fmt: skip
    parser.add_argument(
        "--archive", type=int, default=20_000, help="oldest effects the retention archives"
    )
    parser.add_argument(
        "--backoff", type=int, default=20_000, help="UNKNOWN effects in probe backoff"
    )
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("OPENONCE_BENCH_PG") or DEFAULT_PG,
        help="Postgres DSN to run CREATE DATABASE from (default: $OPENONCE_BENCH_PG, then"
        f" {DEFAULT_PG})",
    )
    parser.add_argument(
        "--database", default="openonce_volume", help="the full ledger's database (and NAME_empty)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases at the end")
    args = parser.parse_args(argv)
    if args.effects < 1000 or args.backoff < 1 or args.archive < 1:
        parser.error("--effects must be at least 1,000; --backoff and --archive at least 1")
    # A SIGTERM still drops the databases.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
