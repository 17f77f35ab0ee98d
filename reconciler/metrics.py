"""``/metrics`` for Prometheus: computed at scrape time from the ledger (through the core's
store read methods) and from the daemon's own records in the database — never from one
process's memory, so every web replica reports the same numbers and a restart loses
nothing.

Names (all ``openonce_``; the alert rules in deploy/prometheus/ use them):

effects{state}                         effects by state: exact for the states an effect
                                       passes through (each counted on the state index),
                                       up to a minute old for the terminal ones (their
                                       rows are history: counted at most once a minute,
                                       OPENONCE_METRICS_TERMINAL_SECONDS; 0: not at all;
                                       past a million effects on Postgres, the planner's
                                       estimates)
human_queue{kind}                      awaiting approval, in human review, UNKNOWN due for
                                       a probe (past grace or backoff: openonce_core._due)
oldest_unknown_age_seconds             seconds since the longest-waiting UNKNOWN changed
approval_oldest_wait_seconds           seconds the oldest pending approval has waited
probes_total{tool,outcome,status}      probes by result (happened, not_happened,
                                       inconclusive, transient, credential, error) and the
                                       provider's HTTP status when it refused ("ok": answered;
                                       "limited": a rate limit held it, nothing was sent)
probe_duration_seconds{...}            the same probes' latency, a histogram
sweep_recorded                         1 once any sweep is recorded (0: age and lag have
                                       no sample yet)
sweep_age_seconds / sweep_lag_seconds  since the last sweep started; how far past its interval
sweep_duration_seconds                 how long the last finished sweep took
sweep_due                              effects the last sweep found due
dispatch_queue_depth                   batches waiting in openonce.batches (absent: unknown)
prober_failing{provider}               1 while a provider refuses the prober's credentials
quarantined_messages                   batch messages held back for killing workers
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ledger.clients import get_grace, get_openonce
from openonce_core._due import count_overdue_unknown
from openonce_core._runtime import OpenOnce
from openonce_core._states import TERMINAL, EffectState

from . import deliveries, queue
from .models import ProberStatus, ProbeTally, Sweep

S = EffectState
PENDING: tuple[EffectState, ...] = tuple(s for s in EffectState if s not in TERMINAL)


# Above this many effects (the planner's figure), terminal totals are the planner's
# estimates, not counts: counting a million committed effects reads the whole table
# (0.5 s; minutes at hundreds of millions).
EXACT_LIMIT = 1_000_000


class TerminalTotals:
    """Terminal states' totals, taken at most once per ``ttl`` seconds (ledger clock) per
    ledger client: they only grow with history, so counting them on every scrape would
    cost what the ledger ever held. Per process (two web replicas may differ by a minute
    of commits). Past ``EXACT_LIMIT`` effects on Postgres they are the planner's estimates
    (two catalog rows); ``estimated`` says which the last figures were."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: tuple[OpenOnce, float, dict[str, int], bool] | None = None

    def get(self, oo: OpenOnce, at: float, ttl: float) -> tuple[dict[str, int], bool]:
        """The totals by state, and whether they are estimates."""
        with self._lock:
            kept = self._kept
        # Taken again when too old, for another client (the site's ledger was reset), or
        # when taken "in the future" (the ledger's clock stepped back).
        if kept is not None and kept[0] is oo and 0.0 <= at - kept[1] < ttl:
            return kept[2], kept[3]
        totals, estimated = _terminal_totals(oo)
        with self._lock:
            self._kept = (oo, at, totals, estimated)
        return totals, estimated


def _terminal_totals(oo: OpenOnce) -> tuple[dict[str, int], bool]:
    estimate = getattr(oo.store, "estimated_counts", None)  # Postgres only
    figures = estimate(TERMINAL) if estimate is not None else None
    if figures is not None and figures[0] >= EXACT_LIMIT:
        return figures[1], True
    return {str(state): oo.store.count([state]) for state in TERMINAL}, False


terminal_totals = TerminalTotals()


def _terminal_help(ttl: float, estimated: bool) -> str:
    if not ttl:
        return "terminal states are not counted (OPENONCE_METRICS_TERMINAL_SECONDS=0)"
    how = (
        f"estimated by Postgres's planner past {EXACT_LIMIT:,} effects (as of the table's"
        " last ANALYZE)"
        if estimated
        else "counted"
    )
    return (
        f"terminal states (committed, failed, denied, cancelled, released) {how}, at most"
        f" every {ttl:g}s: they may lag by that much"
    )


def pending_counts(oo: OpenOnce) -> dict[str, int]:
    """Exact counts of the states an effect passes through, one range of the state index
    each: what is pending, never what is history."""
    return {str(state): oo.store.count([state]) for state in PENDING}


def human_queue(oo: OpenOnce, pending: dict[str, int], at: float) -> dict[str, int]:
    """Depth of what waits for a person, by kind, as the console's queue counts it."""
    return {
        "requires_approval": pending[S.REQUIRES_APPROVAL],
        "human_review": pending[S.HUMAN_REVIEW],
        "unknown_past_grace": count_overdue_unknown(oo.store, get_grace(), oo.clock, at),
    }


class LedgerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        oo = get_openonce()
        at = oo.clock.now()  # the ledger's time: what leases and grace windows are read on
        store = oo.store
        ttl = settings.OPENONCE_METRICS_TERMINAL_SECONDS
        pending = pending_counts(oo)
        terminal, estimated = terminal_totals.get(oo, at, ttl) if ttl else ({}, False)
        effects = GaugeMetricFamily(
            "openonce_effects",
            f"Effects by state; exact for pending states, {_terminal_help(ttl, estimated)}.",
            labels=["state"],
        )
        counts = {**pending, **terminal}
        for state in EffectState:
            if state in counts:
                effects.add_metric([state.value], counts[state])
        yield effects

        depth = GaugeMetricFamily(
            "openonce_human_queue",
            "What waits for a person, by kind (unknown_past_grace: UNKNOWN effects due for a"
            " probe, past their grace window or backoff).",
            labels=["kind"],
        )
        for kind, n in human_queue(oo, pending, at).items():
            depth.add_metric([kind], n)
        yield depth
        yield _age("openonce_oldest_unknown_age_seconds",
                   "Seconds since the longest-waiting UNKNOWN effect last changed.",
                   store.oldest_change(S.UNKNOWN), at)  # fmt: skip
        yield _age("openonce_approval_oldest_wait_seconds",
                   "Seconds the oldest effect awaiting approval has waited.",
                   store.oldest_change(S.REQUIRES_APPROVAL), at)  # fmt: skip
        yield from _probes()
        # The daemon's records are stamped with this host's clock (Django's timezone.now).
        yield from _sweeps(time.time())
        queued = queue.depth()
        if queued is not None:  # eager mode or an unanswering broker: no sample
            yield GaugeMetricFamily(
                "openonce_dispatch_queue_depth",
                "Reconcile batches waiting in the broker's openonce.batches queue.",
                value=queued,
            )
        failing = GaugeMetricFamily(
            "openonce_prober_failing",
            "1 while the provider refuses the prober's credentials.",
            labels=["provider"],
        )
        for row in ProberStatus.objects.order_by("provider"):
            failing.add_metric([row.provider], int(row.failing))
        yield failing
        yield GaugeMetricFamily(
            "openonce_quarantined_messages",
            "Batch messages quarantined for killing their workers.",
            value=len(deliveries.quarantined()),
        )


def _age(name: str, doc: str, since: float | None, at: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=0.0 if since is None else max(0.0, at - since))


def _probes() -> Iterator[Metric]:
    labels = ["tool", "outcome", "status"]
    total = CounterMetricFamily(
        "openonce_probes", "Probes by tool, result and provider status.", labels=labels
    )
    latency = HistogramMetricFamily(
        "openonce_probe_duration_seconds", "Probe latency.", labels=labels
    )
    for row in ProbeTally.objects.order_by("tool", "outcome", "status"):
        key = [row.tool, row.outcome, row.status]
        total.add_metric(key, row.count)
        buckets: list[tuple[str, Any]] = [
            (f"{le:g}", getattr(row, ProbeTally.bucket_field(le))) for le in ProbeTally.BUCKETS
        ]
        buckets.append(("+Inf", row.count))
        latency.add_metric(key, buckets, row.seconds_sum)
    yield total
    yield latency


def _sweeps(at: float) -> Iterator[Metric]:
    last = Sweep.objects.order_by("-started_at").first()
    finished = Sweep.objects.filter(finished_at__isnull=False).order_by("-finished_at").first()
    yield GaugeMetricFamily(
        "openonce_sweep_recorded",
        "1 once any sweep is recorded; 0 before (sweep age and lag then have no sample).",
        value=int(last is not None),
    )
    # No sample before the first sweep: a 0 would read as "on time" to the alert rules.
    age = GaugeMetricFamily("openonce_sweep_age_seconds", "Seconds since the last sweep started.")
    lag = GaugeMetricFamily(
        "openonce_sweep_lag_seconds", "Seconds the next sweep is overdue (age past the interval)."
    )
    if last is not None:
        seconds = at - last.started_at.timestamp()
        age.add_metric([], seconds)
        lag.add_metric([], max(0.0, seconds - (last.interval or 0.0)))
    yield age
    yield lag
    duration = (
        (finished.finished_at - finished.started_at).total_seconds()
        if finished and finished.finished_at
        else 0.0
    )
    yield GaugeMetricFamily(
        "openonce_sweep_duration_seconds",
        "How long the last finished sweep took, start to its last batch.",
        value=duration,
    )
    yield GaugeMetricFamily(
        "openonce_sweep_due", "Effects the last sweep found due.", value=last.due if last else 0
    )


registry = CollectorRegistry(auto_describe=False)
registry.register(LedgerCollector())
