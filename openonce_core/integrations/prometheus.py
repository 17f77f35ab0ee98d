"""Agent-side metrics for Prometheus: how each call of an effect ended, per tool.

    from openonce_core.integrations.prometheus import EffectMetrics

    oo.observe(EffectMetrics())          # counts into prometheus_client's default registry

``openonce_agent_calls_total{tool, outcome}`` tells a replay from a fresh run from a parked
UNKNOWN (outcomes: ``openonce_core._observe.OUTCOMES``), and
``openonce_agent_call_seconds{tool, outcome}`` how long the call took, ledger included.
Expose them the way your process already does (``prometheus_client.start_http_server``).
Ledger-wide facts (effects by state, the human queue) come from the daemon's ``/metrics``.

Needs ``pip install "openonce[metrics]"`` (prometheus_client).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from .._observe import EffectEvent

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class EffectMetrics:
    """An observer (``oo.observe(...)``) that counts calls by tool and outcome."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, prefix: str = "openonce_agent"
    ) -> None:
        registry = REGISTRY if registry is None else registry
        self.calls = Counter(
            f"{prefix}_calls",
            "Calls of an OpenOnce effect, by how they ended (executed, replayed, unknown, ...)",
            ["tool", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            f"{prefix}_call_seconds",
            "Time an OpenOnce effect call took, ledger writes included",
            ["tool", "outcome"],
            buckets=BUCKETS,
            registry=registry,
        )

    def __call__(self, event: EffectEvent) -> None:
        self.calls.labels(event.tool, event.outcome).inc()
        self.seconds.labels(event.tool, event.outcome).observe(event.duration)

    def __repr__(self) -> str:
        return "EffectMetrics()"


__all__ = ["EffectMetrics"]
