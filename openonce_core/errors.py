"""Every error OpenOnce raises, and what the caller should do next.

An agent calling a decorated tool needs two ``except`` clauses, one per question it must
answer before it goes on: is the world as it was before, or may the effect be out there?

::

    try:
        receipt = refund(order_id, amount=1200)
    except NothingRanError as e:      # not done: say why, plan around it
        tell_model(f"not done: {e}")
    except MayHaveRunError as e:      # maybe done: never do it again another way
        tell_model(f"may have happened, effect {e.effect_id}: {e}")

::

    OpenOnceError
    ├── NothingRanError              this call ran nothing, and no effect of it is in doubt
    │   ├── InvalidArgumentsError        arguments are not strict JSON (names the field)
    │   │   └── FloatInKeyMaterialError  a float where a key is derived: use integer minor units
    │   ├── ScopeRequiredError           a derived key needs ``with oo.scope(...)``
    │   ├── IdempotencyMismatchError     the key was used with different arguments: new key
    │   ├── ProviderContractError        the call breaks its provider capability's contract
    │   ├── ApprovalPending              the call needs approval; retry the same call later
    │   │   └── ApprovalExpired          an approval expired before the call ran (fail closed)
    │   ├── ApprovalDenied               a person denied it; the call never runs
    │   ├── EffectCancelled              a person cancelled it; the call never runs
    │   ├── HandlerNotStartedError       the handler never began (its loop closed): call again
    │   └── LedgerUnavailableError       the ledger could not be reached before the handler ran
    ├── MayHaveRunError              the effect may have happened, or did: do not make it again
    │   ├── OutcomeUnknownError          it may have happened; a probe or a person settles it
    │   ├── EffectInFlightError          another caller is running it right now; look later
    │   ├── EffectArchivedError          the key's effect ended long ago and was archived
    │   ├── ResultUnavailableError       it happened, but its return value could not be stored
    │   ├── ReceiptContractError         it returned a receipt that breaks the contract: held
    │   └── LedgerWriteError             the handler ran, recording its outcome failed
    │       └── LeaseLostError           a newer owner holds the effect; this result is evidence
    │
    │   neither: a person's decision was refused (the console, ``oo.approve``, ...);
    │   nothing changed, and no tool call raises these
    ├── EffectNotFoundError          no effect has that id
    ├── IllegalTransitionError       the effect's state does not allow that decision
    │   └── EffectChangedError       it changed since the decision was prepared
    ├── InvalidReceiptError          a receipt that is not a non-empty JSON object
    │   └── ReceiptIdentityError     a person's receipt names another effect
    ├── ApproverAlreadyCounted       one person cannot approve twice
    │
    │   neither: the replay of a handler's own failure
    ├── EffectFailed                 a recorded failure whose exception class is not loaded
    │
    │   neither: the setup is wrong; no call can succeed until a person fixes it
    ├── SchemaVersionError           this code cannot use the ledger's schema version
    ├── ConfigurationError           set up in a way that breaks a promise (secrets, no pepper)
    ├── CapabilityError              provider knowledge that cannot be used (names the field)
    ├── WiringError                  a probers / capabilities reference that cannot be loaded
    └── ArchiveError                 an archive that cannot be read or imported

Why each error sits where it does — decided by what an agent must do next:

* ``NothingRanError`` promises that this call sent nothing and that no attempt of its
  effect is in doubt. The agent may report "not done" and plan around it. Bad arguments
  belong here, not with the setup errors: in an agent loop the arguments come from the
  model, so the message goes back to the model to fix them.
* ``MayHaveRunError`` says the effect may be out in the world: OpenOnce will not run it
  again, and the agent must not either, under a new key or with another tool. The same
  call answers from the ledger once a probe or a person settles it. Two members did not
  run anything in *this* call, and still belong here: ``EffectInFlightError`` (another
  caller's attempt is running now and may already have reached the provider) and
  ``EffectArchivedError`` (the key's effect ended long ago, perhaps committed; its
  ``state`` says how). Treating either as "not done" is the double execution OpenOnce
  exists to prevent; for an archived effect that was denied or failed, the caution costs
  only a look at ``state``.
* Neither: a refused decision is an answer to a person, not to an agent's call. The
  replay of a recorded failure stands for the handler's own exception (a
  ``BusinessError``, say), which OpenOnce lets through as it is: handle both where you
  handle the handler's errors. A setup error says every call will fail: an agent loop
  that caught it would keep going with a broken deployment, so let it stop the loop.

Every ``MayHaveRunError`` names its effect in ``effect_id``; so does every
``NothingRanError`` raised once the call has an effect.

Every error here (and every subclass, yours included) crosses a process boundary:
``pickle`` and ``copy`` rebuild it by calling its constructor with the arguments it was
made with, so its type, message, arguments and attributes survive a process pool, a
pickled task result, ``multiprocessing``. A value a handler produced (a
``LedgerWriteError``'s ``observed_value``, a ``ReceiptContractError``'s ``value``) that
cannot be pickled crosses as its ``repr`` rather than failing the whole error. Celery's json
result serializer cannot rebuild them (it calls the class with the message alone): use
its pickle serializer for task results that may hold one.

::

    ConformanceError       (an AssertionError) a prober's results miss its conformance plan

    BusinessError          raise it from a handler: the provider said no; FAILED, replayed
    RetryableEffectError   raise it from a handler: definitely did not happen, run again
    UnknownOutcomeError    raise it from a handler: may have happened, park as UNKNOWN

    ProbeError             raise it from a prober: the provider could not be asked
    ├── ProbeTransientError      429, 5xx, timeouts, connection errors: ask again later
    └── ProbeCredentialError     401, a permission 403: the prober's key is refused

None of these is an ``OpenOnceError``: handlers and probers raise them, OpenOnce catches
them. A ProbeError says nothing about the effect itself.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from typing import Any, ClassVar, Self

# The longest repr kept of a handler's value that cannot be pickled.
MAX_REPR = 2000


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


class _Portable(Exception):
    """Pickles and copies as a call of its constructor with the arguments it was made with
    (kept by ``__new__``), so a subclass with an ``__init__`` of its own needs nothing more.

    The default would call ``cls(*self.args)``, that is with the finished message alone:
    in the receiving process a TypeError (``missing ... 'tool'``) instead of the error."""

    # Constructor arguments (stored as attributes) that hold a value the caller's code made,
    # which may not pickle (an SDK object holding a socket): they cross as their repr.
    _foreign: ClassVar[tuple[str, ...]] = ()
    _made_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        self = super().__new__(cls, *args, **kwargs)
        self._made_with = (args, kwargs)
        return self

    def __reduce__(self) -> str | tuple[Any, ...]:
        made_with = self.__dict__.get("_made_with")
        if made_with is None:  # made without its constructor: the default way, then
            return super().__reduce__()
        args, kwargs = made_with
        state = {k: v for k, v in self.__dict__.items() if k != "_made_with"}
        if self._foreign:
            # The attribute is the very object the constructor was given: swap it by identity.
            swap = {id(state[n]): _portable(state[n]) for n in self._foreign if n in state}
            args = tuple(swap.get(id(a), a) for a in args)
            kwargs = {k: swap.get(id(v), v) for k, v in kwargs.items()}
            state = {k: swap.get(id(v), v) for k, v in state.items()}
        return (_rebuild, (type(self), args, kwargs, self.args), state)


def _rebuild(
    cls: type[BaseException], args: tuple[Any, ...], kwargs: dict[str, Any], exc_args: Any
) -> BaseException:
    exc = cls(*args, **kwargs)
    exc.args = exc_args  # as it was, had anyone changed it since
    return exc


def _portable(value: Any) -> Any:
    """``value`` if it pickles, else its repr: a value that cannot cross must not keep the
    error that carries it (a LedgerWriteError's "do not repeat the call") from crossing."""
    try:
        pickle.dumps(value)
    except Exception:
        try:
            return repr(value)[:MAX_REPR]
        except Exception:
            return object.__repr__(value)
    return value


class OpenOnceError(_Portable):
    """Base of every error OpenOnce itself raises."""


class NothingRanError(OpenOnceError):
    """This call sent nothing, and no attempt of its effect is in doubt: the world is as it
    was. Report "not done" and why; the subclass says what can be done next (approve and
    call again, fix the arguments, use a new key). Those raised once the call has an effect
    name it in ``effect_id``; bad arguments, a missing scope or a broken contract are
    refused before there is one."""


class MayHaveRunError(OpenOnceError):
    """The effect may have happened, or did. Never make it again another way (a new key,
    another tool): the same call answers from the ledger once a probe or a person settles
    it, and ``effect_id`` names it for whoever does."""

    effect_id: str  # every subclass sets it: there is always an effect to look at


class InvalidArgumentsError(NothingRanError, ValueError):
    """An argument is not strict JSON. ``path`` names the offending field (``$.items[2]``)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"argument {path}: {problem}")


class FloatInKeyMaterialError(InvalidArgumentsError):
    """Floats are ambiguous as key material (0.1 + 0.2); pass integer minor units instead."""


class ScopeRequiredError(NothingRanError):
    """A key derived from arguments needs a run scope, so two runs are not collapsed."""


class IdempotencyMismatchError(NothingRanError):
    """The idempotency key is already used by a call with different arguments."""

    def __init__(self, effect_id: str, tool: str) -> None:
        self.effect_id = effect_id
        self.tool = tool
        super().__init__(
            f"idempotency key of {tool!r} already used with different arguments by {effect_id};"
            " nothing was run. Use a new key for a different request."
        )


class EffectArchivedError(MayHaveRunError):
    """The key's effect ran (or was refused) long ago and the retention archived it: what
    remains in the ledger is a tombstone of its key, so this duplicate is not run again.
    Nothing ran here, but the effect may have (``state`` says how it ended).
    ``openonce retention import ARCHIVE`` brings the effect back, and the same call then
    replays its recorded outcome."""

    def __init__(
        self, effect_id: str, tool: str, state: str, archived_at: float, archive: str
    ) -> None:
        self.effect_id = effect_id
        self.tool = tool
        self.state = state
        self.archived_at = archived_at
        self.archive = archive
        super().__init__(
            f"{tool}: this key's effect {effect_id} ended {state} and was archived on"
            f" {_utc(archived_at)} to {archive or 'an archive'}; nothing was run."
            " Import the archive to replay its outcome, or use a new key for a new request."
        )


class InvalidReceiptError(OpenOnceError, ValueError):
    """A receipt must be a non-empty JSON object holding the provider's evidence."""


class ReceiptIdentityError(InvalidReceiptError):
    """A person's receipt contradicts the effect's own identity (another provider key,
    Message-ID, effect id or PR): it is evidence about some other effect. Nothing was
    committed; resolve with the right receipt, or override it explicitly with a reason."""

    def __init__(self, effect_id: str, problems: list[str]) -> None:
        self.effect_id = effect_id
        self.problems = problems
        super().__init__(
            f"receipt does not belong to effect {effect_id}: {'; '.join(problems)}."
            " Nothing was committed; check the receipt, or override with a reason."
        )


class ProviderContractError(NothingRanError):
    """The call does not meet its provider capability's contract; nothing was run."""


class ReceiptContractError(MayHaveRunError):
    """The handler returned, but its receipt breaks the provider contract. The effect is in
    HUMAN_REVIEW with the value kept for audit; it is not replayed to duplicates."""

    _foreign = ("value",)

    def __init__(self, effect_id: str, problems: list[str], value: Any) -> None:
        self.effect_id = effect_id
        self.problems = problems
        self.value = value
        super().__init__(
            f"effect {effect_id} returned a receipt that breaks the provider contract"
            f" ({'; '.join(problems)}); it waits for a person in human_review"
        )


class EffectNotFoundError(OpenOnceError, LookupError):
    def __init__(self, effect_id: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"no effect with id {effect_id!r}")


class IllegalTransitionError(OpenOnceError):
    """The effect's current state does not allow the requested decision."""

    def __init__(self, effect_id: str, state: str, action: str, allowed: str = "") -> None:
        self.effect_id = effect_id
        self.state = state
        self.action = action
        self.allowed = allowed
        super().__init__(self._message())

    def _message(self) -> str:
        text = f"cannot {self.action} effect {self.effect_id}: it is {self.state}"
        return text + (f" ({self.allowed})" if self.allowed else "")


class EffectChangedError(IllegalTransitionError):
    """The effect moved since the person looked at it; nothing was applied. Look again."""

    def __init__(self, effect_id: str, state: str, action: str = "decide") -> None:
        super().__init__(effect_id, state, action)

    def _message(self) -> str:
        return (
            f"effect {self.effect_id} changed since you looked at it (now {self.state});"
            " nothing was applied — reload and decide again"
        )


class ApprovalPending(NothingRanError):
    """The call needs approval. Retry the very same call after ``oo.approve(effect_id)``."""

    def __init__(self, effect_id: str, tool: str, approvals: int = 0, required: int = 1) -> None:
        self.effect_id = effect_id
        self.tool = tool
        self.approvals = approvals
        self.required = required
        super().__init__(
            f"{tool} needs approval ({approvals}/{required}) before it runs: effect {effect_id}"
        )


class ApprovalExpired(ApprovalPending):
    """The approval lapsed before the call ran; a fresh approval is needed (fail closed)."""


class ApprovalDenied(NothingRanError):
    def __init__(self, effect_id: str, by: str, reason: str) -> None:
        self.effect_id = effect_id
        self.by = by
        self.reason = reason
        super().__init__(f"effect {effect_id} was denied by {by}: {reason}")


class EffectCancelled(NothingRanError):
    def __init__(self, effect_id: str, by: str, reason: str) -> None:
        self.effect_id = effect_id
        self.by = by
        self.reason = reason
        super().__init__(f"effect {effect_id} was cancelled by {by}: {reason}")


class EffectInFlightError(MayHaveRunError):
    """Another caller is running this effect and did not finish within the wait. This call
    ran nothing, but that caller's attempt may already have reached the provider."""

    def __init__(self, effect_id: str, waited: float) -> None:
        self.effect_id = effect_id
        self.waited = waited
        super().__init__(
            f"effect {effect_id} is still running in another caller after {waited:.1f}s;"
            " it was not run again. Retry later to get its result."
        )


class OutcomeUnknownError(MayHaveRunError):
    """The call may have happened. It is parked as UNKNOWN until evidence resolves it."""

    def __init__(self, effect_id: str, tool: str, detail: str = "") -> None:
        self.effect_id = effect_id
        self.tool = tool
        self.detail = detail
        super().__init__(
            f"outcome of {tool} is unknown (effect {effect_id}); it will not be retried"
            " until a probe or a person resolves it" + (f": {detail}" if detail else "")
        )


class ResultUnavailableError(MayHaveRunError):
    """The effect committed but its return value was not JSON, so it cannot be replayed."""

    def __init__(self, effect_id: str, detail: str) -> None:
        self.effect_id = effect_id
        self.detail = detail
        super().__init__(
            f"effect {effect_id} committed, but its return value was not stored ({detail}),"
            " so it cannot be replayed"
        )


class EffectFailed(OpenOnceError):
    """Replays a recorded failure whose original exception class cannot be rebuilt here."""

    def __init__(self, effect_id: str, error_type: str, message: str) -> None:
        self.effect_id = effect_id
        self.error_type = error_type
        self.message = message
        super().__init__(f"effect {effect_id} failed earlier with {error_type}: {message}")


class ApproverAlreadyCounted(OpenOnceError):
    def __init__(self, effect_id: str, by: str) -> None:
        self.effect_id = effect_id
        self.by = by
        super().__init__(
            f"{by} already approved effect {effect_id}; another person has to approve it"
        )


class LedgerWriteError(MayHaveRunError):
    """The handler ran but its outcome could not be recorded.

    Never permission to repeat the call: inspect the ledger. ``observed_outcome`` is what
    this process saw (``"returned"``, ``"failed"``, ``"unknown"``, ...), ``observed_value``
    the handler's return value or exception (its repr, once pickled, if it cannot be).
    """

    _foreign = ("observed_value",)

    def __init__(
        self, effect_id: str, observed_outcome: str, observed_value: Any, cause: str
    ) -> None:
        self.effect_id = effect_id
        self.observed_outcome = observed_outcome
        self.observed_value = observed_value
        self.cause = cause
        super().__init__(
            f"effect {effect_id}: the handler ran ({observed_outcome}) but recording it failed:"
            f" {cause}. Do not repeat the call; the effect resolves through the ledger."
        )


class LeaseLostError(LedgerWriteError):
    """Another owner took the effect over; this attempt's result was kept as evidence only."""


class HandlerNotStartedError(NothingRanError, RuntimeError):
    """The handler never began (its event loop closed first): nothing was sent, and the
    effect is PLANNED again, so the same call runs it later."""

    def __init__(self, effect_id: str, detail: str) -> None:
        self.effect_id = effect_id
        self.detail = detail
        super().__init__(f"effect {effect_id}: the handler never started ({detail}); call again")


class LedgerUnavailableError(NothingRanError):
    """The ledger could not be read or written before the handler ran (the database down
    or restarting, a dropped connection, a lock or pool wait that timed out): nothing was
    sent. Call again once the ledger answers; if the claim did reach the ledger before the
    connection dropped, that call finds it and waits for it or replays."""

    def __init__(self, tool: str, cause: str) -> None:
        self.tool = tool
        self.cause = cause
        super().__init__(
            f"{tool}: the ledger could not be reached before the handler ran ({cause});"
            " nothing was sent: call again once the ledger answers"
        )


class SchemaVersionError(OpenOnceError):
    """This code cannot use the ledger: its schema is older (run ``openonce migrate``), or
    newer and needs a newer OpenOnce (upgrade it; a newer ledger that only added what this
    code never touches is used as it is). The message says which; ``needs_upgrade`` is
    True for the second (no migration helps), ``ledger_version`` is the ledger's."""

    def __init__(
        self, message: str, *, ledger_version: int | None = None, needs_upgrade: bool = False
    ) -> None:
        self.ledger_version = ledger_version
        self.needs_upgrade = needs_upgrade
        super().__init__(message)


class ConfigurationError(OpenOnceError, ValueError):
    """OpenOnce is set up in a way that cannot keep its promises (say, secret fields without
    a pepper); the message says what to change."""


class WiringError(OpenOnceError):
    """A reference to probers, capabilities or pins that cannot be used as given."""


class CapabilityError(OpenOnceError, ValueError):
    """A capability, capability file or conformance file is malformed, or a pin is wrong.

    The message names the file and the field, so the fix is one edit away.
    """


class ConformanceError(_Portable, AssertionError):
    """A prober's results do not match its capability's conformance plan."""


class BusinessError(_Portable):
    """Raise (or subclass) from a handler when the provider definitively said no — a card
    declined, a validation refusal. Recorded FAILED and replayed to duplicates."""


class RetryableEffectError(_Portable):
    """Raise from a handler when the effect definitely did not happen and may run again."""


class UnknownOutcomeError(_Portable):
    """Raise from a handler when the effect may have happened (a lost reply, a timeout)."""


class ProbeError(_Portable):
    """Raise from a prober when the provider could not be asked at all.

    ``provider`` names the provider ("stripe", "github", "imap"), ``status`` the HTTP status
    (or None). It is no observation of the effect: the effect stays UNKNOWN."""

    def __init__(self, provider: str, detail: str, *, status: int | None = None) -> None:
        self.provider = provider
        self.detail = detail
        self.status = status
        super().__init__(f"{provider}: {detail}")


class ProbeTransientError(ProbeError):
    """The provider is busy, down or slow (429, 5xx, a timeout, a refused connection).

    ``retry_after`` is how many seconds the provider asked us to wait (``Retry-After``,
    a rate-limit reset), or None: the reconciler then backs off on its own schedule.
    ``sent=False``: nothing was asked at all (the client's own rate limit held the probe
    back), so it is no attempt: the reconciler simply asks again after ``retry_after``."""

    def __init__(
        self,
        provider: str,
        detail: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        sent: bool = True,
    ) -> None:
        super().__init__(provider, detail, status=status)
        self.retry_after = retry_after
        self.sent = sent


class ProbeCredentialError(ProbeError):
    """The provider refused the prober's credentials or permissions (401, a 403 that is
    not a rate limit). Nothing will succeed until a person fixes the key."""
