"""Readiness and suggestions: whether a capability is finished provider knowledge
(``--require-reviewed``), and conservative stubs for unknown tools."""

from __future__ import annotations

import re
from typing import Any

from ._capability import TIER_3_NON_AUTHORITATIVE, TODO, Capability


def _todo_fields(cap: Capability) -> list[str]:
    """The fields whose text (or any list item or mapping value) still says TODO."""
    found = []
    for key, value in cap.to_json().items():
        if isinstance(value, dict):
            value = list(value.values())
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and TODO in text for text in texts):
            found.append(key)
    return found


def readiness_problems(capability: Capability) -> list[str]:
    """Why ``capability`` is not finished provider knowledge (for ``--require-reviewed``)."""
    cap = capability
    problems = [
        f"{cap.name}: {key} is still a TODO stub; review and fill it in"
        for key in _todo_fields(cap)
    ]
    if cap.can_auto_rearm_on_miss and not cap.prober:
        problems.append(
            f"{cap.name}: auto re-arms on a miss but names no prober; a miss needs a probe"
        )
    if cap.prober and not cap.required_receipt_fields:
        problems.append(
            f"{cap.name}: prober {cap.prober} has no required_receipt_fields; a HAPPENED probe"
            " could commit without external evidence"
        )
    return problems


def suggest_capability(tool: str) -> dict[str, Any]:
    """A conservative capability stub for an unknown tool, in the capability-file schema.

    It loads, but it is review work, not knowledge: tier 3, a miss never re-arms, and
    every judgement a person must make says TODO so ``--require-reviewed`` fails on it.
    """
    name = re.sub(r"[^A-Za-z0-9_]+", "_", tool).strip("_") or "custom_tool"
    return {
        "name": name,
        "tool_pattern": re.sub(r"([*?\[])", r"[\1]", tool),
        "tier": TIER_3_NON_AUTHORITATIVE,
        "key_strategy": f"{TODO}: how a call's key reaches the provider",
        "probe_basis": f"{TODO}: which read proves the effect happened",
        "miss_semantics": f"{TODO}: until reviewed, a miss is not evidence",
        "can_auto_rearm_on_miss": False,
        "default_grace_seconds": 0,
        "prober": None,
        "handler_requirements": [f"{TODO}: what the handler must pass or stamp"],
        "risk": f"{TODO}: what a wrong answer costs",
        "required_receipt_fields": [],
    }
