"""OpenOnce: durable side effects for AI agent tool calls.

Duplicates replay instead of re-running, ambiguous outcomes park as UNKNOWN instead of
being retried blindly, and every transition leaves a journal line.

This module is the public surface, with ``openonce_core.errors`` (the exceptions),
``openonce_core.integrations`` (LangGraph, OpenAI Agents), ``openonce_core.probers``,
``openonce_core.stores`` and the ``openonce`` command (``openonce_core.cli``). Modules whose
name starts with an underscore are the implementation: their names may change. Their
old names (``openonce_core.reconcile``, ``openonce_core.probe``, ...) still import, as the
same modules, with a DeprecationWarning, until the next release.

``openonce_core.testing`` holds what you need to test your own code against OpenOnce
(a FakeClock, fake providers, the fault harness).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._aliases import SameModules, install, moved_attribute, moved_real_name, warn_moved
from ._classify import Classifier, FailureClass
from ._clock import Clock, DatabaseClock, SystemClock
from ._context import EffectContext, current_effect, current_scope
from ._helpers import (
    ScannedEffectTool,
    canonicalize,
    capabilities_for_tool,
    capability_from_dict,
    capability_guidance_for_tool,
    classify_exception,
    derive_key,
    scan_effect_tools,
)
from ._ledger import Ledger
from ._observe import EffectEvent
from ._options import EffectFunction, EffectOptions
from ._policy import PolicyDecision, all_of, require_approval_for
from ._probe import ProbeOutcome, Prober, ProbeResult
from ._providers import (
    Capability,
    CapabilityMatrix,
    ConformanceScenario,
    assert_conformance,
    load_capabilities_file,
)
from ._reconcile import Reconciler, ReconcileReport
from ._reconciler_options import ReconcilerOptions
from ._records import Approval, Effect, JournalEntry
from ._retention import (
    ArchiveError,
    RetentionPolicy,
    RetentionReport,
    import_archive,
    run_retention,
)
from ._runtime import OpenOnce, load_pepper
from ._states import DECISIONS, MOVES, EffectState, decisions_allowed
from .errors import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    ApproverAlreadyCounted,
    BusinessError,
    CapabilityError,
    ConfigurationError,
    ConformanceError,
    EffectArchivedError,
    EffectCancelled,
    EffectChangedError,
    EffectFailed,
    EffectInFlightError,
    EffectNotFoundError,
    FloatInKeyMaterialError,
    HandlerNotStartedError,
    IdempotencyMismatchError,
    IllegalTransitionError,
    InvalidArgumentsError,
    InvalidReceiptError,
    LeaseLostError,
    LedgerUnavailableError,
    LedgerWriteError,
    MayHaveRunError,
    NothingRanError,
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
    WiringError,
)
from .probers import EmailMessageIdProber, GitHubPullRequestProber, StripeProber, effect_metadata
from .stores import InMemoryStore, SQLiteStore, Store, open_store

if TYPE_CHECKING:
    from . import testing as testing
    from .stores.postgres import PostgresStore as PostgresStore

__version__ = "0.1.0"

install(SameModules("openonce_core moved", moved_real_name, warn_moved))

# PostgresStore is importable by name but not listed: ``from openonce_core import *``
# reads every listed name, and reading it needs psycopg (the ``openonce[postgres]`` extra).
__all__ = [
    "DECISIONS",
    "MOVES",
    "Approval",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalPending",
    "ApproverAlreadyCounted",
    "ArchiveError",
    "BusinessError",
    "Capability",
    "CapabilityError",
    "CapabilityMatrix",
    "Classifier",
    "Clock",
    "ConfigurationError",
    "ConformanceError",
    "ConformanceScenario",
    "DatabaseClock",
    "Effect",
    "EffectArchivedError",
    "EffectCancelled",
    "EffectChangedError",
    "EffectContext",
    "EffectEvent",
    "EffectFailed",
    "EffectFunction",
    "EffectInFlightError",
    "EffectNotFoundError",
    "EffectOptions",
    "EffectState",
    "EmailMessageIdProber",
    "FailureClass",
    "FloatInKeyMaterialError",
    "GitHubPullRequestProber",
    "HandlerNotStartedError",
    "IdempotencyMismatchError",
    "IllegalTransitionError",
    "InMemoryStore",
    "InvalidArgumentsError",
    "InvalidReceiptError",
    "JournalEntry",
    "LeaseLostError",
    "Ledger",
    "LedgerUnavailableError",
    "LedgerWriteError",
    "MayHaveRunError",
    "NothingRanError",
    "OpenOnce",
    "OpenOnceError",
    "OutcomeUnknownError",
    "PolicyDecision",
    "ProbeCredentialError",
    "ProbeError",
    "ProbeOutcome",
    "ProbeResult",
    "ProbeTransientError",
    "Prober",
    "ProviderContractError",
    "ReceiptContractError",
    "ReceiptIdentityError",
    "ReconcileReport",
    "Reconciler",
    "ReconcilerOptions",
    "ResultUnavailableError",
    "RetentionPolicy",
    "RetentionReport",
    "RetryableEffectError",
    "SQLiteStore",
    "ScannedEffectTool",
    "SchemaVersionError",
    "ScopeRequiredError",
    "Store",
    "StripeProber",
    "SystemClock",
    "UnknownOutcomeError",
    "WiringError",
    "all_of",
    "assert_conformance",
    "canonicalize",
    "capabilities_for_tool",
    "capability_from_dict",
    "capability_guidance_for_tool",
    "classify_exception",
    "current_effect",
    "current_scope",
    "decisions_allowed",
    "derive_key",
    "effect_metadata",
    "import_archive",
    "load_capabilities_file",
    "load_pepper",
    "open_store",
    "require_approval_for",
    "run_retention",
    "scan_effect_tools",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: Postgres support is an extra (``openonce[postgres]``), so
    # psycopg is imported only when PostgresStore is asked for; the testing kit is for
    # tests, and ``openonce_core.testing`` works without importing it first.
    if name == "PostgresStore":
        from .stores.postgres import PostgresStore

        return PostgresStore
    if name == "testing":
        return importlib.import_module(".testing", __name__)
    moved = moved_attribute(name)
    if moved is not None:
        return moved
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
