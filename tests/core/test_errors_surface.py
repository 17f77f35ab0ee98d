"""Every public error crosses a process boundary intact, and an agent loop needs two
``except`` clauses: ``NothingRanError`` and ``MayHaveRunError``.

The round trip covers every exception class any ``openonce_core`` module defines: a new
one fails ``test_every_public_error_has_an_example`` until it gets a row in EXAMPLES.
"""

from __future__ import annotations

import concurrent.futures
import copy
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
import threading
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

import openonce_core
from openonce_core import EffectState as S
from openonce_core import OpenOnce, UnknownOutcomeError, require_approval_for
from openonce_core import errors as E
from openonce_core._bridge import HandlerNotStarted
from openonce_core._clock import ClockUnavailableError
from openonce_core._retention import ArchiveError
from openonce_core.cli._providers import UsageError
from openonce_core.cli._test import SuiteFileError
from openonce_core.probers.email import MailStoreReadError
from openonce_core.probers.github import GitHubReadError
from openonce_core.probers.stripe import StripeReadError, StripeSearchUnavailableError
from openonce_core.stores.postgres import PoolTimeout
from openonce_core.testing import ChargeDeclined, LookupUnavailableError
from tests.support.child_calls import refund_with_lost_reply

EFFECT = "eff_0123456789abcdef"

# One instance of every public exception class, built with every argument it takes.
EXAMPLES: list[BaseException] = [
    E.OpenOnceError("current_effect() is only available inside an @oo.effect handler"),
    E.NothingRanError("nothing ran"),
    E.MayHaveRunError("it may have run"),
    E.InvalidArgumentsError("$.items[2]", "a set is not JSON"),
    E.FloatInKeyMaterialError("$.amount", "0.1 is a float"),
    E.ScopeRequiredError("email.send derives its key: wrap the call in oo.scope(...)"),
    E.IdempotencyMismatchError(EFFECT, "stripe.refund"),
    E.EffectArchivedError(EFFECT, "stripe.refund", "committed", 1_700_000_000.0, "a.jsonl.gz"),
    E.InvalidReceiptError("a receipt must be a non-empty JSON object"),
    E.ReceiptIdentityError(EFFECT, ["Message-ID <a@b> is not this effect's"]),
    E.ProviderContractError("stripe.refund: no provider key field"),
    E.ReceiptContractError(EFFECT, ["no refund id"], {"status": "ok"}),
    E.EffectNotFoundError(EFFECT),
    E.IllegalTransitionError(EFFECT, S.COMMITTED, "approve", "allowed from requires_approval"),
    E.EffectChangedError(EFFECT, S.CANCELLED, "deny"),
    E.ApprovalPending(EFFECT, "stripe.refund", 1, 2),
    E.ApprovalExpired(EFFECT, "stripe.refund", required=2),
    E.ApprovalDenied(EFFECT, "ann", "too large"),
    E.EffectCancelled(EFFECT, "bob", "the customer withdrew"),
    E.EffectInFlightError(EFFECT, 30.0),
    E.OutcomeUnknownError(EFFECT, "stripe.refund", detail="read timeout"),
    E.ResultUnavailableError(EFFECT, "the value was not JSON"),
    E.EffectFailed(EFFECT, "shop.CardDeclined", "insufficient funds"),
    E.ApproverAlreadyCounted(EFFECT, "ann"),
    E.LedgerWriteError(EFFECT, "returned", {"id": "re_1"}, "OperationalError('gone')"),
    E.LeaseLostError(EFFECT, "failed", ValueError("declined"), "a newer owner holds it"),
    E.HandlerNotStartedError(EFFECT, "the event loop is closed"),
    E.LedgerUnavailableError("stripe.refund", "OperationalError: the server closed the connection"),
    E.SchemaVersionError("the ledger schema is v6, this code knows v5"),
    E.SchemaVersionError("ledger at 9 needs OpenOnce at 9", ledger_version=9, needs_upgrade=True),
    E.ConfigurationError("secret_fields need a pepper"),
    E.WiringError("probers: no module named 'acme'"),
    E.CapabilityError("caps.json: $.stripe.grace: not a number"),
    E.ConformanceError("stripe_refund: expected happened, got not_happened"),
    E.BusinessError("card declined"),
    E.RetryableEffectError("connection refused"),
    E.UnknownOutcomeError("read timeout"),
    E.ProbeError("imap", "mailbox locked", status=None),
    E.ProbeTransientError("stripe", "rate limited", status=429, retry_after=2.5, sent=False),
    E.ProbeCredentialError("github", "bad credentials", status=401),
    MailStoreReadError("SEARCH failed", status=None),
    GitHubReadError("list pulls: 502", status=502),
    StripeReadError("list refunds: 500", status=500),
    StripeSearchUnavailableError("search unavailable in your region", status=400),
    ArchiveError("a.jsonl.gz line 3: not an archived effect"),
    PoolTimeout("no ledger connection became free in 5 s"),
    ChargeDeclined("card declined"),
    LookupUnavailableError("search is down"),
    HandlerNotStarted("the event loop is closed"),
    UsageError("--require-conformance needs a capability file"),
    SuiteFileError("suite.py: no such file"),
    ClockUnavailableError("the database clock could not be read yet"),
]


def public_exception_classes() -> set[type[BaseException]]:
    """Every exception class an openonce_core module defines, but for ``_private`` ones."""
    found: set[type[BaseException]] = set()
    for info in pkgutil.walk_packages(openonce_core.__path__, "openonce_core."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found.add(obj)
    return found


def public_attributes(exc: BaseException) -> dict[str, Any]:
    return {k: v for k, v in vars(exc).items() if not k.startswith("_")}


def assert_same_error(copied: BaseException, original: BaseException) -> None:
    assert type(copied) is type(original)
    assert str(copied) == str(original)
    assert copied.args == original.args
    assert _comparable(public_attributes(copied)) == _comparable(public_attributes(original))


def _comparable(attributes: dict[str, Any]) -> dict[str, Any]:
    """Exceptions held as attributes (an observed failure) compare by type and args."""
    return {
        k: (type(v), v.args) if isinstance(v, BaseException) else v for k, v in attributes.items()
    }


def _name(exc: BaseException) -> str:
    return type(exc).__qualname__


def test_every_public_error_has_an_example() -> None:
    missing = public_exception_classes() - {type(e) for e in EXAMPLES}
    assert not missing, f"add an example of each to EXAMPLES: {sorted(map(str, missing))}"


@pytest.mark.parametrize("original", EXAMPLES, ids=_name)
def test_pickle_round_trip_keeps_type_message_and_attributes(original: BaseException) -> None:
    for protocol in (2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        assert_same_error(pickle.loads(pickle.dumps(original, protocol)), original)


@pytest.mark.parametrize("original", EXAMPLES, ids=_name)
def test_copy_and_deepcopy_keep_type_message_and_attributes(original: BaseException) -> None:
    assert_same_error(copy.copy(original), original)
    assert_same_error(copy.deepcopy(original), original)


def test_attributes_set_after_construction_and_notes_cross_too() -> None:
    error = E.LeaseLostError(EFFECT, "returned", {"id": "re_1"}, "a newer owner holds it")
    error.openonce_outcome = "lease_lost"  # type: ignore[attr-defined]
    error.add_note("seen by worker-2")
    copied = pickle.loads(pickle.dumps(error))
    assert copied.openonce_outcome == "lease_lost"
    assert copied.__notes__ == ["seen by worker-2"]


def test_a_handler_value_that_cannot_pickle_crosses_as_its_repr() -> None:
    """A handler's return value holding a lock must not keep "do not repeat the call"
    from reaching the other process."""
    lock = threading.Lock()
    for original, attribute in (
        (E.LedgerWriteError(EFFECT, "returned", lock, "disk full"), "observed_value"),
        (E.ReceiptContractError(EFFECT, ["no refund id"], lock), "value"),
    ):
        copied = pickle.loads(pickle.dumps(original))
        assert type(copied) is type(original)
        assert str(copied) == str(original)
        assert copied.effect_id == EFFECT
        assert getattr(copied, attribute) == repr(lock)
        assert getattr(original, attribute) is lock  # this process keeps the object


class DeclinedWithCode(E.BusinessError):
    """A handler's own error with a keyword argument, as users write them."""

    def __init__(self, code: str, *, amount: int) -> None:
        self.code = code
        self.amount = amount
        super().__init__(f"declined ({code}) for {amount}")


def test_a_user_subclass_with_its_own_constructor_crosses() -> None:
    original = DeclinedWithCode("card_declined", amount=1200)
    copied = pickle.loads(pickle.dumps(original))
    assert_same_error(copied, original)
    assert (copied.code, copied.amount) == ("card_declined", 1200)


def test_effect_changed_error_is_built_by_its_parent(tmp_path) -> None:
    oo = OpenOnce(str(tmp_path / "ledger.db"), retry_delay=0, policy=require_approval_for(["*"]))
    refund = _refund_tool(oo, calls=[])
    with pytest.raises(E.ApprovalPending) as pending:
        refund("o-1", 1200)
    effect_id = pending.value.effect_id
    seen = oo.get(effect_id).fence
    oo.cancel(effect_id, by="bob", reason="the customer withdrew")
    with pytest.raises(E.EffectChangedError) as changed:
        oo.approve(effect_id, by="ann", expected_fence=seen)
    error = changed.value
    assert isinstance(error, E.IllegalTransitionError)
    assert (error.effect_id, error.state, error.action, error.allowed) == (
        effect_id,
        S.CANCELLED,
        "approve",
        "",
    )
    assert "changed since you looked at it (now cancelled)" in str(error)
    assert oo.get(effect_id).state == S.CANCELLED  # nothing was applied


# -- across real process boundaries ------------------------------------------------------


def test_outcome_unknown_in_a_spawned_child_reaches_the_parent_as_itself(tmp_path) -> None:
    ledger = str(tmp_path / "ledger.db")
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        future = pool.submit(refund_with_lost_reply, ledger, "o-1")
        with pytest.raises(E.OutcomeUnknownError) as info:
            future.result(timeout=120)
    oo = OpenOnce(ledger)
    try:
        [effect] = oo.store.list_effects()
        assert info.value.effect_id == effect.id
        assert info.value.tool == "stripe.refund"
        assert "the reply was lost" in str(info.value)
        assert effect.state == S.UNKNOWN
    finally:
        oo.close()


def test_a_celery_pickle_result_backend_keeps_the_error() -> None:
    """A user's own Celery task that calls a tool, with results pickled. (OpenOnce's own
    tasks ignore their results, CELERY_TASK_IGNORE_RESULT, so none is ever stored.)"""
    app = Celery("errors-surface", backend="cache+memory://", set_as_current=False)
    app.conf.result_serializer = "pickle"
    app.conf.result_accept_content = ["pickle"]
    original = E.OutcomeUnknownError(EFFECT, "stripe.refund", "read timeout")
    app.backend.mark_as_failure("task-1", original)
    stored = app.AsyncResult("task-1").result
    assert_same_error(stored, original)


# -- an agent loop with exactly two except clauses ----------------------------------------


def agent_step(call: Callable[[], Any]) -> tuple[str, type[BaseException] | None, str | None]:
    """What an agent loop does with a tool call: the verdict it tells the model, with the
    error's class and the effect a person should look at."""
    try:
        call()
    except E.NothingRanError as error:
        return "not done", type(error), None
    except E.MayHaveRunError as error:
        return "may have happened", type(error), error.effect_id
    return "done", None, None


def _refund_tool(oo: OpenOnce, calls: list[str]) -> Any:
    @oo.effect(tool="stripe.refund", idempotency_key=lambda order, amount: f"refund-{order}")
    def refund(order: str, amount: int) -> dict[str, str]:
        calls.append(order)
        return {"id": f"re_{order}"}

    return refund


def _pending_effect(oo: OpenOnce, refund: Any) -> str:
    with pytest.raises(E.ApprovalPending) as info:
        refund("o-1", 1200)
    return info.value.effect_id


def _approval_pending(oo: OpenOnce, refund: Any) -> Callable[[], Any]:
    _pending_effect(oo, refund)
    return lambda: refund("o-1", 1200)


def _denied(oo: OpenOnce, refund: Any) -> Callable[[], Any]:
    oo.deny(_pending_effect(oo, refund), by="ann", reason="too large")
    return lambda: refund("o-1", 1200)


def _cancelled(oo: OpenOnce, refund: Any) -> Callable[[], Any]:
    oo.cancel(_pending_effect(oo, refund), by="bob", reason="the customer withdrew")
    return lambda: refund("o-1", 1200)


def _mismatch(oo: OpenOnce, refund: Any) -> Callable[[], Any]:
    refund("o-1", 1200)
    return lambda: refund("o-1", 9900)  # the same key, another amount


APPROVAL = require_approval_for(["stripe.*"])


@pytest.mark.parametrize(
    ("scenario", "policy", "expected"),
    [
        (_approval_pending, APPROVAL, E.ApprovalPending),
        (_denied, APPROVAL, E.ApprovalDenied),
        (_cancelled, APPROVAL, E.EffectCancelled),
        (_mismatch, None, E.IdempotencyMismatchError),
    ],
    ids=lambda v: getattr(v, "__name__", "").strip("_") or None,
)
def test_agent_loop_reads_nothing_ran(tmp_path, scenario, policy, expected) -> None:
    oo = OpenOnce(str(tmp_path / "ledger.db"), retry_delay=0, policy=policy)
    calls: list[str] = []
    call = scenario(oo, _refund_tool(oo, calls))
    ran_before = list(calls)
    assert agent_step(call) == ("not done", expected, None)
    assert calls == ran_before  # nothing ran


def test_agent_loop_reads_an_unknown_outcome_as_may_have_happened(tmp_path) -> None:
    oo = OpenOnce(str(tmp_path / "ledger.db"), retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda order: f"refund-{order}")
    def refund(order: str) -> None:
        calls.append(order)
        raise UnknownOutcomeError("read timeout")

    verdict, error_type, effect_id = agent_step(lambda: refund("o-1"))
    assert (verdict, error_type) == ("may have happened", E.OutcomeUnknownError)
    assert effect_id is not None and oo.get(effect_id).state == S.UNKNOWN
    assert agent_step(lambda: refund("o-1"))[:2] == ("may have happened", E.OutcomeUnknownError)
    assert calls == ["o-1"]


def test_agent_loop_reads_a_duplicate_in_flight_as_may_have_happened(tmp_path) -> None:
    oo = OpenOnce(str(tmp_path / "ledger.db"), retry_delay=0, wait_seconds=0)
    seen: list[tuple[str, type[BaseException] | None, str | None]] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        # A duplicate arrives while this attempt holds a live lease: it must not run.
        seen.append(agent_step(lambda: send(to)))
        return {"message_id": "m-1"}

    assert send("a@b.c") == {"message_id": "m-1"}
    [(verdict, error_type, effect_id)] = seen
    assert (verdict, error_type) == ("may have happened", E.EffectInFlightError)
    assert effect_id is not None and oo.get(effect_id).state == S.COMMITTED


def test_agent_loop_reads_a_failed_ledger_write_as_may_have_happened(tmp_path, monkeypatch) -> None:
    oo = OpenOnce(str(tmp_path / "ledger.db"), retry_delay=0)
    calls: list[str] = []
    refund = _refund_tool(oo, calls)
    update = oo.store.update

    def update_failing_on_commit(effect_id: str, states: Any, fence: Any, changes: Any, *rest):
        if changes.get("state") == S.COMMITTED:
            raise RuntimeError("ledger unreachable: disk full")
        return update(effect_id, states, fence, changes, *rest)

    monkeypatch.setattr(oo.store, "update", update_failing_on_commit)
    verdict, error_type, effect_id = agent_step(lambda: refund("o-1", 1200))
    assert (verdict, error_type) == ("may have happened", E.LedgerWriteError)
    assert effect_id is not None and oo.get(effect_id).state == S.STARTED
    assert calls == ["o-1"]


def test_no_error_is_both_nothing_ran_and_may_have_run() -> None:
    both = [
        cls
        for cls in public_exception_classes()
        if issubclass(cls, E.NothingRanError) and issubclass(cls, E.MayHaveRunError)
    ]
    assert both == []
