"""The nemesis soak's checker: the provider's record against the ledger (bench/soak.py).

Pure functions over plain data, so a test can plant a violation and see it caught
(tests/bench/test_soak.py):

* ``provider``: the provider's record, one dict per POST it received (soak_provider.py);
* ``agents``: what the agents saw, one dict per call (soak_agent.py);
* ``effects``: the ledger's effects, dicts with ``id``, ``order``, ``state``, ``result``,
  ``provider_key``, ``updated_at``;
* ``journals``: effect id -> its journal lines, dicts with ``action``, ``from_state``,
  ``to_state``, ``actor``, ``reason``, ``at``, ``evidence``.

The invariants (ARCHITECTURE.md, "The nemesis"):

* ``executed_once``: no order executed more than once at the provider;
* ``outcomes_kept``: every success an agent saw is COMMITTED with that result; every
  execution at the provider is COMMITTED with that PaymentIntent (or with a person);
  nothing is COMMITTED that the provider did not execute;
* ``settled``: after the drain every effect is terminal or with a person (HUMAN_REVIEW,
  REQUIRES_APPROVAL);
* ``journal_legal``: every journal replays from ``planned`` through legal moves of
  ``openonce_core._states`` to the effect's state;
* ``owners_judged``: an owner the reconciler declared gone (an ``expire`` whose reason says
  its process no longer exists or has exited) writes nothing to that effect's journal
  afterwards: a dead process cannot, so a later line of it proves a live owner was read as
  dead (its call re-armed while it still ran). Journal order, no clock needed;
* ``live_leases_kept``: a lease that ran out (an ``expire`` whose reason says the lease
  expired, not that the owner is gone) was not expired while its owner still ran the call
  before any judge could have found it lapsed. A judge expires a lease only once its end has
  passed *and* it has watched that same lease un-renewed for ``unrenewed_span`` of its own
  monotonic time (``leases.lease_lapsed``: 3 s for the soak's 6 s leases); the lease exists
  from its claim, so no judge may expire it before it is that old, whatever happened to its
  owner (stopped, starved, its database slowed or cut) or to any clock. So: when the owner
  of the expired attempt wrote about it afterwards (a late result: the expire fell inside
  its call) and that owner's call (an agent record with its pid, the order and the attempt)
  lasted, on the real clock, less than ``unrenewed_span`` minus a margin, a live call was
  expired early (a judge whose clock stepped forward read its lease as ended: b12c7f0). The
  expires whose owner wrote afterwards but whose call was longer (or not found) are counted
  in ``Verdict.figures``, not judged.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openonce_core._states import TERMINAL, EffectState, check_move, move_for

S = EffectState
WITH_A_PERSON = frozenset({S.HUMAN_REVIEW, S.REQUIRES_APPROVAL})
INVARIANTS = (
    "executed_once", "outcomes_kept", "settled", "journal_legal", "owners_judged",
    "live_leases_kept", "resources",
)  # fmt: skip
# How an ``expire`` line says that the attempt's owner process is gone (openonce_core._leases).
OWNER_GONE = ("no longer exists", "has exited", "is another process now")
# live_leases_kept: the margin below the unrenewed span (rounding of the records' times, the
# gap between a call's first record and its claim, monotonic against wall clock).
LIVE_MARGIN = 0.25


@dataclass
class Violation:
    invariant: str
    order: str
    detail: str
    effect_id: str | None = None

    def __str__(self) -> str:
        where = f" ({self.effect_id})" if self.effect_id else ""
        return f"{self.invariant}: {self.order}{where}: {self.detail}"


@dataclass
class Verdict:
    violations: list[Violation] = field(default_factory=list)
    checked: Counter[str] = field(default_factory=Counter)  # invariant -> items checked
    figures: Counter[str] = field(default_factory=Counter)  # reported, never failing

    def add(self, invariant: str, order: str, detail: str, effect_id: str | None = None) -> None:
        self.violations.append(Violation(invariant, order, detail, effect_id))

    def count(self, invariant: str) -> int:
        return sum(1 for v in self.violations if v.invariant == invariant)

    @property
    def ok(self) -> bool:
        return not self.violations


def replay_journal(lines: list[Mapping[str, Any]]) -> tuple[S | None, str]:
    """The state a journal replays to through legal moves, or (None, why it cannot)."""
    state = S.PLANNED
    for n, line in enumerate(lines):
        action = line.get("action") or ""
        try:
            src, dst = S(line["from_state"] or "planned"), S(line["to_state"])
        except ValueError as exc:
            return None, f"line {n}: {exc}"
        if n == 0:
            try:
                creates = move_for(action).creates
            except ValueError:
                creates = False
            if not creates:
                return None, f"line 0 is {action!r}, not a move that creates an effect"
        if src != state:
            return None, f"line {n} ({action}) starts from {src}, the journal was at {state}"
        if not check_move(action, src, dst):
            return None, f"line {n}: {action} {src} -> {dst} is not a legal move"
        state = dst
    return state, ""


def check(
    provider: Iterable[Mapping[str, Any]],
    agents: Iterable[Mapping[str, Any]],
    effects: Iterable[Mapping[str, Any]],
    journals: Mapping[str, list[Mapping[str, Any]]],
    *,
    unrenewed_span: float = 3.0,
) -> Verdict:
    """Every invariant but ``resources``. ``unrenewed_span``: the shortest a judge must watch
    a lease un-renewed before expiring it (``leases.unrenewed_span`` of the agents' lease)."""
    verdict = Verdict()
    agents = list(agents)
    executions: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for line in provider:
        if line.get("kind") == "exec":
            executions[str(line.get("order"))].append(line)
    current: dict[str, Mapping[str, Any]] = {}
    for effect in effects:
        order = str(effect["order"])
        if effect["state"] != S.RELEASED or order not in current:
            current[order] = effect

    # executed_once
    for order, lines in sorted(executions.items()):
        verdict.checked["executed_once"] += 1
        if len(lines) > 1:
            ids = ", ".join(f"{x.get('id')} (effect {x.get('effect_id')})" for x in lines)
            effect_id = current[order]["id"] if order in current else None
            verdict.add("executed_once", order, f"executed {len(lines)} times: {ids}", effect_id)

    # outcomes_kept: what the agents saw succeed
    seen_ok: dict[tuple[str, str], Mapping[str, Any]] = {}
    for line in agents:
        if line.get("o") == "ok" and isinstance(line.get("r"), dict):
            seen_ok.setdefault((str(line["k"]), str(line["r"].get("stripe_id"))), line)
    for (order, stripe_id), _line in sorted(seen_ok.items()):
        verdict.checked["outcomes_kept"] += 1
        effect = current.get(order)
        if effect is None:
            verdict.add(
                "outcomes_kept", order, f"an agent saw {stripe_id}; no effect in the ledger"
            )
            continue
        got = (
            (effect.get("result") or {}).get("stripe_id")
            if effect["state"] == S.COMMITTED
            else None
        )
        if got != stripe_id:
            verdict.add(
                "outcomes_kept", order,
                f"an agent saw success with {stripe_id}; the ledger has {effect['state']}"
                f" with result {effect.get('result')!r}", effect["id"],
            )  # fmt: skip
    # ... and what the provider executed
    for order, lines in sorted(executions.items()):
        verdict.checked["outcomes_kept"] += 1
        effect = current.get(order)
        stripe_id = lines[0].get("id")
        if effect is None:
            verdict.add("outcomes_kept", order, f"the provider executed {stripe_id}; no effect")
            continue
        state = S(effect["state"])
        if state in WITH_A_PERSON:
            continue
        got = (effect.get("result") or {}).get("stripe_id")
        if state != S.COMMITTED or got not in {x.get("id") for x in lines}:
            verdict.add(
                "outcomes_kept", order,
                f"the provider executed {stripe_id}; the ledger has {state} with result"
                f" {effect.get('result')!r}", effect["id"],
            )  # fmt: skip
    # ... and nothing committed that did not happen
    for order, effect in sorted(current.items()):
        if effect["state"] != S.COMMITTED:
            continue
        verdict.checked["outcomes_kept"] += 1
        got = (effect.get("result") or {}).get("stripe_id")
        if got not in {x.get("id") for x in executions.get(order, [])}:
            verdict.add(
                "outcomes_kept", order,
                f"COMMITTED with {got!r}, which the provider never executed", effect["id"],
            )  # fmt: skip

    # settled
    for order, effect in sorted(current.items()):
        verdict.checked["settled"] += 1
        state = S(effect["state"])
        if state not in TERMINAL and state not in WITH_A_PERSON:
            verdict.add("settled", order, f"left {state} after the drain", effect["id"])

    # journal_legal (every effect, released ones too)
    for effect in effects:
        verdict.checked["journal_legal"] += 1
        lines = journals.get(effect["id"], [])
        replayed, why = replay_journal(lines)
        if replayed is None:
            verdict.add("journal_legal", str(effect["order"]), why, effect["id"])
        elif replayed != S(effect["state"]):
            verdict.add(
                "journal_legal", str(effect["order"]),
                f"the journal replays to {replayed}, the effect is {effect['state']}", effect["id"],
            )  # fmt: skip

    # owners_judged
    for effect in effects:
        owner = ""
        declared_gone: str | None = None
        for line in journals.get(effect["id"], []):
            actor, reason = str(line.get("actor") or ""), str(line.get("reason") or "")
            if line.get("action") in ("claim", "start"):
                owner, declared_gone = actor, None
            elif line.get("action") == "expire" and any(w in reason for w in OWNER_GONE):
                verdict.checked["owners_judged"] += 1
                declared_gone = owner
            elif declared_gone and actor == declared_gone:
                verdict.add(
                    "owners_judged", str(effect["order"]),
                    f"{actor} was declared gone, then wrote {line.get('action')!r}: a live"
                    " owner read as dead", effect["id"],
                )  # fmt: skip
                declared_gone = None

    check_live_leases(verdict, agents, effects, journals, unrenewed_span)
    return verdict


def _owner_of(actor: str) -> str:
    return actor[len("agent:") :] if actor.startswith("agent:") else actor


def _pid_of(owner: str) -> int | None:
    """The pid in a lease owner's name (host:pid:token)."""
    parts = owner.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def check_live_leases(
    verdict: Verdict,
    agents: Iterable[Mapping[str, Any]],
    effects: Iterable[Mapping[str, Any]],
    journals: Mapping[str, list[Mapping[str, Any]]],
    unrenewed_span: float,
) -> None:
    """``live_leases_kept`` (module docstring): a lease expired while its owner ran on, in a
    call too short for any judge to have watched that lease un-renewed long enough."""
    calls: dict[tuple[int, str, int], Mapping[str, Any]] = {}
    for line in agents:
        pid, attempts = line.get("pid"), line.get("a") or ()
        if isinstance(pid, int) and line.get("end") is not None:
            for attempt in attempts:
                calls[(pid, str(line.get("k")), int(attempt))] = line
    bound = unrenewed_span - LIVE_MARGIN
    for effect in effects:
        order = str(effect["order"])
        lines = journals.get(effect["id"], [])
        owner = ""
        for n, line in enumerate(lines):
            action, actor = line.get("action"), str(line.get("actor") or "")
            reason = str(line.get("reason") or "")
            if action in ("claim", "start", "retry"):
                owner = _owner_of(actor)
                continue
            if action != "expire" or any(w in reason for w in OWNER_GONE):
                continue
            evidence = line.get("evidence") or {}
            expired_owner = str(evidence.get("owner") or owner)
            attempt = evidence.get("attempt")
            if attempt is None:
                words = reason.split()
                attempt = words[words.index("attempt") + 1] if "attempt" in words else None
            verdict.checked["live_leases_kept"] += 1
            verdict.figures["lease expires"] += 1
            try:
                attempt = int(attempt)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                continue
            if not _ran_on(lines[n + 1 :], expired_owner, attempt):
                continue
            verdict.figures["lease expires whose owner wrote its result afterwards"] += 1
            pid = _pid_of(expired_owner)
            call = calls.get((pid, order, attempt)) if pid is not None else None
            if call is None:
                verdict.figures["... its call not found in the agents' records"] += 1
                continue
            took = float(call["end"]) - float(call["t"])
            if took >= bound:
                verdict.figures[f"... in a call of {bound:g} s or longer (not judged)"] += 1
                continue
            verdict.add(
                "live_leases_kept", order,
                f"attempt {attempt}'s lease (owner {expired_owner}) expired while its owner"
                f" ran the call, which took {took:.2f} s, under the {unrenewed_span:g} s a"
                " judge must watch a lease un-renewed: a live call expired", effect["id"],
            )  # fmt: skip


def _ran_on(after: list[Mapping[str, Any]], owner: str, attempt: int) -> bool:
    """Whether the owner of ``attempt`` wrote about it after its lease expired (its late
    result, journaled by it, or the contradiction it raised): the expire fell inside the
    call. A claim of a new attempt ends the search."""
    for line in after:
        actor, action = str(line.get("actor") or ""), line.get("action")
        reason = str(line.get("reason") or "")
        if _owner_of(actor) == owner and action in ("claim", "start", "retry"):
            return False
        if _owner_of(actor) == owner or reason.startswith(
            (f"attempt {attempt} finished", f"late result of attempt {attempt} ")
        ):
            return True
    return False


# -- resources ----------------------------------------------------------------------------

FD_GROWTH = 24  # more open files at the end than at the start, per process
THREAD_GROWTH = 12
RSS_GROWTH_MB = 80.0


def check_resources(
    verdict: Verdict,
    start: Mapping[str, Mapping[str, float]],
    end: Mapping[str, Mapping[str, float]],
    *,
    connections: tuple[int, int] | None = None,
    connection_bound: int = 0,
) -> None:
    """Per long-lived process (alive at both samples, same pid): fds, threads and RSS must
    not grow past the thresholds; the ledger's connections must stay under the bound."""
    for name in sorted(set(start) & set(end)):
        a, b = start[name], end[name]
        if a.get("pid") != b.get("pid"):
            continue
        verdict.checked["resources"] += 1
        if b["fds"] - a["fds"] > FD_GROWTH:
            verdict.add("resources", name, f"open files grew {a['fds']:.0f} -> {b['fds']:.0f}")
        if b["threads"] - a["threads"] > THREAD_GROWTH:
            verdict.add("resources", name, f"threads grew {a['threads']:.0f} -> {b['threads']:.0f}")
        if b["rss_mb"] - a["rss_mb"] > RSS_GROWTH_MB:
            verdict.add("resources", name, f"RSS grew {a['rss_mb']:.0f} -> {b['rss_mb']:.0f} MB")
    if connections is not None and connection_bound:
        verdict.checked["resources"] += 1
        if max(connections) > connection_bound:
            verdict.add(
                "resources", "postgres",
                f"{max(connections)} ledger connections (start {connections[0]}, end"
                f" {connections[1]}), over the bound of {connection_bound}",
            )  # fmt: skip
