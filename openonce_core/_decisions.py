"""The decisions people make on effects — approve, deny, cancel, release, resolve — and the
lease expiry that turns a lapsed claim into UNKNOWN.

Each decision names who made it and why, is checked against the state table by the
Ledger, and can be pinned to the version of the effect the person looked at
(``expected_fence``): a decision made on a stale page, or a bulk action on a set that
changed since it was counted, is refused instead of applied to something else.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._canonical import check_json, secret_digest
from ._clock import Clock
from ._leases import HOST, dead_owner, lease_lapsed, note_stopped
from ._ledger import Ledger, Then
from ._providers import (
    Capability,
    CapabilityMatrix,
    receipt_identities,
    receipt_identity_problems,
    receipt_object_problems,
    tool_prefix,
)
from ._records import Approval, Effect, JournalEntry
from ._states import NEEDS_HUMAN, EffectState, move_for
from .errors import (
    ApproverAlreadyCounted,
    EffectChangedError,
    EffectNotFoundError,
    IllegalTransitionError,
    InvalidArgumentsError,
    InvalidReceiptError,
    ProviderContractError,
    ReceiptIdentityError,
)
from .stores.base import Store

S = EffectState


@dataclass(frozen=True)
class ProviderCheck:
    """What the provider said about the object a person's receipt names, asked just before
    the receipt commits (the console asks a registered prober's ``verify``)."""

    confirmed: bool  # the object exists and carries this effect's stamp
    said: str  # what the provider said, in words, for the person and the journal
    evidence: dict[str, Any] = field(default_factory=dict)


# Asks the provider about a receipt's object; None: there was nothing to ask with.
Verify = Callable[[Effect, dict[str, Any]], ProviderCheck | None]


class Decisions:
    """The decision part of :class:`~openonce_core.OpenOnce`."""

    store: Store
    ledger: Ledger
    clock: Clock
    matrix: CapabilityMatrix
    provider_capabilities: dict[str, str]
    secret_pepper: bytes | None

    # Provided by the contracts part.
    if TYPE_CHECKING:

        def capabilities_for(self, tool: str) -> list[Capability]: ...
        def _receipt_contract_problems(
            self,
            tool: str,
            receipt: Any,
            args: Mapping[str, Any],
            *,
            required: bool | None = None,
            require_capability: bool | None = None,
        ) -> list[str]: ...

    # -- reading --------------------------------------------------------------------------

    def get(self, effect_id: str) -> Effect:
        effect = self.store.get(effect_id)
        if effect is None:
            raise EffectNotFoundError(effect_id)
        return effect

    def journal(self, effect_id: str) -> list[JournalEntry]:
        self.get(effect_id)
        return self.store.journal(effect_id)

    def approvals(self, effect_id: str) -> list[Approval]:
        self.get(effect_id)
        return self.store.approvals(effect_id)

    def review(self, limit: int = 100) -> list[Effect]:
        """Effects a person has to look at, oldest first."""
        self.expire_leases()
        return self.store.list_effects(NEEDS_HUMAN, limit)

    # -- approvals ------------------------------------------------------------------------

    def approve(
        self, effect_id: str, *, by: str, reason: str = "", expected_fence: int | None = None
    ) -> Effect:
        """Count ``by``'s approval; the effect becomes APPROVED once enough distinct people
        approved. The approval is bound to the arguments' fingerprint."""
        _require_text("by", by)
        _optional_text("reason", reason)
        while True:
            effect = self._load(effect_id, "approve", expected_fence)
            self._refuse_secret_reason(effect, reason)
            approvers = self._valid_approvers(effect)
            if by in approvers:
                raise ApproverAlreadyCounted(effect_id, by)
            at = self.clock.now()
            count = len(approvers) + 1
            state = S.APPROVED if count >= effect.approvals_required else S.REQUIRES_APPROVAL
            approval = Approval(
                effect_id,
                "approve",
                by,
                reason,
                effect.args_fingerprint,
                at,
                at + effect.approval_ttl if effect.approval_ttl else None,
            )
            evidence = {"approvals": count, "required": effect.approvals_required}
            if self.ledger.move(
                effect, "approve", state, actor=f"operator:{by}", reason=reason,
                evidence=evidence, approval=approval, at=at,
            ):  # fmt: skip
                return self.get(effect_id)

    def deny(
        self, effect_id: str, *, by: str, reason: str, expected_fence: int | None = None
    ) -> Effect:
        _require_text("by", by)
        _require_text("reason", reason)
        while True:
            effect = self._load(effect_id, "deny", expected_fence)
            self._refuse_secret_reason(effect, reason)
            approval = Approval(
                effect_id, "deny", by, reason, effect.args_fingerprint, self.clock.now()
            )
            if self.ledger.move(
                effect, "deny", S.DENIED, actor=f"operator:{by}", reason=reason, approval=approval
            ):
                return self.get(effect_id)

    def _valid_approvers(self, effect: Effect) -> set[str]:
        at = self.clock.now()
        return {
            a.by
            for a in self.store.approvals(effect.id)
            if a.valid_for(effect.args_fingerprint, at)
        }

    # -- giving up ------------------------------------------------------------------------

    def cancel(
        self, effect_id: str, *, by: str, reason: str, expected_fence: int | None = None
    ) -> Effect:
        """Give up an effect that has not started; its calls then raise EffectCancelled."""
        _require_text("by", by)
        _require_text("reason", reason)
        while True:
            effect = self._load(effect_id, "cancel", expected_fence)
            self._refuse_secret_reason(effect, reason)
            if self.ledger.move(
                effect, "cancel", S.CANCELLED, actor=f"operator:{by}", reason=reason
            ):
                return self.get(effect_id)

    def release_unstarted(self, effect_id: str, *, by: str, reason: str = "") -> Effect:
        """Drop a claim that never started (attempt 0) so its key can be claimed anew."""
        _require_text("by", by)
        _optional_text("reason", reason)
        while True:
            effect = self._load(effect_id, "release")
            self._refuse_secret_reason(effect, reason)
            if effect.attempt != 0:
                raise IllegalTransitionError(
                    effect_id,
                    effect.state,
                    "release",
                    f"attempt {effect.attempt} already ran; resolve it instead",
                )
            if self.ledger.move(
                effect, "release", S.RELEASED, actor=f"operator:{by}", reason=reason
            ):
                return self.get(effect_id)

    # -- resolving what is unknown --------------------------------------------------------

    def resolve_happened(
        self,
        effect_id: str,
        *,
        receipt: Mapping[str, Any],
        by: str,
        reason: str = "",
        require_receipt_contract: bool | None = None,
        require_provider_capability: bool | None = None,
        expected_fence: int | None = None,
        override_identity: bool = False,
        verify: Verify | None = None,
    ) -> Effect:
        """A person found the effect happened: commit ``receipt``; duplicates replay it.

        With ``enforce_provider_receipts`` (or ``require_receipt_contract=True``) the
        receipt must meet the tool's provider receipt contract first. It must name one
        provider object of the kind the tool creates (a refund's is a ``re_`` object; one
        Message-ID), or InvalidReceiptError, whatever the override. A receipt whose
        identifying fields name another effect (provider key, Message-ID, PR), or whose
        provider object is already the committed receipt of another effect, is refused
        with ReceiptIdentityError, as a probe's would be, unless ``override_identity=True``
        with a reason: then the override and what it overrode are journaled.

        ``verify`` (the console's provider check) is asked after every other check passed
        and before anything commits; it may raise to refuse. A check that did not confirm
        the object commits only as an override; what the provider said is journaled."""
        _require_text("by", by)
        _optional_text("reason", reason)
        if override_identity:
            _require_text("reason", reason)
        receipt = _check_receipt(receipt)
        while True:
            effect = self._load(effect_id, "resolve_happened", expected_fence)
            self._refuse_secret_reason(effect, reason)
            if self._holds_secret(effect, receipt):
                raise InvalidReceiptError(
                    "the receipt holds the value of one of this effect's secret fields in"
                    " clear; remove it (the ledger keeps secret fields only as digests)"
                )
            problems = self._receipt_contract_problems(
                effect.tool, receipt, effect.args, required=require_receipt_contract,
                require_capability=require_provider_capability,
            )  # fmt: skip
            if problems:
                raise InvalidReceiptError(
                    "receipt breaks the provider contract: " + "; ".join(problems)
                )
            problems = receipt_object_problems(
                effect.tool, self.capabilities_for(effect.tool), receipt
            )
            if problems:
                raise InvalidReceiptError(
                    "; ".join(problems) + ". Nothing was committed; no override applies."
                )
            mismatches = self.receipt_identity_problems(effect, receipt)
            if mismatches and not override_identity:
                raise ReceiptIdentityError(effect.id, mismatches)
            evidence: dict[str, Any] = {"resolution": "happened", "receipt": receipt, "by": by}
            check = verify(effect, receipt) if verify is not None else None
            if check is not None:
                said = check.said
                if self._holds_secret(effect, [said, check.evidence]):
                    said = "(the provider's answer held a secret field's value; not kept)"
                    check = ProviderCheck(check.confirmed, said)
                evidence["provider_check"] = {
                    **check.evidence, "confirmed": check.confirmed, "said": said,
                }  # fmt: skip
                if not check.confirmed:
                    unconfirmed = f"the provider did not confirm it: {said}"
                    if not override_identity:
                        raise ReceiptIdentityError(effect.id, [unconfirmed])
                    mismatches = [*mismatches, unconfirmed]
                # The provider can take seconds to answer: someone may have committed the
                # same object on another effect meanwhile (a second tab). Ask the ledger
                # again, as late as possible; what is left is the gap to the commit.
                taken = [
                    p
                    for p in self.receipt_identity_problems(effect, receipt)
                    if p not in mismatches
                ]
                if taken and not override_identity:
                    raise ReceiptIdentityError(effect.id, taken)
                mismatches = [*mismatches, *taken]
            if mismatches:
                evidence["identity_override"] = mismatches
            changes = {
                "result": receipt,
                "verification_status": "confirmed_by_person",
                "verification_evidence": _with_observations(effect, evidence, reason),
            }
            if self.ledger.move(
                effect, "resolve_happened", S.RECEIPT_RECORDED, actor=f"operator:{by}",
                reason=reason, evidence=evidence, changes=changes,
                then=Then("check_receipt", S.COMMITTED, "receipt accepted"),
            ):  # fmt: skip
                return self.get(effect_id)

    def receipt_identity_problems(self, effect: Effect, receipt: Mapping[str, Any]) -> list[str]:
        """Why ``receipt`` is evidence about another effect than ``effect`` (empty: nothing
        says so): its stamps, Message-ID or natural key contradict the effect's own, or the
        provider object it names is already another effect's committed receipt."""
        capabilities = self.capabilities_for(effect.tool)
        problems = receipt_identity_problems(
            capabilities, receipt, effect_id=effect.id, provider_key=effect.provider_key,
            args=effect.args,
        )  # fmt: skip
        for identity in receipt_identities(capabilities, receipt, effect.args):
            found = self.store.committed_receipts_naming(
                tool_prefix(identity.tool_pattern),
                identity.field,
                identity.value,
                identity.scope,
                exclude=effect.id,
                loose=True,  # another effect's receipt may spell the object differently
            )
            holders = [o for o in found if fnmatch.fnmatchcase(o.tool, identity.tool_pattern)]
            if holders:
                names = ", ".join(f"{o.id} ({o.tool})" for o in holders)
                problems.append(f"{identity.label} is already the committed receipt of {names}")
        return problems

    def resolve_not_happened(
        self,
        effect_id: str,
        *,
        by: str,
        reason: str,
        require_auto_rearm: bool = False,
        require_provider_capability: bool = False,
        override_auto_rearm: bool = False,
        expected_fence: int | None = None,
    ) -> Effect:
        """A person found the effect did not happen: re-arm it so the next identical call
        runs. ``reason`` is required: there is no receipt, so it is the evidence.

        ``require_auto_rearm=True`` obeys the provider matrix: refused unless every
        matching capability says a miss is safe to re-arm (unknown tools fail closed)."""
        _require_text("by", by)
        _require_text("reason", reason)
        while True:
            effect = self._load(effect_id, "resolve_not_happened", expected_fence)
            self._refuse_secret_reason(effect, reason)
            capabilities = self.capabilities_for(effect.tool)
            if require_provider_capability and not capabilities:
                raise ProviderContractError(
                    f"no provider capability is known for {effect.tool}; not re-armed"
                )
            pin = self.provider_capabilities.get(effect.tool)
            evidence: dict[str, Any] = {"resolution": "not_happened", "by": by}
            if require_auto_rearm and not self.matrix.can_auto_rearm(effect.tool, pin):
                names = ", ".join(c.name for c in capabilities) or "no known capability"
                if not override_auto_rearm:
                    raise ProviderContractError(
                        f"{effect.tool} is not safe to re-arm on a miss ({names}); resolve it"
                        " with a receipt, or re-arm with an explicit override and say why"
                    )
                # A person with the right to do so overrode the provider matrix: keep
                # that fact in the journal beside the reason.
                evidence["override"] = f"re-armed although a miss is not evidence for {names}"
            changes = {
                "verification_status": "absent_by_person",
                "verification_evidence": _with_observations(effect, evidence, reason),
            }
            if self.ledger.move(
                effect, "resolve_not_happened", S.PLANNED, actor=f"operator:{by}",
                reason=reason, evidence=evidence, changes=changes,
            ):  # fmt: skip
                return self.get(effect_id)

    # -- leases ---------------------------------------------------------------------------

    def expire_leases(self, limit: int = 100) -> list[str]:
        """STARTED effects whose lease ran out, or whose owner process on this host is gone,
        become UNKNOWN: neither is evidence of anything, least of all that the call may run
        again.

        A lease counts as run out only once this process has seen it un-renewed for a
        while of its own monotonic time (``leases.lease_lapsed``), so a step of the clock
        expires nothing: a lease that just now looks expired is judged on a later call."""
        now = self.clock.now()
        expired = [
            e.id
            for e in self.store.expired_leases(now, limit)
            if lease_lapsed(e, self.clock, now) and self.expire_lease(e)
        ]
        for effect in self.store.started_by(HOST + ":", limit):
            dead = dead_owner(effect.lease_owner)
            if dead is not None and self.expire_lease(effect, dead=dead):
                expired.append(effect.id)
        return expired

    def expire_lease(self, effect: Effect, *, dead: str | None = None) -> bool:
        """Move a STARTED effect (as read) to UNKNOWN because its lease ran out or its owner
        is gone (``dead`` says why). False if it changed meanwhile."""
        if dead:
            reason = f"owner of attempt {effect.attempt} is gone: {dead}"
        else:
            reason = f"lease of attempt {effect.attempt} held by {effect.lease_owner} expired"
        at = self.clock.now()
        evidence: dict[str, Any] = {
            "attempt": effect.attempt,
            "lease_expired_at": effect.lease_expires_at,
            "owner": effect.lease_owner,
        }
        if dead:
            # When it was found gone: a request it sent just before may still be in flight
            # at the provider, so a miss is trusted only a grace after this (reconcile.py).
            evidence["owner_gone"] = dead
            evidence["owner_gone_at"] = at
        moved = self.ledger.move(
            effect, "expire", S.UNKNOWN, actor="openonce", reason=reason, evidence=evidence,
            changes={
                "execution_status": "unknown",
                "execution_evidence": {**evidence, "lease_expired": True},
            },
            at=at,
        )  # fmt: skip
        if moved:
            # The reconciler's grace runs on monotonic time from here too (a step of the
            # clock must not spend it).
            note_stopped(self.clock, effect.id, effect.attempt)
        return moved

    # -- plumbing -------------------------------------------------------------------------

    def _load(self, effect_id: str, action: str, expected_fence: int | None = None) -> Effect:
        """The effect, if ``action`` is legal now (the state table says where from)."""
        allowed = move_for(action).sources
        effect = self.get(effect_id)
        if expected_fence is not None and effect.fence != expected_fence:
            raise EffectChangedError(effect_id, effect.state, _VERBS.get(action, action))
        # A lapsed lease makes the effect UNKNOWN, but only on the way to a decision that
        # UNKNOWN allows: a refused call changes nothing.
        if S.UNKNOWN in allowed and effect.state == S.STARTED and lease_lapsed(effect, self.clock):
            self.expire_lease(effect)
            effect = self.get(effect_id)
        if effect.state not in allowed:
            names = ", ".join(str(s) for s in S if s in allowed)
            verb = _VERBS.get(action, action)
            raise IllegalTransitionError(effect_id, effect.state, verb, "allowed from " + names)
        return effect

    def holds_secret(self, effect_id: str, value: Any) -> bool:
        """Whether ``value`` (a receipt, a reason someone is typing) holds the clear value
        of one of the effect's secret fields: the check every decision makes, for a form
        that wants to refuse it before anything else."""
        return self._holds_secret(self.get(effect_id), value)

    def _holds_secret(self, effect: Effect, value: Any) -> bool:
        """Whether text in ``value`` (a receipt, a reason) holds the clear value of one of
        the effect's secret fields, whole or inside a longer string.

        The ledger keeps only the secrets' digests, so each candidate piece of text is
        digested and compared (``_secret_candidates`` says which pieces)."""
        digests = {v for v in effect.args.values() if isinstance(v, str) and _looks_like_digest(v)}
        if not digests:
            return False
        for leaf in _leaves(value):
            candidates: set[Any] = {leaf}
            if isinstance(leaf, str):
                candidates = _secret_candidates(leaf)
            for candidate in candidates:
                if secret_digest(candidate, self.secret_pepper) in digests:
                    return True
        return False

    def _refuse_secret_reason(self, effect: Effect, reason: str) -> None:
        """A reason a person typed is journaled and shown: never a secret in clear."""
        if reason and self._holds_secret(effect, reason):
            raise ValueError(
                "the reason holds the value of one of this effect's secret fields in clear;"
                " leave it out (the ledger keeps secret fields only as digests)"
            )


_VERBS = {
    "resolve_happened": "resolve as happened",
    "resolve_not_happened": "resolve as not happened",
}


def _looks_like_digest(value: str) -> bool:
    return value.startswith(("hmac-sha256:", "sha256:")) and len(value.partition(":")[2]) == 64


# How far a secret inside a longer text is looked for: pieces of text between two cuts
# (a cut is a place next to a character that is not a letter or digit) up to this long
# and spanning at most this many cuts.
_SECRET_WINDOW_CHARS = 128
_SECRET_WINDOW_CUTS = 24
_SECRET_PIECE_MIN = 4
_DIGIT_RUN = re.compile(r"\d[\d -]*\d")


def _secret_candidates(text: str) -> set[Any]:
    """Pieces of ``text`` that could be a secret field's whole value: the text itself;
    each whitespace-separated word; every piece between two cuts (``key=sk_live_x.``
    holds ``sk_live_x``) within the window limits; and digit runs written with spaces or
    dashes, also with those removed (a card number however it was typed), also as a
    number (a secret passed as an integer).

    The limit, honestly: a secret is found when it is a piece bounded by non-alphanumeric
    characters (or the ends), shorter than the window unless it is a whole word, and
    written as it was passed, except that spaces and dashes in a digit run are ignored,
    and at least 4 characters long unless it is the whole value.
    A secret run together with other letters or digits ("pw=hunter2x"), re-cased, or
    split some other way is not found: nothing but its digest is kept to compare with."""
    pieces: set[str] = set(text.split())
    n = len(text)
    cuts = [
        i for i in range(n + 1) if i in (0, n) or not (text[i - 1].isalnum() and text[i].isalnum())
    ]
    for at, start in enumerate(cuts):
        for end in cuts[at + 1 : at + 1 + _SECRET_WINDOW_CUTS]:
            if end - start > _SECRET_WINDOW_CHARS:
                break
            pieces.add(text[start:end])
    for run in _DIGIT_RUN.findall(text):
        pieces.update((run, run.replace(" ", "").replace("-", "")))
    # A piece shorter than this inside a longer text is too common to refuse on (a 3-digit
    # code would match every "123" in a receipt); a whole value of any length still counts.
    found: set[Any] = {text, *(p for p in pieces if len(p) >= _SECRET_PIECE_MIN)}
    for piece in [p for p in found if p.isdigit() and p.isascii() and len(p) <= 100]:
        found.add(int(piece))  # (a key material integer has at most 100 digits)
    return found


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):  # a name can hold a secret as well as a value
        return [leaf for k, v in value.items() for leaf in (k, *_leaves(v))]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value] if isinstance(value, str | int) and not isinstance(value, bool) else []


def _with_observations(effect: Effect, decision: dict[str, Any], reason: str) -> dict[str, Any]:
    """A person's decision joins the evidence; earlier probe observations stay with it
    (evidence aggregates across attempts)."""
    observations = (effect.verification_evidence or {}).get("observations", [])
    return {"observations": observations, **decision, "reason": reason}


def _check_receipt(receipt: Any) -> dict[str, Any]:
    if type(receipt) is not dict or not receipt:
        raise InvalidReceiptError("a receipt must be a non-empty JSON object")
    try:
        check_json(receipt, "$receipt")
    except InvalidArgumentsError as exc:
        raise InvalidReceiptError(str(exc)) from None
    return receipt


def _require_text(name: str, value: Any) -> None:
    if type(value) is not str or not value.strip():
        raise ValueError(f"{name} is required: say who decided and why")
    if name == "by" and value != value.strip():
        # "alice" and "alice " must not count as two approvers.
        raise ValueError("by must not start or end with spaces")


def _optional_text(name: str, value: Any) -> None:
    if type(value) is not str:
        raise ValueError(f"{name} must be text, not {type(value).__name__}")
