"""The decisions a person makes in the console, each one call into the core.

The console never writes ledger rows (invariant 1 of ARCHITECTURE.md): every decision
here goes through ``get_openonce()``, pinned to the fence the person saw, and is
journaled by the core as ``operator:<username>`` with the reason given. Where each
decision is offered comes from the core's state table (``openonce_core._states``).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core import signing

from ledger.clients import get_openonce
from openonce_core import (
    ApproverAlreadyCounted,
    EffectChangedError,
    IllegalTransitionError,
    InvalidReceiptError,
    ProviderContractError,
)
from openonce_core._decisions import ProviderCheck, Verify
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._records import Effect as CoreEffect
from openonce_core._redact import redact_text
from openonce_core._states import MOVES, EffectState
from openonce_core.errors import ProbeCredentialError, ProbeError, ProbeTransientError

from . import forms as console_forms
from . import selectors
from .roles import APPROVE, CANCEL, RESOLVE

S = EffectState


class ProviderNotConfirmed(Exception):
    """The provider did not confirm the object a receipt names (or could not be asked):
    nothing was committed."""


# What the core refuses with, each shown next to the form; none of them changed anything.
DECISION_ERRORS: tuple[type[Exception], ...] = (
    IllegalTransitionError,  # includes EffectChangedError: the page was stale
    InvalidReceiptError,
    ProviderContractError,
    ApproverAlreadyCounted,
    ProviderNotConfirmed,
    ValueError,
)


def is_stale(exc: Exception) -> bool:
    """Refused because the effect is no longer as the page showed it (its fence moved, or
    its state no longer allows the decision): the page should be reloaded."""
    return isinstance(exc, IllegalTransitionError)


@dataclass(frozen=True)
class Action:
    name: str  # as in the URL
    label: str
    perm: str
    move: str  # the core's decision (openonce_core._states.MOVES)
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
        # The person, holding the permission, overrode what the ledger or the provider
        # could not tie to this effect, with a reason; the core journals both.
        override = bool(data.get("override_identity"))
        return oo.resolve_happened(
            effect_id,
            receipt=data["receipt"],
            by=by,
            reason=reason,
            require_receipt_contract=True,  # checked before commit, not after
            expected_fence=fence,
            override_identity=override,
            verify=provider_check(override),
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


# -- asking the provider before a person's receipt commits --------------------------------

# How long a decision waits for the provider: a web worker must not hang on it.
VERIFY_TIMEOUT = 10.0
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def verifiers(tool: str) -> list[Any]:
    """The probers registered for ``tool`` (OPENONCE_PROBERS) that can check one receipt's
    object at the provider: ``verify(effect, receipt) -> ProbeResult``."""
    found = []
    for prober in selectors.registered_probers().get(tool, []):
        inner = getattr(prober, "inner", prober)  # reconciler.probes wraps each one
        if callable(getattr(inner, "verify", None)):
            found.append(inner)
    return found


def provider_check(override: bool) -> Verify:
    """The check the core runs on a receipt after every other check passed, before it
    commits: each verifier registered for the tool must find the object, stamped for this
    effect. Without a verifier there is nothing to ask and the receipt stands on the
    ledger's own checks. Not confirmed, and no override: refused, saying what was said."""

    def check(effect: CoreEffect, receipt: dict[str, Any]) -> ProviderCheck | None:
        found = verifiers(effect.tool)
        if not found:
            return None  # nothing can ask: the receipt stands on the ledger's own checks
        deadline = time.monotonic() + VERIFY_TIMEOUT
        answers = [_ask(verifier, effect, receipt, deadline) for verifier in found]
        confirmed = all(ok for ok, _ in answers)
        words = "; ".join(said for _, said in answers)
        if not confirmed and not override:
            raise ProviderNotConfirmed(
                f"{_provider(found[0], effect.tool)} did not confirm this receipt: {words}."
                " Nothing was committed; check the receipt, or ask someone holding the"
                " override permission to commit it with a reason."
            )
        return ProviderCheck(confirmed, words)

    return check


def _ask(
    verifier: Any, effect: CoreEffect, receipt: dict[str, Any], deadline: float
) -> tuple[bool, str]:
    """(confirmed, what the provider said) from one verifier, within the time left."""
    provider = _provider(verifier, effect.tool)
    left = max(0.0, deadline - time.monotonic())
    future = _executor().submit(verifier.verify, effect, dict(receipt))
    try:
        result = future.result(timeout=left)
    except concurrent.futures.TimeoutError:
        # The thread is left to finish on its own; the decision does not wait for it.
        future.cancel()
        return False, f"{provider} did not answer within {VERIFY_TIMEOUT:g} s"
    except ProbeCredentialError as exc:
        return False, f"{provider} refused the console's credentials{_status(exc)}: {_clean(exc)}"
    except ProbeTransientError as exc:
        return False, f"{provider} could not be asked{_status(exc)}: {_clean(exc)}"
    except ProbeError as exc:
        return False, f"{provider} could not be asked{_status(exc)}: {_clean(exc)}"
    except Exception as exc:  # a broken prober is no confirmation
        return False, f"the {provider} check failed ({type(exc).__name__})"
    if not isinstance(result, ProbeResult):
        return False, f"the {provider} check answered {type(result).__name__}, not a result"
    detail = _redact(result.detail) or "no detail"
    if result.outcome is ProbeOutcome.HAPPENED:
        return True, f"{provider} confirmed it: {detail}"
    if result.outcome is ProbeOutcome.NOT_HAPPENED:
        return False, f"{provider} has no such object: {detail}"
    return False, f"{provider} could not tie it to this effect: {detail}"


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    # Made on first use, in the process that serves requests (never before a fork).
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="console-verify")
        return _pool


def _provider(verifier: Any, tool: str) -> str:
    name = getattr(verifier, "provider", None)
    return name if isinstance(name, str) and name else tool.partition(".")[0]


def _status(exc: ProbeError) -> str:
    return f" (HTTP {exc.status})" if exc.status is not None else ""


def _clean(exc: ProbeError) -> str:
    return _redact(exc.detail)


def _redact(text: str) -> str:
    """A provider's words as a page may show them: no credential, at most 500 characters."""
    return redact_text(str(text))[:500]


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
