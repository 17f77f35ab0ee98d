"""What an agent process can watch: one event per call of an effect, for metrics and traces.

``OpenOnce(observers=[...])`` (or ``oo.observe(fn)``) calls each observer with an
:class:`EffectEvent` when a call ends — fresh run, replay, parked UNKNOWN, approval pending,
refused — with its tool, effect id and timing, so a metrics collector can tell a replay
from a fresh call (``openonce_core.integrations.prometheus``) and a tracer can record a span
per effect (``openonce_core.integrations.otel``). Observers run on the caller's thread
after the ledger write; one that raises is logged and ignored, never the call's problem.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("openonce")

# What a call can end as (EffectEvent.outcome).
OUTCOMES = (
    "executed",  # the handler ran and its result was committed
    "replayed",  # a duplicate: the recorded result (or failure) was returned
    "failed",  # the handler ran and the provider said no (FAILED, recorded)
    "unknown",  # the call may have happened: parked as UNKNOWN
    "approval_pending",  # a person must approve first
    "refused",  # denied, cancelled, mismatched arguments: nothing ran
    "in_flight",  # another caller was still running it when the wait ran out
    "suspended",  # an inner effect paused it; nothing external happened in this attempt
    "receipt_contract_failed",  # it ran, but its receipt breaks the contract: a person decides
    "lease_lost",  # it ran after losing its lease: its result is evidence only
)


@dataclass(frozen=True, slots=True)
class EffectEvent:
    tool: str
    outcome: str
    effect_id: str | None
    attempt: int
    started_at: float  # the ledger clock's time when the call began
    duration: float  # seconds, measured on this host's monotonic clock
    error_type: str | None = None


Observer = Callable[[EffectEvent], None]
# An observer may also have ``begin(tool) -> context manager``: entered for the whole call,
# so a tracer's span is current while the handler runs (its own spans nest inside).


def begin(observers: tuple[Observer, ...], tool: str) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for observer in observers:
        start = getattr(observer, "begin", None)
        if start is not None:
            try:
                stack.enter_context(start(tool))
            except Exception:
                log.exception("openonce observer %r failed to begin a call", observer)
    return stack


def notify(observers: tuple[Observer, ...], event: EffectEvent) -> None:
    for observer in observers:
        try:
            observer(event)
        except Exception:
            log.exception("openonce observer %r failed on %s", observer, event.outcome)
