"""``/metrics`` and the console's queue read what is pending, never history (issue 19), and
agree with the reconciler on what is due: one rule (openonce_core/_due.py), on the ledger's
clock, served by the site's Grace (``ledger.clients.get_grace``).

The ledger's statements are watched through the site's store (its ``_all`` and ``_one``):
no scrape runs a GROUP BY over all effects, and the terminal totals are counted at most
once a minute per process (past a million effects, the planner's estimates are read)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from openonce_core._states import TERMINAL, EffectState
from tests.core.test_due_indexed import Reads, copies, park
from tests.daemon.test_reconciler_envelope import parse_metrics

S = EffectState


@pytest.fixture
def ledger(transactional_db, settings) -> Iterator[str]:
    """The test database's ledger, emptied; grace from the provider capabilities."""
    from django.db import connection

    from ledger import clients as site_ledger

    site_ledger.reset()
    settings.OPENONCE_PROBERS = "tests.support.probers:PROBERS"
    settings.OPENONCE_GRACE_SECONDS = None  # per tool: Stripe's 120 s, none for ledger.sync
    target = site_ledger.ledger_target()
    assert connection.vendor == "postgresql"
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("TRUNCATE openonce_effects, openonce_journal, openonce_approvals")
    yield target
    site_ledger.reset()


def unknown_past_grace(client) -> float:
    page = client.get("/metrics")
    assert page.status_code == 200
    return parse_metrics(page.content.decode())[
        ("openonce_human_queue", (("kind", "unknown_past_grace"),))
    ]


def test_the_reconciler_the_queue_and_the_metrics_agree_on_what_is_due(ledger, client) -> None:
    from console import selectors
    from ledger.clients import get_openonce, get_reconciler

    oo = get_openonce()
    at = oo.clock.now()
    due = {
        park(oo, "ledger.sync", at - 300),  # no grace window
        park(oo, "stripe.charge", at - 600),  # past Stripe's 120 s
        park(oo, "stripe.charge", at - 900, next_probe_at=at - 300),  # its backoff is over
    }
    park(oo, "stripe.charge", at - 60)  # inside Stripe's grace
    park(oo, "ledger.sync", at - 10, next_probe_at=at + 900)  # a failed probe's backoff
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 100)  # history

    queue = selectors.human_queue("unknown", at=at)
    assert {item.effect.id for item in queue.items} == due
    assert str(queue.counts[S.UNKNOWN]) == "3"
    assert unknown_past_grace(client) == 3
    assert {e.id for e in get_reconciler().due(at=at)} == due


def test_a_scrape_counts_pending_states_and_keeps_terminal_totals_a_minute(
    ledger, client, monkeypatch
) -> None:
    from ledger.clients import get_openonce

    oo = get_openonce()
    at = oo.clock.now()
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 99)
    park(oo, "ledger.sync", at - 60)
    park(oo, "stripe.charge", at - 30, state=S.HUMAN_REVIEW)
    reads = Reads(oo.store, monkeypatch)

    page = client.get("/metrics").content.decode()
    m = parse_metrics(page)
    assert m[("openonce_effects", (("state", "committed"),))] == 100
    assert m[("openonce_effects", (("state", "unknown"),))] == 1
    assert m[("openonce_effects", (("state", "human_review"),))] == 1
    assert "counted, at most every 60s: they may lag by that much" in page
    first = [query for query, _ in reads.sql]
    assert not [q for q in first if "GROUP BY" in q.upper()]
    counted = [params for query, params in reads.sql if query.startswith("SELECT count(*)")]
    assert ("committed",) in counted  # counted once, on the state index ...

    # ... and not again for a minute, while pending states are counted on every scrape.
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 9)
    reads.reset()
    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_effects", (("state", "committed"),))] == 100
    counted = [params for query, params in reads.sql if query.startswith("SELECT count(*)")]
    assert not [p for p in counted if p and p[0] in TERMINAL]
    assert ("unknown",) in counted and ("human_review",) in counted

    # A minute later (on the ledger's clock) they are counted again.
    now = oo.clock.now
    monkeypatch.setattr(oo.clock, "now", lambda: now() + 61)
    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_effects", (("state", "committed"),))] == 110


def test_terminal_totals_can_be_kept_longer_or_turned_off(ledger, client, settings, monkeypatch):
    from ledger.clients import get_openonce

    oo = get_openonce()
    at = oo.clock.now()
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 4)
    park(oo, "ledger.sync", at - 60)
    settings.OPENONCE_METRICS_TERMINAL_SECONDS = 3600.0
    page = client.get("/metrics").content.decode()
    assert parse_metrics(page)[("openonce_effects", (("state", "committed"),))] == 5
    assert "counted, at most every 3600s" in page
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 4)
    now = oo.clock.now
    monkeypatch.setattr(oo.clock, "now", lambda: now() + 61)
    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_effects", (("state", "committed"),))] == 5  # kept for the hour

    settings.OPENONCE_METRICS_TERMINAL_SECONDS = 0.0
    reads = Reads(oo.store, monkeypatch)
    page = client.get("/metrics").content.decode()
    m = parse_metrics(page)
    assert "terminal states are not counted (OPENONCE_METRICS_TERMINAL_SECONDS=0)" in page
    assert not [key for key in m if key[0] == "openonce_effects" and key[1][0][1] in TERMINAL]
    assert m[("openonce_effects", (("state", "unknown"),))] == 1
    counted = [params for query, params in reads.sql if query.startswith("SELECT count(*)")]
    assert not [p for p in counted if p and p[0] in TERMINAL]


def test_sweep_age_has_no_sample_before_the_first_sweep(ledger, client) -> None:
    from reconciler.sweep import sweep

    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_sweep_recorded", ())] == 0
    assert ("openonce_sweep_lag_seconds", ()) not in m  # a 0 would read as "on time"
    sweep("once")
    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_sweep_recorded", ())] == 1
    assert m[("openonce_sweep_lag_seconds", ())] >= 0


def test_past_a_million_effects_terminal_totals_are_the_planners_estimates(
    ledger, client, monkeypatch
) -> None:
    """Counting a year of committed effects reads the whole table (0.5 s a million, a seq
    scan); past EXACT_LIMIT the scrape reads two catalog rows instead."""
    from ledger.clients import get_openonce
    from reconciler import metrics

    oo = get_openonce()
    at = oo.clock.now()
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 149)
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.FAILED), 49)
    park(oo, "ledger.sync", at - 60)
    with psycopg.connect(ledger, autocommit=True) as conn:
        conn.execute("ANALYZE openonce_effects")  # a small table: every row sampled
    monkeypatch.setattr(metrics, "EXACT_LIMIT", 100)
    reads = Reads(oo.store, monkeypatch)

    page = client.get("/metrics").content.decode()
    m = parse_metrics(page)
    assert m[("openonce_effects", (("state", "committed"),))] == 150
    assert m[("openonce_effects", (("state", "failed"),))] == 50
    assert m[("openonce_effects", (("state", "denied"),))] == 0  # the sample met none
    assert m[("openonce_effects", (("state", "unknown"),))] == 1  # pending: counted
    assert "estimated by Postgres's planner past 100 effects" in page
    counted = [params for query, params in reads.sql if query.startswith("SELECT count(*)")]
    assert not [p for p in counted if p and p[0] in TERMINAL]

    # Below the limit they are counted, estimates or not.
    monkeypatch.setattr(metrics, "EXACT_LIMIT", 1000)
    now = oo.clock.now
    monkeypatch.setattr(oo.clock, "now", lambda: now() + 61)
    reads.reset()
    page = client.get("/metrics").content.decode()
    assert "counted, at most every 60s" in page
    counted = [params for query, params in reads.sql if query.startswith("SELECT count(*)")]
    assert ("committed",) in counted
