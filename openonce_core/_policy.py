"""Policies decide, before a call runs, whether a person has to approve it."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PolicyDecision:
    requires_approval: bool = False
    approvers: int = 1  # distinct people who must approve
    approval_ttl: float | None = None  # seconds an approval stays valid; None: no expiry
    reason: str = ""


ALLOW = PolicyDecision()

Policy = Callable[[str, Mapping[str, Any]], PolicyDecision]


def require_approval_for(
    patterns: Iterable[str],
    *,
    approvers: int = 1,
    approval_ttl: float | None = None,
) -> Policy:
    """Tools matching any glob pattern (``"stripe.*"``) wait for approval before running.

    ``approvers=2`` asks for two distinct people; ``approval_ttl`` makes approvals expire
    (the call then fails closed and needs a fresh approval).
    """
    patterns = tuple(patterns)
    if approvers < 1:
        raise ValueError("approvers must be at least 1")
    if approval_ttl is not None and approval_ttl <= 0:
        raise ValueError("approval_ttl must be positive seconds")
    decision = PolicyDecision(
        requires_approval=True,
        approvers=approvers,
        approval_ttl=approval_ttl,
        reason="tool matches " + ", ".join(patterns),
    )

    def policy(tool: str, args: Mapping[str, Any]) -> PolicyDecision:
        if any(fnmatch.fnmatchcase(tool, p) for p in patterns):
            return decision
        return ALLOW

    return policy


def all_of(*policies: Policy) -> Policy:
    """Combine policies: approval is needed if any asks; the strictest terms win."""

    def policy(tool: str, args: Mapping[str, Any]) -> PolicyDecision:
        asks = [d for d in (p(tool, args) for p in policies) if d.requires_approval]
        if not asks:
            return ALLOW
        ttls = [d.approval_ttl for d in asks if d.approval_ttl is not None]
        return PolicyDecision(
            requires_approval=True,
            approvers=max(d.approvers for d in asks),
            approval_ttl=min(ttls) if ttls else None,
            reason="; ".join(d.reason for d in asks if d.reason),
        )

    return policy
