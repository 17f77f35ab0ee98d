"""Every query the console runs, each bounded by a LIMIT and served by an index of the
ledger schema (``openonce_core/schema.py``; the index is named beside each query).

Reads only: decisions go through ``openonce_site.ledger.get_openonce()``.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.db.models import Q, QuerySet

from openonce_core.providers import TIERS, Capability, readiness_problems
from openonce_core.states import TERMINAL, EffectState
from openonce_site.ledger import get_openonce, get_reconciler
from reconciler.health import Health, reconciler_health

from .models import Approval, Effect, JournalEntry

S = EffectState

QUEUE_LIMIT = 100  # rows on the human queue
COUNT_CAP = 1000  # counts stop here and show "1000+"
UNKNOWN_SCAN = 1000  # oldest UNKNOWN rows looked at to find those past their grace
PAGE_SIZE = 50
JOURNAL_SHOWN = 200  # journal lines on the detail page (exports have every line)
APPROVALS_LIMIT = 200
AUDIT_PAGE = 100
EXPORT_LIMIT = 5000  # audit rows per export; ``before`` pages on
BULK_LIMIT = 200  # a bulk action touches at most this many effects

QUEUE_KINDS: tuple[str, ...] = (S.REQUIRES_APPROVAL, S.HUMAN_REVIEW, S.UNKNOWN)
# States an effect can be stuck in: everything not terminal.
STUCK_STATES: tuple[str, ...] = tuple(s for s in EffectState if s not in TERMINAL)

# Enough for lists and the queue; evidence and results are loaded on the detail page only.
_LIST_COLUMNS = (
    "id",
    "tool",
    "scope",
    "state",
    "args_json",
    "attempt",
    "max_attempts",
    "fence",
    "approvals_required",
    "created_at",
    "updated_at",
)


# -- the human queue ----------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    value: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.value}+" if self.capped else str(self.value)


@dataclass(frozen=True)
class QueueItem:
    effect: Effect
    age: float  # seconds since the effect last changed
    risk: str  # the provider capability's tier, or "unknown"


@dataclass(frozen=True)
class Queue:
    items: list[QueueItem]
    counts: dict[str, Count]
    at: float


def human_queue(kind: str | None = None, at: float | None = None) -> Queue:
    """Effects waiting for approval, in human review, and UNKNOWN past their grace window,
    oldest change first, with a count per kind."""
    at = time.time() if at is None else at
    streams: list[list[Effect]] = []
    counts: dict[str, Count] = {}
    for state in QUEUE_KINDS:
        if state == S.UNKNOWN:
            due_ids, counts[state] = _unknown_past_grace(at)
            # By primary key; still UNKNOWN, in case one was resolved since the scan.
            rows = Effect.objects.filter(id__in=due_ids[:QUEUE_LIMIT], state=S.UNKNOWN)
        else:
            counts[state] = _capped_count(Effect.objects.filter(state=state))
            # openonce_effects_state_updated (state, updated_at, id)
            rows = Effect.objects.filter(state=state)
        if kind in (None, state):
            streams.append(
                list(rows.only(*_LIST_COLUMNS).order_by("updated_at", "id")[:QUEUE_LIMIT])
            )
    merged = heapq.merge(*streams, key=lambda e: (e.updated_at, e.id))
    items = [
        QueueItem(e, max(0.0, at - e.updated_at), risk_tier(e.tool))
        for e in itertools.islice(merged, QUEUE_LIMIT)
    ]
    return Queue(items, counts, at)


def _unknown_past_grace(at: float) -> tuple[list[str], Count]:
    """Ids of UNKNOWN effects whose grace window is over, oldest first.

    Grace differs per tool, so it is applied here to the oldest ``UNKNOWN_SCAN`` rows
    (openonce_effects_state_updated); the reconciler probes these first anyway.
    """
    rows = list(
        Effect.objects.filter(state=S.UNKNOWN)
        .order_by("updated_at", "id")
        .values_list("id", "tool", "updated_at")[:UNKNOWN_SCAN]
    )
    reconciler = get_reconciler()
    grace: dict[str, float] = {}
    due = []
    for effect_id, tool, updated_at in rows:
        if tool not in grace:
            grace[tool] = reconciler.grace_for(tool)
        if at >= updated_at + grace[tool]:
            due.append(effect_id)
    return due, Count(len(due), capped=len(rows) == UNKNOWN_SCAN)


def _capped_count(rows: QuerySet[Effect]) -> Count:
    # COUNT over a LIMITed subquery: never walks more than COUNT_CAP index entries.
    n = rows.values("id")[: COUNT_CAP + 1].count()
    return Count(min(n, COUNT_CAP), capped=n > COUNT_CAP)


def risk_tier(tool: str) -> str:
    """The tier of the capability governing ``tool``; where several match (email.send
    without a pin), the least trustworthy one, since that is what a miss may mean."""
    capabilities = get_openonce().capabilities_for(tool)
    if not capabilities:
        return "unknown"
    return max((c.tier for c in capabilities), key=TIERS.index)


# -- the effects list ---------------------------------------------------------------------


@dataclass(frozen=True)
class EffectFilter:
    state: str = ""
    tool: str = ""
    scope: str = ""
    key: str = ""  # idempotency key
    created_from: float | None = None
    created_to: float | None = None
    stuck_for: float | None = None  # seconds without a change, not in a terminal state


@dataclass(frozen=True)
class Cursor:
    """Keyset position: the (created_at, id) of the last row shown."""

    created_at: float
    id: str

    def encode(self) -> str:
        return f"{self.created_at!r}~{self.id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        created_at, sep, effect_id = text.partition("~")
        if not sep or not effect_id:
            raise ValueError("not a page cursor")
        return cls(float(created_at), effect_id)


@dataclass(frozen=True)
class EffectPage:
    effects: list[Effect]
    next_cursor: str | None


def effect_page(
    f: EffectFilter, after: Cursor | None = None, limit: int | None = None, at: float | None = None
) -> EffectPage:
    """Newest first, keyset-paged on openonce_effects_created (created_at, id)."""
    limit = limit or PAGE_SIZE
    rows = _filtered(f, time.time() if at is None else at)
    if after is not None:
        # (created_at, id) < (cursor): the plain created_at bound lets the index start
        # at the cursor instead of filtering from the newest row down.
        rows = rows.filter(created_at__lte=after.created_at).filter(
            Q(created_at__lt=after.created_at) | Q(id__lt=after.id)
        )
    found = list(rows.only(*_LIST_COLUMNS).order_by("-created_at", "-id")[: limit + 1])
    next_cursor = None
    if len(found) > limit:
        last = found[limit - 1]
        next_cursor = Cursor(last.created_at, last.id).encode()
    return EffectPage(found[:limit], next_cursor)


def bulk_candidates(
    f: EffectFilter, states: Iterable[str], at: float | None = None, limit: int | None = None
) -> list[Effect]:
    """What a bulk action on ``f`` would touch: up to ``limit + 1`` rows, so the caller
    can tell "exactly these" from "more than it may touch at once"."""
    limit = limit or BULK_LIMIT
    rows = _filtered(f, time.time() if at is None else at).filter(state__in=list(states))
    return list(rows.only(*_LIST_COLUMNS).order_by("created_at", "id")[: limit + 1])


def _filtered(f: EffectFilter, at: float) -> QuerySet[Effect]:
    rows = Effect.objects.all()
    if f.state:
        rows = rows.filter(state=f.state)  # openonce_effects_state_updated
    if f.tool:
        rows = rows.filter(tool=f.tool)
    if f.scope:
        rows = rows.filter(scope=f.scope)  # openonce_effects_scope (scope, created_at)
    if f.key:
        rows = rows.filter(idempotency_key=f.key)
    if f.created_from is not None:
        rows = rows.filter(created_at__gte=f.created_from)  # openonce_effects_created
    if f.created_to is not None:
        rows = rows.filter(created_at__lt=f.created_to)
    if f.stuck_for is not None:
        rows = rows.filter(state__in=STUCK_STATES, updated_at__lte=at - f.stuck_for)
    return rows


# -- one effect ---------------------------------------------------------------------------


def effect(effect_id: str) -> Effect | None:
    return Effect.objects.filter(id=effect_id).first()  # primary key


def journal(effect_id: str) -> Iterator[JournalEntry]:
    """Every line, oldest first, streamed (exports must not drop any). Served by
    openonce_journal_effect (effect_id, seq)."""
    return JournalEntry.objects.filter(effect_id=effect_id).order_by("seq").iterator(2000)


def journal_tail(effect_id: str, limit: int = JOURNAL_SHOWN) -> tuple[list[JournalEntry], int]:
    """The newest ``limit`` lines, oldest first, and how many lines there are in all: a
    page showing thousands of lines would be slow and unreadable; the export has them."""
    lines = JournalEntry.objects.filter(effect_id=effect_id).order_by("-seq")[:limit]
    newest = list(lines)[::-1]
    total = len(newest)
    if total == limit:
        total = JournalEntry.objects.filter(effect_id=effect_id).count()
    return newest, total


def approvals(effect_id: str, limit: int = APPROVALS_LIMIT) -> list[Approval]:
    # openonce_approvals_effect (effect_id, id)
    return list(Approval.objects.filter(effect_id=effect_id).order_by("id")[:limit])


# -- the operator audit log ---------------------------------------------------------------


def audit_log(before: int | None = None, limit: int = AUDIT_PAGE) -> list[JournalEntry]:
    """Journal lines written by people, newest first, keyset-paged on ``seq``.

    ``actor LIKE 'operator:%'`` is the predicate of the partial index
    openonce_journal_operators (seq), so agents' lines are never scanned."""
    rows = JournalEntry.objects.filter(actor__startswith="operator:")
    if before is not None:
        rows = rows.filter(seq__lt=before)
    return list(rows.order_by("-seq")[:limit])


# -- provider knowledge and reconciler health ---------------------------------------------


@dataclass(frozen=True)
class CapabilityRow:
    capability: Capability
    guidance: str
    problems: list[str]  # readiness: what a reviewer still has to fix
    pinned_tools: list[str]  # tools pinned to this capability by configuration


def capability_matrix() -> list[CapabilityRow]:
    oo = get_openonce()
    return [
        CapabilityRow(
            capability=cap,
            guidance=cap.guidance(),
            problems=readiness_problems(cap),
            pinned_tools=sorted(
                t for t, name in oo.provider_capabilities.items() if name == cap.name
            ),
        )
        for cap in oo.matrix.capabilities
    ]


def capabilities_for(tool: str) -> list[Capability]:
    return get_openonce().capabilities_for(tool)


def miss_may_rearm(tool: str) -> bool:
    """Whether the provider matrix lets a person re-arm ``tool`` on a miss without an
    override (the rule ``resolve_not_happened(require_auto_rearm=True)`` applies)."""
    oo = get_openonce()
    return oo.matrix.can_auto_rearm(tool, oo.provider_capabilities.get(tool))


def health() -> Health:
    """Judged by sweeps recorded in the database (reconciler.Sweep, index sweep_latest)."""
    return reconciler_health()
