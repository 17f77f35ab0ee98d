"""``/metrics`` for Prometheus: computed at scrape time from the ledger (through the core's
store read methods) and from the daemon's own records in the database — never from one
process's memory, so every web replica reports the same numbers and a restart loses
nothing.

Names (all ``openonce_``; the alert rules in deploy/prometheus/ use them):

effects{state}                         effects by state (count_by_state)
human_queue{kind}                      awaiting approval, in human review, UNKNOWN past grace
oldest_unknown_age_seconds             seconds since the longest-waiting UNKNOWN changed
approval_oldest_wait_seconds           seconds the oldest pending approval has waited
probes_total{tool,outcome,status}      probes by result (happened, not_happened,
                                       inconclusive, transient, credential, error) and the
                                       provider's HTTP status when it refused ("ok": answered)
probe_duration_seconds{...}            the same probes' latency, a histogram
sweep_age_seconds / sweep_lag_seconds  since the last sweep started; how far past its interval
sweep_duration_seconds                 how long the last finished sweep took
sweep_due                              effects the last sweep found due
prober_failing{provider}               1 while a provider refuses the prober's credentials
quarantined_messages                   batch messages held back for killing workers
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from openonce_core.states import EffectState
from openonce_site.ledger import get_openonce, get_reconciler

from . import deliveries
from .models import ProberStatus, ProbeTally, Sweep

S = EffectState
# UNKNOWN effects past grace are counted by reading the oldest ones (grace differs per
# tool); past this many the count is a floor and openonce_human_queue_capped says so.
UNKNOWN_SCAN = 10_000


def human_queue(at: float) -> tuple[dict[str, int], bool]:
    """Depth of what waits for a person, by kind, as the console's queue counts it."""
    store = get_openonce().store
    counts = store.count_by_state()
    reconciler = get_reconciler()
    grace: dict[str, float] = {}
    past_grace, scanned = 0, 0
    after: tuple[float, str] | None = None
    while scanned < UNKNOWN_SCAN:
        rows = store.due_unknown(at, min(1000, UNKNOWN_SCAN - scanned), after)
        for effect in rows:
            if effect.tool not in grace:
                grace[effect.tool] = reconciler.grace_for(effect.tool)
            if at >= effect.updated_at + grace[effect.tool]:
                past_grace += 1
        scanned += len(rows)
        if len(rows) < 1000:
            break
        after = (rows[-1].updated_at, rows[-1].id)
    return {
        "requires_approval": counts.get(S.REQUIRES_APPROVAL, 0),
        "human_review": counts.get(S.HUMAN_REVIEW, 0),
        "unknown_past_grace": past_grace,
    }, scanned >= UNKNOWN_SCAN


class LedgerCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        at = time.time()
        store = get_openonce().store
        effects = GaugeMetricFamily("openonce_effects", "Effects by state.", labels=["state"])
        counts = store.count_by_state()
        for state in EffectState:
            effects.add_metric([state.value], counts.get(state, 0))
        yield effects

        queue, capped = human_queue(at)
        depth = GaugeMetricFamily(
            "openonce_human_queue", "What waits for a person, by kind.", labels=["kind"]
        )
        for kind, n in queue.items():
            depth.add_metric([kind], n)
        yield depth
        yield GaugeMetricFamily(
            "openonce_human_queue_capped",
            f"1 when more than {UNKNOWN_SCAN} UNKNOWN effects were scanned (a floor).",
            value=int(capped),
        )
        yield _age("openonce_oldest_unknown_age_seconds",
                   "Seconds since the longest-waiting UNKNOWN effect last changed.",
                   store.oldest_change(S.UNKNOWN), at)  # fmt: skip
        yield _age("openonce_approval_oldest_wait_seconds",
                   "Seconds the oldest effect awaiting approval has waited.",
                   store.oldest_change(S.REQUIRES_APPROVAL), at)  # fmt: skip
        yield from _probes()
        yield from _sweeps(at)
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
    age = at - last.started_at.timestamp() if last else 0.0
    interval = (last.interval if last else None) or 0.0
    yield GaugeMetricFamily(
        "openonce_sweep_age_seconds", "Seconds since the last sweep started.", value=age
    )
    yield GaugeMetricFamily(
        "openonce_sweep_lag_seconds",
        "Seconds the next sweep is overdue (age past the interval).",
        value=max(0.0, age - interval) if last else 0.0,
    )
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
