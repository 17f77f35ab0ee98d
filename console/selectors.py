"""Every query the console runs, each bounded by a LIMIT and served by an index of the
ledger schema (``openonce_core/_schema.py``; the index is named beside each query).

Reads only: decisions go through ``ledger.clients.get_openonce()``.
"""

from __future__ import annotations

import fnmatch
import heapq
import itertools
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import BooleanField, Min, Q, QuerySet
from django.db.models.expressions import RawSQL

from ledger.clients import get_grace, get_openonce, get_reconciler
from ledger.models import Approval, Effect, JournalEntry, Tombstone
from openonce_core._due import count_overdue_unknown, overdue_unknown
from openonce_core._providers import TIERS, Capability, readiness_problems
from openonce_core._redact import redact_text
from openonce_core._states import TERMINAL, EffectState
from reconciler import queue as dispatch_queue
from reconciler.health import Health, reconciler_health
from reconciler.probes import statuses_by_provider, tallies_by_tool

from .context import Fact, Requester, Verdict, amounts, customer, probe_verdict, requester
from .search import Search

S = EffectState

QUEUE_LIMIT = 100  # rows on the human queue
COUNT_CAP = 1000  # queue counts stop here and show "1000+"
LIST_COUNT_CAP = 10_000  # list and search counts stop here and show "10,000+"
PAGE_SIZE = 50
JOURNAL_SHOWN = 200  # journal lines on the detail page (exports have every line)
APPROVALS_LIMIT = 200
AUDIT_PAGE = 100
EXPORT_LIMIT = 5000  # audit rows per export; ``before`` pages on
BULK_LIMIT = 200  # a bulk action touches at most this many effects

QUEUE_KINDS: tuple[str, ...] = (S.REQUIRES_APPROVAL, S.HUMAN_REVIEW, S.UNKNOWN)
# Shown on the queue too, though no person has to act: approved effects wait for the
# agent's next call, and would otherwise leave every view but a filter.
WAITING_KINDS: tuple[str, ...] = (S.APPROVED,)
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
        return f"{self.value:,}+" if self.capped else f"{self.value:,}"


@dataclass(frozen=True)
class QueueItem:
    effect: Effect
    age: float  # seconds since the effect last changed
    tier: str  # the provider capability's evidence tier, or "unknown"
    requester: Requester | None = None
    verdict: Verdict | None = None
    new: bool = False  # changed since the page was first loaded
    facts: list[Fact] = field(default_factory=list)  # amounts with currency, customer


@dataclass(frozen=True)
class Queue:
    items: list[QueueItem]
    counts: dict[str, Count]
    at: float

    @property
    def waiting(self) -> int:
        """How many need a person (the tab title's count)."""
        return sum(self.counts[k].value for k in QUEUE_KINDS)


def human_queue(
    kind: str | None = None, at: float | None = None, since: float | None = None
) -> Queue:
    """Effects waiting for approval, in human review, and UNKNOWN due for a probe (past
    their grace window or backoff), oldest change first, with a count per kind; approved
    ones waiting for their agent only when asked for. ``since``: rows that changed after it
    are marked new. ``at``: the ledger's time (``ledger_now``), as the reconciler's."""
    at = ledger_now() if at is None else at
    streams: list[list[Effect]] = []
    counts: dict[str, Count] = {}
    for state in (*QUEUE_KINDS, *WAITING_KINDS):
        if state == S.UNKNOWN:
            due_ids, counts[state] = _unknown_past_grace(at)
            # By primary key; still UNKNOWN, in case one was resolved since the scan.
            rows = Effect.objects.filter(id__in=due_ids[:QUEUE_LIMIT], state=S.UNKNOWN)
        else:
            counts[state] = _capped_count(Effect.objects.filter(state=state))
            # openonce_effects_state_updated (state, updated_at, id)
            rows = Effect.objects.filter(state=state)
        if kind == state or (kind is None and state in QUEUE_KINDS):
            columns = (*_LIST_COLUMNS, "verification_evidence_json")
            streams.append(list(rows.only(*columns).order_by("updated_at", "id")[:QUEUE_LIMIT]))
    merged = heapq.merge(*streams, key=lambda e: (e.updated_at, e.id))
    effects = list(itertools.islice(merged, QUEUE_LIMIT))
    actors = first_actors([e.id for e in effects])
    tiers: dict[str, str] = {}
    for e in effects:
        if e.tool not in tiers:
            tiers[e.tool] = evidence_tier(e.tool)
    items = [
        QueueItem(
            e,
            max(0.0, at - e.updated_at),
            tiers[e.tool],
            _requester(actors, e),
            probe_verdict(e.verification_evidence),
            new=since is not None and e.updated_at > since,
            facts=[*amounts(args), *customer(args)][:3],
        )
        for e, args in ((e, e.args) for e in effects)
    ]
    return Queue(items, counts, at)


def first_actors(effect_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Who made each effect: the actor of its first journal line, and who it was asked for
    (``requested_by`` in that line's evidence, "" if none). Two queries, both on the
    journal's key (effect_id, seq), whatever the number of effects."""
    if not effect_ids:
        return {}
    firsts = (
        JournalEntry.objects.filter(effect_id__in=effect_ids)
        .values("effect_id")
        .annotate(first=Min("seq"))
        .values_list("first", flat=True)
    )
    lines = JournalEntry.objects.filter(effect_id__in=effect_ids, seq__in=list(firsts))
    found = {}
    for effect_id, actor, evidence_json in lines.values_list("effect_id", "actor", "evidence_json"):
        found[effect_id] = (actor, _requested_by(evidence_json))
    return found


def _requester(actors: dict[str, tuple[str, str]], effect: Effect) -> Requester | None:
    actor, asked = actors.get(effect.id, (None, ""))
    return requester(actor, effect.scope, asked)


def _requested_by(evidence_json: str | None) -> str:
    if not evidence_json or '"requested_by"' not in evidence_json:
        return ""
    try:
        asked = json.loads(evidence_json).get("requested_by")
    except (ValueError, AttributeError):
        return ""
    return asked if isinstance(asked, str) else ""


def ledger_now() -> float:
    """The ledger's clock (the database's on Postgres): what grace windows are read on."""
    return get_openonce().clock.now()


def _unknown_past_grace(at: float) -> tuple[list[str], Count]:
    """Ids of the first QUEUE_LIMIT UNKNOWN effects due for a probe, longest overdue
    first, and how many are due (exact): the reconciler's own rule (``openonce_core._due``),
    read through the indexes of UNKNOWN rows only."""
    oo = get_openonce()
    grace = get_grace()
    due = overdue_unknown(oo.store, grace, oo.clock, at, QUEUE_LIMIT)
    return [e.id for e in due], Count(count_overdue_unknown(oo.store, grace, oo.clock, at))


def _capped_count(rows: QuerySet[Effect]) -> Count:
    return capped_count(rows, COUNT_CAP)


def evidence_tier(tool: str) -> str:
    """How far a probe of ``tool`` can be trusted (the capability's evidence tier, not the
    effect's risk); where several match (email.send without a pin), the least
    trustworthy, since that is what a miss may mean."""
    capabilities = capabilities_for(tool)
    if not capabilities:
        return "unknown"
    return max((c.tier for c in capabilities), key=TIERS.index)


# -- the effects list ---------------------------------------------------------------------


@dataclass(frozen=True)
class EffectFilter:
    state: str = ""
    tool: str = ""  # a name or a glob (stripe.*)
    scope: str = ""
    key: str = ""  # idempotency key
    created_from: float | None = None
    created_to: float | None = None
    stuck_for: float | None = None  # seconds without a change, not in a terminal state
    search: Search | None = None  # the search box


@dataclass(frozen=True)
class Cursor:
    """Keyset position: the (created_at, id) of a row shown."""

    created_at: float
    id: str

    def encode(self) -> str:
        return f"{self.created_at!r}~{self.id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        created_at, sep, effect_id = text.partition("~")
        if not sep or not effect_id or len(effect_id) > 100:
            raise ValueError("not a page cursor")
        value = float(created_at)
        if value != value or value in (float("inf"), float("-inf")) or value < 0:
            raise ValueError("not a page cursor")
        return cls(value, effect_id)


@dataclass(frozen=True)
class EffectPage:
    effects: list[Effect]
    next_cursor: str | None  # older rows start after this one
    prev_cursor: str | None = None  # newer rows start before this one
    total: Count = field(default_factory=lambda: Count(0))
    first: int = 0  # the position of the first row shown, counted from the newest (1-based)

    @property
    def last(self) -> int:
        return self.first + len(self.effects) - 1 if self.effects else 0


def effect_page(
    f: EffectFilter,
    after: Cursor | None = None,
    limit: int | None = None,
    at: float | None = None,
    before: Cursor | None = None,
) -> EffectPage:
    """Newest first, keyset-paged both ways on (created_at, id): ``after`` pages to older
    rows, ``before`` back to newer ones. Each filter is served by the index named in
    ``_filtered``; the count stops at LIST_COUNT_CAP."""
    limit = limit or PAGE_SIZE
    rows = _filtered(f, time.time() if at is None else at)
    columns = rows.only(*_LIST_COLUMNS)
    if before is not None:
        found = list(_newer(columns, before).order_by("created_at", "id")[: limit + 1])
        more_newer = len(found) > limit
        found = found[:limit][::-1]
        more_older = bool(found) and _older(rows, _cursor(found[-1])).exists()
    else:
        if after is not None:
            columns = _older(columns, after)
        found = list(columns.order_by("-created_at", "-id")[: limit + 1])
        more_older = len(found) > limit
        found = found[:limit]
        more_newer = after is not None and bool(found) and _newer(rows, _cursor(found[0])).exists()
    return EffectPage(
        found,
        _cursor(found[-1]).encode() if more_older else None,
        _cursor(found[0]).encode() if more_newer else None,
        capped_count(rows, LIST_COUNT_CAP),
        _position(_newer(rows, _cursor(found[0])) if more_newer else None, bool(found)),
    )


def _position(newer: QuerySet[Any] | None, any_shown: bool) -> int:
    """The 1-based position of a page's first row: one more than the rows before it (a
    keyset page does not know its offset; counting them costs what a capped count does)."""
    if not any_shown:
        return 0
    if newer is None:
        return 1
    return capped_count(newer, LIST_COUNT_CAP).value + 1


def _cursor(effect: Effect) -> Cursor:
    return Cursor(effect.created_at, effect.id)


def _older(rows: QuerySet[Effect], c: Cursor) -> QuerySet[Effect]:
    # (created_at, id) < cursor: the plain created_at bound lets the index start at the
    # cursor instead of filtering from the newest row down.
    return rows.filter(created_at__lte=c.created_at).filter(
        Q(created_at__lt=c.created_at) | Q(id__lt=c.id)
    )


def _newer(rows: QuerySet[Effect], c: Cursor) -> QuerySet[Effect]:
    return rows.filter(created_at__gte=c.created_at).filter(
        Q(created_at__gt=c.created_at) | Q(id__gt=c.id)
    )


def capped_count(rows: QuerySet[Any], cap: int) -> Count:
    """COUNT over a LIMITed subquery: never walks more than ``cap`` + 1 index entries."""
    n = rows.values("pk")[: cap + 1].count()
    return Count(min(n, cap), capped=n > cap)


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
        rows = rows.filter(tool__in=matching_tools(f.tool))  # openonce_effects_tool
    if f.scope:
        rows = rows.filter(scope=f.scope)  # openonce_effects_scope (scope, created_at)
    if f.key:
        rows = rows.filter(idempotency_key=f.key)  # openonce_effects_key
    if f.created_from is not None:
        rows = rows.filter(created_at__gte=f.created_from)  # openonce_effects_created
    if f.created_to is not None:
        rows = rows.filter(created_at__lt=f.created_to)
    if f.stuck_for is not None:
        rows = rows.filter(state__in=STUCK_STATES, updated_at__lte=at - f.stuck_for)
    if f.search is not None:
        rows = rows.filter(_search_condition(f.search))
    return rows


def _search_condition(search: Search) -> Q:
    """The search box as one condition, each part served by an index (schema v3)."""
    if search.kind == "id":
        return _prefix("id", search.text)  # openonce_effects_id_prefix
    if search.kind == "key":
        return _prefix("idempotency_key", search.text)  # openonce_effects_key
    if search.kind == "scope":
        return _prefix("scope", search.text)  # openonce_effects_scope
    if search.kind == "tool":
        return Q(tool__in=matching_tools(search.text))  # openonce_effects_tool
    if search.kind == "arg":
        return _arguments_contain(search.args)  # openonce_effects_args (GIN)
    if search.kind == "state":
        return Q(state=search.text)  # openonce_effects_state_updated
    if search.kind == "all":
        condition = Q()
        for term in search.terms:
            condition &= _search_condition(term)
        return condition
    # Anything else: whichever of id, key and scope starts with it, or the tool it names.
    # Postgres ORs the indexes (BitmapOr); SQLite unions them (multi-index OR).
    condition = (
        _prefix("id", search.text)
        | _prefix("idempotency_key", search.text)
        | _prefix("scope", search.text)
        | Q(tool=search.text)
    )
    if search.bare_id:
        # An id pasted without its eff_ (a log line, a chat message often drops it).
        condition |= _prefix("id", search.bare_id)
    return condition


def _prefix(column: str, text: str) -> Q:
    if connection.vendor == "postgresql":
        # LIKE 'text%' (Django escapes % and _): the text_pattern_ops indexes serve it
        # whatever the database's collation.
        return Q(**{f"{column}__startswith": text})
    # SQLite's LIKE ignores case and no index serves it; a range on the bytewise btree
    # does: every string starting with ``text`` sorts between it and text + U+10FFFF.
    return Q(**{f"{column}__gte": text, f"{column}__lt": text + "\U0010ffff"})


def _arguments_contain(doc: dict[str, Any]) -> Q:
    if connection.vendor == "postgresql":
        return Q(
            RawSQL(
                "(openonce_effects.args_json::jsonb) @> %s::jsonb",
                [json.dumps(doc)],
                output_field=BooleanField(),
            )
        )
    # SQLite has no JSON index: compare each leaf by type and value (json_type keeps 1
    # apart from true and "1"); the list's created_at order bounds the walk.
    condition = Q()
    for path, value in _leaves(doc):
        kind, sql_value = _sqlite_json(value)
        sql = "json_type(openonce_effects.args_json, %s) = %s"
        params: list[Any] = [path, kind]
        if sql_value is not None:
            sql += " AND json_extract(openonce_effects.args_json, %s) = %s"
            params += [path, sql_value]
        condition &= Q(RawSQL(sql, params, output_field=BooleanField()))
    return condition


def _leaves(doc: dict[str, Any], path: str = "$") -> Iterator[tuple[str, Any]]:
    for name, value in doc.items():
        here = path + "." + json.dumps(name)
        if isinstance(value, dict):
            yield from _leaves(value, here)
        else:
            yield here, value


def _sqlite_json(value: Any) -> tuple[str, Any]:
    if value is None:
        return "null", None
    if value is True or value is False:
        return ("true" if value else "false"), None
    if isinstance(value, int):
        return "integer", value
    return "text", str(value)


def matching_tools(pattern: str) -> list[str]:
    """The tool names ``pattern`` (a name or a glob) matches. A skip scan over
    openonce_effects_tool finds the distinct tools without reading every row; a glob
    then becomes ``tool IN (...)``, which that index serves newest first."""
    if not set(pattern) & set("*?["):
        return [pattern]
    return [t for t in distinct_tools() if fnmatch.fnmatchcase(t, pattern)]


_DISTINCT_TOOLS = """
WITH RECURSIVE t(tool) AS (
    SELECT min(tool) FROM openonce_effects
    UNION ALL
    SELECT (SELECT min(e.tool) FROM openonce_effects e WHERE e.tool > t.tool)
    FROM t WHERE t.tool IS NOT NULL
)
SELECT tool FROM t WHERE tool IS NOT NULL LIMIT %s
"""
MAX_TOOLS = 1000


def distinct_tools() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(_DISTINCT_TOOLS, [MAX_TOOLS])
        return [row[0] for row in cursor.fetchall()]


# -- one effect ---------------------------------------------------------------------------


def effect(effect_id: str) -> Effect | None:
    return Effect.objects.filter(id=effect_id).first()  # primary key


def effect_fence(effect_id: str) -> int | None:
    """The effect's fence alone, by primary key: what an open page's poll compares (every
    5 s per open page, so it reads one integer, not the arguments and evidence)."""
    return Effect.objects.filter(id=effect_id).values_list("fence", flat=True).first()


def archived(effect_id: str) -> Tombstone | None:
    """The tombstone the retention left of ``effect_id``, if it archived that effect: asked
    only once the effect itself is not found. Served by openonce_tombstones_effect (schema
    v7). The newest one, should a damaged ledger ever hold two."""
    return Tombstone.objects.filter(effect_id=effect_id).order_by("-archived_at").first()


def journal(effect_id: str) -> Iterator[JournalEntry]:
    """Every line, oldest first, streamed (exports must not drop any). Served by
    the journal's key (effect_id, seq)."""
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


@dataclass(frozen=True)
class AuditFilter:
    actor: str = ""  # an operator's name (the ``operator:`` prefix may be left out)
    action: str = ""  # a key of AUDIT_ACTIONS
    tool: str = ""  # a name or a glob
    since: float | None = None
    until: float | None = None


# What a person did: the audit filter's choices, each the core's move of that name.
AUDIT_ACTIONS: dict[str, tuple[str, str]] = {
    "approve": ("Approved", "approve"),
    "deny": ("Denied", "deny"),
    "cancel": ("Cancelled", "cancel"),
    "resolve-happened": ("Resolved: happened", "resolve_happened"),
    "resolve-not-happened": ("Resolved: did not happen", "resolve_not_happened"),
    "release": ("Released", "release"),
}


@dataclass(frozen=True)
class AuditPage:
    entries: list[JournalEntry]
    older: int | None  # ``before`` for the next, older page
    newer: int | None  # ``after`` for the previous, newer page
    total: Count
    first: int = 0  # the position of the first line shown, from the newest (1-based)

    @property
    def last(self) -> int:
        return self.first + len(self.entries) - 1 if self.entries else 0


def audit_log(
    before: int | None = None,
    limit: int = AUDIT_PAGE,
    f: AuditFilter | None = None,
    after: int | None = None,
) -> list[JournalEntry]:
    """Journal lines written by people, newest first, keyset-paged on ``seq``.

    ``actor LIKE 'operator:%'`` is the predicate of the partial index
    openonce_journal_operators (seq), so agents' lines are never scanned; the filters
    narrow the walk along it (a tool filter joins each line to its effect by key)."""
    rows = _audit_rows(f or AuditFilter())
    if after is not None:
        newer = list(rows.filter(seq__gt=after).order_by("seq")[:limit])
        return newer[::-1]
    if before is not None:
        rows = rows.filter(seq__lt=before)
    return list(rows.order_by("-seq")[:limit])


def audit_page(
    f: AuditFilter, before: int | None = None, after: int | None = None, limit: int = AUDIT_PAGE
) -> AuditPage:
    entries = audit_log(before, limit + 1, f, after=after)
    rows = _audit_rows(f)
    if after is not None:
        # Fetched oldest first and reversed: the extra row, if any, is the newest one.
        more_newer = len(entries) > limit
        entries = entries[-limit:] if more_newer else entries
        more_older = bool(entries) and rows.filter(seq__lt=entries[-1].seq).exists()
    else:
        more_older = len(entries) > limit
        entries = entries[:limit]
        more_newer = (
            before is not None and bool(entries) and (rows.filter(seq__gt=entries[0].seq).exists())
        )
    return AuditPage(
        entries,
        entries[-1].seq if more_older else None,
        entries[0].seq if more_newer else None,
        capped_count(rows, LIST_COUNT_CAP),
        _position(rows.filter(seq__gt=entries[0].seq) if more_newer else None, bool(entries)),
    )


def _audit_rows(f: AuditFilter) -> QuerySet[JournalEntry]:
    rows = JournalEntry.objects.filter(actor__startswith="operator:")
    if f.actor:
        name = f.actor.removeprefix("operator:")
        rows = rows.filter(actor="operator:" + name)
    if f.action:
        rows = rows.filter(action=AUDIT_ACTIONS[f.action][1])
    if f.tool:
        tools = matching_tools(f.tool)
        rows = rows.filter(effect_id__in=Effect.objects.filter(tool__in=tools).values("id"))
    if f.since is not None:
        rows = rows.filter(at__gte=f.since)
    if f.until is not None:
        rows = rows.filter(at__lt=f.until)
    return rows


# -- provider knowledge and reconciler health ---------------------------------------------


@dataclass(frozen=True)
class CapabilityRow:
    capability: Capability
    guidance: str
    problems: list[str]  # the capability's own readiness: what a reviewer still has to fix
    pinned_tools: list[str]  # tools pinned to this capability by configuration
    probed_tools: list[str]  # tools this deployment's reconciler has a prober for


def capability_matrix() -> list[CapabilityRow]:
    oo = get_openonce()
    probed = registered_probers()
    rows = []
    for cap in oo.matrix.capabilities:
        tools = sorted(t for t in probed if cap.matches(t))
        rows.append(
            CapabilityRow(
                capability=cap,
                guidance=cap.guidance(prober_registered=bool(tools)),
                problems=readiness_problems(cap),
                pinned_tools=sorted(
                    t for t, name in oo.provider_capabilities.items() if name == cap.name
                ),
                probed_tools=tools,
            )
        )
    return rows


def registered_probers() -> dict[str, list[Any]]:
    """Tool -> probers registered with this deployment's reconciler (OPENONCE_PROBERS).
    The Reconciler keeps them privately; this read is the console's only use of it."""
    return get_reconciler().probers


def capabilities_for(tool: str) -> list[Capability]:
    """The capabilities governing ``tool``: the pinned one if configuration pins it (an
    email.send pinned to email_smtp), else every one whose pattern matches."""
    return get_openonce().capabilities_for(tool)


def mail_domain(tool: str) -> str | None:
    """The sending domain of an email prober registered for ``tool``, for the
    Message-ID a receipt must name."""
    for prober in registered_probers().get(tool, []):
        inner = getattr(prober, "inner", prober)  # reconciler.probes wraps each one
        domain = getattr(inner, "domain", None)
        if isinstance(domain, str) and domain:
            return domain
    return None


def miss_may_rearm(tool: str) -> bool:
    """Whether the provider matrix lets a person re-arm ``tool`` on a miss without an
    override (the rule ``resolve_not_happened(require_auto_rearm=True)`` applies)."""
    oo = get_openonce()
    return oo.matrix.can_auto_rearm(tool, oo.provider_capabilities.get(tool))


def health() -> Health:
    """Judged by sweeps recorded in the database (reconciler.Sweep, index sweep_latest)."""
    return reconciler_health()


# -- one agent run ------------------------------------------------------------------------

RUN_LIMIT = 500  # effects on a run's timeline
RUN_LINES = 5000  # journal lines on it, all effects together


@dataclass(frozen=True)
class RunStep:
    effect: Effect
    lines: list[JournalEntry]


@dataclass(frozen=True)
class Run:
    scope: str
    steps: list[RunStep]
    total: Count  # effects in the run (the timeline shows the first RUN_LIMIT)
    lines_cut: bool  # the journal lines stopped at RUN_LINES

    @property
    def started_at(self) -> float | None:
        return self.steps[0].effect.created_at if self.steps else None

    @property
    def last_change_at(self) -> float | None:
        return max((s.effect.updated_at for s in self.steps), default=None)

    @property
    def states(self) -> list[tuple[str, int]]:
        counts: dict[str, int] = {}
        for step in self.steps:
            counts[step.effect.state] = counts.get(step.effect.state, 0) + 1
        return sorted(counts.items())


def run_timeline(scope: str, limit: int = RUN_LIMIT, max_lines: int = RUN_LINES) -> Run:
    """Every effect of one run (scope), oldest first, each with its journal lines in order:
    openonce_effects_scope (scope, created_at) for the effects, the journal's key
    (effect_id, seq) for the lines."""
    rows = Effect.objects.filter(scope=scope)
    effects = list(rows.only(*_LIST_COLUMNS).order_by("created_at", "id")[:limit])
    lines = list(
        JournalEntry.objects.filter(effect_id__in=[e.id for e in effects]).order_by("seq")[
            : max_lines + 1
        ]
    )
    by_effect: dict[str, list[JournalEntry]] = {e.id: [] for e in effects}
    for line in lines[:max_lines]:
        by_effect[line.effect_id].append(line)
    steps = [RunStep(e, by_effect[e.id]) for e in effects]
    return Run(scope, steps, capped_count(rows, LIST_COUNT_CAP), len(lines) > max_lines)


# -- the effects list as a download -------------------------------------------------------

EFFECTS_EXPORT_LIMIT = 5000  # rows per effects export; ``after`` pages on


def effect_export(
    f: EffectFilter, after: Cursor | None = None, limit: int | None = None
) -> tuple[Iterator[Effect], Cursor | None]:
    """The filter's effects, newest first as the list shows them, streamed, at most
    ``limit``; and where the next export starts when there are more (read before the
    stream, so it can go in a header)."""
    limit = limit or EFFECTS_EXPORT_LIMIT
    rows = _filtered(f, time.time())
    if after is not None:
        rows = _older(rows, after)
    ordered = rows.only(*_LIST_COLUMNS, "idempotency_key").order_by("-created_at", "-id")
    edge = list(ordered[limit - 1 : limit + 1])
    more = _cursor(edge[0]) if len(edge) == 2 else None
    return ordered[:limit].iterator(500), more


# -- probers, one row each ----------------------------------------------------------------

VERDICTS = ("happened", "not_happened", "inconclusive")
FAILURES = ("transient", "credential", "error")
# Probes held back by a rate limit: the provider's 429, or our own shared limiter
# (reconciler.probes records those as status "limited").
RATE_LIMITED = ("429", "limited")


@dataclass(frozen=True)
class ProberRow:
    tool: str
    provider: str
    tier: str
    verdicts: dict[str, int]  # happened, not_happened, inconclusive
    failures: dict[str, int]  # transient, credential, error
    rate_limited: int
    last_answer: Any  # datetime | None: the provider last answered a probe
    last_refusal: Any  # datetime | None: the last probe that got no answer
    failing_since: Any  # datetime | None: refusing our credentials since then
    reason: str
    waiting: Count  # UNKNOWN effects of this tool (what its probes work through)
    registered: bool  # False: probes were recorded, but this deployment has no prober now

    @property
    def last_probe(self) -> Any:
        moments = [m for m in (self.last_answer, self.last_refusal) if m is not None]
        return max(moments) if moments else None


def prober_rows() -> list[ProberRow]:
    """One row per prober: what the workers recorded (reconciler.probes: ProbeTally by
    tool, ProberStatus by provider) beside the UNKNOWN effects each one works through.
    Bounded: one row per tool with probes; the waiting counts stop at COUNT_CAP."""
    registered = registered_probers()
    tallies = tallies_by_tool()
    statuses = statuses_by_provider()
    rows = []
    for tool in sorted(set(registered) | set(tallies)):
        probers = registered.get(tool, [])
        provider = next(
            (p.provider for p in probers if isinstance(getattr(p, "provider", None), str)),
            tool.partition(".")[0],
        )
        counts = tallies.get(tool, {})
        status = statuses.get(provider)
        rows.append(
            ProberRow(
                tool=tool,
                provider=provider,
                tier=evidence_tier(tool),
                verdicts={v: sum(n for (o, _), n in counts.items() if o == v) for v in VERDICTS},
                failures={v: sum(n for (o, _), n in counts.items() if o == v) for v in FAILURES},
                rate_limited=sum(n for (_, st), n in counts.items() if st in RATE_LIMITED),
                last_answer=status.last_success_at if status else None,
                last_refusal=status.last_failure_at if status else None,
                failing_since=status.since if status and status.failing else None,
                reason=redact_text(status.reason) if status and status.failing else "",
                waiting=_capped_count(Effect.objects.filter(state=S.UNKNOWN, tool=tool)),
                registered=tool in registered,
            )
        )
    return rows


def dispatch_queue_depth() -> int | None:
    """Reconcile batches waiting in the broker (None: eager mode, or no answer)."""
    return dispatch_queue.depth()
