"""The runtime agents import: ``OpenOnce``, the ``@oo.effect`` decorator, scopes, and the
decisions people make (approve, deny, resolve, cancel, release).

Every change of an effect's state goes through ``_move``: a conditional update naming the
state(s) and fence the caller read, with its journal line, in one transaction. Whoever
loses a race re-reads and decides again; nobody overwrites a newer decision.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import hashlib
import inspect
import os
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from .canonical import canonical, check_json, fingerprint, secret_digest
from .classify import Classifier, FailureClass
from .errors import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    ApproverAlreadyCounted,
    EffectCancelled,
    EffectChangedError,
    EffectFailed,
    EffectInFlightError,
    EffectNotFoundError,
    IdempotencyMismatchError,
    IllegalTransitionError,
    InvalidArgumentsError,
    InvalidReceiptError,
    LeaseLostError,
    LedgerWriteError,
    OpenOnceError,
    OutcomeUnknownError,
    ProviderContractError,
    ReceiptContractError,
    ReceiptIdentityError,
    ResultUnavailableError,
    SchemaVersionError,
    ScopeRequiredError,
)
from .policy import ALLOW, Policy
from .providers import (
    Capability,
    CapabilityMatrix,
    check_call_contract,
    check_receipt,
    receipt_identity_problems,
)
from .records import Approval, Effect, JournalEntry, new_effect_id, now
from .schema import SCHEMA_VERSION
from .states import NEEDS_HUMAN, NOT_STARTED, EffectState, is_legal
from .stores import open_store
from .stores.base import Store

S = EffectState
F = TypeVar("F", bound=Callable[..., Any])

_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("openonce_scope", default=None)
_current: contextvars.ContextVar[EffectContext | None] = contextvars.ContextVar(
    "openonce_effect", default=None
)


@dataclass(frozen=True, slots=True)
class EffectContext:
    """What a running handler knows about its effect (``openonce_core.current_effect()``)."""

    effect_id: str
    tool: str
    attempt: int
    idempotency_key: str
    scope: str | None
    # Stable for the effect's whole life, across attempts and processes: pass it as the
    # provider's idempotency key (Stripe's Idempotency-Key header, an email's Message-ID).
    provider_key: str


def current_effect() -> EffectContext:
    ctx = _current.get()
    if ctx is None:
        raise OpenOnceError("current_effect() is only available inside an @oo.effect handler")
    return ctx


def current_scope() -> str | None:
    return _scope.get()


@dataclass(frozen=True, slots=True)
class _Spec:
    """One decorated tool: how its calls become keys and how it runs."""

    fn: Callable[..., Any]
    tool: str
    signature: inspect.Signature
    idempotency_fields: tuple[str, ...] | None
    idempotency_key: Callable[..., Any] | None
    secret_fields: frozenset[str]
    max_attempts: int
    lease_seconds: float
    wait_seconds: float
    is_async: bool
    # Parameter names when every parameter is plain (positional-or-keyword): such calls
    # are bound without inspect.Signature.bind, which costs more than the rest of a replay.
    plain_names: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class _Call:
    """One call, checked and keyed, before anything is written."""

    spec: _Spec
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    stored_args: dict[str, Any]
    key: str
    fingerprint: str  # of every argument as stored: what an approval or a re-arm covers
    scope: str | None
    secrets: tuple[str, ...] = ()  # clear secret values, scrubbed from recorded errors

    @property
    def tool(self) -> str:
        return self.spec.tool


class OpenOnce:
    """The ledger client an agent process holds. Thread-safe; one per process is enough.

    ``target`` is a SQLite path, a ``postgresql://`` DSN, ``":memory:"`` or a Store.
    """

    def __init__(
        self,
        target: str | Store = "openonce.db",
        *,
        policy: Policy | None = None,
        classifier: Classifier | None = None,
        max_attempts: int = 3,
        lease_seconds: float = 300.0,
        wait_seconds: float = 30.0,
        retry_delay: float = 0.2,
        owner: str | None = None,
        secret_pepper: bytes | None = None,
        migrate: bool | None = None,
        enforce_provider_receipts: bool = False,
        require_provider_capability_for_receipts: bool = False,
        provider_capabilities: Mapping[str, str] | None = None,
        extra_capabilities: Iterable[Capability] = (),
    ) -> None:
        self.store: Store = target if not isinstance(target, str) else open_store(target)
        if migrate is None:
            # Embedded stores install their schema on first use; Postgres is migrated
            # explicitly (``openonce --db DSN migrate``) and only checked here.
            migrate = getattr(self.store, "dialect", "memory") != "postgres"
        if migrate:
            self.store.migrate()
        else:
            _check_schema(self.store)
        self.policy = policy or (lambda tool, args: ALLOW)
        self.classifier = classifier or Classifier()
        self.max_attempts = max_attempts
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.retry_delay = retry_delay
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.secret_pepper = secret_pepper
        # Counts per outcome, so metrics can tell a replay from a fresh call.
        self.stats: Counter[str] = Counter()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Provider knowledge. With enforcement on, calls must meet their capability's
        # contract before they run and receipts after; off, whatever returns is recorded.
        self.extra_capabilities = tuple(extra_capabilities)
        self.matrix = CapabilityMatrix(extra=self.extra_capabilities)
        self.provider_capabilities = dict(provider_capabilities or {})
        for tool, name in self.provider_capabilities.items():
            self.matrix.resolve(tool, name)  # a pin that fits no capability fails here
        self.enforce_provider_receipts = enforce_provider_receipts
        self.require_provider_capability_for_receipts = require_provider_capability_for_receipts

    # -- declaring effects ----------------------------------------------------------------

    def effect(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        tool: str | None = None,
        idempotency_fields: Sequence[str] | None = None,
        idempotency_key: Callable[..., Any] | None = None,
        max_attempts: int | None = None,
        secret_fields: Sequence[str] = (),
        lease_seconds: float | None = None,
        wait_seconds: float | None = None,
    ) -> Any:
        """Make ``fn`` a durable effect: ``@oo.effect``, ``@oo.effect(tool=...)`` or
        ``oo.effect(existing_callable)``.

        * ``idempotency_fields``: only these arguments form the key (the intent
          fingerprint), so reworded prose does not defeat dedup. Needs a scope.
        * ``idempotency_key``: a callable taking the call's arguments and returning an
          explicit key (``lambda charge, **_: f"refund-{charge}"``); needs no scope, and the
          same key with different arguments is refused.
        * ``secret_fields``: stored only as digests, still usable as key material.
        """
        if fn is None:
            return functools.partial(
                self.effect,
                tool=tool,
                idempotency_fields=idempotency_fields,
                idempotency_key=idempotency_key,
                max_attempts=max_attempts,
                secret_fields=secret_fields,
                lease_seconds=lease_seconds,
                wait_seconds=wait_seconds,
            )
        if idempotency_fields is not None and idempotency_key is not None:
            raise ValueError("give idempotency_fields or idempotency_key, not both")
        signature = inspect.signature(fn)
        for name in (*(idempotency_fields or ()), *secret_fields):
            if name not in signature.parameters:
                raise ValueError(f"{name!r} is not a parameter of {fn.__qualname__}")
        attempts = max_attempts if max_attempts is not None else self.max_attempts
        if attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        spec = _Spec(
            fn=fn,
            tool=tool or _tool_name(fn),
            signature=signature,
            idempotency_fields=tuple(idempotency_fields) if idempotency_fields else None,
            idempotency_key=idempotency_key,
            secret_fields=frozenset(secret_fields),
            max_attempts=attempts,
            lease_seconds=lease_seconds if lease_seconds is not None else self.lease_seconds,
            wait_seconds=wait_seconds if wait_seconds is not None else self.wait_seconds,
            is_async=_is_async(fn),
            plain_names=_plain_names(signature),
        )
        if spec.is_async:

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                call = self._prepare(spec, args, kwargs)
                context = contextvars.copy_context()
                loop = asyncio.get_running_loop()
                # Ledger I/O runs on a worker thread; the handler itself runs on this loop.
                job = functools.partial(context.run, self._execute, call, loop, context)
                return await loop.run_in_executor(self._threads(), job)

            async_wrapper.openonce_tool = spec.tool  # type: ignore[attr-defined]
            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self._execute(self._prepare(spec, args, kwargs))

        wrapper.openonce_tool = spec.tool  # type: ignore[attr-defined]
        return wrapper

    @contextmanager
    def scope(self, run_id: str | None = None) -> Iterator[str]:
        """Dedup derived keys within a run. Without an id each ``with`` is a new run; with a
        stable id a resumed run after a crash replays what the first one did."""
        if run_id is not None and (type(run_id) is not str or not run_id):
            raise ValueError("scope id must be a non-empty string")
        scope_id = run_id or "run_" + uuid.uuid4().hex
        token = _scope.set(scope_id)
        try:
            yield scope_id
        finally:
            _scope.reset(token)

    # -- keys -----------------------------------------------------------------------------

    def _prepare(self, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        arguments = _bind(spec, args, kwargs)
        derived_from_all = spec.idempotency_key is None and spec.idempotency_fields is None
        if not derived_from_all:
            check_json(arguments)  # else the key-material check below covers every argument
        stored = arguments
        if spec.secret_fields:
            stored = {
                name: secret_digest(value, self.secret_pepper)
                if name in spec.secret_fields
                else value
                for name, value in arguments.items()
            }
        secrets = tuple(
            str(arguments[name]) for name in spec.secret_fields if arguments[name] not in ("", None)
        )
        scope = _scope.get()
        if self.enforce_provider_receipts or self.require_provider_capability_for_receipts:
            self._check_call_contract(spec, stored)
        if spec.idempotency_key is not None:
            key = spec.idempotency_key(**arguments)
            if type(key) is not str or not key:
                raise InvalidArgumentsError("idempotency_key", "must return a non-empty string")
            # Explicit keys are global; the whole argument set must match on reuse.
            return _Call(spec, args, kwargs, stored, key, fingerprint(stored), scope, secrets)
        if scope is None:
            raise ScopeRequiredError(
                f"{spec.tool}: a key derived from arguments needs a run scope;"
                " wrap the calls in `with oo.scope():` (or pass idempotency_key=)"
            )
        # Checked on the clear values, so a float stays refused even in a secret field.
        if derived_from_all:
            check_json(arguments, key_material=True)
            digest = _sha256(canonical(stored))
        else:
            fields = spec.idempotency_fields or ()
            check_json({f: arguments[f] for f in fields}, key_material=True)
            digest = _sha256(canonical({f: stored[f] for f in fields}))
        key = _sha256(f"{scope}\0{digest}")
        full = "sha256:" + (
            digest if spec.idempotency_fields is None else _sha256(canonical(stored))
        )
        return _Call(spec, args, kwargs, stored, key, full, scope, secrets)

    # -- the call -------------------------------------------------------------------------

    def _execute(
        self,
        call: _Call,
        loop: asyncio.AbstractEventLoop | None = None,
        context: contextvars.Context | None = None,
    ) -> Any:
        deadline = time.monotonic() + call.spec.wait_seconds
        while True:
            effect = self.store.find(call.tool, call.key)
            if effect is None:
                effect = self._claim_new(call)
                if effect is None:
                    continue  # another caller inserted first: read what it wrote
                return self._run(call, effect, loop, context)
            if (
                call.spec.idempotency_key is not None
                and effect.args_fingerprint != call.fingerprint
            ):
                raise IdempotencyMismatchError(effect.id, call.tool)
            claimed = self._decide_existing(call, effect, deadline)
            if claimed is not None:
                if claimed is _REPLAY:
                    return self._replay(effect)
                return self._run(call, claimed, loop, context)

    def _claim_new(self, call: _Call) -> Effect | None:
        decision = self.policy(call.tool, call.stored_args)
        at = now()
        base = Effect(
            id=new_effect_id(),
            tool=call.tool,
            idempotency_key=call.key,
            scope=call.scope,
            state=S.STARTED,
            args=call.stored_args,
            args_fingerprint=call.fingerprint,
            provider_key=_provider_key(call.tool, call.key),
            max_attempts=call.spec.max_attempts,
            created_at=at,
            updated_at=at,
        )
        if decision.requires_approval:
            effect = dataclasses.replace(
                base,
                state=S.REQUIRES_APPROVAL,
                approvals_required=decision.approvers,
                approval_ttl=decision.approval_ttl,
            )
            entry = self._entry(effect, S.PLANNED, S.REQUIRES_APPROVAL, reason=decision.reason)
            if not self.store.insert(effect, entry):
                return None
            self.stats["approval_pending"] += 1
            raise ApprovalPending(effect.id, call.tool, 0, decision.approvers)
        # Claim before call: STARTED, attempt 1, lease and fence are durable before the
        # handler runs, in this one commit.
        effect = dataclasses.replace(
            base,
            attempt=1,
            fence=1,
            lease_owner=self.owner,
            lease_expires_at=at + call.spec.lease_seconds,
        )
        entry = self._entry(effect, S.PLANNED, S.STARTED, evidence={"attempt": 1}, at=at)
        return effect if self.store.insert(effect, entry) else None

    def _decide_existing(self, call: _Call, effect: Effect, deadline: float) -> Any:
        """What a call does with an effect someone already wrote: returns a claimed Effect
        to run, ``_REPLAY``, or None to read again; raises for everything else."""
        state = effect.state
        if state in (S.COMMITTED, S.FAILED):
            return _REPLAY
        if state == S.STARTED:
            if _lease_expired(effect, now()):
                self._expire_lease(effect)
                return None
            self._wait_for_change(effect, deadline, call.spec.wait_seconds)
            return None
        if state in (S.UNKNOWN, S.HUMAN_REVIEW, S.RECEIPT_RECORDED):
            raise OutcomeUnknownError(effect.id, effect.tool, _last_error(effect))
        if state == S.REQUIRES_APPROVAL:
            count = len(self._valid_approvers(effect))
            raise ApprovalPending(effect.id, effect.tool, count, effect.approvals_required)
        if state == S.APPROVED:
            if len(self._valid_approvers(effect)) < effect.approvals_required:
                self._move(
                    effect,
                    S.REQUIRES_APPROVAL,
                    "reconsider",
                    actor="openonce",
                    reason="approval expired before the call ran",
                )
                raise ApprovalExpired(effect.id, effect.tool, 0, effect.approvals_required)
            return self._claim_existing(call, effect)
        if state == S.PLANNED:
            # A re-armed effect that needed approval runs only while that approval holds.
            if (
                effect.approvals_required
                and len(self._valid_approvers(effect)) < effect.approvals_required
            ):
                self._move(effect, S.REQUIRES_APPROVAL, "reconsider", actor="openonce",
                           reason="approval expired before the re-armed call ran")  # fmt: skip
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
            journal = self.store.journal(effect.id)
            line = next(j for j in journal if j.to_state == S.CANCELLED)
            raise EffectCancelled(effect.id, line.actor, line.reason)
        raise IllegalTransitionError(effect.id, state, "run")  # RELEASED is never found

    def _claim_existing(self, call: _Call, effect: Effect) -> Effect | None:
        if effect.args_fingerprint != call.fingerprint:
            # Approvals and re-arms cover the arguments that were recorded; a call that
            # shares the intent key but changed, say, the amount must not run under them.
            raise IdempotencyMismatchError(effect.id, call.tool)
        at = now()
        attempt = effect.attempt + 1
        changes: dict[str, Any] = {
            "state": S.STARTED,
            "attempt": attempt,
            "fence": effect.fence + 1,
            "lease_owner": self.owner,
            "lease_expires_at": at + call.spec.lease_seconds,
            "updated_at": at,
        }
        entry = self._entry(effect, effect.state, S.STARTED, evidence={"attempt": attempt}, at=at)
        if not self.store.update(effect.id, (effect.state,), effect.fence, changes, entry):
            return None
        return dataclasses.replace(effect, **changes)

    def _run(
        self,
        call: _Call,
        effect: Effect,
        loop: asyncio.AbstractEventLoop | None,
        context: contextvars.Context | None,
    ) -> Any:
        first_attempt = effect.attempt
        while True:
            ctx = EffectContext(
                effect.id, call.tool, effect.attempt, call.key, call.scope, effect.provider_key
            )
            try:
                value = self._invoke(call, ctx, loop, context)
            except BaseException as exc:
                kind = self.classifier.classify(exc)
                error = _describe(exc, kind, call.secrets)
                if kind is FailureClass.RETRYABLE:
                    if effect.attempt - first_attempt + 1 < call.spec.max_attempts:
                        # Wait first, then renew the claim (fenced), then call: a claim
                        # lost while we waited means no call at all (LeaseLostError).
                        pause = self.retry_delay * 2 ** (effect.attempt - first_attempt)
                        time.sleep(min(pause, call.spec.lease_seconds / 2))
                        effect = self._retry(call, effect, error, exc)
                        continue
                    self._finish(
                        effect,
                        S.FAILED,
                        "failed",
                        exc,
                        error=error,
                        reason=f"retryable error, {call.spec.max_attempts} attempts used",
                    )
                    self.stats["failed"] += 1
                    raise
                if kind is FailureClass.UNKNOWN:
                    self._finish(
                        effect,
                        S.UNKNOWN,
                        "unknown",
                        exc,
                        error=error,
                        reason="may have happened: " + error["type"],
                    )
                    self.stats["unknown"] += 1
                    if not isinstance(exc, Exception):
                        raise  # cancellation or interrupt: let it propagate as it was
                    raise OutcomeUnknownError(effect.id, call.tool, error["message"]) from exc
                self._finish(effect, S.FAILED, "failed", exc, error=error, reason=error["type"])
                self.stats["failed"] += 1
                raise
            if inspect.isawaitable(value):
                self._awaitable_returned(effect, value)
            result, stored = _storable(value)
            problems = self._receipt_contract_problems(call.tool, value, call.stored_args)
            if problems:
                # The call returned, so it happened; but this receipt does not prove it was
                # *this* effect. Keep the value for audit, let a person decide.
                self._finish(effect, S.HUMAN_REVIEW, "returned", value, result=result,
                             stored=stored, reason="receipt breaks the provider contract: "
                             + "; ".join(problems))  # fmt: skip
                self.stats["receipt_contract_failed"] += 1
                raise ReceiptContractError(effect.id, problems, value)
            self._finish(effect, S.COMMITTED, "returned", value, result=result, stored=stored)
            self.stats["executed"] += 1
            return value

    def _awaitable_returned(self, effect: Effect, value: Any) -> None:
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
        described = _describe(error, kind, ())
        self._finish(effect, state, outcome, error, error=described, reason=str(error))
        raise error

    # -- provider contracts ---------------------------------------------------------------

    def capabilities_for(self, tool: str) -> list[Capability]:
        return self.matrix.resolve(tool, self.provider_capabilities.get(tool))

    def _check_call_contract(self, spec: _Spec, args: dict[str, Any]) -> None:
        capabilities = self.capabilities_for(spec.tool)
        if not capabilities:
            if self.require_provider_capability_for_receipts:
                raise ProviderContractError(
                    f"{spec.tool}: no provider capability is known, and"
                    " require_provider_capability_for_receipts fails closed"
                )
            return
        problems = [
            problem
            for capability in capabilities
            for problem in check_call_contract(
                capability, args, spec.idempotency_fields, spec.idempotency_key is not None
            )
        ]
        if problems:
            raise ProviderContractError(f"{spec.tool}: " + "; ".join(problems))

    def _receipt_contract_problems(
        self,
        tool: str,
        receipt: Any,
        args: Mapping[str, Any],
        *,
        required: bool | None = None,
        require_capability: bool | None = None,
    ) -> list[str]:
        if not (self.enforce_provider_receipts if required is None else required):
            return []
        capabilities = self.capabilities_for(tool)
        if require_capability is None:
            require_capability = self.require_provider_capability_for_receipts
        if not capabilities:
            return [f"no provider capability is known for {tool}"] if require_capability else []
        return check_receipt(capabilities, receipt, args)

    def _invoke(
        self,
        call: _Call,
        ctx: EffectContext,
        loop: asyncio.AbstractEventLoop | None,
        context: contextvars.Context | None,
    ) -> Any:
        if loop is None:
            token = _current.set(ctx)
            try:
                return call.spec.fn(*call.args, **call.kwargs)
            finally:
                _current.reset(token)
        assert context is not None
        handler_context = context.copy()
        handler_context.run(_current.set, ctx)
        return _run_on_loop(loop, lambda: call.spec.fn(*call.args, **call.kwargs), handler_context)

    def _retry(
        self, call: _Call, effect: Effect, error: dict[str, Any], exc: BaseException
    ) -> Effect:
        at = now()
        changes: dict[str, Any] = {
            "attempt": effect.attempt + 1,
            "fence": effect.fence + 1,
            "lease_expires_at": at + call.spec.lease_seconds,
            "execution_status": "retryable_failure",
            "execution_evidence": {"attempt": effect.attempt, "error": error},
            "updated_at": at,
        }
        entry = self._entry(
            effect,
            S.STARTED,
            S.STARTED,
            reason="retry: nothing was sent",
            evidence={"attempt": effect.attempt + 1, "previous_error": error},
            at=at,
        )
        try:
            done = self.store.update(effect.id, (S.STARTED,), effect.fence, changes, entry)
        except Exception as write_exc:
            raise LedgerWriteError(effect.id, "retryable", exc, repr(write_exc)) from write_exc
        if not done:
            self._lease_lost(effect, "retryable", exc, error)
        return dataclasses.replace(effect, **changes)

    def _finish(
        self,
        effect: Effect,
        state: EffectState,
        outcome: str,
        observed: Any,
        *,
        error: dict[str, Any] | None = None,
        result: Any = None,
        stored: bool = True,
        reason: str = "",
    ) -> None:
        """The second commit: record what the attempt established, fenced to our claim."""
        at = now()
        evidence: dict[str, Any] = {"attempt": effect.attempt}
        if error is not None:
            evidence["error"] = error
        if not stored:
            evidence["result_unavailable"] = type(observed).__name__
        changes: dict[str, Any] = {
            "state": state,
            "fence": effect.fence + 1,
            "lease_owner": None,
            "lease_expires_at": None,
            "execution_status": outcome,
            "execution_evidence": evidence,
            "result": result,
            "error": error,
            "updated_at": at,
        }
        entry = self._entry(effect, S.STARTED, state, reason=reason, evidence=evidence, at=at)
        try:
            done = self.store.update(effect.id, (S.STARTED,), effect.fence, changes, entry)
        except Exception as exc:
            raise LedgerWriteError(effect.id, outcome, observed, repr(exc)) from exc
        if not done:
            self._late_result(effect, state, outcome, observed, changes)

    def _late_result(
        self,
        effect: Effect,
        state: EffectState,
        outcome: str,
        observed: Any,
        changes: dict[str, Any],
    ) -> None:
        """Our claim was fenced off (our lease expired). What we saw is still evidence."""
        current = self.store.get(effect.id)
        if (
            current is not None
            and current.state == S.UNKNOWN
            and current.attempt == effect.attempt
            and state == S.COMMITTED
        ):
            # Nobody started a newer attempt: our receipt resolves the uncertainty the lease
            # expiry created. Commit it, journaled as a late result.
            late = {**changes, "fence": current.fence + 1, "verification_status": "late_receipt"}
            entry = self._entry(
                current,
                S.UNKNOWN,
                S.COMMITTED,
                evidence=changes["execution_evidence"],
                reason=f"late result of attempt {effect.attempt} after its lease expired",
            )
            if self.store.update(effect.id, (S.UNKNOWN,), current.fence, late, entry):
                return
        self._lease_lost(effect, outcome, observed, changes.get("error"))

    def _lease_lost(
        self, effect: Effect, outcome: str, observed: Any, error: dict[str, Any] | None
    ) -> None:
        current = self.store.get(effect.id)
        state = current.state if current else effect.state
        evidence = {"attempt": effect.attempt, "observed": outcome, "fence": effect.fence}
        if error is not None:
            evidence["error"] = error
        reason = f"attempt {effect.attempt} finished ({outcome}) after losing its lease"
        if current is not None and current.state == S.PLANNED and outcome == "returned":
            # Someone decided it did not happen, yet this attempt returned: contradiction.
            self._move(
                current,
                S.HUMAN_REVIEW,
                "reconsider",
                actor="openonce",
                reason=reason + "; contradicts the not-happened decision",
                evidence=evidence,
            )
        else:
            self.store.append_journal(
                self._entry(effect, state, state, reason=reason, evidence=evidence)
            )
        raise LeaseLostError(effect.id, outcome, observed, "a newer owner holds the effect")

    def _replay(self, effect: Effect) -> Any:
        self.stats["replayed"] += 1
        if effect.state == S.COMMITTED:
            evidence = effect.execution_evidence or {}
            if "result_unavailable" in evidence:
                raise ResultUnavailableError(
                    f"effect {effect.id} committed, but its {evidence['result_unavailable']}"
                    " return value was not JSON and was not stored"
                )
            return effect.result
        raise _rebuild_error(effect)

    # -- waiting on another caller ----------------------------------------------------------

    def _wait_for_change(self, effect: Effect, deadline: float, wait_seconds: float) -> None:
        with self.store.watch(effect.id) as watch:
            # Registered before re-reading, so a commit landing in between still wakes us.
            while True:
                current = self.store.get(effect.id)
                if current is None or current.state != S.STARTED or current.fence != effect.fence:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EffectInFlightError(effect.id, wait_seconds)
                lease_left = (current.lease_expires_at or 0) - now()
                if lease_left <= 0:
                    return  # the caller turns the expired lease into UNKNOWN
                watch.wait(min(remaining, lease_left))

    # -- decisions by people and by the reconciler ---------------------------------------

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

    def approve(
        self, effect_id: str, *, by: str, reason: str = "", expected_fence: int | None = None
    ) -> Effect:
        """Count ``by``'s approval; the effect becomes APPROVED once enough distinct people
        approved. The approval is bound to the arguments' fingerprint."""
        _require_text("by", by)
        _optional_text("reason", reason)
        while True:
            effect = self._load(effect_id, (S.REQUIRES_APPROVAL,), "approve", expected_fence)
            approvers = self._valid_approvers(effect)
            if by in approvers:
                raise ApproverAlreadyCounted(effect_id, by)
            at = now()
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
            if self._move(
                effect,
                state,
                "approve",
                actor=f"operator:{by}",
                reason=reason,
                evidence=evidence,
                approval=approval,
                at=at,
            ):
                return self.get(effect_id)

    def deny(
        self, effect_id: str, *, by: str, reason: str, expected_fence: int | None = None
    ) -> Effect:
        _require_text("by", by)
        _require_text("reason", reason)
        while True:
            effect = self._load(
                effect_id, (S.REQUIRES_APPROVAL, S.APPROVED), "deny", expected_fence
            )
            approval = Approval(effect_id, "deny", by, reason, effect.args_fingerprint)
            if self._move(
                effect, S.DENIED, "deny", actor=f"operator:{by}", reason=reason, approval=approval
            ):
                return self.get(effect_id)

    def cancel(
        self, effect_id: str, *, by: str, reason: str, expected_fence: int | None = None
    ) -> Effect:
        """Give up an effect that has not started; its calls then raise EffectCancelled."""
        _require_text("by", by)
        _require_text("reason", reason)
        while True:
            effect = self._load(effect_id, tuple(NOT_STARTED), "cancel", expected_fence)
            if self._move(effect, S.CANCELLED, "cancel", actor=f"operator:{by}", reason=reason):
                return self.get(effect_id)

    def release_unstarted(self, effect_id: str, *, by: str, reason: str = "") -> Effect:
        """Drop a claim that never started (attempt 0) so its key can be claimed anew."""
        _require_text("by", by)
        _optional_text("reason", reason)
        while True:
            effect = self._load(effect_id, tuple(NOT_STARTED), "release")
            if effect.attempt != 0:
                raise IllegalTransitionError(
                    effect_id,
                    effect.state,
                    "release",
                    f"attempt {effect.attempt} already ran; resolve it instead",
                )
            if self._move(effect, S.RELEASED, "release", actor=f"operator:{by}", reason=reason):
                return self.get(effect_id)

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
    ) -> Effect:
        """A person found the effect happened: commit ``receipt``; duplicates replay it.

        With ``enforce_provider_receipts`` (or ``require_receipt_contract=True``) the
        receipt must meet the tool's provider receipt contract first. A receipt whose
        identifying fields name another effect (provider key, Message-ID, PR) is refused
        with ReceiptIdentityError, as a probe's would be, unless ``override_identity=True``
        with a reason: then the override and what it overrode are journaled."""
        _require_text("by", by)
        _optional_text("reason", reason)
        if override_identity:
            _require_text("reason", reason)
        receipt = _check_receipt(receipt)
        while True:
            effect = self._load(
                effect_id, (S.UNKNOWN, S.HUMAN_REVIEW), "resolve as happened", expected_fence
            )
            problems = self._receipt_contract_problems(
                effect.tool, receipt, effect.args, required=require_receipt_contract,
                require_capability=require_provider_capability,
            )  # fmt: skip
            if problems:
                raise InvalidReceiptError(
                    "receipt breaks the provider contract: " + "; ".join(problems)
                )
            mismatches = receipt_identity_problems(
                self.capabilities_for(effect.tool), receipt, effect_id=effect.id,
                provider_key=effect.provider_key, args=effect.args,
            )  # fmt: skip
            if mismatches and not override_identity:
                raise ReceiptIdentityError(effect.id, mismatches)
            evidence: dict[str, Any] = {"resolution": "happened", "receipt": receipt, "by": by}
            if mismatches:
                evidence["identity_override"] = mismatches
            changes = {
                "result": receipt,
                "verification_status": "confirmed_by_person",
                "verification_evidence": _with_observations(effect, evidence, reason),
            }
            if self._move(
                effect,
                S.COMMITTED,
                "resolve",
                actor=f"operator:{by}",
                reason=reason,
                evidence=evidence,
                changes=changes,
            ):
                return self.get(effect_id)

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
            effect = self._load(
                effect_id, (S.UNKNOWN, S.HUMAN_REVIEW), "resolve as not happened", expected_fence
            )
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
            if self._move(
                effect,
                S.PLANNED,
                "resolve",
                actor=f"operator:{by}",
                reason=reason,
                evidence=evidence,
                changes=changes,
            ):
                return self.get(effect_id)

    def expire_leases(self, limit: int = 100) -> list[str]:
        """STARTED effects whose lease ran out become UNKNOWN: an expired lease is evidence of
        nothing, least of all that the call may run again."""
        return [e.id for e in self.store.expired_leases(now(), limit) if self._expire_lease(e)]

    def _expire_lease(self, effect: Effect) -> bool:
        return self._move(
            effect,
            S.UNKNOWN,
            "expire",
            actor="openonce",
            reason=f"lease of attempt {effect.attempt} held by {effect.lease_owner} expired",
            evidence={"attempt": effect.attempt, "lease_expired_at": effect.lease_expires_at},
            changes={
                "lease_owner": None,
                "lease_expires_at": None,
                "execution_status": "unknown",
                "execution_evidence": {"attempt": effect.attempt, "lease_expired": True},
            },
        )

    # -- plumbing -------------------------------------------------------------------------

    def _load(
        self,
        effect_id: str,
        allowed: tuple[EffectState, ...],
        action: str,
        expected_fence: int | None = None,
    ) -> Effect:
        """The effect, if ``action`` is legal now. ``expected_fence`` pins the version a
        person looked at: a decision made on a stale page (or a bulk action on a set that
        changed since it was counted) is refused instead of applied to something else."""
        effect = self.get(effect_id)
        if expected_fence is not None and effect.fence != expected_fence:
            raise EffectChangedError(effect_id, effect.state)
        # A lapsed lease makes the effect UNKNOWN, but only on the way to a decision that
        # UNKNOWN allows: a refused call changes nothing.
        if S.UNKNOWN in allowed and effect.state == S.STARTED and _lease_expired(effect, now()):
            self._expire_lease(effect)
            effect = self.get(effect_id)
        if effect.state not in allowed:
            raise IllegalTransitionError(
                effect_id, effect.state, action, "allowed from " + ", ".join(allowed)
            )
        return effect

    def _move(
        self,
        effect: Effect,
        state: EffectState,
        action: str,
        *,
        actor: str,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
        approval: Approval | None = None,
        at: float | None = None,
    ) -> bool:
        """One conditional transition with its journal line; False if someone moved first."""
        if not is_legal(effect.state, state):
            raise IllegalTransitionError(effect.id, effect.state, action)
        at = at or now()
        # Every decision also ends any lease or probe claim on the effect.
        all_changes: dict[str, Any] = {
            "state": state,
            "fence": effect.fence + 1,
            "updated_at": at,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        all_changes.update(changes or {})
        entry = JournalEntry(effect.id, effect.state, state, actor, reason, evidence, at)
        return self.store.update(
            effect.id, (effect.state,), effect.fence, all_changes, entry, approval
        )

    def _entry(
        self,
        effect: Effect,
        src: EffectState | None,
        dst: EffectState,
        *,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> JournalEntry:
        return JournalEntry(
            effect.id, src, dst, f"agent:{self.owner}", reason, evidence, at or now()
        )

    def _valid_approvers(self, effect: Effect) -> set[str]:
        at = now()
        return {
            a.by
            for a in self.store.approvals(effect.id)
            if a.valid_for(effect.args_fingerprint, at)
        }

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=64, thread_name_prefix="openonce"
            )
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self.store.close()

    def __enter__(self) -> OpenOnce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REPLAY = object()


def _check_schema(store: Store) -> None:
    version = store.schema_version()
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"ledger schema is at version {version}, this OpenOnce needs {SCHEMA_VERSION};"
            " run `openonce --db DSN migrate`"
        )


def _provider_key(tool: str, key: str) -> str:
    return "oo_" + hashlib.sha256(f"{tool}\0{key}".encode()).hexdigest()[:40]


def _lease_expired(effect: Effect, at: float) -> bool:
    return effect.lease_expires_at is not None and effect.lease_expires_at <= at


def _last_error(effect: Effect) -> str:
    error = (effect.execution_evidence or {}).get("error") or {}
    return str(error.get("message", ""))


def _describe(exc: BaseException, kind: FailureClass, secrets: tuple[str, ...]) -> dict[str, Any]:
    cls = type(exc)
    args: list[Any] | None = list(exc.args)
    try:
        check_json(args)
    except InvalidArgumentsError:
        args = None
    message = str(exc)[:2000]
    if secrets:
        # A provider error that echoes a card number must not put it in the ledger.
        message = _scrub(message, secrets)
        args = None if args is None or _scrub(canonical(args), secrets) != canonical(args) else args
    return {
        "type": f"{cls.__module__}.{cls.__qualname__}",
        "message": message,
        "args": args,
        "class": str(kind),
    }


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, "[secret]")
    return text


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _plain_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    params = signature.parameters.values()
    if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return tuple(signature.parameters)
    return None


def _bind(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults applied; ``*args`` become a list."""
    names = spec.plain_names
    if names is not None and len(args) + len(kwargs) == len(names) and len(args) <= len(names):
        arguments = dict(zip(names, args, strict=False))
        if all(k in names and k not in arguments for k in kwargs):
            arguments.update(kwargs)
            return arguments
    try:
        bound = spec.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentsError("$", str(exc)) from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for name, param in spec.signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            arguments[name] = list(arguments[name])
    return arguments


def _tool_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>":
        raise ValueError(f"cannot name the tool of {fn!r}; pass tool='...'")
    return name


def _is_async(fn: Callable[..., Any]) -> bool:
    """Coroutine functions, and callable objects whose ``__call__`` is one."""
    target = getattr(fn, "func", fn)  # functools.partial
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - a method, not callability
    )


def _rebuild_error(effect: Effect) -> BaseException:
    """The recorded failure, as the same exception class when it is loaded here."""
    error = effect.error or {}
    type_name = str(error.get("type", "Exception"))
    module_name, _, qualname = type_name.rpartition(".")
    exc: BaseException | None = None
    obj: Any = sys.modules.get(module_name)  # never import modules named by ledger data
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Exception) and error.get("args") is not None:
        try:
            exc = obj(*error["args"])
        except Exception:
            exc = None
    if exc is None:
        exc = EffectFailed(effect.id, type_name, str(error.get("message", "")))
    exc.openonce_replayed = True  # type: ignore[attr-defined]
    exc.openonce_effect_id = effect.id  # type: ignore[attr-defined]
    return exc


def _storable(value: Any) -> tuple[Any, bool]:
    try:
        check_json(value)
    except InvalidArgumentsError:
        return None, False
    return value, True


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


def _run_on_loop(
    loop: asyncio.AbstractEventLoop,
    make_coro: Callable[[], Any],
    context: contextvars.Context,
) -> Any:
    """Run a coroutine on ``loop`` from a worker thread and block this thread for it."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def start() -> None:
        try:
            task = loop.create_task(make_coro(), context=context)
        except BaseException as exc:  # the handler raised before its first await
            done.set_exception(exc)
            return

        def finished(t: asyncio.Task[Any]) -> None:
            if t.cancelled():
                done.set_exception(asyncio.CancelledError())
            elif t.exception() is not None:
                done.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                done.set_result(t.result())

        task.add_done_callback(finished)

    loop.call_soon_threadsafe(start)
    return done.result()
