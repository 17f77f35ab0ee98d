"""``/metrics`` and the console's queue read what is pending, never history (issue 19), and
agree with the reconciler on what is due: one rule (openonce_core/_due.py), on the ledger's
clock, served by the site's Grace (``ledger.clients.get_grace``).

The ledger's statements are watched through the site's store (its ``_all`` and ``_one``):
no scrape runs a GROUP BY over all effects, and the terminal totals are counted at most
once a minute per process."""

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
    from reconciler import metrics

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
    assert "may lag by up to 60s" in page
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

    monkeypatch.setattr(metrics, "TERMINAL_TTL", 0.0)
    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_effects", (("state", "committed"),))] == 110


def test_sweep_age_has_no_sample_before_the_first_sweep(ledger, client) -> None:
    from reconciler.sweep import sweep

    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_sweep_recorded", ())] == 0
    assert ("openonce_sweep_lag_seconds", ()) not in m  # a 0 would read as "on time"
    sweep("once")
    m = parse_metrics(client.get("/metrics").content.decode())
    assert m[("openonce_sweep_recorded", ())] == 1
    assert m[("openonce_sweep_lag_seconds", ())] >= 0
