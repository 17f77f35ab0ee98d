"""OpenOnce: durable side effects for AI agent tool calls.

Duplicates replay instead of re-running, ambiguous outcomes park as UNKNOWN instead of
being retried blindly, and every transition leaves a journal line.
"""

from __future__ import annotations

from typing import Any

from .classify import Classifier, FailureClass
from .errors import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    ApproverAlreadyCounted,
    BusinessError,
    EffectCancelled,
    EffectChangedError,
    EffectFailed,
    EffectInFlightError,
    EffectNotFoundError,
    FloatInKeyMaterialError,
    IdempotencyMismatchError,
    IllegalTransitionError,
    InvalidArgumentsError,
    InvalidReceiptError,
    LeaseLostError,
    LedgerWriteError,
    OpenOnceError,
    OutcomeUnknownError,
    ProbeCredentialError,
    ProbeError,
    ProbeTransientError,
    ProviderContractError,
    ReceiptContractError,
    ReceiptIdentityError,
    ResultUnavailableError,
    RetryableEffectError,
    SchemaVersionError,
    ScopeRequiredError,
    UnknownOutcomeError,
)
from .policy import PolicyDecision, all_of, require_approval_for
from .records import Approval, Effect, JournalEntry
from .runtime import EffectContext, OpenOnce, current_effect, current_scope
from .states import EffectState
from .stores import InMemoryStore, SQLiteStore, Store, open_store

__version__ = "0.1.0"

__all__ = [
    "Approval",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalPending",
    "ApproverAlreadyCounted",
    "BusinessError",
    "Classifier",
    "Effect",
    "EffectCancelled",
    "EffectChangedError",
    "EffectContext",
    "EffectFailed",
    "EffectInFlightError",
    "EffectNotFoundError",
    "EffectState",
    "FailureClass",
    "FloatInKeyMaterialError",
    "IdempotencyMismatchError",
    "IllegalTransitionError",
    "InMemoryStore",
    "InvalidArgumentsError",
    "InvalidReceiptError",
    "JournalEntry",
    "LeaseLostError",
    "LedgerWriteError",
    "OpenOnce",
    "OpenOnceError",
    "OutcomeUnknownError",
    "PolicyDecision",
    "PostgresStore",
    "ProbeCredentialError",
    "ProbeError",
    "ProbeTransientError",
    "ProviderContractError",
    "ReceiptContractError",
    "ReceiptIdentityError",
    "ResultUnavailableError",
    "RetryableEffectError",
    "SQLiteStore",
    "SchemaVersionError",
    "ScopeRequiredError",
    "Store",
    "UnknownOutcomeError",
    "all_of",
    "current_effect",
    "current_scope",
    "open_store",
    "require_approval_for",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(name)
