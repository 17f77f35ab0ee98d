"""The reconciler: resolves what a timeout left open, with evidence, never by retrying.

For each due effect it decides one of these:

* a STARTED effect whose lease ran out, or whose owner process on this host is gone,
  becomes UNKNOWN (an expired lease proves nothing);
* an UNKNOWN effect past its grace window is probed. HAPPENED with a non-empty receipt
  bound to this effect commits the receipt; NOT_HAPPENED re-arms it, but only where the
  provider capability says a miss is authoritative, and — when the call's lease ran out,
  so that it may still be running — only once the grace has passed since the lease's end;
  everything else — inconclusive, a receipt naming another effect, contradictory
  observations, a broken receipt contract, no prober at all — goes to HUMAN_REVIEW with
  the capability's guidance in the note;
* a young miss (an INCONCLUSIVE result with ``retry_after``: the provider's index may not
  have the object yet) is probed again when it matures, not sent to a person; bounded by
  ``young_reprobes`` and ``maturity_window``, after which a person decides;
* a prober that could not ask the provider says nothing about the effect: a transient
  failure (429, 5xx, a timeout) is asked again later, honouring the provider's
  ``Retry-After``, and goes to a person only after a bounded number of attempts or time; a
  refused credential marks the prober failing (``ReconcileReport.prober_failures``) and the
  effect simply waits — a revoked key must not flood the human queue.

Probers that measure an effect's age get the reconciler's clock (``bind_clock``) when they
are registered, so age and grace are read on the clock the effect's timestamps were written
with (the database's on Postgres), not this host's.

Every decision is a conditional move on the fence the reconciler read, so two reconcilers
(or a Celery task delivered twice) racing on one effect resolve it once. The loser's
observation is not thrown away (invariant 7): it is journaled, and if it contradicts what
the winner decided — a receipt for an effect a person just re-armed — the effect goes to a
person.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._canonical import check_json
from ._classify import provider_had_it
from ._clock import Clock, ClockLike, as_clock
from ._due import Grace, overdue_unknown, probe_pause, started_due, stopped_calls, unknown_due
from ._failures import message_text, safe_text
from ._leases import dead_owner, lease_lapsed, stopped_for, wait_over
from ._ledger import Then
from ._probe import ProbeOutcome, Prober, ProbeResult, attempt_ended_at
from ._providers import (
    Capability,
    CapabilityMatrix,
    check_conformance_evidence,
    check_receipt,
    load_conformance_file,
)
from ._reconciler_options import ReconcilerOptions
from ._records import Effect
from ._redact import redact_text
from ._runtime import OpenOnce
from ._states import EffectState
from .errors import InvalidArgumentsError, ProbeCredentialError, ProbeError, ProbeTransientError
from .stores.base import Store

S = EffectState

MAX_BACKOFF = 900.0  # the longest pause between two probes of one effect
KEEP_ATTEMPTS = 20  # failed probe attempts kept in an effect's evidence


@dataclass
class ReconcileReport:
    """What one sweep did. ``outcomes`` counts probe results for health records."""

    expired: list[str] = field(default_factory=list)
    committed: list[str] = field(default_factory=list)
    rearmed: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)  # the prober failed; asked again later
    skipped: list[str] = field(default_factory=list)  # left for later: the batch ran out of time
    deferred: list[str] = field(default_factory=list)  # held back by our own rate limit
    # UNKNOWN effects left after the sweep: in their grace window, in probe backoff, or
    # claimed by another reconciler.
    waiting: int = 0
    lost_races: int = 0  # another reconciler (or a person) decided first
    outcomes: dict[str, int] = field(default_factory=dict)
    # Provider -> why its prober cannot work now (a refused key): health turns red.
    prober_failures: dict[str, str] = field(default_factory=dict)

    @property
    def resolved(self) -> int:
        return len(self.committed) + len(self.rearmed) + len(self.escalated)

    def merge(self, other: ReconcileReport) -> None:
        self.expired += other.expired
        self.committed += other.committed
        self.rearmed += other.rearmed
        self.escalated += other.escalated
        self.retried += other.retried
        self.skipped += other.skipped
        self.deferred += other.deferred
        self.waiting += other.waiting
        self.lost_races += other.lost_races
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        self.prober_failures.update(other.prober_failures)

    def to_json(self) -> dict[str, Any]:
        return {
            "expired": self.expired,
            "committed": self.committed,
            "rearmed": self.rearmed,
            "escalated": self.escalated,
            "retried": self.retried,
            "skipped": self.skipped,
            "deferred": self.deferred,
            "waiting": self.waiting,
            "lost_races": self.lost_races,
            "outcomes": self.outcomes,
            "prober_failures": self.prober_failures,
        }

    def __str__(self) -> str:
        text = (
            f"expired {len(self.expired)}, committed {len(self.committed)},"
            f" re-armed {len(self.rearmed)}, to human review {len(self.escalated)},"
            f" probe retries {len(self.retried)},"
            f" still unknown {self.waiting}, lost races {self.lost_races}"
        )
        if self.prober_failures:
            text += "; failing probers: " + ", ".join(
                f"{p} ({why})" for p, why in sorted(self.prober_failures.items())
            )
        return text


ConformanceGate = Callable[[Capability], list[str]]
AnyProber = Prober | Callable[[Effect], ProbeResult]


def _evidence_gate(evidence: dict[str, Any]) -> ConformanceGate:
    """The gate that checks a capability against a conformance file's ``evidence``."""

    def gate(capability: Capability) -> list[str]:
        return check_conformance_evidence(capability, evidence)

    return gate


class Reconciler:
    def __init__(
        self,
        target: OpenOnce | Store | str,
        *,
        options: ReconcilerOptions | None = None,
        extra_capabilities: Iterable[Capability] = (),
        grace_overrides: Mapping[str, float] | None = None,
        conformance: ConformanceGate | None = None,
        clock: ClockLike | None = None,
        **option_values: Any,
    ) -> None:
        """``options`` (``ReconcilerOptions``) says how it decides; any of its fields given
        as a keyword (``probe_timeout=10``) overrides it. ``conformance`` checks a
        capability's evidence; without it, ``options.conformance_file`` is read for one."""
        self.options = opts = (options or ReconcilerOptions()).replace(**option_values)
        if conformance is None and opts.conformance_file:
            conformance = _evidence_gate(load_conformance_file(opts.conformance_file))
        clock = as_clock(clock)
        self.oo = target if isinstance(target, OpenOnce) else OpenOnce(target, clock=clock)
        self.clock: Clock = clock or self.oo.clock
        self.matrix = CapabilityMatrix(extra=(*self.oo.extra_capabilities, *extra_capabilities))
        # Pins of tool -> capability for tools that map to several (email.send).
        self._pins: dict[str, str] = dict(self.oo.provider_capabilities)
        # The grace windows, with the pins by reference: register() may add one.
        self.grace = Grace(
            self.matrix,
            grace_seconds=opts.grace_seconds,
            overrides=grace_overrides,
            pins=self._pins,
        )
        self.require_provider_capability = opts.require_provider_capability
        self.conformance = conformance
        self.require_conformance = opts.require_conformance
        self.probe_timeout = opts.probe_timeout
        # A prober that raises or times out says nothing about the effect; with retries it
        # is asked again after a growing pause before the effect goes to a person.
        self.probe_retries = opts.probe_retries
        self.retry_backoff = opts.retry_backoff
        # A provider that is busy or down (ProbeTransientError) is asked again up to this
        # many times, or for this long, before a person is asked instead.
        self.transient_retries = opts.transient_retries
        self.transient_window = opts.transient_window
        # A miss soon after a lease ran out is no evidence: the call may still be running
        # (stopped, cut off). Re-arming on a miss waits this long after the lease's end.
        self.stale_call_grace = opts.stale_call_grace
        # A process found gone sends nothing more, but a request it sent just before it
        # died may still be in flight at the provider (a PR being created): a miss is no
        # evidence until this long (or the tool's grace, if longer) after it was found
        # gone. Shorter than stale_call_grace, which covers a process that may wake up.
        self.dead_owner_grace = opts.dead_owner_grace
        # A young miss is asked again when the prober says it matures; a prober that keeps
        # saying "not yet" (an index that never catches up) is asked at most this many
        # times, or for this long after its first such answer, then a person decides.
        self.young_reprobes = opts.young_reprobes
        self.maturity_window = opts.maturity_window
        owner = opts.owner
        self.actor = owner if ":" in owner else f"reconciler:{owner}"
        self._claimer = f"{self.actor}#{uuid.uuid4().hex[:8]}"
        self._probers: dict[str, list[AnyProber]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="openonce-probe")

    @property
    def store(self) -> Store:
        return self.oo.store

    @property
    def probers(self) -> dict[str, list[AnyProber]]:
        """The probers registered per tool (a copy): what the console shows as "probed"."""
        return {tool: list(found) for tool, found in self._probers.items()}

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
        self._bind_clock(prober)
        self._probers.setdefault(tool, []).append(prober)

    def _bind_clock(self, prober: Any) -> None:
        """Hand the prober (or the one a wrapper keeps as ``inner``, like the daemon's
        InstrumentedProber) this reconciler's clock: a young miss must be judged on the
        clock the effect's timestamps and the grace use, not on this host's."""
        for _ in range(4):
            bind = getattr(prober, "bind_clock", None)
            if callable(bind):
                bind(self.clock.now)
                return
            prober = getattr(prober, "inner", None)
            if prober is None:
                return

    # -- sweeping -------------------------------------------------------------------------

    def due(self, limit: int = 500, at: float | None = None) -> list[Effect]:
        """Effects a sweep would act on now (``openonce_core._due`` says when one is due):
        expired leases and owners gone from this host, then UNKNOWN effects whose next
        probe time has come, except those another reconciler is probing. (A lease whose
        end passed is expired only once this process has seen it un-renewed long enough:
        ``leases.lease_lapsed``.)"""
        at = at if at is not None else self.clock.now()
        found = stopped_calls(self.store, at, limit)
        room = limit - len(found)
        if room > 0:
            found += overdue_unknown(
                self.store, self.grace, self.clock, at, room, lambda e: self._is_due(e, at)
            )
        return found[:limit]

    def run_once(self, limit: int = 500) -> ReconcileReport:
        report = ReconcileReport()
        at = self.clock.now()
        for effect in self.due(limit, at):
            self._reconcile(effect, report, at)
        report.waiting = self.store.count([S.UNKNOWN])
        return report

    # A dispatch claim says "queued for a batch", a probe claim "being asked about now".
    # Their owners are told apart by this prefix: a batch may take over another
    # dispatcher's claim (reconcile_ids), never a probe claim.
    DISPATCH_PREFIX = "dispatch:"

    @classmethod
    def is_dispatch_claim(cls, owner: str | None) -> bool:
        return owner is not None and owner.startswith(cls.DISPATCH_PREFIX)

    def claim_due(self, limit: int, owner: str, ttl: float) -> list[str]:
        """For a dispatcher (the Celery tick): the ids of due effects, the UNKNOWN ones
        claimed for ``owner`` (a name starting with ``DISPATCH_PREFIX``) during ``ttl``
        seconds so that the next tick does not hand them out again while they wait in the
        queue. If the worker that gets them dies, the claim lapses and a later tick hands
        them out anew; a batch still queued then probes them anyway (reconcile_ids)."""
        if not self.is_dispatch_claim(owner):
            raise ValueError(
                f"a dispatch claim's owner must start with {self.DISPATCH_PREFIX!r}"
                f" (batches take such claims over, never a probe claim): {owner!r}"
            )
        at = self.clock.now()
        due = self.due(limit, at)
        started = [e.id for e in due if e.state == S.STARTED]
        unknown = [e.id for e in due if e.state == S.UNKNOWN]
        return started + self.oo.ledger.claim_for_probe(unknown, owner, at + ttl)

    def reconcile_ids(
        self,
        effect_ids: Iterable[str],
        dispatched_by: str | None = None,
        claimer: str | None = None,
        *,
        deadline: float | None = None,
    ) -> ReconcileReport:
        """Re-read the effects and act on those still due: a task delivered twice, or an
        id another worker already resolved, is harmless. ``dispatched_by`` is the claim
        the dispatcher took for this batch; ``claimer`` names this batch's probe claims
        (a Celery task id), so a redelivery of a batch whose worker died can take over its
        own claims at once instead of waiting for them to lapse.

        Another dispatcher's claim does not hold a batch back: a newer tick that queued
        the effect again (this batch waited longer than the dispatch TTL) only put it in
        a later batch, and skipping it here would leave it to that batch, which a still
        newer tick overtakes the same way, so nothing would ever be probed. Only a live
        probe claim means somebody is asking the provider: that effect is skipped.

        ``deadline`` (``time.monotonic()`` seconds) stops the batch before a probe could
        run past it; the effects not reached are in ``report.skipped``, still due."""
        if self.is_dispatch_claim(claimer or self._claimer):
            raise ValueError(
                f"a probe claimer must not be named like a dispatcher"
                f" ({self.DISPATCH_PREFIX!r}): another batch would take its claim over"
                f" while it probes: {claimer or self._claimer!r}"
            )
        report = ReconcileReport()
        at = self.clock.now()
        own = tuple(o for o in (dispatched_by, claimer) if o)
        for effect in self.store.get_many(list(effect_ids)):
            if deadline is not None:
                probes = max(1, len(self._probers.get(effect.tool, ())))
                if time.monotonic() + self.probe_timeout * probes > deadline:
                    report.skipped.append(effect.id)
                    continue
            # Taking the other dispatcher's claim is fenced on what was read here: if a
            # batch probe-claimed the effect since, this batch loses that race.
            holder = effect.lease_owner
            mine = (*own, holder) if holder and self.is_dispatch_claim(holder) else own
            if self._is_due(effect, at, mine):
                self._reconcile(effect, report, at, mine, claimer)
        return report

    def _is_due(self, effect: Effect, at: float, own: tuple[str, ...] = ()) -> bool:
        if effect.state == S.STARTED:
            return started_due(effect, self.clock, at)
        if not unknown_due(effect, self.grace, self.clock, at):
            return False
        # Someone else is probing it, or has it queued (a dispatch claim, which a batch
        # passes in ``own`` to take it over): leave it to them.
        claimed = effect.lease_expires_at is not None and not wait_over(
            self.clock,
            ("claim", effect.id, effect.fence),
            effect.lease_expires_at,
            at,
            MAX_BACKOFF,  # no probe claim is longer (a dispatch's TTL, a probe's timeout)
        )
        return not claimed or effect.lease_owner in own

    def grace_for(self, tool: str) -> float:
        return self.grace.for_tool(tool)

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
            dead = dead_owner(effect.lease_owner)
            if dead is None and not lease_lapsed(effect, self.clock, at):
                # Its end passed on the clock, but we have not yet seen it go un-renewed
                # for long enough (the clock may have stepped): judged on a later sweep.
                return
            if self.oo.expire_lease(effect, dead=dead):
                report.expired.append(effect.id)
            else:
                report.lost_races += 1
            return
        probers = self._probers.get(effect.tool)
        # Claim it before probing, so two reconcilers (or a batch delivered twice) do
        # not both ask the provider; the claim bumps the fence our decision is made on.
        until = at + self.probe_timeout * max(1, len(probers or ())) + 5
        claimer = claimer or self._claimer
        if not self.oo.ledger.claim_for_probe(
            [effect.id], claimer, until, steal_from=own, expect_fence=effect.fence
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
        if failures and self._retry_later(effect, failures, report, guidance):
            return
        self._decide(effect, results, capabilities, guidance, report)

    def _retry_later(
        self,
        effect: Effect,
        failures: list[ProbeResult],
        report: ReconcileReport,
        guidance: str,
    ) -> bool:
        """Ask again later when the prober could not ask the provider. False when the
        effect should go to a person now instead (its retries are used up)."""
        if all(r.observed.get("not_sent") for r in failures):
            # Our own rate limit held the probe back: no attempt, no journal line. Keep the
            # probe claim just until the provider's pause ends; then it is due again.
            wait = max(1.0, max(float(r.observed.get("retry_after") or 0) for r in failures))
            self.oo.ledger.claim_for_probe(
                [effect.id], str(effect.lease_owner), self.clock.now() + wait,
                steal_from=[str(effect.lease_owner)], expect_fence=effect.fence,
            )  # fmt: skip
            report.deferred.append(effect.id)
            return True
        history = _failures(effect)
        attempts = [
            *history.get("attempts", []),
            *(_attempt(r, self.clock.now()) for r in failures),
        ]
        credential = [r for r in failures if r.observed.get("credential")]
        transient = [r for r in failures if r.observed.get("transient")]
        for r in credential:
            report.prober_failures[str(r.observed.get("provider", "?"))] = r.detail
        count = int(history.get("count", 0)) + 1
        first = float(history.get("since", self.clock.now()))
        if credential:
            # Nothing succeeds until a person fixes the key: wait, do not flood the queue.
            wait = min(MAX_BACKOFF, self.retry_backoff * 2 ** min(count - 1, 10))
        elif transient and len(transient) == len(failures):
            if count > self.transient_retries or self.clock.now() - first > self.transient_window:
                return False
            asked = max((float(r.observed.get("retry_after") or 0) for r in transient), default=0.0)
            wait = min(MAX_BACKOFF, max(asked, self.retry_backoff * 2 ** min(count - 1, 10)))
        elif count <= self.probe_retries:
            wait = self.retry_backoff * 2 ** (count - 1)
        else:
            return False
        detail = "; ".join(r.detail for r in failures)
        evidence = _reprobe_evidence(effect)
        evidence["probe_failures"] = {
            "attempt": effect.attempt,
            "count": count,
            "since": first,
            "wait": wait,
            "attempts": attempts[-KEEP_ATTEMPTS:],
            **{k: v for k, v in history.items() if k in ("young_count", "young_since")},
        }
        kind = (
            "credential refused"
            if credential
            else "provider unavailable"
            if transient
            else "probe failed"
        )
        limit = (
            ""
            if credential
            else f" ({count}/{self.transient_retries if transient else self.probe_retries})"
        )
        moved = self._reprobe(
            effect, f"{kind}{limit}: {detail}; asking again in {wait:g}s",
            {"probe_error": detail, "retry": count, "wait": wait}, evidence,
        )  # fmt: skip
        self._count(moved, effect, report.retried, report)
        return True

    def _reprobe(
        self, effect: Effect, reason: str, evidence: dict[str, Any], verification: dict[str, Any]
    ) -> bool:
        """Ask again later (UNKNOWN -> UNKNOWN), with ``verification`` as the effect's new
        verification evidence. Its next probe is written beside it: the pause its
        ``probe_failures`` call for (``due.probe_pause``) after this move, so the sweep's
        index (``openonce_effects_unknown_next``) finds the effect when it is due."""
        at = self.clock.now()
        pause = probe_pause(effect.tool, verification.get("probe_failures"), self.grace)
        return self.oo.ledger.move(
            effect, "reprobe", S.UNKNOWN, actor=self.actor, reason=reason, evidence=evidence,
            changes={"verification_evidence": verification, "next_probe_at": at + pause}, at=at,
        )  # fmt: skip

    def _conformance_problems(self, capabilities: list[Capability]) -> list[str]:
        if not capabilities:
            return ["no provider capability"]
        if self.conformance is None:
            return ["no conformance evidence loaded"]
        return [p for c in capabilities for p in self.conformance(c)]

    def _probe(self, prober: AnyProber, effect: Effect) -> ProbeResult:
        """Run the prober with a time limit; anything but a well-formed, bound result is
        inconclusive ("could not verify" is not "did not happen").

        An exception raised *in this thread* while waiting — a Celery soft time limit, an
        interrupt — is not the prober's: it propagates, so the task can stop cleanly."""
        call = prober.probe if hasattr(prober, "probe") else prober
        started = time.monotonic()
        future = self._pool.submit(call, effect)
        try:
            result = future.result(timeout=self.probe_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return _inconclusive(f"probe timed out after {self.probe_timeout:g}s", transient=True)
        except BaseException as exc:
            if not future.done() or future.exception() is not exc:
                future.cancel()
                raise  # not the prober's failure
            return _prober_failure(exc)
        if not isinstance(result, ProbeResult) or not isinstance(result.outcome, ProbeOutcome):
            return _inconclusive(f"prober returned {type(result).__name__}, not a ProbeResult")
        elapsed = time.monotonic() - started
        if isinstance(result.detail, str) and redact_text(result.detail) != result.detail:
            result = dataclasses.replace(result, detail=redact_text(result.detail))
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
        now = self.clock.now()
        seen = [_observation(r, effect.attempt, now) for r in results]
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
            wait = _maturing(results)
            if wait is not None:
                waited = _failures(effect)
                count = int(waited.get("young_count", 0)) + 1
                since = float(waited.get("young_since", now))
                if count <= self.young_reprobes and now - since <= self.maturity_window:
                    self._reprobe_young(effect, report, detail, wait, count, since, seen,
                                        observations)  # fmt: skip
                    return
                detail += (
                    f"; still not decisive after {count - 1} re-probes over"
                    f" {now - since:.0f}s: the provider's index may never catch up"
                )
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
            moved = self.oo.ledger.move(
                effect, "probe_happened", S.RECEIPT_RECORDED, actor=self.actor, reason=reason,
                evidence={"probe": "happened", "observations": seen},
                changes={"result": first.receipt, "verification_status": "confirmed",
                         "verification_evidence": {"observations": observations}},
                then=Then("check_receipt", S.COMMITTED, "receipt meets the provider contract"),
            )  # fmt: skip
            if not moved:
                self._lost_race(effect, first, report)
                return
            report.committed.append(effect.id)
            return
        said = _provider_had_it(effect)
        if said:
            # GitHub's 422 "already exists" for an old PR of the head, Stripe's
            # idempotency_error: re-arming sends the call back to the same answer, for ever.
            self._escalate(
                effect, report,
                f"a miss is not evidence here: when the call ran, {said}; whether this"
                " effect made it is a person's call", guidance, observations,
            )  # fmt: skip
            return
        if not self.matrix.can_auto_rearm(effect.tool, self._pins.get(effect.tool)):
            self._escalate(
                effect, report,
                "a miss is not evidence here: no provider capability allows re-arming"
                f" {effect.tool} on a miss", guidance, observations,
            )  # fmt: skip
            return
        young = self._too_soon_after_lease(effect, now)
        if young:
            # The call whose lease ran out may still be running, or the request of an owner
            # found gone still in flight: wait before trusting a miss.
            gone = (effect.execution_evidence or {}).get("owner_gone")
            why = (
                f"its owner was found gone only {now - _lease_end(effect):.0f}s ago and a"
                " request it sent may still be in flight"
                if gone
                else f"the call's lease ran out only {now - _lease_end(effect):.0f}s ago and"
                " it may still be running"
            )
            evidence = _reprobe_evidence(effect)
            evidence["observations"] = observations
            evidence["probe_failures"] = {
                **{k: v for k, v in _failures(effect).items() if k != "maturing"},
                "attempt": effect.attempt,
                "wait": young,
            }
            moved = self._reprobe(
                effect, f"no trace yet, but {why}; asking again in {young:.0f}s",
                {"probe": "not_happened", "observations": seen, "wait": young}, evidence,
            )  # fmt: skip
            self._count(moved, effect, report.retried, report)
            return
        moved = self.oo.ledger.move(
            effect, "probe_not_happened", S.PLANNED, actor=self.actor,
            reason=first.detail or "probe found no trace past the grace window; re-armed",
            evidence={"probe": "not_happened", "observations": seen},
            changes={"verification_status": "absent",
                     "verification_evidence": {"observations": observations}},
        )  # fmt: skip
        if not moved:
            self._lost_race(effect, first, report)
            return
        report.rearmed.append(effect.id)

    def _reprobe_young(
        self,
        effect: Effect,
        report: ReconcileReport,
        detail: str,
        wait: float,
        count: int,
        since: float,
        seen: list[dict[str, Any]],
        observations: list[dict[str, Any]],
    ) -> None:
        """A young miss: ask again when the prober says it matures (UNKNOWN stays
        UNKNOWN), instead of sending a person an effect the provider simply has not
        indexed yet."""
        evidence = _reprobe_evidence(effect)
        evidence["observations"] = observations
        evidence["probe_failures"] = {
            **_failures(effect),
            "attempt": effect.attempt,
            "wait": wait,
            "maturing": True,  # the pause is this wait alone (see due.probe_pause)
            "young_count": count,
            "young_since": since,
        }
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock.now() + wait))
        moved = self._reprobe(
            effect, f"young miss ({count}/{self.young_reprobes}): {detail}; asking again in"
            f" {wait:.0f}s, at {when}",
            {"probe": "inconclusive", "observations": seen, "wait": wait}, evidence,
        )  # fmt: skip
        self._count(moved, effect, report.retried, report)

    def _too_soon_after_lease(self, effect: Effect, now: float) -> float:
        """Seconds still to wait before a miss may re-arm an effect whose attempt ended by
        its lease (0 when it did not). A lease that ran out may belong to a call that is
        still running (stopped, cut off): ``stale_call_grace``. An owner found gone sends
        nothing more, but its last request may still be in flight: ``dead_owner_grace``.
        Either way at least the tool's own grace.

        The window runs from the lease's end (or when the owner was found gone) on the
        ledger's clock, and from when this process first knew the attempt had stopped on
        its monotonic clock: a forward step of the clock must not spend it."""
        evidence = effect.execution_evidence or {}
        if not evidence.get("lease_expired"):
            return 0.0
        floor = self.dead_owner_grace if evidence.get("owner_gone") else self.stale_call_grace
        window = max(self.grace_for(effect.tool), floor)
        by_clock = _lease_end(effect) + window - now
        by_monotonic = window - stopped_for(self.clock, effect.id, effect.attempt)
        return max(0.0, by_clock, by_monotonic)

    def _lost_race(self, effect: Effect, result: ProbeResult, report: ReconcileReport) -> None:
        """A decisive observation arrived after someone else moved the effect. Keep it; if
        it contradicts the newer state, a person must look."""
        report.lost_races += 1
        current = self.store.get(effect.id)
        if current is None:
            return
        observation = _observation(result, effect.attempt, self.clock.now())
        # A miss agrees with anything (after a commit it is a lagging index); a find agrees
        # only with a commit of the same provider object, or with a person already looking.
        # A find after a re-arm, a retry, a cancel or another object may mean the effect
        # happened twice.
        agrees = (
            result.outcome is not ProbeOutcome.HAPPENED
            or current.state in (S.HUMAN_REVIEW, S.UNKNOWN)
            or (
                current.state == S.COMMITTED
                and self._same_object(current.result, result.receipt, effect.tool)
            )
        )
        reason = f"probe found {result.outcome} after the effect was moved to {current.state}"
        evidence = {"observation": observation, "probed_attempt": effect.attempt}
        if agrees or not self.oo.ledger.move(
            current, "contradict", S.HUMAN_REVIEW, actor=self.actor,
            reason=reason + "; it contradicts that decision: check the provider for a duplicate",
            evidence=evidence, changes={"verification_status": "contradicted"},
        ):  # fmt: skip
            self.oo.ledger.note(effect.id, actor=self.actor, reason=reason, evidence=evidence)
            return
        report.escalated.append(effect.id)

    def _same_object(self, committed: Any, receipt: Any, tool: str) -> bool:
        """Whether a committed result names the provider object a probe found. The two
        differ in shape (a handler may return the whole Stripe object, a prober returns
        ``{"stripe_id": ...}``), so identity is compared: every identity field of the
        receipt (its capability's required receipt fields; without one, all its fields)
        is carried by the result under the same name or, for an object returned whole, as
        the result's own identity, its ``id`` (a Stripe object's), for a receipt field that
        names an id (``id``, ``stripe_id``, ``message_id``). Any other value of the result
        is not its identity: ``{"id": "ch_2", "refund_of": "ch_1"}`` is not ``ch_1``."""
        if committed == receipt:
            return True
        if not isinstance(committed, Mapping) or not isinstance(receipt, Mapping):
            return False
        capabilities = self.matrix.resolve(tool, self._pins.get(tool))
        fields = [f for c in capabilities for f in c.required_receipt_fields if f in receipt]
        fields = fields or list(receipt)

        def same(a: Any, b: Any) -> bool:
            return type(a) is type(b) and a == b  # as JSON values: 42 is not "42"

        for name in fields:
            wanted = receipt[name]
            if name in committed:
                if not same(committed[name], wanted):
                    return False
            elif not (
                (name == "id" or str(name).endswith("_id"))
                and "id" in committed
                and same(committed["id"], wanted)
            ):
                return False
        return bool(fields)

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
        moved = self.oo.ledger.move(
            effect, "escalate", S.HUMAN_REVIEW, actor=self.actor,
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


def _prober_failure(exc: BaseException) -> ProbeResult:
    """What a prober's exception tells: which provider failed how, and when to ask again."""
    if isinstance(exc, ProbeError):
        observed: dict[str, Any] = {"probe_error": True, "provider": exc.provider}
        if exc.status is not None:
            observed["status"] = exc.status
        if isinstance(exc, ProbeCredentialError):
            observed["credential"] = True
        elif isinstance(exc, ProbeTransientError):
            observed["transient"] = True
            if exc.retry_after is not None:
                observed["retry_after"] = exc.retry_after
            if not exc.sent:
                observed["not_sent"] = True
        return ProbeResult(
            ProbeOutcome.INCONCLUSIVE,
            detail=f"{type(exc).__name__}: {_words(exc)}"[:500],
            observed=observed,
        )
    return _inconclusive(f"prober raised {type(exc).__name__}: {_words(exc)}"[:500], error=True)


def _words(exc: BaseException) -> str:
    """A prober's exception text as a journal reason: a provider's error may quote the key
    or a card number (masked by shape, :func:`redact_text`), and every store must be able
    to hold it (escaped, :func:`safe_text`). Notifications and the console show it."""
    return safe_text(redact_text(message_text(exc)))


def _inconclusive(
    detail: str,
    original: ProbeResult | None = None,
    *,
    error: bool = False,
    transient: bool = False,
) -> ProbeResult:
    observed: dict[str, Any] = {}
    if original is not None:
        observed = {"claimed": str(original.outcome), "receipt": original.receipt}
    if error or transient:
        observed["probe_error"] = True
    if transient:
        observed["transient"] = True
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed)


def _provider_had_it(effect: Effect) -> str:
    """The reason the attempt was parked UNKNOWN, when it says the provider reported it has
    this already (classify.provider_had_it); empty otherwise."""
    error = (effect.execution_evidence or {}).get("error")
    why = error.get("why") if isinstance(error, dict) else None
    return why if isinstance(why, str) and provider_had_it(why) else ""


def _maturing(results: list[ProbeResult]) -> float | None:
    """How long to wait when every inconclusive result is a young miss that will mature
    (``retry_after``): the longest of their waits, kept within [1 s, MAX_BACKOFF]. None
    when any inconclusive result will not mature: that is a person's now."""
    waits = []
    for r in results:
        if r.decisive:
            continue
        wait = r.retry_after
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
            return None
        waits.append(min(MAX_BACKOFF, max(1.0, float(wait))))
    return max(waits) if waits else None


def _reprobe_evidence(effect: Effect) -> dict[str, Any]:
    """The effect's verification evidence for a re-probe (UNKNOWN -> UNKNOWN), keeping when
    it went UNKNOWN: the move updates the row, and a prober counts a miss's age from then
    (``probe.attempt_ended_at``)."""
    evidence = dict(effect.verification_evidence or {})
    evidence["unknown_since"] = {"attempt": effect.attempt, "at": attempt_ended_at(effect)}
    return evidence


def _failed(result: ProbeResult) -> bool:
    """The prober itself failed (raised, timed out): no observation of the effect at all."""
    return result.observed.get("probe_error") is True


def _failures(effect: Effect) -> dict[str, Any]:
    """Failed probes of the current attempt so far (count, since, wait, attempts)."""
    doc = (effect.verification_evidence or {}).get("probe_failures") or {}
    return doc if isinstance(doc, dict) and doc.get("attempt") == effect.attempt else {}


def _attempt(result: ProbeResult, at: float) -> dict[str, Any]:
    keep = {k: v for k, v in result.observed.items() if k in ("provider", "status", "retry_after")}
    return {"at": at, "detail": result.detail[:300], **keep}


def _lease_end(effect: Effect) -> float:
    """When the attempt stopped, as the ledger knows it: when its owner was found gone, or
    its lease's end (ledgers from before ``owner_gone_at`` have only the latter: later)."""
    evidence = effect.execution_evidence or {}
    for name in ("owner_gone_at", "lease_expired_at"):
        end = evidence.get(name)
        if isinstance(end, int | float) and not isinstance(end, bool):
            return float(end)
    return effect.updated_at


def _observation(result: ProbeResult, attempt: int, at: float) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "outcome": str(result.outcome),
        "detail": result.detail,
        "attempt": attempt,
        "at": at,
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
