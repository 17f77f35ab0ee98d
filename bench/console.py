"""Server time of the operator console on a large Postgres ledger, against the issue's budget.

On this machine, in one run:

* a fresh Postgres database (``CREATE DATABASE``), migrated by ``manage.py migrate`` in a
  subprocess with ``OPENONCE_DATABASE`` pointing at it, so every table and index is the one
  production gets;
* filled with SQL (``INSERT ... SELECT`` over ``generate_series``): ``N`` effects (1,000,000
  by default) shaped as the core writes them (states, tools, compact JSON as text, sha256
  fingerprints, ``oo_`` provider keys, epoch-second floats spread over 30 days, attempts,
  fences, leases, execution and verification fields), 1% of them in the human queue
  (REQUIRES_APPROVAL, HUMAN_REVIEW and UNKNOWN past its grace), the journal lines and
  approvals those states imply (about 2.2 lines per effect), one effect with exactly 1,000
  journal lines, and 30 days of reconciler sweeps (one every 5 s, as beat records them);
  then ``VACUUM (ANALYZE)``, the state autovacuum leaves a table in;
* Django set up in this process on that database, a user in the ``viewer`` group signed in,
  and each page requested through ``django.test.Client``: the server time is request ->
  response inside this process (middleware, session, permission check, queries, template),
  with no network and no HTTP server in front. Each page is requested a few times untimed,
  then ``--runs`` times timed; p50/p95/max are compared with the budget (p95 <= 100 ms for
  the queue and the list, <= 50 ms for the detail page). The list's deep page is reached by
  following its "Older effects" link 50 times from page 1, each page timed once on the way.

A sweep row is added every 5 s of wall-clock time (outside the timed spans), as a running
beat would, so the health panel reads a live reconciler. The database is dropped at the end,
whatever happened. Usage::

    python bench/console.py [--effects N] [--runs R] [--explain] [--pg-dsn DSN] [--json]

The Postgres DSN (a database to connect to for ``CREATE DATABASE``) defaults to
``$OPENONCE_BENCH_PG``, then to ``postgresql://root@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import gc
import html
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from daemon import database_url
from hotpath import code_revision, say

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PG = "postgresql://root@127.0.0.1:5432/test"
SPAN = 30 * 86400  # effects were created over the last 30 days ...
NEWEST = 3 * 3600  # ... up to 3 hours ago (every later step of an effect fits before now)
SWEEP_EVERY = 5.0  # OPENONCE_SWEEP_INTERVAL's default: one reconciler_sweep row per tick
JOURNAL_LINES = 1000  # the one effect whose detail page is timed
JOURNAL_SHOWN = 200  # lines its detail page renders (console.selectors.JOURNAL_SHOWN)
DEEP_PAGES = 50  # "next" links followed for the deep page
STUCK = "1h"
FILTERED = "/effects/?state=committed&tool=stripe.charge"  # the common case
RARE = "/effects/?state=failed&tool=email.send"  # 0.6% of effects
WARMUP = 5
TOP_STATEMENTS = 3  # costliest ledger/sweep statements reported per page ...
TOP_MIN_MS = 1.0  # ... beyond the first, those costing at least this per request
BUDGET_MS = {"queue": 100.0, "list": 100.0, "search": 100.0, "detail": 50.0}

# Which state each effect gets, by n % 1000: exact counts, 1% in the human queue.
STATE_BUCKETS = [
    (4, "requires_approval"),
    (6, "human_review"),
    (10, "unknown"),
    (30, "failed"),
    (35, "cancelled"),
    (38, "denied"),
    (39, "released"),
    (40, "started"),
    (41, "planned"),  # re-armed by the reconciler after a miss
    (42, "approved"),
]
CLAIMED = ("committed", "failed", "unknown", "human_review", "started", "planned")
FINISHED = ("committed", "failed", "unknown", "human_review", "planned")
ESCALATED = ("human_review", "planned")
DECIDED = ("denied", "cancelled", "released")
UNAPPROVED = ("requires_approval", "denied", "cancelled", "released")


def _in(states: tuple[str, ...]) -> str:
    return "(" + ", ".join(f"'{s}'" for s in states) + ")"


_STATE_CASE = (
    "CASE "
    + " ".join(f"WHEN k < {upper} THEN '{state}'" for upper, state in STATE_BUCKETS)
    + " ELSE 'committed' END"
)
_TIMEOUT = (
    '{"type":"builtins.TimeoutError","message":"The read operation timed out",'
    '"args":["The read operation timed out"],"class":"unknown"}'
)


def _error(kind: str, message: str) -> str:
    return json.dumps(
        {"type": kind, "message": message, "args": [message], "class": "failed"},
        separators=(",", ":"),
    )


# One row per effect with everything its row, journal lines and approvals are made of.
# @N@, @T0@, @STEP@ and @NOW@ are replaced before the statement is sent (no parameters, so
# the % of format() reach Postgres untouched). stripe.refund waits for approval (a
# require_approval("stripe.refund") policy): its effects carry the approval lines.
SEED_SQL = f"""
CREATE TEMP TABLE seed AS
WITH b AS (
    SELECT n, n % 1000 AS k, random() AS r1, random() AS r2, random() AS r3, random() AS r4
    FROM generate_series(1, @N@) AS n
), s AS (
    SELECT n, r1, r2, r3, r4, {_STATE_CASE} AS state FROM b
), t AS (
    SELECT n, r2, r3, r4, state,
        CASE WHEN state IN ('requires_approval', 'approved', 'denied', 'cancelled', 'released')
                  THEN 'stripe.refund'
             WHEN r1 < 0.35 THEN 'stripe.charge'
             WHEN r1 < 0.45 THEN 'stripe.refund'
             WHEN r1 < 0.75 THEN 'email.send'
             WHEN r1 < 0.92 THEN 'github.create_pr'
             ELSE 'slack.post_message' END AS tool,
        CASE WHEN state = 'started' THEN @NOW@ - 60 - r2 * 240  -- in flight: recent
             ELSE @T0@ + (n - 1 + r2) * @STEP@ END AS created_at
    FROM s
), u AS (
    SELECT t.*,
        'eff_' || md5('effect:' || n) AS id,
        tool = 'stripe.refund' AS gated,
        CASE WHEN tool IN ('email.send', 'github.create_pr') OR r3 < 0.5
             THEN 'run_' || md5('run:' || (n / 25)) END AS scope,
        'worker-' || (n % 6) || ':' || (4000 + (n / 20000) % 300) AS owner,
        (ARRAY['alice', 'bob', 'carol', 'dmitri'])[1 + n % 4] AS operator
    FROM t
), v AS (
    SELECT u.*,
        CASE tool
            WHEN 'stripe.charge' THEN 'charge:ord_' || lpad(n::text, 8, '0')
            WHEN 'stripe.refund' THEN 'refund:ord_' || lpad(n::text, 8, '0')
            WHEN 'slack.post_message' THEN 'incident-' || n
            -- derived from the run scope and the arguments' digest, as the core derives it
            ELSE encode(sha256(convert_to(scope, 'UTF8') || '\\x00'::bytea
                               || convert_to(md5('args:' || n), 'UTF8')), 'hex')
        END AS idempotency_key,
        CASE tool
            WHEN 'stripe.charge' THEN format(
                '{{"amount":%s,"currency":"usd","customer":"cus_%s","order_id":"ord_%s"}}',
                500 + (r4 * 20000)::int, lpad((n % 50000)::text, 6, '0'), lpad(n::text, 8, '0'))
            WHEN 'stripe.refund' THEN format(
                '{{"charge":"ch_%s","amount":%s,"reason":"requested_by_customer"}}',
                left(md5('ch:' || n), 24), 500 + (r4 * 5000)::int)
            WHEN 'email.send' THEN format(
                '{{"to":"customer%s@example.com","subject":"Your receipt for order ord_%s",'
                '"template":"receipt"}}', n % 50000, lpad(n::text, 8, '0'))
            WHEN 'github.create_pr' THEN format(
                '{{"owner":"acme","repo":"%s","head":"agent/fix-%s","base":"main",'
                '"title":"Fix flaky test #%s"}}', (ARRAY['web', 'api', 'infra', 'docs'])[1 + n % 4],
                n, n)
            ELSE format('{{"channel":"#ops","text":"Incident %s resolved"}}', n)
        END AS args_json,
        CASE WHEN tool = 'stripe.refund' THEN created_at + 60 + r3 * 7200 END AS approved_at
    FROM u
), w AS (
    SELECT v.*, CASE WHEN gated THEN approved_at + 0.02 ELSE created_at END AS claim_at
    FROM v
)
SELECT w.*,
    'sha256:' || encode(sha256(convert_to(args_json, 'UTF8')), 'hex') AS fingerprint,
    'oo_' || left(encode(sha256(convert_to(tool, 'UTF8') || '\\x00'::bytea
                                || convert_to(idempotency_key, 'UTF8')), 'hex'), 40)
        AS provider_key,
    claim_at + CASE state WHEN 'committed' THEN 0.2 + r4 * 1.8
                          WHEN 'failed' THEN 0.1 + r4 ELSE 30.0 END AS finish_at,
    claim_at + 30.0 + 130 + r4 * 600 AS esc_at,
    created_at + 300 + r3 * 7200 AS decided_at,
    CASE WHEN state = 'failed' THEN CASE tool
            WHEN 'email.send' THEN 'smtplib.SMTPRecipientsRefused'
            WHEN 'github.create_pr' THEN 'github.GithubException'
            WHEN 'slack.post_message' THEN 'slack_sdk.errors.SlackApiError'
            ELSE 'stripe.error.CardError' END
         WHEN state IN {_in(FINISHED)} AND state <> 'committed' THEN 'builtins.TimeoutError'
    END AS error_type,
    CASE WHEN state = 'failed' THEN CASE tool
            WHEN 'email.send' THEN '{_error("smtplib.SMTPRecipientsRefused", "recipient refused")}'
            WHEN 'github.create_pr' THEN '{_error("github.GithubException", "422 Validation Failed")}'
            WHEN 'slack.post_message' THEN '{_error("slack_sdk.errors.SlackApiError", "channel_not_found")}'
            ELSE '{_error("stripe.error.CardError", "Your card was declined.")}' END
         WHEN state IN {_in(FINISHED)} AND state <> 'committed' THEN '{_TIMEOUT}'
    END AS error_json,
    CASE tool WHEN 'email.send' THEN 'EmailMessageIdProber'
              WHEN 'github.create_pr' THEN 'GitHubPullRequestProber'
              ELSE 'StripeProber' END AS prober,
    0 AS extra_lines
FROM w
"""  # noqa: E501

# The effect whose detail page is timed: a stripe.charge in human review after a long
# run of failed probes (UNKNOWN -> UNKNOWN lines, every 10 minutes), then an escalation.
BIG_SQL = f"""
UPDATE seed SET extra_lines = {JOURNAL_LINES - 3}, esc_at = finish_at + {JOURNAL_LINES - 2} * 600
WHERE n = (SELECT min(n) FROM seed WHERE state = 'human_review' AND tool = 'stripe.charge')
RETURNING id
"""

_LINES = f"""(CASE WHEN gated THEN 1 ELSE 0 END
    + CASE WHEN gated AND state NOT IN {_in(UNAPPROVED)} THEN 1 ELSE 0 END
    + CASE WHEN state IN {_in(CLAIMED)} THEN 1 ELSE 0 END
    + CASE WHEN state IN {_in(FINISHED)} THEN 1 ELSE 0 END
    + CASE WHEN state IN {_in(ESCALATED)} THEN 1 ELSE 0 END
    + CASE WHEN state IN {_in(DECIDED)} THEN 1 ELSE 0 END
    + extra_lines)"""

EFFECTS_SQL = f"""
INSERT INTO openonce_effects (id, tool, idempotency_key, scope, state, args_json,
    args_fingerprint, provider_key, attempt, max_attempts, fence, lease_owner, lease_expires_at,
    approvals_required, approval_ttl, execution_status, execution_evidence_json,
    verification_status, verification_evidence_json, result_json, error_json, created_at,
    updated_at, waiters)
SELECT id, tool, idempotency_key, scope, state, args_json, fingerprint, provider_key,
    CASE WHEN state IN {_in(CLAIMED)} THEN 1 ELSE 0 END,
    3,
    -- the claim that inserts a STARTED row writes fence 1, an approval request fence 0;
    -- every later transition adds one
    {_LINES} - CASE WHEN gated THEN 1 ELSE 0 END,
    CASE WHEN state = 'started' THEN owner END,
    CASE WHEN state = 'started' THEN claim_at + 300 END,
    CASE WHEN gated THEN 1 ELSE 0 END,
    NULL,
    CASE WHEN state = 'committed' THEN 'returned' WHEN state = 'failed' THEN 'failed'
         WHEN state IN {_in(FINISHED)} THEN 'unknown' END,
    CASE WHEN state = 'committed' THEN '{{"attempt":1}}'
         WHEN state IN {_in(FINISHED)} THEN '{{"attempt":1,"error":' || error_json || '}}' END,
    CASE state WHEN 'human_review' THEN 'needs_human' WHEN 'planned' THEN 'absent' END,
    CASE state
        WHEN 'human_review' THEN '{{"observations":[{{"prober":"' || prober
            || '","outcome":"inconclusive","detail":"provider search index is lagging"}}]}}'
        WHEN 'planned' THEN '{{"observations":[{{"prober":"' || prober
            || '","outcome":"not_happened","detail":"no trace past the grace window"}}]}}'
    END,
    CASE WHEN state = 'committed' THEN CASE tool
        WHEN 'stripe.charge' THEN '{{"stripe_id":"ch_' || left(md5('ch:' || n), 24)
            || '","status":"succeeded"}}'
        WHEN 'stripe.refund' THEN '{{"stripe_id":"re_' || left(md5('re:' || n), 24)
            || '","status":"succeeded"}}'
        WHEN 'email.send' THEN '{{"message_id":"<' || provider_key || '@mail.acme.example>"}}'
        WHEN 'github.create_pr' THEN '{{"number":' || (n % 100000) || ',"head":"agent/fix-' || n
            || '"}}'
        ELSE '{{"ok":true,"ts":"' || finish_at || '"}}' END
    END,
    error_json,
    created_at,
    CASE WHEN state IN ('committed', 'failed', 'unknown') THEN finish_at
         WHEN state IN {_in(ESCALATED)} THEN esc_at
         WHEN state = 'requires_approval' THEN created_at
         WHEN state = 'approved' THEN approved_at
         WHEN state = 'started' THEN claim_at
         ELSE decided_at END,
    0
FROM seed ORDER BY n
"""

# Every line the core (agent), an operator or the reconciler writes for these states, in
# time order, so seq follows at and one effect's lines are spread over the table.
JOURNAL_SQL = f"""
INSERT INTO openonce_journal (effect_id, at, from_state, to_state, actor, reason, evidence_json)
SELECT effect_id, at, from_state, to_state, actor, reason, evidence_json FROM (
    SELECT id AS effect_id, created_at AS at, 'planned' AS from_state,
        'requires_approval' AS to_state, 'agent:' || owner AS actor,
        'tool matches stripe.refund' AS reason, NULL::text AS evidence_json
    FROM seed WHERE gated
    UNION ALL
    SELECT id, approved_at, 'requires_approval', 'approved', 'operator:' || operator, '',
        '{{"approvals":1,"required":1}}'
    FROM seed WHERE gated AND state NOT IN {_in(UNAPPROVED)}
    UNION ALL
    SELECT id, claim_at, CASE WHEN gated THEN 'approved' ELSE 'planned' END, 'started',
        'agent:' || owner, '', '{{"attempt":1}}'
    FROM seed WHERE state IN {_in(CLAIMED)}
    UNION ALL
    SELECT id, finish_at, 'started',
        CASE state WHEN 'committed' THEN 'committed' WHEN 'failed' THEN 'failed'
                   ELSE 'unknown' END,
        'agent:' || owner,
        CASE state WHEN 'committed' THEN '' WHEN 'failed' THEN error_type
                   ELSE 'may have happened: ' || error_type END,
        CASE WHEN state = 'committed' THEN '{{"attempt":1}}'
             ELSE '{{"attempt":1,"error":' || error_json || '}}' END
    FROM seed WHERE state IN {_in(FINISHED)}
    UNION ALL
    SELECT id, finish_at + i * 600, 'unknown', 'unknown', 'reconciler:daemon',
        'probe failed (' || (1 + i % 3) || '/3): ' || prober
            || ': timed out after 30s; asking again in 5s',
        '{{"probe_error":"' || prober || ': timed out after 30s","retry":' || (1 + i % 3) || '}}'
    FROM (SELECT * FROM seed WHERE extra_lines > 0) AS big,
        generate_series(1, big.extra_lines) AS i
    UNION ALL
    SELECT id, esc_at, 'unknown', state, 'reconciler:daemon',
        CASE state WHEN 'human_review' THEN 'probe inconclusive: provider search index is lagging'
                   ELSE 'probe found no trace past the grace window; re-armed' END,
        CASE state
            WHEN 'human_review' THEN '{{"guidance":"check the provider dashboard for '
                || provider_key || '","observations":[{{"prober":"' || prober
                || '","outcome":"inconclusive"}}]}}'
            ELSE '{{"probe":"not_happened","observations":[{{"prober":"' || prober
                || '","outcome":"not_happened"}}]}}' END
    FROM seed WHERE state IN {_in(ESCALATED)}
    UNION ALL
    SELECT id, decided_at, 'requires_approval', state, 'operator:' || operator,
        CASE state WHEN 'denied' THEN 'refund already issued by support'
                   WHEN 'cancelled' THEN 'customer withdrew the request'
                   ELSE 'agent run abandoned' END,
        NULL
    FROM seed WHERE state IN {_in(DECIDED)}
) AS lines ORDER BY at
"""

APPROVALS_SQL = f"""
INSERT INTO openonce_approvals (effect_id, decision, decided_by, reason, args_fingerprint, at,
    expires_at)
SELECT effect_id, decision, decided_by, reason, fingerprint, at, NULL FROM (
    SELECT id AS effect_id, 'approve' AS decision, operator AS decided_by, '' AS reason,
        fingerprint, approved_at AS at
    FROM seed WHERE gated AND state NOT IN {_in(UNAPPROVED)}
    UNION ALL
    SELECT id, 'deny', operator, 'refund already issued by support', fingerprint, decided_at
    FROM seed WHERE state = 'denied'
) AS decisions ORDER BY at
"""

# Thirty days of beat ticks, oldest first; one in twelve found work.
SWEEPS_SQL = """
INSERT INTO reconciler_sweep (source, started_at, interval, last_batch_at, finished_at, due,
    batches, batches_done, expired, committed, rearmed, escalated, retried, lost_races,
    probes_happened, probes_not_happened, probes_inconclusive, probe_errors, oldest_unknown_age)
SELECT 'beat', to_timestamp(@NOW@ - i * @EVERY@), NULL,
    CASE WHEN busy THEN to_timestamp(@NOW@ - i * @EVERY@ + 0.8) END,
    to_timestamp(@NOW@ - i * @EVERY@ + CASE WHEN busy THEN 0.9 ELSE 0.01 END),
    CASE WHEN busy THEN 4 ELSE 0 END, busy::int, busy::int, 0,
    CASE WHEN busy THEN 2 ELSE 0 END, CASE WHEN busy THEN 1 ELSE 0 END,
    CASE WHEN busy THEN 1 ELSE 0 END, 0, 0,
    CASE WHEN busy THEN 2 ELSE 0 END, CASE WHEN busy THEN 1 ELSE 0 END,
    CASE WHEN busy THEN 1 ELSE 0 END, 0, 3600.0
FROM (SELECT i, i % 12 = 0 AS busy FROM generate_series(@SWEEPS@, 1, -1) AS i) AS ticks
"""

TICK_SQL = (
    "INSERT INTO reconciler_sweep (source, started_at, interval, last_batch_at, finished_at,"
    " due, batches, batches_done, expired, committed, rearmed, escalated, retried, lost_races,"
    " probes_happened, probes_not_happened, probes_inconclusive, probe_errors,"
    " oldest_unknown_age) VALUES ('beat', now(), NULL, NULL, now(), 0, 0, 0, 0, 0, 0, 0, 0, 0,"
    " 0, 0, 0, 0, 3600.0)"
)


def _fill(sql: str, **values: float | int) -> str:
    for name, value in values.items():
        sql = sql.replace(f"@{name}@", repr(value))
    return sql


# -- setup ----------------------------------------------------------------------------------


@dataclass
class Data:
    effects: int = 0
    states: dict[str, int] = field(default_factory=dict)
    journal: int = 0
    approvals: int = 0
    sweeps: int = 0
    big_effect: str = ""
    big_lines: int = 0
    search_key: str = ""
    search_id: str = ""
    search_scope: str = ""
    search_customer: str = ""
    sizes_mb: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def seed(dsn: str, count: int) -> Data:
    import psycopg

    data = Data(effects=count)
    now = time.time()
    values = {
        "N": count,
        "NOW": round(now, 3),
        "T0": round(now - SPAN, 3),
        "STEP": (SPAN - NEWEST) / count,
        "EVERY": SWEEP_EVERY,
        "SWEEPS": int(SPAN / SWEEP_EVERY),
    }
    with psycopg.connect(dsn) as conn:
        conn.execute("SET work_mem = '256MB'")
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute("SET synchronous_commit = off")  # the seeding only; timings read
        conn.execute("SELECT setseed(0.42)")

        def step(name: str, sql: str) -> tuple[int, list[Any]]:
            start = time.perf_counter()
            cursor = conn.execute(_fill(sql, **values))
            rows = cursor.fetchall() if cursor.description else []
            conn.commit()
            data.seconds[name] = time.perf_counter() - start
            say(f"  {name}: {cursor.rowcount:,} rows, {data.seconds[name]:.1f} s")
            return cursor.rowcount, rows

        step("seed rows", SEED_SQL)
        _, big = step("1,000-line effect", BIG_SQL)
        if not big:
            raise RuntimeError("no stripe.charge effect in human review to give 1,000 lines")
        data.big_effect = big[0][0]
        row = conn.execute(
            "SELECT idempotency_key FROM seed WHERE tool = 'stripe.charge' AND n >= %s"
            " ORDER BY n LIMIT 1",
            (count // 2,),
        ).fetchone()
        data.search_key = row[0] if row else "charge:ord_00000001"
        sample = conn.execute(
            "SELECT id, scope, args_json::jsonb ->> 'customer' FROM seed"
            " WHERE tool = 'stripe.charge' AND scope IS NOT NULL AND n >= %s ORDER BY n LIMIT 1",
            (count // 3,),
        ).fetchone()
        if sample is None:
            raise RuntimeError("no stripe.charge effect with a scope to search for")
        data.search_id, data.search_scope, data.search_customer = sample
        data.effects, _ = step("effects", EFFECTS_SQL)
        data.journal, _ = step("journal", JOURNAL_SQL)
        data.approvals, _ = step("approvals", APPROVALS_SQL)
        data.sweeps, _ = step("sweeps", SWEEPS_SQL)
        conn.execute("DROP TABLE seed")
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        conn.execute(
            "VACUUM (ANALYZE) openonce_effects, openonce_journal, openonce_approvals,"
            " reconciler_sweep"
        )
        try:
            conn.execute("CHECKPOINT")  # the fill's dirty pages are written before timing
        except psycopg.Error as exc:
            say(f"  (no CHECKPOINT: {exc})")
        data.seconds["vacuum analyze"] = time.perf_counter() - start
        say(f"  vacuum analyze + checkpoint: {data.seconds['vacuum analyze']:.1f} s")
        data.states = dict(
            conn.execute(  # type: ignore[arg-type]
                "SELECT state, count(*) FROM openonce_effects GROUP BY state ORDER BY 2 DESC"
            ).fetchall()
        )
        data.big_lines = conn.execute(  # type: ignore[index]
            "SELECT count(*) FROM openonce_journal WHERE effect_id = %s", (data.big_effect,)
        ).fetchone()[0]
        for table in ("openonce_effects", "openonce_journal", "reconciler_sweep"):
            size = conn.execute(  # type: ignore[index]
                "SELECT pg_total_relation_size(%s)", (table,)
            ).fetchone()[0]
            data.sizes_mb[table] = size / 1e6
    if data.big_lines != JOURNAL_LINES:
        raise AssertionError(f"{data.big_effect} has {data.big_lines} journal lines")
    return data


# -- timing ---------------------------------------------------------------------------------


class SqlTimer:
    """A Django execute wrapper: time and count every query of a request, by statement."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.count = 0
        self.by_sql: dict[str, list[Any]] = {}  # sql -> [total ms, calls, last params]

    def reset(self) -> None:
        self.ms = 0.0
        self.count = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            ms = (time.perf_counter() - start) * 1000
            self.ms += ms
            self.count += 1
            entry = self.by_sql.setdefault(sql, [0.0, 0, None])
            entry[0] += ms
            entry[1] += 1
            entry[2] = params


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the samples at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Result:
    name: str
    budget: str  # key of BUDGET_MS, or "" for a page the issue sets no budget for
    url: str
    samples: list[float] = field(default_factory=list)  # ms per request
    sql_ms: list[float] = field(default_factory=list)
    queries: int = 0
    # The costliest ledger/sweep statements: (mean ms per request, sql, last params).
    top: list[tuple[float, str, Any]] = field(default_factory=list)
    explains: list[str] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return percentile(self.samples, 0.50)

    @property
    def p95(self) -> float:
        return percentile(self.samples, 0.95)

    @property
    def limit(self) -> float | None:
        return BUDGET_MS.get(self.budget)

    @property
    def verdict(self) -> str:
        if self.limit is None:
            return "-"
        return "PASS" if self.p95 <= self.limit else "BELOW"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "runs": len(self.samples),
            "p50_ms": round(self.p50, 2),
            "p95_ms": round(self.p95, 2),
            "max_ms": round(max(self.samples), 2),
            "budget_p95_ms": self.limit,
            "verdict": self.verdict,
            "sql_p50_ms": round(percentile(self.sql_ms, 0.5), 2),
            "queries_per_request": self.queries,
            "costliest_statements": [
                {"mean_ms": round(ms, 2), "sql": sql, "params": _short(params)}
                for ms, sql, params in self.top
            ],
            "explain": self.explains or None,
            "samples_ms": [round(s, 2) for s in self.samples],
        }


class Ticker:
    """Adds a sweep row every SWEEP_EVERY seconds, as beat would; called between requests."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.last = 0.0

    def __call__(self) -> None:
        if time.monotonic() - self.last >= SWEEP_EVERY:
            self.conn.execute(TICK_SQL)
            self.last = time.monotonic()

    def close(self) -> None:
        self.conn.close()


Check = Callable[[Any], None]


def rows_check(pattern: str, expected: int) -> Check:
    regex = re.compile(pattern)

    def check(response: Any) -> None:
        if response.status_code != 200:
            raise AssertionError(f"status {response.status_code}")
        found = len(regex.findall(response.content.decode()))
        if found != expected:
            raise AssertionError(f"{found} matches of {pattern!r}, expected {expected}")

    return check


def both(*checks: Check) -> Check:
    def check(response: Any) -> None:
        for one in checks:
            one(response)

    return check


def search_queries(data: Data, one: Check, page_full: Check) -> list[tuple[str, str, Check]]:
    """One search of each kind, with what its page must show."""
    some = _at_least(EFFECT_ROWS, 1)
    return [
        ("search: effect id, full", data.search_id, one),
        ("search: effect id prefix", data.search_id[:12], some),
        ("search: key prefix", "key:" + data.search_key[:-2], some),
        ("search: scope prefix", "scope:" + (data.search_scope or "")[:12], some),
        ("search: tool glob stripe.*", "stripe.*", page_full),
        ("search: tool glob, rare (slack.*)", "slack.*", page_full),
        ("search: argument value (JSON)", f"customer={data.search_customer}", some),
        ("search: argument, two values", f"customer={data.search_customer} currency=usd", some),
        ("search: plain token (any kind)", data.search_key[:-2], some),
    ]


def _at_least(pattern: str, least: int) -> Check:
    regex = re.compile(pattern)

    def check(response: Any) -> None:
        if response.status_code != 200:
            raise AssertionError(f"status {response.status_code}")
        found = len(regex.findall(response.content.decode()))
        if found < least:
            raise AssertionError(f"{found} matches of {pattern!r}, expected >= {least}")

    return check


EFFECT_ROWS = r'<a data-row-link href="/effects/eff_[0-9a-f]{32}/"'
JOURNAL_ROWS = r'<div class="when">#\d+'


def measure(
    client: Any,
    timer: SqlTimer,
    tick: Ticker,
    result: Result,
    check: Check,
    runs: int,
    headers: dict[str, str] | None = None,
) -> Result:
    headers = headers or {}
    for _ in range(WARMUP):
        tick()
        check(client.get(result.url, headers=headers))
    timer.by_sql.clear()
    gc.collect()
    for _ in range(runs):
        tick()
        timer.reset()
        start = time.perf_counter()
        response = client.get(result.url, headers=headers)
        elapsed = (time.perf_counter() - start) * 1000
        check(response)
        result.samples.append(elapsed)
        result.sql_ms.append(timer.ms)
        result.queries = timer.count
    _top_query(timer, result, runs)
    say(
        f"  {result.name}: p50 {result.p50:.1f} ms, p95 {result.p95:.1f} ms,"
        f" sql p50 {percentile(result.sql_ms, 0.5):.1f} ms"
    )
    return result


def _top_query(timer: SqlTimer, result: Result, requests: int) -> None:
    """The ledger or sweep statements that cost the page most (Django's own session, user
    and permission lookups are left out: each is a primary-key read)."""
    ledger = {
        sql: entry
        for sql, entry in timer.by_sql.items()
        if '"openonce_' in sql or '"reconciler_sweep"' in sql
    }
    ranked = sorted(ledger.items(), key=lambda item: item[1][0], reverse=True)
    result.top = [
        (total / requests, sql, params)
        for sql, (total, _, params) in ranked[:TOP_STATEMENTS]
        if total / requests >= TOP_MIN_MS or sql == ranked[0][0]
    ]


def _short(params: Any, most: int = 200) -> str:
    text = repr(params)
    return text if len(text) <= most else text[: most - 3] + "..."


def next_link(response: Any) -> str:
    text = response.content.decode()
    match = re.search(r'<a rel="next" href="(/effects/\?[^"]*after=[^"]*)"', text)
    if match is None:
        raise AssertionError("no 'next' link on a page that should have one")
    return html.unescape(match.group(1))


def walk(client: Any, timer: SqlTimer, tick: Ticker, results: list[Result], check: Check) -> str:
    """Follow "Older effects" DEEP_PAGES times from page 1 of FILTERED, timing each page
    once on the way (as a person paging back would); returns the last page's URL."""
    result = Result(f"list state+tool, pages 2-{DEEP_PAGES + 1} once each", "list", "")
    link = FILTERED
    response = client.get(link)
    check(response)
    timer.by_sql.clear()
    for _ in range(DEEP_PAGES):
        link = next_link(response)
        tick()
        timer.reset()
        start = time.perf_counter()
        response = client.get(link)
        result.samples.append((time.perf_counter() - start) * 1000)
        result.sql_ms.append(timer.ms)
        result.queries = timer.count
        check(response)
    _top_query(timer, result, DEEP_PAGES)
    result.url = link
    results.append(result)
    say(f"  {result.name}: p50 {result.p50:.1f} ms, p95 {result.p95:.1f} ms")
    return link


def explain(sql: str, params: Any, width: int = 240) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        lines = [row[0] for row in cursor.fetchall()]
    return "\n".join(line if len(line) <= width else line[: width - 3] + "..." for line in lines)


def run_pages(url: str, dsn: str, data: Data, runs: int, want_explain: bool) -> list[Result]:
    """In this process: Django on the bench database, a signed-in viewer, every page."""
    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "openonce_site.settings.test"
    os.environ["OPENONCE_DATABASE"] = url
    # This file is bench/console.py: with bench/ on the path, "console" (the Django app)
    # would name this script. The project root goes first, bench/ leaves.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") not in (here, ROOT)]
    django.setup()

    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client

    from console.roles import sync_roles

    group, _ = Group.objects.get_or_create(name="viewer")
    if not group.permissions.exists():
        sync_roles()
    user = User.objects.create_user("bench-viewer", password=uuid.uuid4().hex)
    user.groups.add(group)
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)

    tick = Ticker(dsn)
    timer = SqlTimer()
    results: list[Result] = []
    try:
        with connection.execute_wrapper(timer):

            def page(name: str, budget: str, url: str, check: Check, htmx: bool = False) -> None:
                headers = {"HX-Request": "true"} if htmx else None
                result = Result(name, budget, url)
                results.append(measure(client, timer, tick, result, check, runs, headers))

            queue_rows = rows_check(EFFECT_ROWS, 100)
            list_rows = rows_check(EFFECT_ROWS, 50)
            healthy = rows_check(r"Reconciler healthy", 1)  # the ticks reach the panel
            page("queue page", "queue", "/", both(queue_rows, healthy))
            page("queue fragment (htmx poll)", "queue", "/", queue_rows, htmx=True)
            page("list state+tool, page 1", "list", FILTERED, list_rows)
            deep = walk(client, timer, tick, results, list_rows)
            page(f"list state+tool, page {DEEP_PAGES + 1}", "list", deep, list_rows)
            page("list rare state+tool, page 1", "list", RARE, list_rows)
            page(f"list stuck > {STUCK}", "list", f"/effects/?stuck={STUCK}", list_rows)
            key_rows = rows_check(EFFECT_ROWS, 1)
            page("list key search", "list", f"/effects/?key={data.search_key}", key_rows)
            # The search box, one query of each kind (console/search.py), counted up to
            # 10,000 like every list.
            for name, query, check in search_queries(data, key_rows, list_rows):
                page(name, "search", "/effects/?" + urlencode({"q": query}), check)
            detail = f"/effects/{data.big_effect}/"
            # The page shows the newest JOURNAL_SHOWN lines and says how many there are
            # in all; the exports hold every line.
            journal_rows = both(
                rows_check(JOURNAL_ROWS, JOURNAL_SHOWN),
                rows_check(f"Showing the newest {JOURNAL_SHOWN} of {JOURNAL_LINES} lines", 1),
            )
            page(f"detail, {JOURNAL_LINES:,} journal lines", "detail", detail, journal_rows)
            page("reconciler panel (htmx poll)", "", "/reconciler/", healthy, htmx=True)
        if want_explain:
            for result in results:
                result.explains = [explain(sql, params) for _, sql, params in result.top]
    finally:
        tick.close()
        connection.close()
    return results


# -- report ---------------------------------------------------------------------------------


def _statement(sql: str) -> str:
    """A statement, shortened for one line: the column list dropped, the rest kept."""
    text = " ".join(sql.split())
    text = re.sub(r"^SELECT (.{60}).*? FROM ", r"SELECT \1... FROM ", text)
    return text if len(text) <= 300 else text[:297] + "..."


def render(
    results: list[Result], data: Data, settings: dict[str, Any], runs: int, notes: list[str]
) -> str:
    p = settings["postgres"]
    queue = sum(data.states.get(s, 0) for s in ("requires_approval", "human_review", "unknown"))
    out = [
        "OpenOnce console server time on Postgres: request -> response through"
        " django.test.Client in this process (no network), same machine, same run",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; code: {settings['revision']}",
        f"postgres {p['server_version']}: shared_buffers={p['shared_buffers']},"
        f" work_mem={p['work_mem']}, random_page_cost={p['random_page_cost']},"
        f" jit={p['jit']}",
        f"ledger: {data.effects:,} effects over 30 days, {queue:,} in the human queue ("
        + ", ".join(
            f"{s} {data.states.get(s, 0):,}"
            for s in ("requires_approval", "human_review", "unknown")
        )
        + f"); {data.journal:,} journal lines, {data.approvals:,} approvals,"
        f" {data.sweeps:,} sweeps (30 days at {SWEEP_EVERY:g} s)",
        "sizes with indexes: " + ", ".join(f"{t} {mb:,.0f} MB" for t, mb in data.sizes_mb.items()),
        f"each page: {WARMUP} untimed requests, then {runs} timed (the walk: each page once);"
        " percentiles are nearest-rank",
        "load average (1, 5, 15 min) before timing "
        + " ".join(f"{v:.2f}" for v in settings["load_before"])
        + ", after "
        + " ".join(f"{v:.2f}" for v in settings["load_after"])
        + f" on {os.cpu_count()} cores (other work on the machine shows up in the tails)",
        "",
    ]
    header = (
        f"{'page':<38}{'runs':>5}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'budget':>9}"
        f"  {'verdict':<8}{'sql p50':>8}{'queries':>8}"
    )
    out += [header, "-" * len(header)]
    for r in results:
        budget = f"<={r.limit:.0f}" if r.limit is not None else "-"
        out.append(
            f"{r.name:<38}{len(r.samples):>5}{r.p50:>9.1f}{r.p95:>9.1f}{max(r.samples):>9.1f}"
            f"{budget:>9}  {r.verdict:<8}{percentile(r.sql_ms, 0.5):>8.1f}{r.queries:>8}"
        )
    out += [
        "budget: p95 of the server time, from the issue (queue and list <= 100 ms, detail"
        " <= 50 ms); sql p50: time inside the database driver per request (median);",
        "queries: statements per request (session, user, permissions included)",
        "",
        "urls:",
    ]
    out += [f"  {r.name}: {r.url}" for r in results]
    out += ["", "costliest ledger/sweep statements per page (mean ms per request):"]
    for r in results:
        for ms, sql, _params in r.top:
            out.append(f"  {r.name}: {ms:.1f} ms  {_statement(sql)}")
    if any(r.explains for r in results):
        out += ["", "EXPLAIN (ANALYZE, BUFFERS) of those statements:"]
        for r in results:
            for (ms, sql, params), plan in zip(r.top, r.explains, strict=True):
                out += ["", f"-- {r.name} ({ms:.1f} ms): {_statement(sql)}"]
                out += [f"-- params {_short(params)}", plan]
    s = data.seconds
    out += [
        "",
        f"setup (not timed): manage.py migrate {s.get('migrate', 0):.1f} s; fill "
        + ", ".join(f"{k} {v:.1f} s" for k, v in s.items() if k != "migrate"),
    ]
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=1_000_000, help="effects in the ledger")
    parser.add_argument("--runs", type=int, default=40, help="timed requests per page")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print EXPLAIN (ANALYZE, BUFFERS) of each page's costliest ledger statement",
    )
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("OPENONCE_BENCH_PG") or DEFAULT_PG,
        help="Postgres DSN to run CREATE DATABASE from (default: $OPENONCE_BENCH_PG or"
        f" {DEFAULT_PG})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.effects < 10_000 or args.runs < 1:
        parser.error("--effects must be at least 10,000 and --runs at least 1")

    import psycopg
    from psycopg.conninfo import make_conninfo

    # A SIGTERM still drops the database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Only what this script sets reaches Django (a stray OPENONCE_GRACE_SECONDS would
    # change the queue).
    for name in [k for k in os.environ if k.startswith(("OPENONCE_", "DJANGO_"))]:
        del os.environ[name]
    settings: dict[str, Any] = {"revision": code_revision()}
    dbname = "openonce_bench_console_" + uuid.uuid4().hex[:10]
    url = database_url(args.pg_dsn, dbname)
    dsn = make_conninfo(args.pg_dsn, dbname=dbname)
    started = time.monotonic()
    created = False
    try:
        with psycopg.connect(args.pg_dsn, autocommit=True) as admin:
            settings["postgres"] = {
                name: str(admin.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in ("server_version", "shared_buffers", "work_mem",
                             "random_page_cost", "jit")
            }  # fmt: skip
            admin.execute(f"CREATE DATABASE {dbname}")
            created = True
        say(f"database {dbname}: manage.py migrate ...")
        start = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENONCE_", "DJANGO_"))}
        env.update(DJANGO_SETTINGS_MODULE="openonce_site.settings.test", OPENONCE_DATABASE=url)
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{done.stdout}\n{done.stderr}")
        migrate_s = time.perf_counter() - start
        say(f"filling {args.effects:,} effects ...")
        data = seed(dsn, args.effects)
        data.seconds = {"migrate": migrate_s, **data.seconds}
        say("timing pages ...")
        settings["load_before"] = os.getloadavg()
        results = run_pages(url, dsn, data, args.runs, args.explain)
        settings["load_after"] = os.getloadavg()
    finally:
        if created:
            with psycopg.connect(args.pg_dsn, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            say(f"database {dbname} dropped")
    elapsed = time.monotonic() - started
    if args.json:
        report = {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "settings": settings,
            "data": {
                "effects": data.effects,
                "states": data.states,
                "journal_lines": data.journal,
                "approvals": data.approvals,
                "sweeps": data.sweeps,
                "detail_effect": data.big_effect,
                "detail_journal_lines": data.big_lines,
                "sizes_mb": {k: round(v, 1) for k, v in data.sizes_mb.items()},
                "setup_seconds": {k: round(v, 1) for k, v in data.seconds.items()},
            },
            "warmup": WARMUP,
            "runs": args.runs,
            "budgets_p95_ms": BUDGET_MS,
            "results": [r.as_dict() for r in results],
            "all_pass": all(r.verdict != "BELOW" for r in results),
            "seconds": round(elapsed, 1),
        }
        print(json.dumps(report, indent=2))
    else:
        print(render(results, data, settings, args.runs, [f"took {elapsed:.0f} s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
