"""Provider knowledge: what a probe miss means for each provider, and how to prove it.

A prober answers "did this effect happen at the provider?". Whether its answer can be
trusted depends on the provider, not on the prober's code: a Stripe metadata search lags
behind writes, a GitHub PR read is authoritative, a bare SMTP "sent" copy can be lost
after delivery. This module is the one named place for that knowledge:

* ``Capability`` — one provider behaviour: its honesty tier, what a miss means, whether a
  miss may re-arm the effect, the grace window, and the handler and receipt contracts;
* ``CapabilityMatrix`` — the built-in capabilities plus a team's own, resolved per tool;
* receipt and call contracts (``check_receipt``, ``check_call_contract``) the runtime
  and the reconciler enforce;
* conformance: the scenarios every prober of a capability must pass
  (``conformance_plan``, ``assert_conformance``) and the JSON evidence CI checks
  (``check_conformance_evidence``), bound to the capability's ``fingerprint()`` so that
  evidence goes stale when the capability's semantics change.

The three honesty tiers:

* tier 1 — the provider dedups by our key (Stripe): a miss is inconclusive inside the
  index lag window, then not-happened;
* tier 2 — a natural business key read from the primary store (GitHub PR by head), or a
  sender-controlled key searched in an authoritative sent store: a miss is not-happened;
* tier 3 — non-authoritative evidence (bare SMTP): a miss is never evidence.

The package holds one job per module: ``_capability`` (the record), ``_matrix`` (the
built-in matrix), ``_files`` (capability files), ``_receipts`` (receipt checks),
``_call_contract`` (call contracts), ``_conformance`` (plans and evidence) and
``_readiness`` (readiness and stubs for unknown tools). Import from the package.
"""

from __future__ import annotations

from .._probe import ProbeOutcome, ProbeResult
from ..errors import CapabilityError, ConformanceError
from ._call_contract import check_call_contract
from ._capability import (
    SCHEMA_VERSION,
    TIER_1_NATIVE_IDEMPOTENCY_KEY,
    TIER_2_NATURAL_BUSINESS_KEY,
    TIER_2_SENDER_CONTROLLED_AUTHORITATIVE,
    TIER_3_NON_AUTHORITATIVE,
    TIERS,
    TODO,
    Capability,
)
from ._conformance import (
    ConformanceScenario,
    PlanStep,
    assert_conformance,
    check_conformance_evidence,
    conformance_plan,
    conformance_problems,
    conformance_template,
    load_conformance_file,
    source_arg_names,
)
from ._files import capability_from_json, load_capabilities_file
from ._matrix import BUILTIN_CAPABILITIES, CapabilityMatrix
from ._readiness import readiness_problems, suggest_capability
from ._receipts import (
    ReceiptIdentity,
    check_receipt,
    is_refund_tool,
    receipt_identities,
    receipt_identity_problems,
    receipt_object_problems,
    tool_prefix,
)

__all__ = [
    "BUILTIN_CAPABILITIES",
    "SCHEMA_VERSION",
    "TIERS",
    "TIER_1_NATIVE_IDEMPOTENCY_KEY",
    "TIER_2_NATURAL_BUSINESS_KEY",
    "TIER_2_SENDER_CONTROLLED_AUTHORITATIVE",
    "TIER_3_NON_AUTHORITATIVE",
    "TODO",
    "Capability",
    "CapabilityError",
    "CapabilityMatrix",
    "ConformanceError",
    "ConformanceScenario",
    "PlanStep",
    "ProbeOutcome",
    "ProbeResult",
    "ReceiptIdentity",
    "assert_conformance",
    "capability_from_json",
    "check_call_contract",
    "check_conformance_evidence",
    "check_receipt",
    "conformance_plan",
    "conformance_problems",
    "conformance_template",
    "is_refund_tool",
    "load_capabilities_file",
    "load_conformance_file",
    "readiness_problems",
    "receipt_identities",
    "receipt_identity_problems",
    "receipt_object_problems",
    "source_arg_names",
    "suggest_capability",
    "tool_prefix",
]
