"""A payment whose reply is lost after the provider committed it, and the safety suite
around it.

A naive retry loop charges the customer twice. OpenOnce parks the charge as UNKNOWN, makes
no second call, and the reconciler's read-only probe finds the charge and commits its
receipt. The suite below runs that and eleven more scenarios against a fake provider with
injected faults; every verdict is computed from what happened (provider counters, effect
states, the journal), each scenario on a fresh in-memory ledger.

    openonce test examples/payment_timeout_after_commit.py [--json]
    python examples/payment_timeout_after_commit.py
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any

from openonce_core import (
    Effect,
    EffectState,
    IdempotencyMismatchError,
    OpenOnce,
    OutcomeUnknownError,
    ProbeResult,
    Reconciler,
    ReconcileReport,
    current_effect,
)
from openonce_core.testing import (
    ChargeDeclined,
    ChargeFault,
    FakeClock,
    FakePaymentProber,
    FakePaymentProvider,
    NaiveRetryComparison,
    SafetyCheck,
    SafetyReport,
    fake_payment_capability,
    stop_heartbeat,
)

TOOL = "charge_customer"
ORDER: dict[str, Any] = {
    "order_id": "order-123",
    "customer_id": "customer_123",
    "amount_cents": 2_500,
}

Fact = tuple[str, Any, Any]  # (what, observed, expected)


class Run:
    """One scenario's world: a fresh ledger, a fresh fake provider, the charge tool."""

    def __init__(
        self,
        *faults: ChargeFault,
        max_attempts: int = 3,
        lease_seconds: float = 300.0,
        after_commit: Callable[[], object] | None = None,
        clock: FakeClock | None = None,
        **provider_options: Any,
    ) -> None:
        self.provider = FakePaymentProvider(faults, **provider_options)
        self.oo = OpenOnce(
            ":memory:",
            retry_delay=0,
            max_attempts=max_attempts,
            lease_seconds=lease_seconds,
            clock=clock,
        )
        self._reconcilers: list[Reconciler] = []
        provider = self.provider

        @self.oo.effect(tool=TOOL, idempotency_key=lambda order_id, **_: order_id)
        def charge_customer(order_id: str, customer_id: str, amount_cents: int) -> dict[str, Any]:
            # The provider key is stable across attempts: the provider dedups a re-sent
            # charge, and the prober finds the charge by it.
            charge = provider.charge(
                customer_id=customer_id,
                amount_cents=amount_cents,
                client_reference=current_effect().provider_key,
            )
            if after_commit is not None:
                after_commit()
            return charge.receipt()

        self.charge = charge_customer

    def attempt(self, **changes: Any) -> Any:
        """Call the tool as an agent would; return its result or the exception it raised."""
        try:
            return self.charge(**{**ORDER, **changes})
        except Exception as exc:
            return exc

    def effect(self) -> Effect:
        effect = self.oo.store.find(TOOL, ORDER["order_id"])
        assert effect is not None, "no effect was recorded"
        return effect

    def reconcile(self, *, grace_seconds: float = 0.0, prober: Any = None) -> ReconcileReport:
        rec = Reconciler(
            self.oo,
            grace_seconds=grace_seconds,
            extra_capabilities=[fake_payment_capability(TOOL)],
        )
        self._reconcilers.append(rec)
        rec.register(TOOL, prober if prober is not None else FakePaymentProber(self.provider))
        return rec.run_once()

    def journal_reasons(self) -> list[str]:
        return [entry.reason for entry in self.oo.journal(self.effect().id)]

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        for rec in self._reconcilers:
            rec.close()
        self.oo.close()


def kind(outcome: Any) -> str:
    """What a call ended with: the exception class's name, or "returned"."""
    return type(outcome).__name__ if isinstance(outcome, BaseException) else "returned"


def show(value: Any) -> str:
    return value.value if isinstance(value, Enum) else repr(value)


def verdict(name: str, facts: list[Fact]) -> SafetyCheck:
    """PASS only if every observed fact is what a safe run must produce."""
    wrong = [
        f"{what}: expected {show(want)}, observed {show(got)}"
        for what, got, want in facts
        if got != want
    ]
    if wrong:
        return SafetyCheck(name, False, "\n".join(wrong))
    return SafetyCheck(name, True, "; ".join(f"{what}={show(got)}" for what, got, _ in facts))


# -- the scenarios ------------------------------------------------------------------------


def normal_success() -> list[Fact]:
    with Run() as run:
        outcome = run.attempt()
        effect = run.effect()
        return [
            ("call", kind(outcome), "returned"),
            (
                "receipt is the provider's charge",
                outcome == run.provider.charges[0].receipt(),
                True,
            ),
            ("state", effect.state, EffectState.COMMITTED),
            ("provider calls", run.provider.charge_calls, 1),
            ("charges", len(run.provider.charges), 1),
        ]


def explicit_pre_side_effect_failure() -> list[Fact]:
    with Run(ChargeFault.FAIL_BEFORE_COMMIT) as run:
        first = run.attempt()
        again = run.attempt()  # an answered "no" is recorded and replayed, not re-sent
        effect = run.effect()
        return [
            ("call", kind(first), "ChargeDeclined"),
            ("state", effect.state, EffectState.FAILED),
            ("execution", effect.execution_status, "failed"),
            ("charges", len(run.provider.charges), 0),
            ("repeat replays the failure", isinstance(again, ChargeDeclined), True),
            ("provider calls", run.provider.charge_calls, 1),
        ]


def replay_safety() -> list[Fact]:
    with Run() as run:
        first = run.attempt()
        replays = [run.attempt() for _ in range(3)]
        return [
            ("replays equal the first receipt", all(r == first for r in replays), True),
            ("replays counted", run.oo.stats["replayed"], 3),
            ("provider calls", run.provider.charge_calls, 1),
            ("charges", len(run.provider.charges), 1),
        ]


def concurrent_duplicate_safety() -> list[Fact]:
    callers = 8
    # The charge takes a while, so the duplicates arrive while the first one is in flight.
    with Run(latency_seconds=0.05) as run:
        barrier = threading.Barrier(callers)

        def agent() -> Any:
            barrier.wait(timeout=10)
            return run.attempt()

        with ThreadPoolExecutor(callers) as pool:
            outcomes = list(pool.map(lambda _: agent(), range(callers)))
        return [
            ("callers that got a receipt", sum(kind(o) == "returned" for o in outcomes), callers),
            ("distinct receipts", len({repr(o) for o in outcomes}), 1),
            ("handler runs", run.oo.stats["executed"], 1),
            ("provider calls", run.provider.charge_calls, 1),
            ("charges", len(run.provider.charges), 1),
        ]


def same_key_body_conflict() -> list[Fact]:
    with Run() as run:
        first = run.attempt()
        conflict = run.attempt(amount_cents=9_900)  # same order id, different body
        return [
            ("conflicting call", kind(conflict), IdempotencyMismatchError.__name__),
            ("recorded amount", run.effect().args["amount_cents"], 2_500),
            ("original still replays", run.attempt() == first, True),
            ("provider calls", run.provider.charge_calls, 1),
            ("charged cents", run.provider.total_cents, 2_500),
        ]


def timeout_before_commit_recovery() -> list[Fact]:
    with Run(ChargeFault.TIMEOUT_BEFORE_COMMIT) as run:
        first = run.attempt()
        parked = run.effect().state
        blocked = run.attempt()  # UNKNOWN is never retried by the caller
        report = run.reconcile()
        rearmed = run.effect()
        retried = run.attempt()  # the probe proved it absent: the same call runs again
        effect = run.effect()
        return [
            ("first call", kind(first), OutcomeUnknownError.__name__),
            ("parked as", parked, EffectState.UNKNOWN),
            ("repeat before reconcile", kind(blocked), OutcomeUnknownError.__name__),
            ("reconciler re-armed it", report.rearmed == [effect.id], True),
            ("verification", rearmed.verification_status, "absent"),
            ("retry", kind(retried), "returned"),
            ("final state", effect.state, EffectState.COMMITTED),
            ("attempts", effect.attempt, 2),
            ("provider calls", run.provider.charge_calls, 2),
            ("charges", len(run.provider.charges), 1),
        ]


def _timeout_after_commit(run: Run) -> tuple[Any, Any, ReconcileReport]:
    first = run.attempt()
    blocked = run.attempt()
    return first, blocked, run.reconcile()


def timeout_after_commit_recovery() -> list[Fact]:
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT) as run:
        first, blocked, report = _timeout_after_commit(run)
        effect = run.effect()
        replay = run.attempt()
        charge = run.provider.charges[0] if run.provider.charges else None
        return [
            ("first call", kind(first), OutcomeUnknownError.__name__),
            ("repeat before reconcile", kind(blocked), OutcomeUnknownError.__name__),
            ("reconciler committed it", report.committed == [effect.id], True),
            ("execution", effect.execution_status, "unknown"),
            ("verification", effect.verification_status, "confirmed"),
            ("final", effect.state, EffectState.COMMITTED),
            ("receipt is the charge", effect.result == (charge and charge.receipt()), True),
            ("replay after reconcile", replay == effect.result, True),
            ("provider calls", run.provider.charge_calls, 1),
            ("charges", len(run.provider.charges), 1),
        ]


def unknown_auto_retry_protection() -> list[Fact]:
    facts: list[Fact] = []
    # A lost reply with attempts to spare: it may have happened, so nothing retries it.
    with Run(ChargeFault.LOST_REPLY, max_attempts=5) as run:
        outcomes = [run.attempt() for _ in range(3)]
        run.oo.expire_leases()
        effect = run.effect()
        facts += [
            ("lost reply: calls", [kind(o) for o in outcomes], [OutcomeUnknownError.__name__] * 3),
            ("lost reply: state", effect.state, EffectState.UNKNOWN),
            ("lost reply: attempts", effect.attempt, 1),
            ("lost reply: provider calls", run.provider.charge_calls, 1),
        ]
        # No prober for the tool: a person decides, the reconciler never re-runs it.
        rec = Reconciler(run.oo, grace_seconds=0)
        try:
            report = rec.run_once()
        finally:
            rec.close()
        facts += [
            ("no prober: escalated", report.escalated == [effect.id], True),
            ("no prober: provider calls", run.provider.charge_calls, 1),
        ]
    # A worker is stopped after the provider committed, past its lease: the lease expiring
    # is not a licence to run the charge again.
    release, committed = threading.Event(), threading.Event()
    clock = FakeClock()

    def stopped_after_commit() -> None:
        committed.set()
        release.wait(10)

    with Run(lease_seconds=300.0, after_commit=stopped_after_commit, clock=clock) as run:
        holder: list[Any] = []
        worker = threading.Thread(target=lambda: holder.append(run.attempt()))
        worker.start()
        committed.wait(10)
        stop_heartbeat(run.oo)  # stopped: nothing renews its lease any more
        clock.advance(301)
        duplicate = run.attempt()  # finds the lease expired: UNKNOWN, not a second charge
        state_after_expiry = run.effect().state
        release.set()
        worker.join(10)
        effect = run.effect()
        facts += [
            ("expired lease: duplicate", kind(duplicate), OutcomeUnknownError.__name__),
            ("expired lease: state", state_after_expiry, EffectState.UNKNOWN),
            ("expired lease: provider calls", run.provider.charge_calls, 1),
            ("late reply commits", effect.state, EffectState.COMMITTED),
            ("late reply: verification", effect.verification_status, "late_receipt"),
            ("expired lease: charges", len(run.provider.charges), 1),
        ]
    return facts


def verifier_unavailable_handling() -> list[Fact]:
    facts: list[Fact] = []
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT, lookup_outage=True) as run:
        run.attempt()
        report = run.reconcile()
        effect = run.effect()
        observations = (effect.verification_evidence or {}).get("observations", [])
        facts += [
            ("outage: escalated", report.escalated == [effect.id], True),
            ("outage: state", effect.state, EffectState.HUMAN_REVIEW),
            ("outage: observed", [o["outcome"] for o in observations], ["inconclusive"]),
            ("outage: no receipt", effect.result, None),
            ("outage: repeat", kind(run.attempt()), OutcomeUnknownError.__name__),
            ("outage: provider calls", run.provider.charge_calls, 1),
        ]

    def raising_prober(effect: Effect) -> ProbeResult:
        raise ConnectionRefusedError("verifier endpoint refused the connection")

    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT) as run:
        run.attempt()
        report = run.reconcile(prober=raising_prober)
        effect = run.effect()
        facts += [
            ("prober raised: state", effect.state, EffectState.HUMAN_REVIEW),
            (
                "prober raised: journaled",
                any("prober raised" in r for r in run.journal_reasons()),
                True,
            ),
            ("prober raised: provider calls", run.provider.charge_calls, 1),
        ]
    return facts


def unhealthy_false_negative_handling() -> list[Fact]:
    facts: list[Fact] = []
    # The charge committed, but the search index has not caught up: the search misses.
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT, index_lag_lookups=3) as run:
        run.attempt()
        report = run.reconcile()
        effect = run.effect()
        facts += [
            ("lagging index: re-armed", len(report.rearmed), 0),
            ("lagging index: state", effect.state, EffectState.HUMAN_REVIEW),
            ("lagging index: repeat", kind(run.attempt()), OutcomeUnknownError.__name__),
            ("lagging index: provider calls", run.provider.charge_calls, 1),
            ("lagging index: charges", len(run.provider.charges), 1),
        ]
    # Inside the grace window the reconciler does not even ask.
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT, index_lag_seconds=60) as run:
        run.attempt()
        report = run.reconcile(grace_seconds=60)
        facts += [
            ("inside grace: waiting", report.waiting, 1),
            ("inside grace: searches", run.provider.search_calls, 0),
            ("inside grace: state", run.effect().state, EffectState.UNKNOWN),
        ]
    return facts


def wrong_verification_identity() -> list[Fact]:
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT, wrong_identity=True) as run:
        run.attempt()
        report = run.reconcile()
        effect = run.effect()
        return [
            ("probe outcomes", report.outcomes, {"inconclusive": 1}),
            ("committed", len(report.committed), 0),
            ("state", effect.state, EffectState.HUMAN_REVIEW),
            ("another charge's receipt kept out", effect.result, None),
            ("journal says why", any("not bound" in r for r in run.journal_reasons()), True),
            ("provider calls", run.provider.charge_calls, 1),
        ]


def unknown_evidence_erasure() -> list[Fact]:
    facts: list[Fact] = []
    # The provider would decline a second attempt; if one ran, its FAILED would overwrite
    # the first attempt's UNKNOWN although that charge exists.
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT, ChargeFault.FAIL_BEFORE_COMMIT) as run:
        run.attempt()
        second = run.attempt()
        effect = run.effect()
        facts += [
            ("later attempt", kind(second), OutcomeUnknownError.__name__),
            ("still", effect.state, EffectState.UNKNOWN),
            ("attempts", effect.attempt, 1),
            ("provider calls", run.provider.charge_calls, 1),
        ]
    # Attempt 1 proven absent and re-armed, attempt 2 times out after committing: the
    # evidence of both attempts stays on the effect.
    with Run(ChargeFault.TIMEOUT_BEFORE_COMMIT, ChargeFault.TIMEOUT_AFTER_COMMIT) as run:
        run.attempt()
        run.reconcile()
        run.attempt()
        run.reconcile()
        effect = run.effect()
        observations = (effect.verification_evidence or {}).get("observations", [])
        facts += [
            ("two attempts: final", effect.state, EffectState.COMMITTED),
            (
                "observations kept",
                [(o["attempt"], o["outcome"]) for o in observations],
                [(1, "not_happened"), (2, "happened")],
            ),
            ("two attempts: charges", len(run.provider.charges), 1),
        ]
    # A person re-arms after an inconclusive probe; the next attempt's resolution does not
    # remove the first attempt's observation from the audit trail.
    with Run(
        ChargeFault.TIMEOUT_BEFORE_COMMIT, ChargeFault.TIMEOUT_AFTER_COMMIT, lookup_outage=True
    ) as run:
        run.attempt()
        run.reconcile()
        run.oo.resolve_not_happened(run.effect().id, by="ops", reason="not in the dashboard")
        run.provider.lookup_outage = False
        run.attempt()
        run.reconcile()
        effect = run.effect()
        journaled = [
            (o["attempt"], o["outcome"])
            for entry in run.oo.journal(effect.id)
            for o in (entry.evidence or {}).get("observations", [])
        ]
        facts += [
            ("after a person's re-arm: final", effect.state, EffectState.COMMITTED),
            ("journaled observations", journaled, [(1, "inconclusive"), (2, "happened")]),
            ("after a person's re-arm: charges", len(run.provider.charges), 1),
        ]
    return facts


SCENARIOS: list[tuple[str, Callable[[], list[Fact]]]] = [
    ("Normal success", normal_success),
    ("Explicit pre-side-effect failure", explicit_pre_side_effect_failure),
    ("Replay safety", replay_safety),
    ("Concurrent duplicate safety", concurrent_duplicate_safety),
    ("Same-key/body conflict", same_key_body_conflict),
    ("Timeout-before-commit recovery", timeout_before_commit_recovery),
    ("Timeout-after-commit recovery", timeout_after_commit_recovery),
    ("Unknown auto-retry protection", unknown_auto_retry_protection),
    ("Verifier unavailable handling", verifier_unavailable_handling),
    ("Unhealthy false-negative handling", unhealthy_false_negative_handling),
    ("Wrong verification identity", wrong_verification_identity),
    ("Unknown-evidence erasure", unknown_evidence_erasure),
]


# -- the comparison -----------------------------------------------------------------------


def naive_retry(provider: FakePaymentProvider, attempts: int = 2) -> None:
    """What an agent loop without OpenOnce does: retry on timeout, with a fresh request
    id each time (so the provider cannot dedup the second request)."""
    for _ in range(attempts):
        try:
            provider.charge(
                customer_id=ORDER["customer_id"],
                amount_cents=ORDER["amount_cents"],
                client_reference=f"req_{uuid.uuid4().hex}",
            )
            return
        except TimeoutError:
            continue


def compare_with_naive_retry() -> NaiveRetryComparison:
    naive = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT])
    naive_retry(naive)
    with Run(ChargeFault.TIMEOUT_AFTER_COMMIT) as run:
        _timeout_after_commit(run)
        effect = run.effect()
        return NaiveRetryComparison(
            naive_calls=naive.charge_calls,
            naive_charges=len(naive.charges),
            naive_total_cents=naive.total_cents,
            calls=run.provider.charge_calls,
            charges=len(run.provider.charges),
            execution=str(effect.execution_status),
            verification=str(effect.verification_status),
            final=str(effect.state),
        )


def run_safety_suite() -> SafetyReport:
    checks = []
    for name, scenario in SCENARIOS:
        try:
            checks.append(verdict(name, scenario()))
        except Exception as exc:  # a scenario that crashes has not shown it is safe
            checks.append(SafetyCheck(name, False, f"scenario raised {type(exc).__name__}: {exc}"))
    return SafetyReport(f"Tool: {TOOL}", checks, compare_with_naive_retry())


if __name__ == "__main__":
    report = run_safety_suite()
    print(report.to_text())
    sys.exit(0 if report.passed else 1)
