"""Call contracts: whether a call may run under a capability (its required args and
the key fields a natural-key contract needs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._capability import Capability


def check_call_contract(
    capability: Capability,
    args: Mapping[str, Any],
    idempotency_fields: Iterable[str] | None,
    explicit_key: bool,
) -> list[str]:
    """Why a call may not run under ``capability`` (empty: it may).

    Natural-key contracts need their key fields in the derived key material, so a replay
    can only ever answer the same owner/repo/head. An explicit ``idempotency_key`` is
    opaque: OpenOnce cannot see whether it contains those fields, so it is refused.
    """
    problems = [
        f"{capability.name}: call is missing required arg {arg!r}"
        for arg in capability.required_args
        if arg not in args
    ]
    required = capability.required_idempotency_fields
    if not required:
        return problems
    wanted = ", ".join(required)
    if explicit_key:
        problems.append(
            f"{capability.name}: an explicit idempotency_key is opaque; derive the key with"
            f" idempotency_fields including {wanted}"
        )
        return problems
    declared = tuple(idempotency_fields) if idempotency_fields is not None else None
    if declared is None:
        problems.append(f"{capability.name}: declare idempotency_fields including {wanted}")
        return problems
    missing = [name for name in required if name not in declared]
    if missing:
        problems.append(f"{capability.name}: idempotency_fields must include {', '.join(missing)}")
    return problems
