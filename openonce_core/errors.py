"""Every error OpenOnce raises, and what the caller should do next.

::

    OpenOnceError
    ├── InvalidArgumentsError        arguments are not strict JSON (names the field)
    │   └── FloatInKeyMaterialError  a float where a key is derived: use integer minor units
    ├── ScopeRequiredError           a derived key needs ``with oo.scope(...)``
    ├── IdempotencyMismatchError     the key was used with different arguments
    ├── EffectArchivedError          the key's effect was archived: not run again (import it)
    ├── InvalidReceiptError          a receipt that is not a non-empty JSON object
    │   └── ReceiptIdentityError     a person's receipt names another effect
    ├── ProviderContractError        the call breaks its provider capability's contract
    ├── ReceiptContractError         the handler's receipt breaks it: held for a person
    ├── EffectNotFoundError          no effect has that id
    ├── IllegalTransitionError       the effect's state does not allow that call
    │   └── EffectChangedError       it changed since the decision was prepared
    ├── ApprovalPending              the call needs approval; retry the same call later
    │   └── ApprovalExpired          an approval expired before the call ran (fail closed)
    ├── ApprovalDenied               a person denied it; the call never runs
    ├── EffectCancelled              a person cancelled it; the call never runs
    ├── EffectInFlightError          another caller holds the effect; wait or look later
    ├── OutcomeUnknownError          the call may have happened; never retry it blindly
    ├── ResultUnavailableError       it happened, but its return value could not be stored
    ├── EffectFailed                 replay of a failure whose exception class is not loaded
    ├── ApproverAlreadyCounted       one person cannot approve twice
    ├── LedgerWriteError             the handler ran, recording its outcome failed
    │   └── LeaseLostError           a newer owner holds the effect; this result is evidence only
    ├── HandlerNotStartedError       the handler never began (its loop closed): call again
    ├── SchemaVersionError           the ledger schema is newer or older than this code
    ├── ConfigurationError           set up in a way that breaks a promise (secrets, no pepper)
    ├── CapabilityError              provider knowledge that cannot be used (names the field)
    └── WiringError                  a probers / capabilities reference that cannot be loaded

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

from datetime import UTC, datetime
from typing import Any


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


class OpenOnceError(Exception):
    """Base of every error OpenOnce itself raises."""


class InvalidArgumentsError(OpenOnceError, ValueError):
    """An argument is not strict JSON. ``path`` names the offending field (``$.items[2]``)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"argument {path}: {problem}")


class FloatInKeyMaterialError(InvalidArgumentsError):
    """Floats are ambiguous as key material (0.1 + 0.2); pass integer minor units instead."""


class ScopeRequiredError(OpenOnceError):
    """A key derived from arguments needs a run scope, so two runs are not collapsed."""


class IdempotencyMismatchError(OpenOnceError):
    """The idempotency key is already used by a call with different arguments."""

    def __init__(self, effect_id: str, tool: str) -> None:
        self.effect_id = effect_id
        super().__init__(
            f"idempotency key of {tool!r} already used with different arguments by {effect_id};"
            " nothing was run. Use a new key for a different request."
        )


class EffectArchivedError(OpenOnceError):
    """The key's effect ran (or was refused) long ago and the retention archived it: what
    remains in the ledger is a tombstone of its key, so this duplicate is not run again.
    Nothing ran here. ``openonce retention import ARCHIVE`` brings the effect back, and
    the same call then replays its recorded outcome."""

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


class ProviderContractError(OpenOnceError):
    """The call does not meet its provider capability's contract; nothing was run."""


class ReceiptContractError(OpenOnceError):
    """The handler returned, but its receipt breaks the provider contract. The effect is in
    HUMAN_REVIEW with the value kept for audit; it is not replayed to duplicates."""

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
        msg = f"cannot {action} effect {effect_id}: it is {state}"
        super().__init__(msg + (f" ({allowed})" if allowed else ""))


class EffectChangedError(IllegalTransitionError):
    """The effect moved since the person looked at it; nothing was applied. Look again."""

    def __init__(self, effect_id: str, state: str) -> None:
        OpenOnceError.__init__(
            self,
            f"effect {effect_id} changed since you looked at it (now {state}); nothing was"
            " applied — reload and decide again",
        )
        self.effect_id = effect_id
        self.state = state


class ApprovalPending(OpenOnceError):
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


class ApprovalDenied(OpenOnceError):
    def __init__(self, effect_id: str, by: str, reason: str) -> None:
        self.effect_id = effect_id
        self.by = by
        self.reason = reason
        super().__init__(f"effect {effect_id} was denied by {by}: {reason}")


class EffectCancelled(OpenOnceError):
    def __init__(self, effect_id: str, by: str, reason: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"effect {effect_id} was cancelled by {by}: {reason}")


class EffectInFlightError(OpenOnceError):
    """Another caller is running this effect and did not finish within the wait."""

    def __init__(self, effect_id: str, waited: float) -> None:
        self.effect_id = effect_id
        super().__init__(
            f"effect {effect_id} is still running in another caller after {waited:.1f}s;"
            " it was not run again. Retry later to get its result."
        )


class OutcomeUnknownError(OpenOnceError):
    """The call may have happened. It is parked as UNKNOWN until evidence resolves it."""

    def __init__(self, effect_id: str, tool: str, detail: str = "") -> None:
        self.effect_id = effect_id
        self.tool = tool
        super().__init__(
            f"outcome of {tool} is unknown (effect {effect_id}); it will not be retried"
            " until a probe or a person resolves it" + (f": {detail}" if detail else "")
        )


class ResultUnavailableError(OpenOnceError):
    """The effect committed but its return value was not JSON, so it cannot be replayed."""


class EffectFailed(OpenOnceError):
    """Replays a recorded failure whose original exception class cannot be rebuilt here."""

    def __init__(self, effect_id: str, error_type: str, message: str) -> None:
        self.effect_id = effect_id
        self.error_type = error_type
        super().__init__(f"effect {effect_id} failed earlier with {error_type}: {message}")


class ApproverAlreadyCounted(OpenOnceError):
    def __init__(self, effect_id: str, by: str) -> None:
        self.effect_id = effect_id
        super().__init__(
            f"{by} already approved effect {effect_id}; another person has to approve it"
        )


class LedgerWriteError(OpenOnceError):
    """The handler ran but its outcome could not be recorded.

    Never permission to repeat the call: inspect the ledger. ``observed_outcome`` is what
    this process saw (``"returned"``, ``"failed"``, ``"unknown"``, ...), ``observed_value``
    the handler's return value or exception.
    """

    def __init__(
        self, effect_id: str, observed_outcome: str, observed_value: Any, cause: str
    ) -> None:
        self.effect_id = effect_id
        self.observed_outcome = observed_outcome
        self.observed_value = observed_value
        super().__init__(
            f"effect {effect_id}: the handler ran ({observed_outcome}) but recording it failed:"
            f" {cause}. Do not repeat the call; the effect resolves through the ledger."
        )


class LeaseLostError(LedgerWriteError):
    """Another owner took the effect over; this attempt's result was kept as evidence only."""


class HandlerNotStartedError(OpenOnceError, RuntimeError):
    """The handler never began (its event loop closed first): nothing was sent, and the
    effect is PLANNED again, so the same call runs it later."""

    def __init__(self, effect_id: str, detail: str) -> None:
        self.effect_id = effect_id
        super().__init__(f"effect {effect_id}: the handler never started ({detail}); call again")


class SchemaVersionError(OpenOnceError):
    """The ledger schema is newer or older than this code; run ``openonce migrate``."""


class ConfigurationError(OpenOnceError, ValueError):
    """OpenOnce is set up in a way that cannot keep its promises (say, secret fields without
    a pepper); the message says what to change."""


class WiringError(OpenOnceError):
    """A reference to probers, capabilities or pins that cannot be used as given."""


class CapabilityError(OpenOnceError, ValueError):
    """A capability, capability file or conformance file is malformed, or a pin is wrong.

    The message names the file and the field, so the fix is one edit away.
    """


class ConformanceError(AssertionError):
    """A prober's results do not match its capability's conformance plan."""


class BusinessError(Exception):
    """Raise (or subclass) from a handler when the provider definitively said no — a card
    declined, a validation refusal. Recorded FAILED and replayed to duplicates."""


class RetryableEffectError(Exception):
    """Raise from a handler when the effect definitely did not happen and may run again."""


class UnknownOutcomeError(Exception):
    """Raise from a handler when the effect may have happened (a lost reply, a timeout)."""


class ProbeError(Exception):
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
