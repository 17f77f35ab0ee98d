"""What a prober reports about one effect: did it happen at the provider?

A prober is read-only: it looks the effect up at the provider (by the provider key the
handler passed, or by a natural business key) and never repeats the mutation.

Time: a prober that judges an effect's age (a young miss inside an index lag) compares the
effect's timestamps, written on the ledger's clock (the database's on Postgres), with the
time now. It must read "now" on that same clock: a prober with a ``bind_clock(now)`` method
is handed the reconciler's ``clock.now`` when it is registered (``Reconciler.register``),
and the age counts from :func:`attempt_ended_at`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from ._records import Effect

# A young miss is asked again this long after the provider's lag has passed: the request
# may have reached the provider after the attempt ended, and a prober's clock not bound to
# the ledger's may read a little behind it.
MATURITY_MARGIN_SECONDS = 10.0


class ProbeOutcome(StrEnum):
    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class ProbeResult:
    outcome: ProbeOutcome
    receipt: dict[str, Any] | None = None
    detail: str = ""
    # A decisive result must echo the effect's provider reference (its provider_key, or
    # the natural key the prober searched by); without it the result counts as
    # inconclusive, so a lookup of the wrong object can never resolve this effect.
    provider_reference: str | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    # For an INCONCLUSIVE result that will mature (a young miss: the provider's index may
    # not have the object yet): ask again after this many seconds instead of asking a
    # person now. The reconciler re-probes then, within its bounds (reconcile.py).
    retry_after: float | None = None

    @property
    def decisive(self) -> bool:
        return self.outcome is not ProbeOutcome.INCONCLUSIVE


def attempt_ended_at(effect: Effect) -> float:
    """When the effect's current attempt stopped, on the ledger's clock: when it went
    UNKNOWN. Its ``updated_at`` says that until a reconciler re-probes it (a move of
    UNKNOWN to UNKNOWN, which updates the row), so a re-probe keeps the first time in
    ``verification_evidence["unknown_since"]``, valid for the attempt it names."""
    since = (effect.verification_evidence or {}).get("unknown_since")
    if isinstance(since, dict) and since.get("attempt") == effect.attempt:
        at = since.get("at")
        if isinstance(at, int | float) and not isinstance(at, bool):
            return float(at)
    return effect.updated_at


def young_miss_wait(age: float, lag: float, margin: float) -> float | None:
    """How long to wait before a miss ``age`` seconds after the attempt is evidence: until
    the provider's ``lag`` has passed, plus ``margin``; None once it has.

    A negative age means the prober's clock reads behind the clock the effect was written
    on (a host clock stepped back, a prober not bound to the reconciler's clock). The
    attempt cannot have ended in the future, so the age counts as 0: the wait is never
    longer than the lag plus the margin, and a clock an hour behind does not park an
    effect for an hour."""
    age = max(age, 0.0)
    return None if age >= lag else lag - age + margin


def age_words(age: float) -> str:
    """The age a prober reports: ``12s old``, or where the clocks disagree, says so."""
    if age >= 0:
        return f"{age:.0f}s old"
    return f"0s old (this clock reads {-age:.0f}s before it ended: clocks disagree)"


class Prober(Protocol):
    def probe(self, effect: Effect) -> ProbeResult: ...
