"""What an agent process can watch: one event per call, a Prometheus collector that tells a
replay from a fresh run, and an OpenTelemetry span per effect call."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from openonce_core import EffectEvent, OpenOnce, OutcomeUnknownError
from openonce_core.integrations.otel import EffectSpans
from openonce_core.integrations.prometheus import EffectMetrics
from openonce_core.testing import FakeClock


def _tools(oo: OpenOnce) -> tuple[Any, Any]:
    @oo.effect(tool="email.send", idempotency_key=lambda to: to)
    def send(to: str) -> str:
        return f"sent to {to}"

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> None:
        raise TimeoutError("read timed out")

    return send, charge


def test_observers_see_how_every_call_ended(store):
    events: list[EffectEvent] = []
    clock = FakeClock()
    oo = OpenOnce(store, observers=[events.append], clock=clock)
    send, charge = _tools(oo)
    send("a@x")
    send("a@x")
    with pytest.raises(OutcomeUnknownError):
        charge("o1")
    with pytest.raises(OutcomeUnknownError):
        charge("o1")
    assert [(e.tool, e.outcome, e.attempt) for e in events] == [
        ("email.send", "executed", 1),
        ("email.send", "replayed", 0),
        ("stripe.charge", "unknown", 1),
        ("stripe.charge", "unknown", 0),
    ]
    assert events[0].effect_id == events[1].effect_id is not None
    assert events[2].error_type == "OutcomeUnknownError"
    assert all(e.duration >= 0 and e.started_at <= clock.now() for e in events)
    assert oo.stats == {"executed": 1, "replayed": 1, "unknown": 2}


def test_a_broken_observer_never_breaks_a_call(store, caplog):
    def broken(event: EffectEvent) -> None:
        raise RuntimeError("metrics backend down")

    oo = OpenOnce(store, observers=[broken])
    send, _ = _tools(oo)
    assert send("a@x") == "sent to a@x"
    assert "observer" in caplog.text and "metrics backend down" in caplog.text


def test_the_prometheus_collector_counts_replays_apart_from_fresh_calls(store):
    registry = CollectorRegistry()
    oo = OpenOnce(store)
    oo.observe(EffectMetrics(registry))
    send, charge = _tools(oo)
    for _ in range(3):
        send("a@x")
    with pytest.raises(OutcomeUnknownError):
        charge("o1")

    def count(tool: str, outcome: str) -> float | None:
        return registry.get_sample_value(
            "openonce_agent_calls_total", {"tool": tool, "outcome": outcome}
        )

    assert count("email.send", "executed") == 1
    assert count("email.send", "replayed") == 2
    assert count("stripe.charge", "unknown") == 1
    histogram = registry.get_sample_value(
        "openonce_agent_call_seconds_count", {"tool": "email.send", "outcome": "replayed"}
    )
    assert histogram == 2


def test_each_call_is_a_span_and_the_handler_runs_inside_it(store):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    oo = OpenOnce(store)
    oo.observe(EffectSpans(tracer))

    @oo.effect(tool="email.send", idempotency_key=lambda to: to)
    async def send(to: str) -> str:
        with tracer.start_as_current_span("smtp.sendmail"):
            return "sent"

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> None:
        raise TimeoutError("read timed out")

    assert asyncio.run(send("a@x")) == "sent"
    assert asyncio.run(send("a@x")) == "sent"
    with pytest.raises(OutcomeUnknownError):
        charge("o1")
    spans = {
        (s.name, s.attributes.get("openonce.outcome")): s for s in exporter.get_finished_spans()
    }
    sent = spans[("openonce email.send", "executed")]
    assert spans[("smtp.sendmail", None)].parent.span_id == sent.context.span_id
    assert sent.attributes["openonce.effect_id"].startswith("eff_")
    assert ("openonce email.send", "replayed") in spans
    unknown = spans[("openonce stripe.charge", "unknown")]
    assert unknown.status.status_code is StatusCode.ERROR
