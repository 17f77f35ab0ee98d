"""The capability record: one provider behaviour, its honesty tier and its contracts,
checked for contradictions whatever file or code it came from."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._canonical import fingerprint as _fingerprint
from ..errors import CapabilityError

SCHEMA_VERSION = 1

TIER_1_NATIVE_IDEMPOTENCY_KEY = "tier_1_native_idempotency_key"
TIER_2_NATURAL_BUSINESS_KEY = "tier_2_natural_business_key"
TIER_2_SENDER_CONTROLLED_AUTHORITATIVE = "tier_2_sender_controlled_authoritative"
TIER_3_NON_AUTHORITATIVE = "tier_3_non_authoritative"
TIERS = (
    TIER_1_NATIVE_IDEMPOTENCY_KEY,
    TIER_2_NATURAL_BUSINESS_KEY,
    TIER_2_SENDER_CONTROLLED_AUTHORITATIVE,
    TIER_3_NON_AUTHORITATIVE,
)

# Text a reviewer still has to replace. Any field holding it fails --require-reviewed
# and any evidence holding it fails --require-conformance.
TODO = "TODO"

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class _InvalidCapability(CapabilityError):
    """A semantic contradiction in one field; ``capability_from_json`` re-labels it."""

    def __init__(self, name: str, problem: str) -> None:
        self.problem = problem
        super().__init__(f"capability {name!r}: {problem}")


# -- the capability -----------------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    """One provider behaviour and the contracts that make its probe results trustworthy."""

    name: str
    tool_pattern: str
    tier: str
    key_strategy: str
    probe_basis: str
    miss_semantics: str
    can_auto_rearm_on_miss: bool
    default_grace_seconds: int
    prober: str | None = None
    handler_requirements: tuple[str, ...] = ()
    risk: str = ""
    required_receipt_fields: tuple[str, ...] = ()
    required_receipt_source_fields: Mapping[str, str] = field(default_factory=dict)
    required_args: tuple[str, ...] = ()
    required_idempotency_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Accept lists from callers, but keep the instance immutable: a capability is
        # shared by every reconciler tick and must not change under one of them.
        for name in _TUPLE_FIELDS:
            object.__setattr__(self, name, tuple(getattr(self, name)))
        sources = MappingProxyType(dict(self.required_receipt_source_fields))
        object.__setattr__(self, "required_receipt_source_fields", sources)
        problems = _semantic_problems(self)
        if problems:
            raise _InvalidCapability(self.name, problems[0])

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def matches(self, tool: str) -> bool:
        """True when ``tool`` matches the capability's glob (``stripe.*``)."""
        return fnmatch.fnmatchcase(tool, self.tool_pattern)

    def to_json(self) -> dict[str, Any]:
        """The capability in the capability-file schema (``capability_from_json`` reads it)."""
        return {
            "name": self.name,
            "tool_pattern": self.tool_pattern,
            "tier": self.tier,
            "key_strategy": self.key_strategy,
            "probe_basis": self.probe_basis,
            "miss_semantics": self.miss_semantics,
            "can_auto_rearm_on_miss": self.can_auto_rearm_on_miss,
            "default_grace_seconds": self.default_grace_seconds,
            "prober": self.prober,
            "handler_requirements": list(self.handler_requirements),
            "risk": self.risk,
            "required_receipt_fields": list(self.required_receipt_fields),
            "required_receipt_source_fields": dict(self.required_receipt_source_fields),
            "required_args": list(self.required_args),
            "required_idempotency_fields": list(self.required_idempotency_fields),
        }

    def fingerprint(self) -> str:
        """``sha256:`` of the canonical JSON of everything that decides probe semantics.

        Conformance evidence records it; when a field that changes what a prober must do
        or what its result means changes, old evidence stops counting. ``risk`` is a
        reviewer's note, not semantics, so rewording it does not invalidate evidence.
        """
        semantic = self.to_json()
        del semantic["risk"]
        return _fingerprint(semantic)

    def guidance(self, *, prober_registered: bool = False) -> str:
        """What an operator needs to resolve an UNKNOWN effect of this capability by hand
        (and, when no prober was registered, which one would have done it)."""
        lines = [f"provider capability {self.name} ({self.tier})"]
        if not prober_registered and self.prober:
            lines.append(
                f"missing prober: register {self.prober} for this tool"
                f" (Reconciler.register(tool, prober, capability={self.name!r}))"
            )
        elif not prober_registered:
            lines.append("missing prober: none is known for this capability; check by hand")
        lines.append(f"probe basis: {self.probe_basis}")
        lines.append(f"miss semantics: {self.miss_semantics}")
        if self.can_auto_rearm_on_miss:
            lines.append(
                f"a miss may re-arm the effect after a {self.default_grace_seconds}s grace window"
            )
        else:
            lines.append("a miss is not evidence: never re-arm without a person's decision")
        if self.handler_requirements:
            lines.append("handler requirements:")
            lines.extend(f"  - {item}" for item in self.handler_requirements)
        if self.required_idempotency_fields:
            lines.append(
                "required idempotency fields: " + ", ".join(self.required_idempotency_fields)
            )
        if self.required_receipt_fields:
            lines.append("required receipt fields: " + ", ".join(self.required_receipt_fields))
        for receipt_field, arg in self.required_receipt_source_fields.items():
            lines.append(f"receipt source contract: receipt {receipt_field} must equal arg {arg}")
        return "\n".join(lines)


_TUPLE_FIELDS = (
    "handler_requirements",
    "required_receipt_fields",
    "required_args",
    "required_idempotency_fields",
)


def _semantic_problems(cap: Capability) -> list[str]:
    """Contradictions no capability may hold, whatever file or code it came from."""
    problems: list[str] = []
    if not _NAME.match(cap.name):
        problems.append("name: use letters, digits, '_', '.' or '-'")
    if not cap.tool_pattern:
        problems.append("tool_pattern: must not be empty")
    if cap.tier not in TIERS:
        problems.append(f"tier: unknown tier {cap.tier!r}; expected one of {', '.join(TIERS)}")
    if type(cap.default_grace_seconds) is not int or cap.default_grace_seconds < 0:
        problems.append("default_grace_seconds: must be a non-negative integer")
    if cap.tier == TIER_3_NON_AUTHORITATIVE and cap.can_auto_rearm_on_miss:
        # The whole point of tier 3: its miss is not evidence, so it can never re-arm.
        problems.append(
            "can_auto_rearm_on_miss: a tier_3_non_authoritative miss is not evidence;"
            " it cannot re-arm"
        )
    for name in _TUPLE_FIELDS:
        values: tuple[str, ...] = getattr(cap, name)
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            problems.append(f"{name}: duplicate entries {', '.join(duplicates)}")
    for receipt_field, arg in cap.required_receipt_source_fields.items():
        where = f"required_receipt_source_fields.{receipt_field}"
        if receipt_field not in cap.required_receipt_fields:
            problems.append(f"{where}: {receipt_field!r} is not in required_receipt_fields")
        if arg not in cap.required_idempotency_fields:
            # A receipt tied to an arg that is not key material could be replayed for a
            # call with a different value of that arg.
            problems.append(f"{where}: source arg {arg!r} is not in required_idempotency_fields")
    return problems
