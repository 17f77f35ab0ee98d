"""Every probe the daemon makes, observed: how long it took, what it answered or what the
provider refused, written to the database after each batch.

The probers registered from OPENONCE_PROBERS are wrapped (:func:`instrument`). A wrapper
changes nothing about the probe — same result, same exception, same ``reference_for`` —
it only times it, logs it with the effect id, and keeps a sample. :func:`flush` adds the
samples to ``ProbeTally`` (for ``/metrics``) and ``ProberStatus`` (for health), so any web
process reports what every worker saw, and a prober whose key was revoked shows red
until a probe of it succeeds again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from openonce_core._probe import ProbeResult
from openonce_core._records import Effect
from openonce_core._redact import redact_text
from openonce_core._wiring import WiringError, load_object
from openonce_core.errors import ProbeCredentialError, ProbeError, ProbeTransientError

from .logs import current_effect_id
from .models import ProberStatus, ProbeTally

log = logging.getLogger("openonce.probe")


@dataclass(frozen=True)
class Sample:
    tool: str
    provider: str
    outcome: str  # happened, not_happened, inconclusive, transient, credential, error
    # The provider's HTTP status when it refused, "ok" for an answer, "limited" when a
    # rate limit held the probe before it was sent, "none" otherwise.
    status: str
    seconds: float
    detail: str = ""
    at: float = 0.0


_samples: list[Sample] = []
_lock = threading.Lock()


def tallies_by_tool() -> dict[str, dict[tuple[str, str], int]]:
    """What the workers recorded, for the console's prober table: per tool, the count of
    probes by (outcome, status)."""
    found: dict[str, dict[tuple[str, str], int]] = {}
    for tally in ProbeTally.objects.order_by("tool"):
        found.setdefault(tally.tool, {})[(tally.outcome, tally.status)] = tally.count
    return found


def statuses_by_provider() -> dict[str, ProberStatus]:
    """Each provider's last answer, last refusal and whether it is failing now."""
    return {row.provider: row for row in ProberStatus.objects.all()}


def _record(sample: Sample) -> None:
    with _lock:
        _samples.append(sample)


def pending() -> list[Sample]:
    with _lock:
        return list(_samples)


class InstrumentedProber:
    """A registered prober, timed and logged; behaves exactly like the one it wraps."""

    def __init__(self, tool: str, inner: Any) -> None:
        self.tool = tool
        self.inner = inner
        self._call: Callable[[Effect], ProbeResult] = (
            inner.probe if hasattr(inner, "probe") else inner
        )
        # The core binds natural-key results through reference_for: keep it if there is one.
        if callable(getattr(inner, "reference_for", None)):
            self.reference_for = inner.reference_for
        self.capability = getattr(inner, "capability", None)
        provider = getattr(inner, "provider", None)
        self.provider = provider if isinstance(provider, str) else tool.partition(".")[0]

    def __repr__(self) -> str:
        return f"InstrumentedProber({self.tool!r}, {self.inner!r})"

    def probe(self, effect: Effect) -> ProbeResult:
        token = current_effect_id.set(effect.id)
        started = time.monotonic()
        try:
            result = self._call(effect)
        except ProbeError as exc:
            self.provider = exc.provider or self.provider
            kind = (
                "transient"
                if isinstance(exc, ProbeTransientError)
                else "credential"
                if isinstance(exc, ProbeCredentialError)
                else "error"
            )
            status = str(exc.status) if exc.status is not None else "none"
            if isinstance(exc, ProbeTransientError) and not getattr(exc, "sent", True):
                # Not asked at all: a rate limit (ours, or a pause the provider asked for)
                # held the probe. The console's prober table counts these as waits.
                status = "limited"
            self._done(effect, kind, status, started, str(exc), logging.WARNING)
            raise
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            self._done(effect, "error", "none", started, detail, logging.WARNING)
            raise
        else:
            outcome = str(getattr(result, "outcome", "invalid"))
            self._done(effect, outcome, "ok", started, getattr(result, "detail", ""), logging.INFO)
            return result
        finally:
            current_effect_id.reset(token)

    def _done(
        self, effect: Effect, outcome: str, status: str, started: float, detail: str, level: int
    ) -> None:
        seconds = time.monotonic() - started
        _record(Sample(self.tool, self.provider, outcome, status, seconds, detail, time.time()))
        log.log(
            level,
            "probe %s %s: %s (%s) in %.3fs",
            self.tool, effect.id, outcome, status, seconds,
            extra={
                "effect_id": effect.id, "tool": self.tool, "provider": self.provider,
                "outcome": outcome, "provider_status": status, "seconds": round(seconds, 4),
            },
        )  # fmt: skip


def instrument(probers: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """OPENONCE_PROBERS (a ``module:NAME`` reference or a mapping) with each prober
    wrapped; entries keep their ``(prober, capability)`` form."""
    table = load_object(probers) if isinstance(probers, str) else (probers or {})
    if not isinstance(table, Mapping):
        raise WiringError(f"probers must be a mapping of tool to prober, got {type(table)}")
    wrapped: dict[str, Any] = {}
    for tool, entry in table.items():
        prober, capability = entry if isinstance(entry, tuple) else (entry, None)
        if not isinstance(prober, InstrumentedProber):
            prober = InstrumentedProber(tool, prober)
        wrapped[tool] = (prober, capability) if capability else prober
    return wrapped


def flush() -> int:
    """Write the samples taken so far; returns how many. Samples stay pending if the
    write fails (the next batch writes them)."""
    with _lock:
        taken = list(_samples)
        _samples.clear()
    if not taken:
        return 0
    try:
        _write(taken)
    except BaseException:
        with _lock:
            _samples[:0] = taken
        raise
    return len(taken)


def _write(samples: list[Sample]) -> None:
    tallies: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in samples:
        row = tallies.setdefault((s.tool, s.outcome, s.status), {"count": 0, "seconds_sum": 0.0})
        row["count"] += 1
        row["seconds_sum"] += s.seconds
        for le in ProbeTally.BUCKETS:
            if s.seconds <= le:
                name = ProbeTally.bucket_field(le)
                row[name] = row.get(name, 0) + 1
    for (tool, outcome, status), counts in tallies.items():
        _add(tool, outcome, status, counts)
    _update_prober_status(samples)


def _add(tool: str, outcome: str, status: str, counts: dict[str, Any]) -> None:
    increments = {name: F(name) + value for name, value in counts.items()}
    _update_or_create(
        ProbeTally.objects.filter(tool=tool, outcome=outcome, status=status),
        increments,
        lambda: ProbeTally.objects.create(tool=tool, outcome=outcome, status=status, **counts),
    )


def _update_or_create(
    rows: QuerySet[Any], changes: dict[str, Any], create: Callable[[], object]
) -> None:
    """Update the row, or create it; when two workers create it at once, the one that
    loses updates the row the other made (Django's update_or_create takes a row lock
    first and cannot add to a counter)."""
    if rows.update(**changes):
        return
    try:
        with transaction.atomic():
            create()
    except IntegrityError:
        rows.update(**changes)


def _update_prober_status(samples: list[Sample]) -> None:
    now = timezone.now()
    last: dict[str, Sample] = {}
    tools: dict[str, set[str]] = {}
    unanswered: set[str] = set()
    for s in samples:
        if s.outcome == "credential" or s.status == "ok":
            last[s.provider] = s
        elif s.status != "limited":
            unanswered.add(s.provider)  # sent, and no answer (a timeout, a 5xx)
        if s.outcome == "credential":
            tools.setdefault(s.provider, set()).add(s.tool)
    for provider in unanswered - set(last):
        # When a probe last got no answer, for the console's prober table; whether the
        # prober is failing is decided by credential refusals and answers only.
        _update_or_create(
            ProberStatus.objects.filter(provider=provider),
            {"last_failure_at": now},
            lambda p=provider: ProberStatus.objects.create(provider=p, last_failure_at=now),
        )
    for provider, sample in last.items():
        if sample.outcome == "credential":
            _mark_failing(provider, sample.detail, now, tools.get(provider, set()))
        else:
            # The provider answered a probe: whatever refused us before is fixed.
            _update_or_create(
                ProberStatus.objects.filter(provider=provider),
                {"failing": False, "last_success_at": now},
                lambda p=provider: ProberStatus.objects.create(provider=p, last_success_at=now),
            )


def record_prober_failures(failures: Mapping[str, str]) -> None:
    """The core's own verdict (``ReconcileReport.prober_failures``), where it has one."""
    now = timezone.now()
    for provider, reason in failures.items():
        _mark_failing(provider, str(reason), now)


def _mark_failing(provider: str, reason: str, now: datetime, tools: set[str] | None = None) -> None:
    """The provider refuses our prober (a revoked key): health turns red naming it."""
    row, _ = ProberStatus.objects.get_or_create(provider=provider)
    if not row.failing:
        row.failing, row.since = True, now
    row.reason = redact_text(reason)[:1000]  # a provider's error may quote our key
    if tools:
        row.tools = sorted(set(row.tools) | tools)
    row.last_failure_at = now
    row.save()


def flush_discard() -> None:
    """Forget samples not yet written (tests that switch databases)."""
    with _lock:
        _samples.clear()
