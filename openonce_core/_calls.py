"""The call path: what one call of an ``@oo.effect`` does with the ledger.

A new effect costs two commits: the claim (STARTED, attempt, lease and fence, written
before the handler runs: invariant 2) and the finish (the outcome, fenced to that claim).
A duplicate costs one read: a settled effect replays its recorded result or failure; one
in flight is waited on until it settles; an UNKNOWN one raises OutcomeUnknownError and is
never run again without evidence (invariant 3).

What the handler's exception means is the classifier's call (classify.py); an OpenOnce
error raised by an *inner* effect the handler called is not the handler's failure: it
propagates as itself, and this effect goes back to PLANNED, to run again when called.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from ._bridge import HandlerNotStarted
from ._canonical import dumps, loads
from ._classify import Classifier, FailureClass
from ._clock import Clock, monotonic_of
from ._context import EffectContext, _requested_by
from ._failures import (
    contains_secret,
    describe,
    exception_text,
    last_error,
    message_text,
    rebuild,
    safe_text,
    scrub,
    storable,
    type_name,
    undescribed,
)
from ._keys import Call, provider_key
from ._leases import LeaseKeeper, dead_owner, lease_lapsed
from ._ledger import Ledger, Then
from ._observe import EffectEvent, Observer, begin, notify
from ._policy import Policy
from ._records import Effect, new_effect_id
from ._retention import drop_released_tombstone, find_tombstone
from ._states import EffectState
from .errors import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    EffectArchivedError,
    EffectCancelled,
    EffectFailed,
    EffectInFlightError,
    HandlerNotStartedError,
    IdempotencyMismatchError,
    IllegalTransitionError,
    LeaseLostError,
    LedgerUnavailableError,
    LedgerWriteError,
    OpenOnceError,
    OutcomeUnknownError,
    ReceiptContractError,
    ResultUnavailableError,
)
from .stores.base import Store, ledger_errors
from .stores.sql import ReplayRow

S = EffectState
_REPLAY = object()
KNOWN_KEYS = 10_000  # how many (tool, key) pairs a process remembers having seen
_SETTLED = (S.COMMITTED, S.FAILED)


class CallPath:
    """The call-path part of :class:`~openonce_core.OpenOnce`."""

    store: Store
    ledger: Ledger
    clock: Clock
    keeper: LeaseKeeper
    owner: str
    policy: Policy
    classifier: Classifier
    retry_delay: float
    stats: Counter[str]
    observers: tuple[Observer, ...]
    _known_keys: dict[tuple[str, str], None]  # keys this process claimed or replayed

    # Provided by the other parts of OpenOnce.
    if TYPE_CHECKING:

        def _receipt_contract_problems(self, tool: str, receipt: Any, args: Any) -> list[str]: ...
        def _checks_receipts(self, required: bool | None = None) -> bool: ...
        def _context(self, call: Call, effect: Effect) -> EffectContext: ...
        def _invoke(
            self,
            call: Call,
            ctx: EffectContext,
            loop: asyncio.AbstractEventLoop | None,
            context: contextvars.Context | None,
        ) -> Any: ...
        def expire_lease(self, effect: Effect, *, dead: str | None = None) -> bool: ...
        def _valid_approvers(self, effect: Effect) -> set[str]: ...

    # -- one call ---------------------------------------------------------------------------

    def _execute(
        self,
        call: Call,
        loop: asyncio.AbstractEventLoop | None = None,
        context: contextvars.Context | None = None,
    ) -> Any:
        read: tuple[ReplayRow | None] | None = None
        if not self.observers and (call.tool, call.key) in self._known_keys:
            # The replay path, kept lean: a key this process saw is most likely a duplicate
            # of a settled effect. One read; anything else (no row, not settled, another
            # call's arguments) goes the whole way below, which decides on the same read.
            try:
                row = self.store.find_replay(call.tool, call.key)
            except ledger_errors(self.store) as exc:
                if _about_the_data(exc):
                    raise
                raise LedgerUnavailableError(call.tool, _cause(exc)) from exc
            if (
                row is not None
                and row.state in _SETTLED
                and (call.spec.idempotency_key is None or row.args_fingerprint == call.fingerprint)
            ):
                self.stats["replayed"] += 1
                return self._replay(row)
            read = (row,)
        trace = _Trace()
        started = time.monotonic()
        scopes = begin(self.observers, call.tool) if self.observers else None
        try:
            return self._settle(call, trace, loop, context, read)
        except BaseException as exc:
            trace.error = type(exc).__name__
            if trace.outcome == "executed":  # raised while running: say how it ended
                trace.outcome = _outcome_of(exc)
            elif trace.outcome == "":
                trace.outcome = _outcome_of(exc)
                trace.effect_id = getattr(exc, "effect_id", None)
            raise
        finally:
            self.stats[trace.outcome] += 1
            if self.observers:
                elapsed = time.monotonic() - started
                notify(
                    self.observers,
                    EffectEvent(
                        call.tool, trace.outcome, trace.effect_id, trace.attempt,
                        self.clock.now() - elapsed, elapsed, trace.error,
                    ),
                )  # fmt: skip
            if scopes is not None:
                scopes.close()

    def _settle(
        self,
        call: Call,
        trace: _Trace,
        loop: asyncio.AbstractEventLoop | None,
        context: contextvars.Context | None,
        read: tuple[ReplayRow | None] | None = None,
    ) -> Any:
        try:
            found = self._acquire(call, trace, read)
        except ledger_errors(self.store) as exc:
            if _about_the_data(exc):
                raise  # what was to be written, not the ledger: not worth calling again
            raise LedgerUnavailableError(call.tool, _cause(exc)) from exc
        if isinstance(found, ReplayRow):
            trace.outcome = "replayed"
            return self._replay(found)
        trace.effect_id, trace.attempt, trace.outcome = found.id, found.attempt, "executed"
        return self._run(call, found, trace, loop, context)

    def _acquire(
        self, call: Call, trace: _Trace, read: tuple[ReplayRow | None] | None
    ) -> Effect | ReplayRow:
        """The effect this call runs (claimed, fenced to us), or the row to replay; raises
        for every refusal. Nothing has been sent yet, whatever it raises."""
        deadline: float | None = None
        while True:
            claimed, row = self._claim_or_find(call, read)
            read = None  # a second pass reads again
            if claimed is not None:
                return claimed
            if row is None:
                self._refuse_archived(call)
                continue  # another caller's insert we could not see yet: read again
            self._remember((call.tool, call.key))
            trace.effect_id = row.id
            if call.spec.idempotency_key is not None and row.args_fingerprint != call.fingerprint:
                raise IdempotencyMismatchError(row.id, call.tool)
            if row.state in _SETTLED:
                return row
            effect = self.store.get(row.id)
            if effect is None:
                continue
            if deadline is None:
                # On monotonic time: a step of the clock neither ends nor stretches it.
                deadline = monotonic_of(self.clock) + call.spec.wait_seconds
            decided = self._decide_existing(call, effect, deadline)
            if decided is _REPLAY:
                return _replay_row(effect)
            if isinstance(decided, Effect):
                return decided

    def _claim_or_find(
        self, call: Call, read: tuple[ReplayRow | None] | None = None
    ) -> tuple[Effect | None, ReplayRow | None]:
        """Claim a new effect for this call, or read what already holds its key.

        A key this process has not seen is most likely new: the claim is tried first, and
        the holder, if any, read after it (on Postgres in the same round trip), so a new
        effect costs two commits and nothing else. A duplicate from another process finds
        the key taken (no row is written). A key seen here before is most likely a
        duplicate (the agent retried): one lean read, no write lock taken, or none at all
        when the caller's lean read just found the row (``read``: what it found, boxed,
        so that "found nothing" differs from "did not read")."""
        known = (call.tool, call.key)
        if known in self._known_keys:
            row = read[0] if read is not None else self.store.find_replay(call.tool, call.key)
            if row is not None:
                return None, row
        self._remember(known)
        effect, why = self._new_effect(call)
        action = "request_approval" if effect.state == S.REQUIRES_APPROVAL else "claim"
        evidence: dict[str, Any] | None = {"attempt": 1} if action == "claim" else None
        asked_by = _requested_by.get()
        if asked_by is not None:
            evidence = {**(evidence or {}), "requested_by": asked_by}
        inserted, row = self.ledger.create(
            effect,
            action,
            actor=f"agent:{self.owner}",
            reason=why,
            evidence=evidence,
            find=True,
        )
        if not inserted:
            return None, row
        if effect.state == S.REQUIRES_APPROVAL:
            raise ApprovalPending(effect.id, call.tool, 0, effect.approvals_required)
        return effect, None

    def _refuse_archived(self, call: Call) -> None:
        """The insert wrote nothing and no effect holds the key: the retention may have
        archived the key's effect, leaving its tombstone. That call ran (or was refused)
        already, so this one never runs: raise, naming the archived effect."""
        stone = find_tombstone(self.store, call.tool, call.key)
        if stone is None:
            return
        if drop_released_tombstone(self.store, call.tool, call.key, stone.effect_id):
            return  # left by a crashed run, and its effect was released since: claim anew
        if call.spec.idempotency_key is not None and stone.args_fingerprint != call.fingerprint:
            raise IdempotencyMismatchError(stone.effect_id, call.tool)
        raise EffectArchivedError(
            stone.effect_id, call.tool, stone.state, stone.archived_at, stone.archive
        )

    def _remember(self, known: tuple[str, str]) -> None:
        keys = self._known_keys
        keys[known] = None
        if len(keys) > KNOWN_KEYS:
            # Forget the oldest half; a forgotten key only costs its next replay a
            # combined statement instead of a plain read. (Racing threads may both trim.)
            for old in list(keys)[: KNOWN_KEYS // 2]:
                keys.pop(old, None)

    def _new_effect(self, call: Call) -> tuple[Effect, str]:
        decision = self.policy(call.tool, call.stored_args)
        at = self.clock.now()
        common: dict[str, Any] = dict(
            id=new_effect_id(),
            tool=call.tool,
            idempotency_key=call.key,
            scope=call.scope,
            args=call.stored_args,
            args_fingerprint=call.fingerprint,
            provider_key=provider_key(call.tool, call.key),
            max_attempts=call.spec.max_attempts,
            created_at=at,
            updated_at=at,
        )
        if decision.requires_approval:
            effect = Effect(
                state=S.REQUIRES_APPROVAL,
                approvals_required=decision.approvers,
                approval_ttl=decision.approval_ttl,
                **common,
            )
            return effect, decision.reason
        # Claim before call: STARTED, attempt 1, lease and fence are durable before the
        # handler runs, in this one commit.
        effect = Effect(
            state=S.STARTED,
            attempt=1,
            fence=1,
            lease_owner=self.owner,
            lease_expires_at=at + call.spec.lease_seconds,
            **common,
        )
        return effect, ""

    def _decide_existing(self, call: Call, effect: Effect, deadline: float) -> Any:
        """What a call does with an effect someone already wrote: returns a claimed Effect
        to run, ``_REPLAY``, or None to read again; raises for everything else."""
        state = effect.state
        if state in _SETTLED:
            return _REPLAY
        if state == S.STARTED:
            dead = dead_owner(effect.lease_owner)
            if dead is not None or lease_lapsed(effect, self.clock):
                self.expire_lease(effect, dead=dead)
                return None
            self._wait_for_change(effect, deadline, call.spec.wait_seconds)
            return None
        if state in (S.UNKNOWN, S.HUMAN_REVIEW, S.RECEIPT_RECORDED):
            raise OutcomeUnknownError(effect.id, effect.tool, last_error(effect))
        if state == S.REQUIRES_APPROVAL:
            count = len(self._valid_approvers(effect))
            raise ApprovalPending(effect.id, effect.tool, count, effect.approvals_required)
        if state in (S.APPROVED, S.PLANNED):
            # An approved effect, or a re-armed one that needed approval, runs only while
            # its approvals hold: an expired approval fails closed.
            if (
                effect.approvals_required
                and len(self._valid_approvers(effect)) < effect.approvals_required
            ):
                self.ledger.move(
                    effect, "reconsider", S.REQUIRES_APPROVAL, actor="openonce",
                    reason="approval expired before the call ran",
                )  # fmt: skip
                raise ApprovalExpired(effect.id, effect.tool, 0, effect.approvals_required)
            return self._claim_existing(call, effect)
        if state == S.DENIED:
            denial = next(
                (a for a in reversed(self.store.approvals(effect.id)) if a.decision == "deny"), None
            )
            raise ApprovalDenied(
                effect.id, denial.by if denial else "?", denial.reason if denial else ""
            )
        if state == S.CANCELLED:
            # Later lines (a late result, say) may follow; name whoever cancelled it.
            line = next(j for j in self.store.journal(effect.id) if j.to_state == S.CANCELLED)
            raise EffectCancelled(effect.id, line.actor, line.reason)
        raise IllegalTransitionError(effect.id, state, "run")  # RELEASED is never found

    def _claim_existing(self, call: Call, effect: Effect) -> Effect | None:
        if effect.args_fingerprint != call.fingerprint:
            # Approvals and re-arms cover the arguments that were recorded; a call that
            # shares the intent key but changed, say, the amount must not run under them.
            raise IdempotencyMismatchError(effect.id, call.tool)
        at = self.clock.now()
        attempt = effect.attempt + 1
        changes: dict[str, Any] = {
            "attempt": attempt,
            "lease_owner": self.owner,
            "lease_expires_at": at + call.spec.lease_seconds,
        }
        if not self.ledger.move(
            effect, "start", S.STARTED, actor=f"agent:{self.owner}",
            evidence={"attempt": attempt}, changes=changes, at=at,
        ):  # fmt: skip
            return None
        return dataclasses.replace(
            effect, state=S.STARTED, fence=effect.fence + 1, updated_at=at, **changes
        )

    # -- running the handler ------------------------------------------------------------------

    def _run(
        self,
        call: Call,
        effect: Effect,
        trace: _Trace,
        loop: asyncio.AbstractEventLoop | None,
        context: contextvars.Context | None,
    ) -> Any:
        self.keeper.hold(effect.id, effect.fence, self.owner, call.spec.lease_seconds)
        try:
            return self._attempts(call, effect, trace, loop, context)
        finally:
            self.keeper.release(effect.id)

    def _attempts(
        self,
        call: Call,
        effect: Effect,
        trace: _Trace,
        loop: asyncio.AbstractEventLoop | None,
        context: contextvars.Context | None,
    ) -> Any:
        first_attempt = effect.attempt
        while True:
            ctx = self._context(call, effect)
            try:
                value = self._invoke(call, ctx, loop, context)
            except BaseException as exc:
                if isinstance(exc, HandlerNotStarted):
                    trace.outcome = "suspended"
                    self._suspend(
                        effect, f"the handler never started: {message_text(exc)}", exc, call
                    )
                    raise HandlerNotStartedError(effect.id, str(exc)) from exc
                if _from_inner_effect(exc, effect):
                    trace.outcome = "suspended"
                    self._suspend(
                        effect, f"an inner effect raised {exception_text(exc)}", exc, call
                    )
                    raise
                try:
                    kind, why = self._classify(call, exc, ctx.sent)
                    error = describe(exc, str(kind), call.secrets, why)
                    why = error.get("why", "")  # scrubbed and storable, like the rest
                except Exception as problem:
                    # The attempt ran and must not stay STARTED: record what is certain.
                    kind = FailureClass.UNKNOWN
                    why = f"the exception could not be recorded ({type(problem).__name__})"
                    error = undescribed(exc, why)
                if kind is FailureClass.RETRYABLE:
                    if effect.attempt - first_attempt + 1 < call.spec.max_attempts:
                        # Wait first, then renew the claim (fenced), then call: a claim
                        # lost while we waited means no call at all (LeaseLostError).
                        pause = self.retry_delay * 2 ** (effect.attempt - first_attempt)
                        self.clock.sleep(min(pause, call.spec.lease_seconds / 2))
                        effect = self._retry(call, effect, error, exc)
                        trace.attempt = effect.attempt
                        continue
                    self._finish(
                        call, effect, S.FAILED, "failed", exc, error=error,
                        reason=f"retryable error, {call.spec.max_attempts} attempts used",
                    )  # fmt: skip
                    raise
                if kind is FailureClass.UNKNOWN:
                    self._finish(
                        call, effect, S.UNKNOWN, "unknown", exc, error=error,
                        reason="may have happened: " + (why or error["type"]),
                    )  # fmt: skip
                    if not isinstance(exc, Exception):
                        raise  # cancellation or interrupt: let it propagate as it was
                    raise OutcomeUnknownError(effect.id, call.tool, error["message"]) from exc
                self._finish(call, effect, S.FAILED, "failed", exc, error=error,
                             reason=why or error["type"])  # fmt: skip
                raise
            if inspect.isawaitable(value):
                self._awaitable_returned(call, effect, value)
            return self._record_success(call, effect, value)

    def _record_success(self, call: Call, effect: Effect, value: Any) -> Any:
        result, stored = storable(value)
        withheld = ""
        if stored and contains_secret(result, call.secrets):
            # The receipt carries a secret field in clear: it is not written to the ledger.
            result, stored, withheld = None, False, "it holds a secret field in clear"
        if not self._checks_receipts():
            self._finish(call, effect, S.COMMITTED, "returned", value, result=result,
                         stored=stored, withheld=withheld)  # fmt: skip
            return value
        problems = [
            safe_text(scrub(p, call.secrets))
            for p in self._receipt_contract_problems(call.tool, value, call.stored_args)
        ]
        verdict = S.HUMAN_REVIEW if problems else S.COMMITTED
        # The call returned, so it happened; whether this receipt proves it was *this*
        # effect is the contract's call. A failed check keeps the value for a person.
        self._finish(
            call, effect, S.RECEIPT_RECORDED, "returned", value, result=result, stored=stored,
            withheld=withheld,
            then=Then(
                "check_receipt", verdict,
                "receipt breaks the provider contract: " + "; ".join(problems) if problems
                else "receipt meets the provider contract",
                {"problems": problems} if problems else None,
            ),
        )  # fmt: skip
        if problems:
            raise ReceiptContractError(effect.id, problems, value)
        return value

    def _classify(
        self, call: Call, exc: BaseException, sent: bool = False
    ) -> tuple[FailureClass, str]:
        """What the handler's exception means. A tool's own ``business_errors`` mean what
        ``Classifier(business=...)`` means (one rule, in classify.py): FAILED, unless the
        rules know the call may have run. Once the handler marked a request sent
        (``ctx.mark_sent()``), "nothing was sent" no longer holds: RETRYABLE is UNKNOWN."""
        business = call.spec.business_errors
        classifier = self.classifier
        if isinstance(classifier, Classifier):
            kind, why = classifier.explain(exc, business)
        elif business and isinstance(exc, business):
            # A classifier of the application's own does not know this tool's declarations.
            kind, why = Classifier().explain(exc, business)
        elif hasattr(classifier, "explain"):
            kind, why = classifier.explain(exc)
        else:
            kind, why = classifier.classify(exc), ""
        if kind is FailureClass.RETRYABLE and sent:
            return FailureClass.UNKNOWN, (
                f"{why or type(exc).__name__}, but the handler had already sent a request"
                " (ctx.mark_sent()), which a retry would send again"
            )
        return kind, str(why)

    def _awaitable_returned(self, call: Call, effect: Effect, value: Any) -> None:
        """A sync wrapper handed back a coroutine: nothing has run yet. Close it so it never
        runs outside the ledger, record a failure, and tell the developer."""
        error = TypeError(
            f"{effect.tool} returned an awaitable from a synchronous call; declare the handler"
            " `async def` (or wrap the coroutine function itself) so OpenOnce awaits it"
        )
        if inspect.iscoroutine(value):
            value.close()
            kind, state, outcome = FailureClass.FAILED, S.FAILED, "failed"
        else:  # a Future or Task may already be running: it may happen
            kind, state, outcome = FailureClass.UNKNOWN, S.UNKNOWN, "unknown"
        described = describe(error, str(kind), ())
        self._finish(call, effect, state, outcome, error, error=described, reason=str(error))
        raise error

    def _suspend(self, effect: Effect, why: str, exc: BaseException, call: Call) -> None:
        """Nothing external happened in this attempt: give the claim back (PLANNED), so the
        next identical call runs it; the exception propagates as itself."""
        evidence = {
            "attempt": effect.attempt,
            "cause": scrub(exception_text(exc), call.secrets),
        }
        why = safe_text(scrub(why, call.secrets))
        inner = getattr(exc, "effect_id", None)
        if inner:
            evidence["inner_effect"] = inner
        try:
            moved = self.ledger.move(
                effect, "suspend", S.PLANNED, actor=f"agent:{self.owner}",
                reason=why[:500], evidence=evidence,
                changes={"execution_status": "suspended", "execution_evidence": evidence},
            )  # fmt: skip
        except Exception as write_exc:
            raise LedgerWriteError(effect.id, "suspended", exc, repr(write_exc)) from write_exc
        if not moved:
            self._late_result(
                call, effect, S.PLANNED, "suspended", exc, {"execution_evidence": evidence}
            )

    def _retry(
        self, call: Call, effect: Effect, error: dict[str, Any], exc: BaseException
    ) -> Effect:
        at = self.clock.now()
        changes: dict[str, Any] = {
            "attempt": effect.attempt + 1,
            "lease_owner": self.owner,
            "lease_expires_at": at + call.spec.lease_seconds,
            "execution_status": "retryable_failure",
            "execution_evidence": {"attempt": effect.attempt, "error": error},
        }
        try:
            done = self.ledger.move(
                effect, "retry", S.STARTED, actor=f"agent:{self.owner}",
                reason="retry: nothing was sent",
                evidence={"attempt": effect.attempt + 1, "previous_error": error},
                changes=changes, at=at,
            )  # fmt: skip
        except Exception as write_exc:
            raise LedgerWriteError(effect.id, "retryable", exc, repr(write_exc)) from write_exc
        if not done:
            self._late_result(call, effect, S.STARTED, "retryable", exc, {"error": error})
        retried = dataclasses.replace(effect, fence=effect.fence + 1, updated_at=at, **changes)
        self.keeper.hold(retried.id, retried.fence, self.owner, call.spec.lease_seconds)
        return retried

    def _finish(
        self,
        call: Call,
        effect: Effect,
        state: EffectState,
        outcome: str,
        observed: Any,
        *,
        error: dict[str, Any] | None = None,
        result: Any = None,
        stored: bool = True,
        withheld: str = "",
        reason: str = "",
        then: Then | None = None,
    ) -> None:
        """The second commit: record what the attempt established, fenced to our claim."""
        evidence: dict[str, Any] = {"attempt": effect.attempt}
        if error is not None:
            evidence["error"] = error
        if not stored:
            evidence["result_unavailable"] = withheld or type(observed).__name__
        changes: dict[str, Any] = {
            "execution_status": outcome,
            "execution_evidence": evidence,
            "result": result,
            "error": error,
        }
        try:
            done = self.ledger.move(
                effect, "finish", state, actor=f"agent:{self.owner}", reason=reason,
                evidence=evidence, changes=changes, then=then,
            )  # fmt: skip
        except Exception as exc:
            if not _about_the_data(exc):
                raise LedgerWriteError(effect.id, outcome, observed, repr(exc)) from exc
            # The store refused what we tried to write (text it cannot hold), not the
            # connection: the attempt ran, so it must not stay STARTED until its lease
            # runs out. Record UNKNOWN, described plainly, and say so.
            self._finish_unstorable(call, effect, outcome, observed, exc)
            raise LedgerWriteError(
                effect.id, outcome, observed,
                f"{type(exc).__name__} (the ledger could not hold the outcome; it was"
                " recorded UNKNOWN instead)",
            ) from exc  # fmt: skip
        if not done:
            final = then.to if then is not None else state
            self._late_result(call, effect, final, outcome, observed, changes, then)

    def _finish_unstorable(
        self, call: Call, effect: Effect, outcome: str, observed: Any, problem: Exception
    ) -> None:
        """The finish of an outcome the store could not hold: UNKNOWN, with nothing of the
        observed value in it but its class."""
        what = (
            type_name(observed)
            if isinstance(observed, BaseException)
            else safe_text(type(observed).__name__)
        )
        why = (
            f"the attempt's outcome ({outcome}, {what}) could not be stored"
            f" ({type(problem).__name__}): it ran, so it may have happened"
        )
        error = {"type": what, "message": why, "args": None, "class": "unknown", "why": why}
        evidence: dict[str, Any] = {"attempt": effect.attempt, "error": error}
        changes: dict[str, Any] = {
            "execution_status": "unknown",
            "execution_evidence": evidence,
            "result": None,
            "error": error,
        }
        try:
            done = self.ledger.move(
                effect, "finish", S.UNKNOWN, actor=f"agent:{self.owner}", reason=why,
                evidence=evidence, changes=changes,
            )  # fmt: skip
        except Exception as exc:
            raise LedgerWriteError(effect.id, outcome, observed, repr(exc)) from problem
        if not done:
            self._late_result(call, effect, S.UNKNOWN, "unknown", observed, changes)

    def _late_result(
        self,
        call: Call,
        effect: Effect,
        state: EffectState,
        outcome: str,
        observed: Any,
        changes: dict[str, Any],
        then: Then | None = None,
    ) -> None:
        """Our claim was fenced off: the lease lapsed, or someone decided meanwhile. What we
        saw is still evidence (invariant 7). If nobody decided since the lease lapsed, our
        outcome stands; otherwise it is journaled and, unless it agrees with what is
        recorded, the effect goes to a person: a double execution is never a clean commit."""
        actor = f"agent:{self.owner}"
        evidence = {
            "attempt": effect.attempt,
            "observed": outcome,
            "fence": effect.fence,
            **{k: v for k, v in changes.items() if k in ("error", "result")},
        }
        reason = f"attempt {effect.attempt} finished ({outcome}) after losing its lease"
        for _ in range(5):
            current = self.store.get(effect.id)
            if current is None:
                break
            same_attempt = current.attempt == effect.attempt
            if current.state == S.UNKNOWN and same_attempt and outcome in ("returned", "failed"):
                # Nobody decided since our lease lapsed: our outcome resolves the doubt.
                late = dict(changes)
                late["verification_status"] = "late_receipt" if outcome == "returned" else None
                first = S.RECEIPT_RECORDED if then is not None else state
                if self.ledger.move(
                    current, "late_result", first, actor=actor,
                    reason=f"late result of attempt {effect.attempt} after its lease expired",
                    evidence=changes.get("execution_evidence"), changes=late, then=then,
                ):  # fmt: skip
                    return
                continue
            if _agrees(current, same_attempt, outcome):
                self.ledger.note(effect.id, actor=actor, reason=reason, evidence=evidence)
                break
            if self.ledger.move(
                current, "contradict", S.HUMAN_REVIEW, actor="openonce",
                reason=f"{reason}; contradicts the recorded {current.state} (attempt"
                f" {current.attempt}): a person must check the provider for a duplicate",
                evidence=evidence,
                changes={"verification_status": "contradicted"},
            ):  # fmt: skip
                break
        else:
            # The effect changed under every try, so no move held; what we saw is still
            # journaled (invariant 7), for a person or the next decision to weigh.
            self.ledger.note(
                effect.id, actor=actor, evidence=evidence,
                reason=f"{reason}; the effect changed on every try to record it, so it was not"
                " compared with the recorded state: check it against the provider",
            )  # fmt: skip
        error = LeaseLostError(effect.id, outcome, observed, "a newer owner holds the effect")
        error.openonce_outcome = "lease_lost"  # type: ignore[attr-defined]
        raise error

    def _replay(self, row: ReplayRow) -> Any:
        if row.state == S.COMMITTED:
            if row.result_json is None and row.execution_evidence_json is not None:
                evidence = _loads(row.execution_evidence_json)
                if "result_unavailable" in evidence:
                    raise ResultUnavailableError(row.id, str(evidence["result_unavailable"]))
            return _loads(row.result_json) if row.result_json is not None else None
        raise rebuild(row.id, _loads(row.error_json) if row.error_json is not None else None)

    # -- waiting on another caller -------------------------------------------------------------

    def _wait_for_change(self, effect: Effect, deadline: float, wait_seconds: float) -> None:
        checked_owner = time.monotonic()
        with self.store.watch(effect.id) as watch:
            # Registered before re-reading, so a commit landing in between still wakes us.
            while True:
                current = self.store.get(effect.id)
                if current is None or current.state != S.STARTED or current.fence != effect.fence:
                    return
                now, left = self.clock.now(), deadline - monotonic_of(self.clock)
                if left <= 0:
                    raise EffectInFlightError(effect.id, wait_seconds)
                # Every read is a sighting of the lease: one we have watched since before
                # its end is judged as soon as it ends. One whose end passed but that we
                # have not yet seen un-renewed long enough (the clock may have stepped) is
                # read again shortly: a live owner renews it meanwhile.
                if lease_lapsed(current, self.clock, now):
                    return  # the caller turns the expired lease into UNKNOWN
                if time.monotonic() - checked_owner > 0.25:
                    checked_owner = time.monotonic()
                    if dead_owner(current.lease_owner):
                        return  # the caller turns the dead owner into UNKNOWN
                lease_left = (current.lease_expires_at or 0) - now
                watch.wait(min(left, lease_left if lease_left > 0 else 0.25, 0.25))


@dataclasses.dataclass(slots=True)
class _Trace:
    """How one call went, for stats and observers."""

    outcome: str = ""
    effect_id: str | None = None
    attempt: int = 0
    error: str | None = None


_loads = loads


def _replay_row(effect: Effect) -> ReplayRow:
    return ReplayRow(
        effect.id,
        str(effect.state),
        effect.args_fingerprint,
        dumps(effect.result) if effect.result is not None else None,
        dumps(effect.error) if effect.error is not None else None,
        dumps(effect.execution_evidence) if effect.execution_evidence is not None else None,
    )


def _from_inner_effect(exc: BaseException, effect: Effect) -> bool:
    """An OpenOnce error raised by the machinery of another effect the handler called
    (ApprovalPending, OutcomeUnknownError, EffectInFlightError, ...): this effect itself
    did nothing external in this attempt. A replayed failure of an inner effect is an
    ordinary failure, classified as usual."""
    return (
        isinstance(exc, OpenOnceError)
        and not isinstance(exc, EffectFailed)
        and not getattr(exc, "openonce_replayed", False)
        and getattr(exc, "effect_id", None) != effect.id
    )


def _agrees(current: Effect, same_attempt: bool, outcome: str) -> bool:
    """A late outcome that says what the ledger already says: nothing to escalate."""
    if current.state == S.HUMAN_REVIEW:
        return True  # a person is already looking; the note joins the evidence
    if outcome in ("retryable", "suspended") and current.state in (S.PLANNED, S.CANCELLED):
        return True  # nothing was sent by this attempt: "did not happen" stands
    if not same_attempt:
        return False  # another attempt ran or was decided meanwhile
    if current.state == S.UNKNOWN:
        return outcome in ("unknown", "retryable", "suspended")  # still not known
    # Committed by a probe or a person: a return or a "may have happened" agrees; a
    # refusal from the provider would contradict the receipt.
    return current.state == S.COMMITTED and outcome in ("returned", "unknown")


def _about_the_data(exc: BaseException) -> bool:
    """Whether a failed write failed on what it was to write (text a store cannot hold:
    a lone surrogate, a NUL on Postgres, a value too long to index), not on the connection
    or the database."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, UnicodeError) or any(
            c.__name__ in ("DataError", "ProgramLimitExceeded") for c in type(current).__mro__
        ):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def _outcome_of(exc: BaseException) -> str:
    if isinstance(exc, ApprovalPending):
        return "approval_pending"
    if isinstance(exc, OutcomeUnknownError):
        return "unknown"
    if isinstance(exc, EffectInFlightError):
        return "in_flight"
    if isinstance(exc, ReceiptContractError):
        return "receipt_contract_failed"
    if getattr(exc, "openonce_replayed", False):
        return "replayed"
    if isinstance(exc, OpenOnceError):
        return "refused"
    return "failed"


def _cause(exc: BaseException) -> str:
    """A database error in one line: its class and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
