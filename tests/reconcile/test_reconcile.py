"""The reconciler on every store: what it does with an effect a timeout left open.

Every UNKNOWN effect here is made the way production makes one: a handler records the
effect at a fake provider (keyed by ``current_effect().provider_key``) and then raises
TimeoutError, so the ledger cannot know whether it happened. Probers read that fake
provider. The assertions are on states, handler and prober call counts, journal lines and
the report: the reconciler resolves with evidence, never by running the handler again
(ARCHITECTURE.md, invariants 3 and 7).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from openonce_core import (
    EffectState,
    InvalidReceiptError,
    LeaseLostError,
    OpenOnce,
    OutcomeUnknownError,
    ProviderContractError,
    SQLiteStore,
    Store,
    current_effect,
)
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._providers import CapabilityMatrix
from openonce_core._reconcile import Reconciler, ReconcileReport
from openonce_core._records import Effect
from openonce_core.testing import FakeClock

S = EffectState
HAPPENED = ProbeOutcome.HAPPENED
NOT_HAPPENED = ProbeOutcome.NOT_HAPPENED
INCONCLUSIVE = ProbeOutcome.INCONCLUSIVE
BOUND = object()  # "echo this effect's provider key"
OWNER = "sweeper-1"
ACTOR = f"reconciler:{OWNER}"
PR = {"owner": "acme", "repo": "api", "head": "fix-login", "title": "Fix login"}
# A probe's decision leaves UNKNOWN for one of these (a receipt first, then its check).
RESOLUTIONS = {S.RECEIPT_RECORDED, S.COMMITTED, S.PLANNED, S.HUMAN_REVIEW}


# -- the world: a fake provider, handlers that time out after it recorded, probers --------


class World:
    """One OpenOnce with four tools whose handlers record at a fake provider.

    ``script`` says what each next handler call does: "after" (the provider records the
    effect, then the reply is lost: TimeoutError), "before" (the request is lost before
    the provider saw it: TimeoutError) or "ok" (the provider records it and answers).
    """

    def __init__(self, oo: OpenOnce) -> None:
        self.oo = oo
        self.provider: dict[str, dict[str, Any]] = {}  # provider_key -> receipt
        self.calls: list[tuple[str, int]] = []  # (tool, attempt) per handler run
        self.script: list[str] = []

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order, amount_cents: order)
        def charge(order: str, amount_cents: int) -> dict[str, Any]:
            return self._body("stripe.charge", {"stripe_id": f"pi_{order}", "amount": amount_cents})

        @oo.effect(tool="github.create_pr", idempotency_fields=["owner", "repo", "head"])
        def create_pr(owner: str, repo: str, head: str, title: str) -> dict[str, Any]:
            return self._body("github.create_pr", {"number": 101, "head": head})

        @oo.effect(tool="email.send", idempotency_key=lambda to, subject: f"{to}|{subject}")
        def send(to: str, subject: str) -> dict[str, Any]:
            key = current_effect().provider_key
            return self._body("email.send", {"message_id": f"<{key}@mail.example>"})

        @oo.effect(tool="acme.ship", idempotency_key=lambda parcel: parcel)
        def ship(parcel: str) -> dict[str, Any]:
            return self._body("acme.ship", {"tracking": f"trk_{parcel}"})

        self.charge, self.create_pr, self.send, self.ship = charge, create_pr, send, ship

    def _body(self, tool: str, receipt: dict[str, Any]) -> dict[str, Any]:
        ctx = current_effect()
        self.calls.append((tool, ctx.attempt))
        mode = self.script.pop(0) if self.script else "after"
        if mode != "before":
            self.provider[ctx.provider_key] = receipt
        if mode == "ok":
            return receipt
        raise TimeoutError("read timed out")

    def unknown(self, tool: str = "stripe.charge", *, mode: str = "after", **kwargs: Any) -> str:
        """Run one call of ``tool`` that times out; the id of the UNKNOWN effect."""
        self.script.append(mode)
        call = {
            "stripe.charge": lambda: self.charge(kwargs.get("order", "o1"), 500),
            "github.create_pr": lambda: self.create_pr(**{**PR, **kwargs}),
            "email.send": lambda: self.send("a@example.com", kwargs.get("subject", "hi")),
            "acme.ship": lambda: self.ship(kwargs.get("parcel", "p1")),
        }[tool]
        with self.oo.scope("run-1"), pytest.raises(OutcomeUnknownError) as info:
            call()
        effect = self.oo.get(info.value.effect_id)
        assert effect.state == S.UNKNOWN
        return effect.id

    def again(self, tool: str = "stripe.charge", **kwargs: Any) -> Any:
        """The identical call once more (a duplicate, or the retry after a re-arm)."""
        with self.oo.scope("run-1"):
            return {
                "stripe.charge": lambda: self.charge(kwargs.get("order", "o1"), 500),
                "github.create_pr": lambda: self.create_pr(**{**PR, **kwargs}),
                "email.send": lambda: self.send("a@example.com", kwargs.get("subject", "hi")),
                "acme.ship": lambda: self.ship(kwargs.get("parcel", "p1")),
            }[tool]()


class Lookup:
    """A well-behaved prober: HAPPENED with the provider's receipt, or NOT_HAPPENED,
    always bound to the effect's provider key."""

    def __init__(
        self, provider: dict[str, dict[str, Any]], gate: threading.Barrier | None = None
    ) -> None:
        self.provider = provider
        self.calls: list[str] = []
        self.gate = gate  # the first probe waits here, so racers start deciding together

    def probe(self, effect: Effect) -> ProbeResult:
        if self.gate is not None and not self.calls:
            self.gate.wait(10)
        self.calls.append(effect.id)
        receipt = self.provider.get(effect.provider_key)
        if receipt is not None:
            return ProbeResult(
                HAPPENED,
                receipt=receipt,
                detail="found at the provider by key",
                provider_reference=effect.provider_key,
            )
        return ProbeResult(
            NOT_HAPPENED, detail="no trace at the provider", provider_reference=effect.provider_key
        )


class Fixed:
    """A prober that always gives the same answer (or raises, or hangs)."""

    def __init__(
        self,
        outcome: Any = HAPPENED,
        *,
        receipt: Any = None,
        reference: Any = BOUND,
        detail: str = "",
        raises: BaseException | None = None,
        hang: threading.Event | None = None,
        returns: Any = BOUND,
    ) -> None:
        self.outcome, self.receipt, self.reference, self.detail = (
            outcome,
            receipt,
            reference,
            detail,
        )
        self.raises, self.hang, self.returns = raises, hang, returns
        self.calls: list[str] = []

    def probe(self, effect: Effect) -> Any:
        self.calls.append(effect.id)
        if self.hang is not None:
            self.hang.wait(10)
        if self.raises is not None:
            raise self.raises
        if self.returns is not BOUND:
            return self.returns
        reference = effect.provider_key if self.reference is BOUND else self.reference
        return ProbeResult(
            self.outcome, receipt=self.receipt, detail=self.detail, provider_reference=reference
        )


@pytest.fixture
def oo(store: Store, clock: FakeClock) -> OpenOnce:
    return OpenOnce(store, retry_delay=0, clock=clock)


@pytest.fixture
def world(oo: OpenOnce) -> World:
    return World(oo)


@pytest.fixture
def make_rec(oo: OpenOnce) -> Iterator[Callable[..., Reconciler]]:
    made: list[Reconciler] = []

    def make(target: Any = None, **options: Any) -> Reconciler:
        options.setdefault("grace_seconds", 0)
        options.setdefault("owner", OWNER)
        rec = Reconciler(target if target is not None else oo, **options)
        made.append(rec)
        return rec

    yield make
    for rec in made:
        rec.close()


def last(oo: OpenOnce, effect_id: str) -> Any:
    return oo.journal(effect_id)[-1]


def assert_escalated(oo: OpenOnce, effect_id: str, *fragments: str) -> Any:
    """In HUMAN_REVIEW through one reconciler journal line whose reason says why."""
    effect = oo.get(effect_id)
    assert effect.state == S.HUMAN_REVIEW
    assert effect.result is None
    assert effect.verification_status == "needs_human"
    line = last(oo, effect_id)
    assert (line.from_state, line.to_state, line.actor) == (S.UNKNOWN, S.HUMAN_REVIEW, ACTOR)
    for fragment in fragments:
        assert fragment in line.reason, line.reason
    return line


def resolution_lines(oo: OpenOnce, effect_id: str) -> list[Any]:
    return [
        j
        for j in oo.journal(effect_id)
        if j.from_state in (S.UNKNOWN, S.RECEIPT_RECORDED) and j.to_state in RESOLUTIONS
    ]


def probe_line(oo: OpenOnce, effect_id: str) -> Any:
    """The reconciler's decision line: for a commit the receipt line before its check."""
    journal = oo.journal(effect_id)
    if journal[-1].action == "check_receipt":
        assert journal[-2].to_state == S.RECEIPT_RECORDED
        assert (journal[-1].from_state, journal[-1].to_state) == (S.RECEIPT_RECORDED, S.COMMITTED)
        return journal[-2]
    return journal[-1]


# -- expired leases -----------------------------------------------------------------------


def test_expired_lease_becomes_unknown_is_not_decided_in_that_sweep_and_never_reruns(
    oo, make_rec, clock
):
    provider: dict[str, dict[str, Any]] = {}
    calls: list[int] = []
    release = threading.Event()
    entered = threading.Event()
    oo.keeper.close()  # the process hangs: nothing renews its lease

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order, lease_seconds=60)
    def charge(order: str) -> dict[str, Any]:
        ctx = current_effect()
        calls.append(ctx.attempt)
        provider[ctx.provider_key] = {"stripe_id": "pi_hung"}
        entered.set()
        release.wait(10)  # the process hangs (or died) after the provider recorded it
        raise TimeoutError("read timed out")

    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            charge("o1")
        except BaseException as exc:
            outcome["exc"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    try:
        miss = Fixed(NOT_HAPPENED)  # even a "miss" must not decide it in the expiry sweep
        sweeper = make_rec()
        sweeper.register("stripe.charge", miss)
        assert entered.wait(5)
        assert sweeper.due() == []  # the lease still runs
        clock.advance(61)
        [due] = sweeper.due()
        assert due.state == S.STARTED
        effect_id = due.id

        report = sweeper.run_once()
        assert report.expired == [effect_id]
        assert (report.committed, report.rearmed, report.escalated) == ([], [], [])
        assert miss.calls == []
        effect = oo.get(effect_id)
        assert effect.state == S.UNKNOWN
        assert effect.execution_status == "unknown"
        assert effect.lease_owner is None and effect.lease_expires_at is None
        line = last(oo, effect_id)
        assert (line.from_state, line.to_state, line.actor) == (S.STARTED, S.UNKNOWN, "openonce")
        assert "lease of attempt 1" in line.reason and "expired" in line.reason
        assert line.evidence["attempt"] == 1
        assert line.evidence["lease_expired_at"] == due.lease_expires_at

        # An identical call does not run the handler again: the outcome is unknown.
        with pytest.raises(OutcomeUnknownError):
            charge("o1")
        assert calls == [1]

        # The next sweep probes it, with evidence, and commits the provider's receipt.
        lookup = Lookup(provider)
        resolver = make_rec()
        resolver.register("stripe.charge", lookup)
        report = resolver.run_once()
        assert report.committed == [effect_id] and report.expired == []
        assert lookup.calls == [effect_id]
        assert charge("o1") == {"stripe_id": "pi_hung"}
        assert calls == [1]
    finally:
        release.set()
        worker.join(10)
    # The hung attempt wakes up to find its claim fenced off; the decision stands.
    assert isinstance(outcome.get("exc"), LeaseLostError)
    assert oo.get(effect_id).state == S.COMMITTED
    assert calls == [1]


def test_expire_leases_and_the_reconciler_agree_on_what_is_due(oo, make_rec, clock):
    release = threading.Event()
    entered = threading.Event()
    oo.keeper.close()  # the process hangs: nothing renews its lease

    @oo.effect(tool="acme.ship", idempotency_key=lambda parcel: parcel, lease_seconds=60)
    def ship(parcel: str) -> None:
        entered.set()
        release.wait(10)
        raise TimeoutError

    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            ship("p1")
        except BaseException as exc:
            outcome["exc"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    try:
        rec = make_rec()
        assert entered.wait(5)
        clock.advance(61)
        [due] = rec.due()
        assert oo.expire_leases() == [due.id]
        assert oo.get(due.id).state == S.UNKNOWN
        report = rec.run_once()  # nothing is expired twice; without a prober, a person decides
        assert report.expired == [] and report.escalated == [due.id]
        assert len([j for j in oo.journal(due.id) if j.to_state == S.UNKNOWN]) == 1
    finally:
        release.set()
        worker.join(10)
    assert isinstance(outcome.get("exc"), LeaseLostError)
    assert oo.get(due.id).state == S.HUMAN_REVIEW


# -- grace windows ------------------------------------------------------------------------


def test_unknown_inside_the_capability_grace_window_is_not_probed(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    lookup = Lookup(world.provider)
    rec = make_rec(grace_seconds=None)  # the capability's default: stripe 120 s
    rec.register("stripe.charge", lookup)
    assert rec.grace_for("stripe.charge") == 120

    report = rec.run_once()
    assert lookup.calls == []
    assert report.waiting == 1
    assert report.resolved == 0 and report.outcomes == {}
    assert rec.due() == []
    assert rec.reconcile_ids([effect_id]).resolved == 0
    assert lookup.calls == []
    assert world.oo.get(effect_id).state == S.UNKNOWN
    assert last(world.oo, effect_id).to_state == S.UNKNOWN  # no journal line was added


def test_unknown_past_an_overridden_grace_window_is_probed(world, make_rec, clock):
    effect_id = world.unknown("stripe.charge")
    lookup = Lookup(world.provider)
    rec = make_rec(grace_seconds=None, grace_overrides={"stripe.charge": 30})
    rec.register("stripe.charge", lookup)

    clock.advance(29)
    report = rec.run_once()
    assert lookup.calls == [] and report.waiting == 1 and report.resolved == 0
    clock.advance(1)
    report = rec.run_once()
    assert lookup.calls == [effect_id]
    assert report.committed == [effect_id] and report.waiting == 0
    assert world.oo.get(effect_id).state == S.COMMITTED


def test_a_capability_without_a_lag_window_is_probed_at_once(world, make_rec):
    # github_pr reads the primary store: default grace 0, no override needed.
    effect_id = world.unknown("github.create_pr", mode="before")
    lookup = Lookup(world.provider)
    rec = make_rec(grace_seconds=None)
    rec.register("github.create_pr", lookup)
    report = rec.run_once()
    assert lookup.calls == [effect_id]
    assert report.rearmed == [effect_id] and report.waiting == 0


# -- HAPPENED -----------------------------------------------------------------------------


def test_happened_with_a_bound_receipt_commits_and_duplicates_replay_it(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    receipt = {"stripe_id": "pi_o1", "amount": 500}
    assert world.provider[world.oo.get(effect_id).provider_key] == receipt
    lookup = Lookup(world.provider)
    rec = make_rec()
    rec.register("stripe.charge", lookup)

    report = rec.run_once()
    assert report.committed == [effect_id]
    assert report.outcomes == {"happened": 1}
    assert (report.expired, report.rearmed, report.escalated, report.lost_races) == (
        [],
        [],
        [],
        0,
    )
    effect = world.oo.get(effect_id)
    assert effect.state == S.COMMITTED
    assert effect.result == receipt
    assert effect.verification_status == "confirmed"
    assert effect.execution_status == "unknown"  # what the attempt itself saw, unchanged
    [observation] = effect.verification_evidence["observations"]
    assert observation["outcome"] == "happened" and observation["attempt"] == 1
    assert observation["receipt"] == receipt
    assert observation["provider_reference"] == effect.provider_key

    line = probe_line(world.oo, effect_id)
    assert (line.from_state, line.to_state, line.actor, line.action) == (
        S.UNKNOWN, S.RECEIPT_RECORDED, ACTOR, "probe_happened",
    )  # fmt: skip
    assert line.reason == "found at the provider by key"
    assert line.evidence["probe"] == "happened"
    assert line.evidence["observations"][0]["receipt"] == receipt

    assert world.again("stripe.charge") == receipt
    assert world.again("stripe.charge") == receipt
    assert world.calls == [("stripe.charge", 1)]
    assert rec.run_once().resolved == 0  # nothing left to do; no second commit
    assert [j.action for j in resolution_lines(world.oo, effect_id)] == [
        "probe_happened", "check_receipt",
    ]  # fmt: skip


def test_a_plain_function_prober_works_like_a_probe_object(world, make_rec):
    effect_id = world.unknown("acme.ship")

    def prober(effect: Effect) -> ProbeResult:
        return ProbeResult(
            HAPPENED, receipt={"tracking": "trk_p1"}, provider_reference=effect.provider_key
        )

    rec = make_rec()
    rec.register("acme.ship", prober)
    assert rec.run_once().committed == [effect_id]
    assert world.oo.get(effect_id).result == {"tracking": "trk_p1"}
    assert world.again("acme.ship") == {"tracking": "trk_p1"}
    assert world.calls == [("acme.ship", 1)]


@pytest.mark.parametrize(
    ("receipt", "reference", "fragment"),
    [
        ({}, BOUND, "happened without a usable receipt"),
        (None, BOUND, "happened without a usable receipt"),
        (["pi_o1"], BOUND, "happened without a usable receipt"),
        ("pi_o1", BOUND, "happened without a usable receipt"),
        ({"stripe_id": "pi_o1"}, None, "not bound to this effect"),
        ({"stripe_id": "pi_o1"}, "oo_" + "0" * 40, "not bound to this effect"),
    ],
    ids=["empty", "none", "list", "string", "no-reference", "foreign-reference"],
)
def test_happened_without_a_receipt_bound_to_this_effect_goes_to_a_person(
    world, make_rec, receipt, reference, fragment
):
    effect_id = world.unknown("stripe.charge")
    rec = make_rec()
    rec.register("stripe.charge", Fixed(HAPPENED, receipt=receipt, reference=reference))
    report = rec.run_once()
    assert report.escalated == [effect_id] and report.committed == []
    line = assert_escalated(world.oo, effect_id, "probe inconclusive", fragment)
    [observation] = line.evidence["observations"]
    assert observation["outcome"] == "inconclusive"
    with pytest.raises(OutcomeUnknownError):
        world.again("stripe.charge")
    assert world.calls == [("stripe.charge", 1)]


def test_a_receipt_naming_another_effect_never_commits_this_one(world, make_rec):
    mine = world.unknown("stripe.charge", order="o1")
    other = world.unknown("stripe.charge", order="o2")
    other_key = world.oo.get(other).provider_key

    # A search that ignored its filter: whatever it is asked, it answers with o2's charge.
    prober = Fixed(HAPPENED, receipt={"stripe_id": "pi_o2"}, reference=other_key)
    rec = make_rec()
    rec.register("stripe.charge", prober)
    report = rec.run_once()
    assert sorted(prober.calls) == sorted([mine, other])
    assert report.committed == [other]
    assert report.escalated == [mine]
    assert_escalated(world.oo, mine, "not bound to this effect", other_key)
    assert world.oo.get(other).result == {"stripe_id": "pi_o2"}


def test_a_miss_naming_another_reference_is_not_evidence_either(world, make_rec):
    effect_id = world.unknown("stripe.charge", mode="before")
    rec = make_rec()
    rec.register("stripe.charge", Fixed(NOT_HAPPENED, reference="oo_" + "1" * 40))
    assert rec.run_once().escalated == [effect_id]
    assert_escalated(world.oo, effect_id, "not_happened result named reference")


def test_a_receipt_that_breaks_the_receipt_contract_goes_to_a_person(world, make_rec):
    # github_pr: the receipt's head must equal the call's head arg.
    effect_id = world.unknown("github.create_pr")
    rec = make_rec()
    rec.register("github.create_pr", Fixed(HAPPENED, receipt={"number": 7, "head": "other"}))
    assert rec.run_once().escalated == [effect_id]
    assert_escalated(
        world.oo,
        effect_id,
        "receipt breaks the provider contract",
        "receipt field 'head' is 'other' but arg 'head' is 'fix-login'",
    )
    with pytest.raises(OutcomeUnknownError):
        world.again("github.create_pr")


def test_a_receipt_with_the_calls_head_commits(world, make_rec):
    effect_id = world.unknown("github.create_pr")
    rec = make_rec()
    rec.register("github.create_pr", Lookup(world.provider))
    assert rec.run_once().committed == [effect_id]
    assert world.oo.get(effect_id).result == {"number": 101, "head": "fix-login"}


def test_a_stripe_receipt_without_stripe_id_goes_to_a_person(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    rec = make_rec()
    rec.register("stripe.charge", Fixed(HAPPENED, receipt={"id": "pi_o1"}))
    assert rec.run_once().escalated == [effect_id]
    assert_escalated(world.oo, effect_id, "missing required field 'stripe_id'")


# -- NOT_HAPPENED -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "pin", "rearmed"),
    [
        ("stripe.charge", None, True),
        ("github.create_pr", None, True),
        ("email.send", None, False),  # ambiguous: email_smtp forbids re-arming on a miss
        ("email.send", "email_smtp", False),
        ("email.send", "email_provider_api", True),
        ("acme.ship", None, False),  # nothing known about the provider
    ],
)
def test_not_happened_rearms_only_where_the_capability_trusts_a_miss(
    world, make_rec, tool, pin, rearmed
):
    effect_id = world.unknown(tool, mode="before")
    assert world.provider == {}
    lookup = Lookup(world.provider)
    rec = make_rec()
    rec.register(tool, lookup, capability=pin)
    report = rec.run_once()
    assert lookup.calls == [effect_id]
    assert report.outcomes == {"not_happened": 1}
    if not rearmed:
        assert report.escalated == [effect_id] and report.rearmed == []
        assert_escalated(world.oo, effect_id, "a miss is not evidence here", tool)
        with pytest.raises(OutcomeUnknownError):
            world.again(tool)
        assert world.calls == [(tool, 1)]
        return
    assert report.rearmed == [effect_id] and report.escalated == []
    effect = world.oo.get(effect_id)
    assert effect.state == S.PLANNED
    assert effect.verification_status == "absent"
    line = last(world.oo, effect_id)
    assert (line.from_state, line.to_state, line.actor) == (S.UNKNOWN, S.PLANNED, ACTOR)
    assert line.evidence["probe"] == "not_happened"
    assert world.calls == [(tool, 1)]  # re-arming runs nothing by itself

    world.script.append("ok")
    receipt = world.again(tool)
    assert world.calls == [(tool, 1), (tool, 2)]
    effect = world.oo.get(effect_id)
    assert effect.state == S.COMMITTED and effect.attempt == 2 and effect.result == receipt


def test_a_pin_on_openonce_reaches_the_reconciler(store, make_rec):
    pinned = OpenOnce(
        store, retry_delay=0, provider_capabilities={"email.send": "email_provider_api"}
    )
    world = World(pinned)
    effect_id = world.unknown("email.send", mode="before")
    rec = make_rec(pinned)
    rec.register("email.send", Lookup(world.provider))
    assert rec.run_once().rearmed == [effect_id]


# -- probes that say nothing --------------------------------------------------------------


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.mark.parametrize(
    "case", ["inconclusive", "raises", "returns-str", "returns-dict", "str-outcome"]
)
def test_a_probe_that_says_nothing_goes_to_a_person_with_the_reason(world, make_rec, case):
    effect_id = world.unknown("stripe.charge")
    prober, fragment = {
        "inconclusive": (Fixed(INCONCLUSIVE, detail="index lags writes"), "index lags writes"),
        "raises": (Fixed(raises=RuntimeError("stripe down")), "RuntimeError: stripe down"),
        "returns-str": (Fixed(returns="happened"), "prober returned str, not a ProbeResult"),
        "returns-dict": (Fixed(returns={"outcome": "happened"}), "prober returned dict"),
        "str-outcome": (
            Fixed(returns=ProbeResult("happened", receipt={"stripe_id": "pi_o1"})),
            "not a ProbeResult",
        ),
    }[case]
    rec = make_rec()
    rec.register("stripe.charge", prober)
    report = rec.run_once()
    assert prober.calls == [effect_id]
    assert report.escalated == [effect_id] and report.committed == report.rearmed == []
    line = assert_escalated(world.oo, effect_id, "probe inconclusive", fragment)
    [observation] = line.evidence["observations"]
    assert observation["outcome"] == "inconclusive" and fragment in observation["detail"]
    assert "stripe" in line.evidence["guidance"]
    assert world.oo.get(effect_id).verification_evidence["observations"] == [observation]
    with pytest.raises(OutcomeUnknownError):
        world.again("stripe.charge")
    assert world.calls == [("stripe.charge", 1)]


def test_a_probe_that_hangs_past_the_timeout_is_asked_again_later(world, make_rec, hang):
    # A slow provider is not an answer: the sweep gives up on the probe at the timeout,
    # the effect stays UNKNOWN for a later sweep, and nobody is paged.
    effect_id = world.unknown("stripe.charge")
    prober = Fixed(hang=hang)  # waits until the test ends (10 s at most)
    rec = make_rec(probe_timeout=0.2)
    rec.register("stripe.charge", prober)
    started = time.monotonic()
    report = rec.run_once()
    assert time.monotonic() - started < 5  # gave up at 0.2 s, not when the prober returned
    assert prober.calls == [effect_id]
    assert report.retried == [effect_id] and report.escalated == report.committed == []
    assert world.oo.get(effect_id).state == "unknown"
    line = world.oo.journal(effect_id)[-1]
    assert line.action == "reprobe"
    assert "probe timed out after 0.2s" in line.reason
    with pytest.raises(OutcomeUnknownError):
        world.again("stripe.charge")
    assert world.calls == [("stripe.charge", 1)]


def test_a_prober_raising_cancelled_error_goes_to_a_person_and_the_sweep_goes_on(world, make_rec):
    # An asyncio-based prober whose task was cancelled raises CancelledError, a
    # BaseException. It is still "a prober that raised": no observation of the effect.
    # It must not abort the sweep (nor kill a --watch daemon) with the rest undecided.
    first = world.unknown("stripe.charge", order="o1")
    second = world.unknown("stripe.charge", order="o2")
    prober = Fixed(raises=asyncio.CancelledError("probe task cancelled"))
    rec = make_rec()
    rec.register("stripe.charge", prober)
    report = rec.run_once()
    assert sorted(prober.calls) == sorted([first, second])  # both asked, in any order
    assert sorted(report.escalated) == sorted([first, second])
    for effect_id in (first, second):
        assert_escalated(world.oo, effect_id, "prober raised CancelledError")


def test_two_probers_that_disagree_send_every_observation_to_a_person(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    yes = Fixed(HAPPENED, receipt={"stripe_id": "pi_o1"}, detail="found by metadata")
    no = Fixed(NOT_HAPPENED, detail="not found by key")
    rec = make_rec()
    rec.register("stripe.charge", yes)
    rec.register("stripe.charge", no)
    report = rec.run_once()
    assert yes.calls == no.calls == [effect_id]
    assert report.escalated == [effect_id]
    assert report.outcomes == {"happened": 1, "not_happened": 1}
    line = assert_escalated(world.oo, effect_id, "contradictory observations")
    observations = line.evidence["observations"]
    assert [(o["outcome"], o["detail"]) for o in observations] == [
        ("happened", "found by metadata"),
        ("not_happened", "not found by key"),
    ]
    assert observations[0]["receipt"] == {"stripe_id": "pi_o1"}
    effect = world.oo.get(effect_id)
    assert effect.verification_evidence["observations"] == observations


def test_two_probers_that_agree_commit(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    rec = make_rec()
    rec.register("stripe.charge", Lookup(world.provider))
    rec.register("stripe.charge", Lookup(world.provider))
    assert rec.run_once().committed == [effect_id]
    assert len(world.oo.get(effect_id).verification_evidence["observations"]) == 2


# -- no prober, fail-closed modes ---------------------------------------------------------


@pytest.mark.parametrize("tool", ["stripe.charge", "email.send", "acme.ship"])
def test_without_a_prober_a_person_gets_the_capability_guidance(world, make_rec, tool):
    effect_id = world.unknown(tool)
    rec = make_rec()
    rec.register("github.create_pr", Lookup(world.provider))  # a prober, for another tool
    report = rec.run_once()
    assert report.escalated == [effect_id] and report.outcomes == {}
    line = assert_escalated(world.oo, effect_id, f"no prober registered for {tool}")
    guidance = line.evidence["guidance"]
    capabilities = CapabilityMatrix().for_tool(tool)
    if capabilities:
        assert guidance == "\n\n".join(c.guidance() for c in capabilities)
    if tool == "stripe.charge":
        assert "pass current_effect().provider_key as Stripe Idempotency-Key" in guidance
        assert (
            "miss semantics: inconclusive inside the index lag window, then not-happened"
            in guidance
        )
        assert "missing prober: register StripeProber for this tool" in guidance
        assert "required receipt fields: stripe_id" in guidance
    elif tool == "email.send":
        assert "provider capability email_provider_api" in guidance
        assert "provider capability email_smtp" in guidance
        assert "a miss is not evidence: never re-arm without a person's decision" in guidance
    else:
        assert "no provider capability is known for acme.ship" in guidance
        assert "resolve-happened" in guidance
    assert world.calls == [(tool, 1)]


def test_require_provider_capability_fails_closed_for_an_unknown_tool(world, make_rec):
    strict_id = world.unknown("acme.ship", parcel="p1")
    loose_id = world.unknown("acme.ship", parcel="p2")
    says_yes = Fixed(HAPPENED, receipt={"tracking": "trk"})

    strict = make_rec(require_provider_capability=True)
    strict.register("acme.ship", says_yes)
    report = strict.reconcile_ids([strict_id])
    assert report.escalated == [strict_id] and report.committed == []
    assert_escalated(world.oo, strict_id, "no reviewed provider capability for acme.ship")

    loose = make_rec()
    loose.register("acme.ship", says_yes)
    assert loose.run_once().committed == [loose_id]


def test_require_provider_capability_lets_a_known_tool_through(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    rec = make_rec(require_provider_capability=True)
    rec.register("stripe.charge", Lookup(world.provider))
    assert rec.run_once().committed == [effect_id]


def test_require_conformance_without_evidence_goes_to_a_person(world, make_rec):
    effect_id = world.unknown("stripe.charge")
    rec = make_rec(require_conformance=True)
    rec.register("stripe.charge", Lookup(world.provider))
    assert rec.run_once().escalated == [effect_id]
    assert_escalated(world.oo, effect_id, "conformance evidence missing", "no conformance evidence")


def test_require_conformance_uses_the_gate(world, make_rec):
    failing_id = world.unknown("stripe.charge", order="o1")
    passing_id = world.unknown("stripe.charge", order="o2")
    seen: list[str] = []

    def failing(capability: Any) -> list[str]:
        seen.append(capability.name)
        return [f"{capability.name}: evidence is stale"]

    rec = make_rec(require_conformance=True, conformance=failing)
    rec.register("stripe.charge", Lookup(world.provider))
    rec.reconcile_ids([failing_id])
    assert seen == ["stripe"]
    assert_escalated(world.oo, failing_id, "conformance evidence missing", "evidence is stale")

    rec = make_rec(require_conformance=True, conformance=lambda capability: [])
    rec.register("stripe.charge", Lookup(world.provider))
    assert rec.run_once().committed == [passing_id]


# -- evidence across attempts -------------------------------------------------------------


def test_observations_accumulate_across_attempts(world, make_rec):
    oo = world.oo
    effect_id = world.unknown("stripe.charge", mode="before")
    first = make_rec()
    first.register("stripe.charge", Fixed(INCONCLUSIVE, detail="index lags writes"))
    assert first.run_once().escalated == [effect_id]

    oo.resolve_not_happened(effect_id, by="eric", reason="not in the dashboard")
    assert oo.get(effect_id).state == S.PLANNED
    world.script.append("after")
    with pytest.raises(OutcomeUnknownError):
        world.again("stripe.charge")
    assert oo.get(effect_id).attempt == 2

    second = make_rec()
    second.register("stripe.charge", Lookup(world.provider))
    assert second.run_once().committed == [effect_id]
    effect = oo.get(effect_id)
    observations = effect.verification_evidence["observations"]
    assert [(o["attempt"], o["outcome"]) for o in observations] == [
        (1, "inconclusive"),
        (2, "happened"),
    ]
    assert observations[0]["detail"] == "index lags writes"
    assert effect.result == {"stripe_id": "pi_o1", "amount": 500}
    assert world.calls == [("stripe.charge", 1), ("stripe.charge", 2)]
    # one escalation (attempt 1), one commit (attempt 2: the receipt and its check)
    assert [j.action for j in resolution_lines(oo, effect_id)] == [
        "escalate", "probe_happened", "check_receipt",
    ]  # fmt: skip


# -- racing reconcilers -------------------------------------------------------------------


def _second_store(store: Store, request: pytest.FixtureRequest) -> Store:
    if store.dialect == "sqlite":
        assert isinstance(store, SQLiteStore)
        return SQLiteStore(store.path)
    if getattr(store, "dialect", "") == "postgres":
        from openonce_core.stores.postgres import PostgresStore

        return PostgresStore(request.getfixturevalue("pg_dsn"), max_size=4)
    return store  # in memory: the same store is the only shared ledger there is


def test_two_reconcilers_racing_resolve_every_effect_exactly_once(store, world, make_rec, request):
    count = 500
    ids = [world.unknown("stripe.charge", order=f"o{i}") for i in range(count)]
    other = _second_store(store, request)
    try:
        owners = ["a", "b"]
        targets = [world.oo, OpenOnce(other, retry_delay=0, clock=world.oo.clock)]
        gate = threading.Barrier(2)
        probers = [Lookup(world.provider, gate), Lookup(world.provider, gate)]
        recs = [make_rec(t, owner=o) for t, o in zip(targets, owners, strict=True)]
        for rec, prober in zip(recs, probers, strict=True):
            rec.register("stripe.charge", prober)
        reports: list[ReconcileReport | None] = [None, None]
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def sweep(i: int) -> None:
            try:
                barrier.wait(10)
                reports[i] = recs[i].run_once(limit=count)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=sweep, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        # Both sweeps finished (none is stuck at the gate); how fast is bench/'s question.
        assert not any(t.is_alive() for t in threads)
        a, b = reports
        assert a is not None and b is not None
        assert sorted(a.committed + b.committed) == sorted(ids)
        assert not set(a.committed) & set(b.committed)
        assert a.escalated == b.escalated == a.rearmed == b.rearmed == []
        for report, prober in zip((a, b), probers, strict=True):
            # a reconciler claims an effect before probing it: it probes only what it
            # resolves, and the provider is never asked twice about one effect
            assert report.resolved == len(prober.calls)
        assert a.resolved + b.resolved == count
        # both read (nearly) all 500 before either decided one; an effect the other had
        # already claimed when a reconciler listed the due ones is not even raced for
        assert count - 10 <= a.lost_races + b.lost_races <= count
        assert len(probers[0].calls) + len(probers[1].calls) == count

        committed_by = {eid: "reconciler:a" for eid in a.committed}
        committed_by.update({eid: "reconciler:b" for eid in b.committed})
        for effect_id in ids:
            effect = world.oo.get(effect_id)
            assert effect.state == S.COMMITTED
            assert effect.result["stripe_id"] == effect.args["order"].replace("o", "pi_o", 1)
            [line, verdict] = resolution_lines(world.oo, effect_id)
            assert line.to_state == S.RECEIPT_RECORDED and line.actor == committed_by[effect_id]
            assert verdict.to_state == S.COMMITTED
        assert world.calls == [("stripe.charge", 1)] * count
        for rec in recs:
            assert rec.run_once().resolved == 0
    finally:
        if other is not store:
            other.close()


def test_a_sweep_leaves_decided_and_unstarted_effects_alone(world, make_rec):
    oo = world.oo
    escalated = world.unknown("stripe.charge", order="o1")
    first = make_rec()
    first.register("stripe.charge", Fixed(INCONCLUSIVE, detail="index lags writes"))
    assert first.run_once().escalated == [escalated]
    rearmed = world.unknown("stripe.charge", order="o2")
    oo.resolve_not_happened(rearmed, by="eric", reason="not in the dashboard")
    world.script.append("ok")
    with oo.scope("run-1"):
        world.charge("o3", 500)
    committed = oo.store.find("stripe.charge", "o3")
    assert committed is not None
    journals = {i: len(oo.journal(i)) for i in (escalated, rearmed, committed.id)}

    says_yes = Fixed(HAPPENED, receipt={"stripe_id": "pi_x"})
    rec = make_rec()
    rec.register("stripe.charge", says_yes)
    for _ in range(3):
        report = rec.run_once()
        assert report.resolved == 0 and report.expired == [] and report.waiting == 0
    assert says_yes.calls == []
    assert [oo.get(i).state for i in journals] == [S.HUMAN_REVIEW, S.PLANNED, S.COMMITTED]
    assert {i: len(oo.journal(i)) for i in journals} == journals


# -- reconcile_ids ------------------------------------------------------------------------


def test_reconcile_ids_ignores_resolved_unknown_and_young_ids(world, make_rec):
    oo = world.oo
    done_id = world.unknown("stripe.charge", order="o1")
    young_id = world.unknown("email.send")  # capability grace 120 s
    due_id = world.unknown("stripe.charge", order="o2")
    lookup = Lookup(world.provider)
    rec = make_rec(grace_seconds=None, grace_overrides={"stripe.charge": 0})
    rec.register("stripe.charge", lookup)
    rec.register("email.send", lookup, capability="email_provider_api")
    assert rec.reconcile_ids([done_id]).committed == [done_id]
    journal_before = {i: len(oo.journal(i)) for i in (done_id, young_id)}
    calls_before = list(lookup.calls)

    report = rec.reconcile_ids([done_id, "eff_does_not_exist", young_id, done_id])
    assert report.to_json() == ReconcileReport().to_json()
    assert lookup.calls == calls_before
    assert oo.get(done_id).state == S.COMMITTED
    assert oo.get(young_id).state == S.UNKNOWN
    assert {i: len(oo.journal(i)) for i in (done_id, young_id)} == journal_before

    # A task delivered twice: the second delivery is a no-op.
    assert rec.reconcile_ids([due_id]).committed == [due_id]
    assert rec.reconcile_ids([due_id]).resolved == 0
    assert [j.action for j in resolution_lines(oo, due_id)] == ["probe_happened", "check_receipt"]


# -- a person's decision with provider contracts ------------------------------------------


def test_resolve_happened_can_require_the_receipt_contract(world):
    oo = world.oo
    effect_id = world.unknown("stripe.charge")
    before = oo.get(effect_id)
    journal = oo.journal(effect_id)
    with pytest.raises(InvalidReceiptError, match="stripe_id"):
        oo.resolve_happened(
            effect_id, receipt={"id": "pi_o1"}, by="eric", require_receipt_contract=True
        )
    after = oo.get(effect_id)
    assert after.state == S.UNKNOWN and after.fence == before.fence and after.result is None
    assert oo.journal(effect_id) == journal

    effect = oo.resolve_happened(
        effect_id, receipt={"stripe_id": "pi_o1"}, by="eric", require_receipt_contract=True
    )
    assert effect.state == S.COMMITTED
    assert effect.verification_status == "confirmed_by_person"
    assert world.again("stripe.charge") == {"stripe_id": "pi_o1"}
    assert world.calls == [("stripe.charge", 1)]


def test_resolve_not_happened_can_require_auto_rearm(world):
    oo = world.oo
    email_id = world.unknown("email.send", mode="before")
    with pytest.raises(ProviderContractError, match="not safe to re-arm"):
        oo.resolve_not_happened(
            email_id, by="eric", reason="not in the sent folder", require_auto_rearm=True
        )
    assert oo.get(email_id).state == S.UNKNOWN
    assert last(oo, email_id).to_state == S.UNKNOWN

    charge_id = world.unknown("stripe.charge", mode="before")
    effect = oo.resolve_not_happened(
        charge_id, by="eric", reason="not in the dashboard", require_auto_rearm=True
    )
    assert effect.state == S.PLANNED
    line = last(oo, charge_id)
    assert (line.actor, line.reason) == ("operator:eric", "not in the dashboard")


def test_effects_waiting_in_grace_do_not_starve_a_due_one(world, make_rec):
    # Three email.send effects sit in their 120 s grace window; a github.create_pr effect
    # (grace 0) timed out after them. A sweep of three must still find the one that is due.
    for subject in ("a", "b", "c"):
        world.unknown("email.send", subject=subject)
    pr_id = world.unknown("github.create_pr", mode="before")
    lookup = Lookup(world.provider)
    rec = make_rec(grace_seconds=None)
    rec.register("email.send", lookup)
    rec.register("github.create_pr", lookup)
    assert [e.id for e in rec.due(limit=3)] == [pr_id]
    report = rec.run_once(limit=3)
    assert report.rearmed == [pr_id]
    assert report.waiting == 3
    assert lookup.calls == [pr_id]
