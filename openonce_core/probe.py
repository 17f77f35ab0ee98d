"""What a prober reports about one effect: did it happen at the provider?

A prober is read-only: it looks the effect up at the provider (by the provider key the
handler passed, or by a natural business key) and never repeats the mutation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from .records import Effect


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

    @property
    def decisive(self) -> bool:
        return self.outcome is not ProbeOutcome.INCONCLUSIVE


class Prober(Protocol):
    def probe(self, effect: Effect) -> ProbeResult: ...
