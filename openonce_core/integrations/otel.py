"""OpenTelemetry spans per effect call.

    from openonce_core.integrations.otel import EffectSpans

    oo.observe(EffectSpans())            # spans from the globally configured tracer provider

Each call of an effect is a span ``openonce <tool>``, current while the call runs (the
handler's own HTTP spans nest inside it), with ``openonce.tool``, ``openonce.outcome``
(executed, replayed, unknown, ...), ``openonce.effect_id`` and ``openonce.attempt``. A call
that ended UNKNOWN, failed, or was refused has an error status: the provider may or may
not have done it, and the trace should say so.

Needs ``pip install "openonce[otel]"`` (opentelemetry-api; bring your own SDK and exporter).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from .._observe import EffectEvent

# Outcomes that are not a clean success from the caller's point of view.
TROUBLED = frozenset({"unknown", "failed", "refused", "in_flight", "lease_lost",
                      "receipt_contract_failed"})  # fmt: skip


class EffectSpans:
    """An observer (``oo.observe(...)``) that records a span per effect call."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self.tracer = tracer or trace.get_tracer("openonce")

    def begin(self, tool: str) -> AbstractContextManager[Any]:
        return self.tracer.start_as_current_span(
            f"openonce {tool}", kind=trace.SpanKind.INTERNAL, attributes={"openonce.tool": tool}
        )

    def __call__(self, event: EffectEvent) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        span.set_attribute("openonce.outcome", event.outcome)
        span.set_attribute("openonce.attempt", event.attempt)
        if event.effect_id:
            span.set_attribute("openonce.effect_id", event.effect_id)
        if event.outcome in TROUBLED:
            span.set_status(Status(StatusCode.ERROR, f"{event.outcome}: {event.error_type}"))

    def __repr__(self) -> str:
        return "EffectSpans()"


__all__ = ["EffectSpans"]
