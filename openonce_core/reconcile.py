"""The reconciler: resolves what a timeout left open, with evidence, never by retrying.

For each due effect it decides one of three things:

* a STARTED effect whose lease ran out becomes UNKNOWN (an expired lease proves nothing);
* an UNKNOWN effect past its grace window is probed. HAPPENED with a non-empty receipt
  bound to this effect commits the receipt; NOT_HAPPENED re-arms it, but only where the
  provider capability says a miss is authoritative; everything else — inconclusive, a
  prober that raised or timed out, a receipt naming another effect, contradictory
  observations, a broken receipt contract, no prober at all — goes to HUMAN_REVIEW with
  the capability's guidance in the note;
* nothing else is touched.

Every decision is a conditional transition on the fence the reconciler read, so two
reconcilers (or a Celery task delivered twice) racing on one effect resolve it once: the
loser's write matches no row, it counts the race and moves on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .canonical import check_json
from .errors import InvalidArgumentsError
from .probe import ProbeOutcome, Prober, ProbeResult
from .providers import Capability, CapabilityMatrix, check_receipt
from .records import Effect, now
from .runtime import OpenOnce
from .states import EffectState
from .stores.base import Store

S = EffectState


@dataclass
class ReconcileReport:
    """What one sweep did. ``outcomes`` counts probe results for health records."""

    expired: list[str] = field(default_factory=list)
    committed: list[str] = field(default_factory=list)
    rearmed: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)  # prober failed; asked again later
    # UNKNOWN effects left after the sweep: in their grace window, in probe backoff, or
    # claimed by another reconciler.
    waiting: int = 0
    lost_races: int = 0  # another reconciler decided first
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def resolved(self) -> int:
        return len(self.committed) + len(self.rearmed) + len(self.escalated)

    def merge(self, other: ReconcileReport) -> None:
        self.expired += other.expired
        self.committed += other.committed
        self.rearmed += other.rearmed
        self.escalated += other.escalated
        self.retried += other.retried
        self.waiting += other.waiting
        self.lost_races += other.lost_races
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v

    def to_json(self) -> dict[str, Any]:
        return {
            "expired": self.expired,
            "committed": self.committed,
            "rearmed": self.rearmed,
            "escalated": self.escalated,
            "retried": self.retried,
            "waiting": self.waiting,
            "lost_races": self.lost_races,
            "outcomes": self.outcomes,
        }

    def __str__(self) -> str:
        return (
            f"expired {len(self.expired)}, committed {len(self.committed)},"
            f" re-armed {len(self.rearmed)}, to human review {len(self.escalated)},"
            f" probe retries {len(self.retried)},"
            f" still unknown {self.waiting}, lost races {self.lost_races}"
        )


ConformanceGate = Callable[[Capability], list[str]]
AnyProber = Prober | Callable[[Effect], ProbeResult]


class Reconciler:
    def __init__(
        self,
        target: OpenOnce | Store | str,
        *,
        extra_capabilities: Iterable[Capability] = (),
        grace_seconds: float | None = None,
        grace_overrides: Mapping[str, float] | None = None,
        require_provider_capability: bool = False,
        conformance: ConformanceGate | None = None,
        require_conformance: bool = False,
        probe_timeout: float = 30.0,
        probe_retries: int = 0,
        retry_backoff: float = 5.0,
        owner: str = "reconciler",
    ) -> None:
        self.oo = target if isinstance(target, OpenOnce) else OpenOnce(target)
        self.matrix = CapabilityMatrix(extra=(*self.oo.extra_capabilities, *extra_capabilities))
        self.grace_seconds = grace_seconds
        self.grace_overrides = dict(grace_overrides or {})
        self.require_provider_capability = require_provider_capability
        self.conformance = conformance
        self.require_conformance = require_conformance
        self.probe_timeout = probe_timeout
        # A prober that raises or times out says nothing about the effect; with retries it
        # is asked again after a growing pause before the effect goes to a person.
        self.probe_retries = probe_retries
        self.retry_backoff = retry_backoff
        self.actor = owner if ":" in owner else f"reconciler:{owner}"
        self._claimer = f"{self.actor}#{uuid.uuid4().hex[:8]}"
        self._probers: dict[str, list[AnyProber]] = {}
        # Pins of tool -> capability for tools that map to several (email.send).
        self._pins: dict[str, str] = dict(self.oo.provider_capabilities)
        self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="openonce-probe")

    @property
    def store(self) -> Store:
        return self.oo.store

    def register(
        self,
        tool: str,
        prober: AnyProber,
        capability: str | None = None,
    ) -> None:
        """Probe ``tool``'s UNKNOWN effects with ``prober``; ``capability`` pins which
        provider behaviour applies when one tool name maps to several (email.send).

        Registering several probers for one tool asks each; they must agree, or the effect
        goes to a person with every observation."""
        if capability is not None:
            self.matrix.resolve(tool, capability)  # raises for a pin that does not fit
            self._pins[tool] = capability
        self._probers.setdefault(tool, []).append(prober)

    # -- sweeping -------------------------------------------------------------------------

    def due(self, limit: int = 500, at: float | None = None) -> list[Effect]:
        """Effects a sweep would act on now: expired leases, then UNKNOWN past grace."""
        at = at if at is not None else now()
        found = self.store.expired_leases(at, limit)
        room = limit - len(found)
        if room > 0:
            found += self._due_unknown(at, room)
        return found

    def _due_unknown(self, at: float, limit: int) -> list[Effect]:
        """UNKNOWN effects past their own grace (or probe backoff), oldest first.

        Grace differs per tool, so the oldest rows may still be waiting while younger
        rows of a tool without grace are due: page on until ``limit`` are found, so
        effects in grace never starve due ones."""
        found: list[Effect] = []
        after: tuple[float, str] | None = None
        page = max(limit, 100)
        while len(found) < limit:
            rows = self.store.due_unknown(at - self._min_grace(), page, after)
            found += [e for e in rows if self._is_due(e, at)]
            if len(rows) < page:
                break
            after = (rows[-1].updated_at, rows[-1].id)
        return found[:limit]

    def run_once(self, limit: int = 500) -> ReconcileReport:
        report = ReconcileReport()
        at = now()
        for effect in self.due(limit, at):
            self._reconcile(effect, report, at)
        report.waiting = self.store.count([S.UNKNOWN])
        return report

    def claim_due(self, limit: int, owner: str, ttl: float) -> list[str]:
        """For a dispatcher (the Celery tick): the ids of due effects, the UNKNOWN ones
        claimed for ``owner`` during ``ttl`` seconds so that the next tick does not hand
        them out again while they wait in the queue. If the worker that gets them dies,
        the claim lapses and a later tick hands them out anew."""
        at = now()
        due = self.due(limit, at)
        expired = [e.id for e in due if e.state == S.STARTED]
        unknown = [e.id for e in due if e.state == S.UNKNOWN]
        return expired + self.store.claim(unknown, owner, at + ttl, at)

    def reconcile_ids(
        self,
        effect_ids: Iterable[str],
        dispatched_by: str | None = None,
        claimer: str | None = None,
    ) -> ReconcileReport:
        """Re-read the effects and act on those still due: a task delivered twice, or an
        id another worker already resolved, is harmless. ``dispatched_by`` is the claim
        the dispatcher took for this batch; ``claimer`` names this batch's probe claims
        (a Celery task id), so a redelivery of a batch whose worker died can take over its
        own claims at once instead of waiting for them to lapse."""
        report = ReconcileReport()
        at = now()
        own = tuple(o for o in (dispatched_by, claimer) if o)
        for effect in self.store.get_many(list(effect_ids)):
            if self._is_due(effect, at, own):
                self._reconcile(effect, report, at, own, claimer)
        return report

    def _is_due(self, effect: Effect, at: float, own: tuple[str, ...] = ()) -> bool:
        if effect.state == S.STARTED:
            return effect.lease_expires_at is not None and effect.lease_expires_at <= at
        if effect.state != S.UNKNOWN or at < effect.updated_at + self._pause(effect):
            return False
        # Someone else is probing it (or has it queued): leave it to them.
        claimed = effect.lease_expires_at is not None and effect.lease_expires_at > at
        return not claimed or effect.lease_owner in own

    def _pause(self, effect: Effect) -> float:
        """How long after its last change an UNKNOWN effect waits: its grace window, or the
        backoff after a failed probe, whichever is longer."""
        errors = _probe_errors(effect)
        backoff = self.retry_backoff * 2 ** (errors - 1) if errors else 0.0
        return max(self.grace_for(effect.tool), backoff)

    def grace_for(self, tool: str) -> float:
        if tool in self.grace_overrides:
            return self.grace_overrides[tool]
        if self.grace_seconds is not None:
            return self.grace_seconds
        grace = self.matrix.grace_seconds(tool, self._pins.get(tool))
        return float(grace) if grace is not None else 0.0

    def _min_grace(self) -> float:
        if self.grace_seconds is not None and not self.grace_overrides:
            return self.grace_seconds
        return 0.0

    # -- one effect -----------------------------------------------------------------------

    def _reconcile(
        self,
        effect: Effect,
        report: ReconcileReport,
        at: float,
        own: tuple[str, ...] = (),
        claimer: str | None = None,
    ) -> None:
        if effect.state == S.STARTED:
            if self.oo._expire_lease(effect):
                report.expired.append(effect.id)
            else:
                report.lost_races += 1
            return
        probers = self._probers.get(effect.tool)
        # Claim it before probing, so two reconcilers (or a batch delivered twice) do
        # not both ask the provider; the claim bumps the fence our decision is made on.
        until = at + self.probe_timeout * max(1, len(probers or ())) + 5
        claimer = claimer or self._claimer
        if not self.store.claim(
            [effect.id], claimer, until, at, steal_from=own, expect_fence=effect.fence
        ):
            report.lost_races += 1
            return
        effect = dataclasses.replace(
            effect, fence=effect.fence + 1, lease_owner=claimer, lease_expires_at=until
        )
        capabilities = self.matrix.resolve(effect.tool, self._pins.get(effect.tool))
        guidance = _guidance(effect.tool, capabilities, bool(probers))
        if not probers:
            self._escalate(effect, report, "no prober registered for " + effect.tool, guidance)
            return
        if self.require_provider_capability and not capabilities:
            self._escalate(
                effect, report, "no reviewed provider capability for " + effect.tool, guidance
            )
            return
        if self.require_conformance:
            problems = self._conformance_problems(capabilities)
            if problems:
                self._escalate(
                    effect, report, "conformance evidence missing: " + "; ".join(problems),
                    guidance,
                )  # fmt: skip
                return
        results = [self._probe(prober, effect) for prober in probers]
        for result in results:
            name = "error" if _failed(result) else str(result.outcome)
            report.outcomes[name] = report.outcomes.get(name, 0) + 1
        failures = [r for r in results if _failed(r)]
        if failures and _probe_errors(effect) < self.probe_retries:
            self._retry_later(effect, failures, report)
            return
        self._decide(effect, results, capabilities, guidance, report)

    def _retry_later(
        self, effect: Effect, failures: list[ProbeResult], report: ReconcileReport
    ) -> None:
        errors = _probe_errors(effect) + 1
        detail = "; ".join(r.detail for r in failures)
        pause = self.retry_backoff * 2 ** (errors - 1)
        evidence = dict(effect.verification_evidence or {})
        evidence["probe_errors"] = [effect.attempt, errors]
        moved = self.oo._move(
            effect, S.UNKNOWN, "retry probe", actor=self.actor,
            reason=f"probe failed ({errors}/{self.probe_retries}): {detail};"
            f" asking again in {pause:g}s", evidence={"probe_error": detail, "retry": errors},
            changes={"verification_evidence": evidence},
        )  # fmt: skip
        self._count(moved, effect, report.retried, report)

    def _conformance_problems(self, capabilities: list[Capability]) -> list[str]:
        if not capabilities:
            return ["no provider capability"]
        if self.conformance is None:
            return ["no conformance evidence loaded"]
        return [p for c in capabilities for p in self.conformance(c)]

    def _probe(self, prober: AnyProber, effect: Effect) -> ProbeResult:
        """Run the prober with a time limit; anything but a well-formed, bound result is
        inconclusive ("could not verify" is not "did not happen")."""
        call = prober.probe if hasattr(prober, "probe") else prober
        started = time.monotonic()
        try:
            result = self._pool.submit(call, effect).result(timeout=self.probe_timeout)
        except concurrent.futures.TimeoutError:
            return _inconclusive(f"probe timed out after {self.probe_timeout:g}s", error=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # CancelledError too: one prober must not end a sweep
            detail = f"prober raised {type(exc).__name__}: {exc}"[:500]
            return _inconclusive(detail, error=True)
        if not isinstance(result, ProbeResult) or not isinstance(result.outcome, ProbeOutcome):
            return _inconclusive(f"prober returned {type(result).__name__}, not a ProbeResult")
        elapsed = time.monotonic() - started
        if not result.decisive:
            return result
        try:
            expected = _expected_reference(prober, effect)
        except Exception as exc:
            return _inconclusive(f"prober's reference_for raised {exc!r}"[:500], error=True)
        if result.provider_reference != expected:
            return _inconclusive(
                f"{result.outcome} result named reference {result.provider_reference!r},"
                f" this effect's is {expected!r}: not bound to this effect",
                result,
            )
        if result.outcome is ProbeOutcome.HAPPENED:
            problem = _receipt_problem(result.receipt)
            if problem:
                return _inconclusive(f"happened without a usable receipt: {problem}", result)
        if elapsed > self.probe_timeout:
            return _inconclusive("probe answered after its time limit", result)
        return result

    def _decide(
        self,
        effect: Effect,
        results: list[ProbeResult],
        capabilities: list[Capability],
        guidance: str,
        report: ReconcileReport,
    ) -> None:
        # Evidence aggregates across attempts: earlier observations stay in the record.
        history = list((effect.verification_evidence or {}).get("observations", []))
        seen = [_observation(r, effect.attempt) for r in results]
        observations = [*history, *seen]
        outcomes = {r.outcome for r in results}
        if {ProbeOutcome.HAPPENED, ProbeOutcome.NOT_HAPPENED} <= outcomes:
            self._escalate(
                effect, report, "contradictory observations: "
                + ", ".join(str(r.outcome) for r in results), guidance, observations,
            )  # fmt: skip
            return
        if ProbeOutcome.INCONCLUSIVE in outcomes:
            detail = "; ".join(r.detail for r in results if not r.decisive) or "no detail"
            self._escalate(effect, report, "probe inconclusive: " + detail, guidance, observations)
            return
        first = results[0]
        if first.outcome is ProbeOutcome.HAPPENED:
            assert first.receipt is not None
            problems = check_receipt(capabilities, first.receipt, effect.args)
            if problems:
                self._escalate(
                    effect, report, "receipt breaks the provider contract: " + "; ".join(problems),
                    guidance, observations,
                )  # fmt: skip
                return
            reason = first.detail or "probe found the effect at the provider"
            if any(r.receipt != first.receipt for r in results):
                # Happened for sure, but two receipts may mean two effects: say so.
                reason += "; probers returned different receipts, a duplicate may exist"
            moved = self.oo._move(
                effect, S.COMMITTED, "reconcile", actor=self.actor, reason=reason,
                evidence={"probe": "happened", "observations": seen},
                changes={"result": first.receipt, "verification_status": "confirmed",
                         "verification_evidence": {"observations": observations}},
            )  # fmt: skip
            self._count(moved, effect, report.committed, report)
            return
        if not self.matrix.can_auto_rearm(effect.tool, self._pins.get(effect.tool)):
            self._escalate(
                effect, report,
                "a miss is not evidence here: no provider capability allows re-arming"
                f" {effect.tool} on a miss", guidance, observations,
            )  # fmt: skip
            return
        moved = self.oo._move(
            effect, S.PLANNED, "reconcile", actor=self.actor,
            reason=first.detail or "probe found no trace past the grace window; re-armed",
            evidence={"probe": "not_happened", "observations": seen},
            changes={"verification_status": "absent",
                     "verification_evidence": {"observations": observations}},
        )  # fmt: skip
        self._count(moved, effect, report.rearmed, report)

    def _escalate(
        self,
        effect: Effect,
        report: ReconcileReport,
        why: str,
        guidance: str,
        observations: list[dict[str, Any]] | None = None,
    ) -> None:
        changes: dict[str, Any] = {"verification_status": "needs_human"}
        evidence: dict[str, Any] = {"guidance": guidance}
        if observations is not None:
            changes["verification_evidence"] = {"observations": observations}
            evidence["observations"] = observations
        moved = self.oo._move(
            effect, S.HUMAN_REVIEW, "escalate", actor=self.actor,
            reason=why, evidence=evidence, changes=changes,
        )  # fmt: skip
        self._count(moved, effect, report.escalated, report)

    @staticmethod
    def _count(moved: bool, effect: Effect, bucket: list[str], report: ReconcileReport) -> None:
        if moved:
            bucket.append(effect.id)
        else:
            report.lost_races += 1

    # -- the daemon loop for the embedded default -----------------------------------------

    def watch(
        self,
        interval: float = 5.0,
        *,
        stop: Callable[[], bool] = lambda: False,
        on_sweep: Callable[[ReconcileReport], None] | None = None,
    ) -> None:
        while not stop():
            report = self.run_once()
            if on_sweep is not None:
                on_sweep(report)
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline and not stop():
                time.sleep(min(0.2, interval))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _expected_reference(prober: Any, effect: Effect) -> str:
    """Probers that search by a natural key (a PR's owner/repo/head) say what that key is
    for this effect; all others must echo the provider key the handler sent."""
    reference_for = getattr(prober, "reference_for", None)
    return str(reference_for(effect)) if callable(reference_for) else effect.provider_key


def _receipt_problem(receipt: Any) -> str:
    if type(receipt) is not dict or not receipt:
        return "the receipt must be a non-empty JSON object"
    try:
        check_json(receipt, "$receipt")
    except InvalidArgumentsError as exc:
        return str(exc)
    return ""


def _inconclusive(
    detail: str, original: ProbeResult | None = None, *, error: bool = False
) -> ProbeResult:
    observed: dict[str, Any] = {}
    if original is not None:
        observed = {"claimed": str(original.outcome), "receipt": original.receipt}
    if error:
        observed["probe_error"] = True
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed)


def _failed(result: ProbeResult) -> bool:
    """The prober itself failed (raised, timed out): no observation of the effect at all."""
    return result.observed.get("probe_error") is True


def _probe_errors(effect: Effect) -> int:
    """Failed probes of the current attempt so far."""
    attempt, count = (effect.verification_evidence or {}).get("probe_errors", (0, 0))
    return int(count) if attempt == effect.attempt else 0


def _observation(result: ProbeResult, attempt: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "outcome": str(result.outcome),
        "detail": result.detail,
        "attempt": attempt,
        "at": now(),
    }
    if result.receipt is not None and _receipt_problem(result.receipt) == "":
        doc["receipt"] = result.receipt
    if result.provider_reference is not None:
        doc["provider_reference"] = result.provider_reference
    if result.observed:
        try:
            check_json(result.observed)
            doc["observed"] = result.observed
        except InvalidArgumentsError:
            doc["observed"] = repr(result.observed)[:500]
    return doc


def _guidance(tool: str, capabilities: list[Capability], prober_registered: bool) -> str:
    if not capabilities:
        return (
            f"no provider capability is known for {tool}: check the provider by hand, then"
            " resolve-happened with its receipt or resolve-not-happened with a reason"
        )
    return "\n\n".join(c.guidance(prober_registered=prober_registered) for c in capabilities)
