"""The decisions a person makes in the console, each one call into the core.

The console never writes ledger rows (invariant 1 of ARCHITECTURE.md): every decision
here goes through ``get_openonce()``, pinned to the fence the person saw, and is
journaled by the core as ``operator:<username>`` with the reason given. Where each
decision is offered comes from the core's state table (``openonce_core.states``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core import signing

from openonce_core import (
    ApproverAlreadyCounted,
    EffectChangedError,
    IllegalTransitionError,
    InvalidReceiptError,
    ProviderContractError,
)
from openonce_core.records import Effect as CoreEffect
from openonce_core.states import MOVES, EffectState
from openonce_site.ledger import get_openonce

from . import forms as console_forms
from .roles import APPROVE, CANCEL, RESOLVE

S = EffectState

# What the core refuses with, each shown next to the form; none of them changed anything.
DECISION_ERRORS: tuple[type[Exception], ...] = (
    IllegalTransitionError,  # includes EffectChangedError: the page was stale
    InvalidReceiptError,
    ProviderContractError,
    ApproverAlreadyCounted,
    ValueError,
)


@dataclass(frozen=True)
class Action:
    name: str  # as in the URL
    label: str
    perm: str
    move: str  # the core's decision (openonce_core.states.MOVES)
    form_class: type[console_forms.DecisionForm]
    danger: bool = False
    labels: tuple[tuple[str, str], ...] = ()  # (state, label) where the label differs

    @property
    def states(self) -> frozenset[str]:
        """Where the console offers it: where the state table allows the decision."""
        return frozenset(str(s) for s in MOVES[self.move].sources)

    def label_for(self, state: str) -> str:
        return dict(self.labels).get(state, self.label)


def allowed(state: str) -> list[Action]:
    """The decisions the core accepts for an effect in ``state``, in page order."""
    return [a for a in ACTIONS.values() if state in a.states]


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("approve", "Approve", APPROVE, "approve", console_forms.ApproveForm),
        Action(
            "deny",
            "Deny",
            APPROVE,
            # An approval can be withdrawn until the call runs: deny an approved one too.
            "deny",
            console_forms.ReasonForm,
            danger=True,
            labels=((S.APPROVED, "Withdraw the approval (deny)"),),
        ),
        Action(
            "resolve-happened",
            "Resolve: it happened",
            RESOLVE,
            "resolve_happened",
            console_forms.ResolveHappenedForm,
        ),
        Action(
            "resolve-not-happened",
            "Resolve: it did not happen",
            RESOLVE,
            "resolve_not_happened",
            console_forms.ResolveNotHappenedForm,
            danger=True,
        ),
        Action("cancel", "Cancel", CANCEL, "cancel", console_forms.ReasonForm, True),
    )
}


def decide(action: str, effect_id: str, by: str, data: Mapping[str, Any]) -> CoreEffect:
    """Apply one decision through the core. Raises one of DECISION_ERRORS if refused."""
    oo = get_openonce()
    fence = data["fence"]
    reason = data.get("reason") or ""
    if action == "approve":
        return oo.approve(effect_id, by=by, reason=reason, expected_fence=fence)
    if action == "deny":
        return oo.deny(effect_id, by=by, reason=reason, expected_fence=fence)
    if action == "cancel":
        return oo.cancel(effect_id, by=by, reason=reason, expected_fence=fence)
    if action == "resolve-happened":
        return oo.resolve_happened(
            effect_id,
            receipt=data["receipt"],
            by=by,
            reason=reason,
            require_receipt_contract=True,  # checked before commit, not after
            expected_fence=fence,
            # The form found the receipt names another identity and the person, holding
            # the permission, overrode it with a reason; the core journals both.
            override_identity=bool(data.get("override_identity")),
        )
    if action == "resolve-not-happened":
        return oo.resolve_not_happened(
            effect_id,
            by=by,
            reason=reason,
            # Obey the provider matrix: a miss re-arms only where the capability says a
            # miss is evidence. A person holding the override permission may overrule
            # it explicitly; the core journals that.
            require_auto_rearm=True,
            override_auto_rearm=bool(data.get("override")),
            expected_fence=fence,
        )
    raise ValueError(f"unknown action {action!r}")


# -- bulk ---------------------------------------------------------------------------------

BULK_SALT = "openonce.console.bulk"
BULK_MAX_AGE = 15 * 60  # seconds a counted set may wait for its confirmation


@dataclass(frozen=True)
class BulkResult:
    effect_id: str
    outcome: str  # "applied", "skipped" (changed since counted) or "refused"
    detail: str


def sign_bulk(action: str, user_pk: Any, effects: Iterable[Any]) -> str:
    """The counted set, sealed: the apply step acts on exactly these effects at exactly the
    fences counted, for this person, and nothing a form field could add."""
    payload = {"a": action, "u": str(user_pk), "e": [[e.id, e.fence] for e in effects]}
    return signing.dumps(payload, salt=BULK_SALT, compress=True)


def read_bulk(token: str, user_pk: Any) -> tuple[str, list[tuple[str, int]]]:
    """The action and (effect id, fence) pairs of a sealed set; ValidationError if it was
    tampered with, has expired, or was counted for someone else."""
    try:
        payload = signing.loads(token, salt=BULK_SALT, max_age=BULK_MAX_AGE)
    except signing.SignatureExpired:
        raise forms.ValidationError(
            "This preview is too old; count the effects again before applying."
        ) from None
    except signing.BadSignature:
        raise forms.ValidationError("This preview cannot be verified; count again.") from None
    if payload.get("u") != str(user_pk) or payload.get("a") not in console_forms.BULK_ACTIONS:
        raise forms.ValidationError("This preview was made for someone else; count again.")
    return payload["a"], [(str(i), int(f)) for i, f in payload["e"]]


def apply_bulk(
    action: str, pairs: Iterable[tuple[str, int]], by: str, reason: str
) -> list[BulkResult]:
    """Effect by effect: one refusal does not stop the rest, and each gets its own result."""
    results = []
    for effect_id, fence in pairs:
        try:
            effect = decide(action, effect_id, by, {"fence": fence, "reason": reason})
        except EffectChangedError as exc:
            results.append(BulkResult(effect_id, "skipped", str(exc)))
        except DECISION_ERRORS as exc:
            results.append(BulkResult(effect_id, "refused", str(exc)))
        else:
            results.append(BulkResult(effect_id, "applied", f"now {effect.state}"))
    return results
