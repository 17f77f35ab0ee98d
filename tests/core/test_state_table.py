"""One table of states and moves, one writer: every write is checked against the table, and
a journal replays to the effects table through legal moves only, on every store."""

from __future__ import annotations

import ast
import contextlib
import random
from pathlib import Path
from typing import Any

import pytest

from openonce_core import (
    ApprovalPending,
    BusinessError,
    EffectState,
    IllegalTransitionError,
    OpenOnce,
    OpenOnceError,
    ProbeOutcome,
    ProbeResult,
    Reconciler,
    RetryableEffectError,
    decisions_allowed,
    require_approval_for,
)
from openonce_core.ledger import Then
from openonce_core.states import DECISIONS, LEGAL, MOVES, check_move
from openonce_core.testing import FakeClock

S = EffectState
ROOT = Path(__file__).resolve().parents[2]
# The only modules that may call a store's write methods.
WRITE_METHODS = {"update", "insert", "insert_or_find", "append_journal", "renew", "claim"}


def test_every_state_is_entered_and_every_move_is_reachable():
    entered = {dst for m in MOVES.values() for dst in m.targets}
    assert entered == set(S)  # no dead states: RECEIPT_RECORDED is entered too
    left = {src for m in MOVES.values() if m.action != "note" for src in m.sources}
    assert left == set(S) - {S.RELEASED}  # only a released claim never moves again
    assert S.RECEIPT_RECORDED in LEGAL[S.UNKNOWN] and S.COMMITTED in LEGAL[S.RECEIPT_RECORDED]


def test_the_console_decisions_come_from_the_table():
    assert DECISIONS == (
        "approve", "deny", "cancel", "release", "resolve_happened", "resolve_not_happened",
    )  # fmt: skip
    assert decisions_allowed(S.REQUIRES_APPROVAL) == ("approve", "deny", "cancel", "release")
    assert decisions_allowed("unknown") == ("resolve_happened", "resolve_not_happened")
    assert decisions_allowed(S.STARTED) == ()  # a running call is nobody's to decide
    assert decisions_allowed(S.COMMITTED) == ()


def test_a_note_never_changes_the_state_and_illegal_moves_are_refused():
    assert check_move("note", S.COMMITTED, S.COMMITTED)
    assert not check_move("note", S.COMMITTED, S.PLANNED)
    assert not check_move("finish", S.UNKNOWN, S.COMMITTED)  # a late result is its own move
    assert not check_move("approve", S.UNKNOWN, S.APPROVED)
    assert not check_move("no_such_move", S.UNKNOWN, S.UNKNOWN)


def _effect(store: Any, clock: FakeClock) -> tuple[OpenOnce, str]:
    oo = OpenOnce(store, retry_delay=0, clock=clock, policy=require_approval_for(["pay"]))

    @oo.effect(tool="pay", idempotency_key=lambda n: f"p{n}")
    def pay(n: int) -> dict[str, int]:
        return {"paid": n}

    with pytest.raises(ApprovalPending) as pending:
        pay(1)
    return oo, pending.value.effect_id


@pytest.mark.parametrize(
    ("action", "to", "then"),
    [
        ("finish", S.COMMITTED, None),  # not running: nothing to finish
        ("start", S.STARTED, None),  # needs approval first
        ("resolve_happened", S.RECEIPT_RECORDED, None),  # not unknown
        ("approve", S.COMMITTED, None),  # approving never commits
        ("reconsider", S.REQUIRES_APPROVAL, None),
        ("note", S.PLANNED, None),  # a note that would change the state
        ("approve", S.APPROVED, Then("check_receipt", S.COMMITTED)),  # a second illegal step
        ("invented", S.APPROVED, None),
    ],
)
def test_an_illegal_write_raises_and_writes_nothing(store, action, to, then):
    oo, effect_id = _effect(store, FakeClock())
    effect = oo.get(effect_id)
    before = oo.journal(effect_id)
    with pytest.raises((IllegalTransitionError, ValueError)):
        oo.ledger.move(effect, action, to, actor="test", then=then)
    assert oo.get(effect_id) == effect
    assert oo.journal(effect_id) == before


def test_creating_an_effect_is_checked_too(store):
    oo, effect_id = _effect(store, FakeClock())
    effect = oo.get(effect_id)
    with pytest.raises(IllegalTransitionError):
        oo.ledger.create(effect, "start", actor="test")  # "start" does not create
    with pytest.raises(IllegalTransitionError):
        oo.ledger.move(effect, "claim", S.STARTED, actor="test")  # "claim" only creates
    assert oo.journal(effect_id)[-1].action == "request_approval"


def _write_calls(path: Path) -> list[str]:
    """Calls of a store write method (``<x>.store.update(...)`` and the like) in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITE_METHODS
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "store"
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} .store.{node.func.attr}")
    return found


def test_the_ledger_is_the_only_writer_of_ledger_state():
    sources = [
        p
        for folder in ("openonce_core", "console", "reconciler", "openonce_site")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "ledger.py" and "stores" not in p.parts and "migrations" not in p.parts
    ]
    assert sources
    offenders = [call for path in sources for call in _write_calls(path)]
    assert offenders == []


def test_the_daemon_never_imports_the_console():
    for path in (ROOT / "reconciler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.split(".")[0] == "console"], path


# -- a random run, replayed through the table -----------------------------------------------


class Chaos:
    """An agent, people and a reconciler acting on a few effects in a random order."""

    def __init__(self, store: Any, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.oo = OpenOnce(
            store,
            retry_delay=0,
            lease_seconds=60,
            clock=self.clock,
            policy=require_approval_for(["refund"]),
        )
        self.rec = Reconciler(self.oo, grace_seconds=0, stale_call_grace=0, probe_retries=1)
        self.rec.register("charge", self._probe)
        self.rec.register("refund", self._probe)
        self.outcomes = ["ok", "business", "retryable", "unknown"]

        @self.oo.effect(tool="charge", idempotency_key=lambda n: f"c{n}", max_attempts=2)
        def charge(n: int) -> dict[str, int]:
            return self._outcome(n)

        @self.oo.effect(tool="refund", idempotency_key=lambda n: f"r{n}", max_attempts=2)
        def refund(n: int) -> dict[str, int]:
            return self._outcome(n)

        self.tools = [charge, refund]

    def _outcome(self, n: int) -> dict[str, int]:
        outcome = self.rng.choice(self.outcomes)
        if outcome == "business":
            raise BusinessError("declined")
        if outcome == "retryable":
            raise RetryableEffectError("refused")
        if outcome == "unknown":
            raise TimeoutError("read timed out")
        return {"n": n}

    def _probe(self, effect: Any) -> ProbeResult:
        outcome = self.rng.choice([*list(ProbeOutcome), "raise"])
        if outcome == "raise":
            raise RuntimeError("provider down")
        receipt = {"found": effect.id} if outcome is ProbeOutcome.HAPPENED else None
        return ProbeResult(outcome, receipt=receipt, provider_reference=effect.provider_key)

    def step(self) -> None:
        rng, oo = self.rng, self.oo
        effects = oo.store.list_effects(limit=100)
        action = rng.choice(["call", "call", "decide", "decide", "sweep", "time"])
        try:
            if action == "call" or not effects:
                rng.choice(self.tools)(rng.randrange(20))
            elif action == "decide":
                effect = rng.choice(effects)
                by = rng.choice(["ann", "bob"])
                decision = rng.choice(
                    ["approve", "deny", "cancel", "resolve_happened", "resolve_not_happened"]
                )
                if decision == "resolve_happened":
                    oo.resolve_happened(effect.id, receipt={"seen": True}, by=by)
                elif decision == "approve":
                    oo.approve(effect.id, by=by)
                else:
                    getattr(oo, decision)(effect.id, by=by, reason="chaos")
            elif action == "sweep":
                self.rec.run_once()
            else:
                self.clock.advance(rng.choice([1, 30, 90]))
        except (OpenOnceError, BusinessError, RetryableEffectError, ValueError):
            pass  # a refused call or decision changes nothing; the replay below checks it


def replay(journal: list[Any]) -> EffectState:
    state = S.PLANNED
    for line in journal:
        assert line.from_state == state, (line, state)
        assert check_move(line.action, S(line.from_state), S(line.to_state)), line
        state = S(line.to_state)
    return state


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_journal_of_a_random_run_replays_to_the_effects_table(store, seed):
    chaos = Chaos(store, seed)
    for _ in range(400):
        chaos.step()
    effects = store.list_effects(limit=1000)
    assert len(effects) >= 6
    actions = set()
    for effect in effects:
        journal = chaos.oo.journal(effect.id)
        assert journal[0].action in ("claim", "request_approval")
        assert replay(journal) == effect.state
        assert [j.seq for j in journal] == sorted(j.seq for j in journal)
        actions |= {j.action for j in journal}
    assert len(actions) >= 10, actions  # the run went through much of the table
    # Whatever the run left behind, a call gets a result or one of OpenOnce's answers.
    for tool in chaos.tools:
        for n in range(20):
            with contextlib.suppress(OpenOnceError, BusinessError, RetryableEffectError):
                tool(n)
