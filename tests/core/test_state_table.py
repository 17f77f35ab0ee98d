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
from openonce_core._ledger import Then
from openonce_core._states import DECISIONS, LEGAL, MOVES, check_move
from openonce_core.testing import FakeClock

S = EffectState
ROOT = Path(__file__).resolve().parents[2]
# A store's write methods.
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


# The core's writer and its stores, by path: the only modules that may call those methods.
WRITER = (ROOT / "openonce_core" / "_ledger.py", ROOT / "openonce_core" / "stores")
# The Django apps, and the one they all share (the ledger's read models and clients).
APPS = ("console", "reconciler", "notifications", "ledger")
SHARED_APP = "ledger"
PROJECT_PACKAGE = "openonce_site"


def _where(path: Path, node: ast.AST) -> str:
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{shown}:{getattr(node, 'lineno', 0)}"


def _is_store(node: ast.expr, names: set[str]) -> bool:
    """``<x>.store`` (or ``._store``), a name bound from one, or a name called ``store``."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("store", "_store")
    return isinstance(node, ast.Name) and (node.id == "store" or node.id in names)


def _store_names(tree: ast.AST) -> set[str]:
    """Names a module binds to a store: ``store = oo.store``, ``s: Store = self._store``,
    ``(s := oo.store)``, and aliases of those, found until no new name appears."""
    names: set[str] = set()
    while True:
        found = set(names)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
                value = node.value
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if value is not None and _is_store(value, found):
                    found |= {t.id for t in targets if isinstance(t, ast.Name)}
        if found == names:
            return names
        names = found


def store_write_calls(paths: list[Path]) -> list[str]:
    """Calls of a store write method (``WRITE_METHODS``) in these modules, on a store
    however it is reached: ``oo.store.update(...)``, ``store = oo.store;
    store.update(...)``, or a ``store`` parameter's ``store.claim(...)``."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        names = _store_names(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in WRITE_METHODS
                and _is_store(node.func.value, names)
            ):
                found.append(f"{_where(path, node)} store.{node.func.attr}")
    return found


def _project_sources() -> list[Path]:
    folders = ("openonce_core", *APPS, PROJECT_PACKAGE)
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def _may_write(path: Path) -> bool:
    return any(path.is_relative_to(writer) for writer in WRITER)


def test_the_ledger_is_the_only_writer_of_ledger_state():
    assert _may_write(ROOT / "openonce_core" / "stores" / "sql.py")
    assert not _may_write(ROOT / "console" / "ledger.py")  # by path, not by a file's name
    sources = [p for p in _project_sources() if not _may_write(p)]
    assert store_write_calls(sources) == []


def test_the_write_checker_finds_a_store_reached_any_way(tmp_path):
    offender = tmp_path / "offender.py"
    offender.write_text(
        "def sneak(oo, effect, changes):\n"
        "    store = oo.store\n"
        "    store.update(effect.id, effect.fence, changes)\n"
        "    alias = store\n"
        "    alias.append_journal(None)\n"
        "    oo.store.renew(effect.id, 1, 'me', 0.0)\n"
        "\n"
        "def given(store):\n"
        "    store.claim('id', 1)\n"
        "    {}.update(a=1)  # a dict's update is no store write\n"
    )
    assert store_write_calls([offender]) == [
        f"{offender}:3 store.update",
        f"{offender}:5 store.append_journal",
        f"{offender}:6 store.renew",
        f"{offender}:9 store.claim",
    ]


def _imported(node: ast.AST) -> list[str]:
    """The modules an import statement names (``from a import b`` may import ``a.b``);
    relative imports stay inside their own app and are left out."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return []


def _import_problem(app: str, module: str) -> str | None:
    top, _, rest = module.partition(".")
    if top == PROJECT_PACKAGE:
        return "imports the project package"
    if top not in APPS or top == app:
        return None
    if app == SHARED_APP:
        return "the shared app imports another app"
    if top != SHARED_APP and (rest == "models" or rest.startswith("models.")):
        return "imports another app's models"
    return None


def app_import_problems(app: str, paths: list[Path]) -> list[str]:
    """Imports in ``app``'s modules that break the rule of the apps: no app imports
    another app's models or the project package (``openonce_site``, which wires the
    apps); the shared app's models are every app's, and it imports no other app."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            problems = [(m, p) for m in _imported(node) if (p := _import_problem(app, m))]
            if problems:  # the first is enough to name the statement
                module, problem = problems[0]
                found.append(f"{_where(path, node)} {module}: {problem}")
    return found


def test_no_app_imports_another_apps_models_or_the_project():
    for app in APPS:
        sources = sorted((ROOT / app).rglob("*.py"))
        assert sources, app
        assert app_import_problems(app, sources) == []


def test_the_import_checker_flags_each_kind_of_bad_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from console.models import Effect\n"
        "from notifications import models\n"
        "import openonce_site.settings\n"
        "from openonce_site import celery\n"
        "from ledger.models import JournalEntry  # the shared app's models: allowed\n"
        "from reconciler.health import Health  # another app, not its models: allowed\n"
        "from .models import Sweep  # its own\n"
    )
    assert [line.split(" ", 1)[1] for line in app_import_problems("reconciler", [bad])] == [
        "console.models: imports another app's models",
        "notifications.models: imports another app's models",
        "openonce_site.settings: imports the project package",
        "openonce_site: imports the project package",
    ]
    assert [line.split(" ", 1)[1] for line in app_import_problems("ledger", [bad])] == [
        "console.models: the shared app imports another app",
        "notifications: the shared app imports another app",
        "openonce_site.settings: imports the project package",
        "openonce_site: imports the project package",
        "reconciler.health: the shared app imports another app",
    ]


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
