"""What a model is told when OpenOnce stops a tool call.

A model cannot catch an exception; it reads the tool's output. These are the outputs for
the calls OpenOnce stops, each naming the one thing the model should do next. Both
adapters use them, so a model reads the same words whichever framework runs it.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import (
    ApprovalDenied,
    ApprovalPending,
    EffectCancelled,
    EffectInFlightError,
    OpenOnceError,
    OutcomeUnknownError,
    ReceiptContractError,
)

APPROVAL_REQUIRED = "approval_required"
APPROVAL_DENIED = "approval_denied"
CANCELLED = "cancelled"
OUTCOME_UNKNOWN = "outcome_unknown"
IN_PROGRESS = "in_progress"

# The errors that stop a call for a reason the model can act on. Anything else a handler
# raises is the tool's own failure and travels the framework's usual error path.
STOPS: tuple[type[OpenOnceError], ...] = (
    ApprovalPending,
    ApprovalDenied,
    EffectCancelled,
    OutcomeUnknownError,
    ReceiptContractError,
    EffectInFlightError,
)


def signal_for(exc: OpenOnceError, tool: str) -> dict[str, Any]:
    """The structured output for one of :data:`STOPS`."""
    effect_id = getattr(exc, "effect_id", None)
    base: dict[str, Any] = {"tool": tool, "effect_id": effect_id}
    if isinstance(exc, ApprovalPending):
        return {
            "status": APPROVAL_REQUIRED,
            **base,
            "approvals": exc.approvals,
            "required": exc.required,
            "instruction": (
                "This call needs a person's approval and has NOT run. Tell the user it is"
                f" waiting for approval (effect {effect_id}). Once they say it was approved,"
                " call this tool again with exactly the same arguments: it then runs once."
            ),
        }
    if isinstance(exc, ApprovalDenied):
        return {
            "status": APPROVAL_DENIED,
            **base,
            "by": exc.by,
            "reason": exc.reason,
            "instruction": (
                f"{exc.by} denied this call ({exc.reason}); it did not run and will not run."
                " Tell the user. Do not call it again with the same arguments."
            ),
        }
    if isinstance(exc, EffectCancelled):
        return {
            "status": CANCELLED,
            **base,
            "instruction": (
                "A person cancelled this call; it did not run and will not run. Tell the"
                " user. Do not call it again with the same arguments."
            ),
        }
    if isinstance(exc, EffectInFlightError):
        return {
            "status": IN_PROGRESS,
            **base,
            "instruction": (
                "This call is still running elsewhere. Do not start it again; the same call"
                " made later returns its result."
            ),
        }
    # OutcomeUnknownError, and ReceiptContractError: the call returned but its receipt
    # could not be verified, so a person holds it. To the model both mean "do not retry".
    return {
        "status": OUTCOME_UNKNOWN,
        **base,
        "instruction": (
            "This call may or may not have happened. Do NOT retry it: a retry could do it"
            f" twice. Tell the user the outcome is being verified (effect {effect_id});"
            " a person or the reconciler resolves it."
        ),
    }


def as_text(signal: dict[str, Any]) -> str:
    return json.dumps(signal)
