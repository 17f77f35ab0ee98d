"""Fault injection and safety reports: test your own effects against a misbehaving provider.

``openonce test suite.py`` loads a file whose zero-argument ``run_safety_suite()`` returns a
:class:`SafetyReport`. The pieces a suite is built from live here:

* :class:`FakePaymentProvider` — a deterministic payment API with provider-side
  idempotency, and faults on either side of its commit (:class:`ChargeFault`), a lagging
  search index, a search outage, and a search that answers about the wrong charge;
* :class:`FakePaymentProber` — the read-only prober for it, which the reconciler uses to
  resolve UNKNOWN charges;
* :func:`fake_payment_capability` — the provider capability that lets a mature miss of
  the fake re-arm an effect (tier 1: the fake dedups by our provider key);
* :class:`SafetyCheck`, :class:`SafetyReport`, :class:`NaiveRetryComparison` — the
  report the CLI prints as text or JSON;
* :class:`FakeClock` — a ledger clock a test moves by hand (``OpenOnce(..., clock=clock)``,
  ``Reconciler(..., clock=clock)``), so leases, grace windows, approval expiry and
  backoff are tested without sleeping; :func:`stop_heartbeat` makes a client behave like
  a process that was stopped or cut off mid-call (its leases are no longer renewed).

"Safe under tested conditions" describes only the scenarios a suite ran. It is not
formal verification: the fake models a few failure modes of a real provider, not all.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ._clock import FakeClock
from ._probe import ProbeOutcome, ProbeResult
from ._providers import TIER_1_NATIVE_IDEMPOTENCY_KEY, Capability
from ._records import Effect
from .errors import BusinessError

__all__ = [
    "Charge",
    "ChargeDeclined",
    "ChargeFault",
    "FakeClock",
    "FakePaymentProber",
    "FakePaymentProvider",
    "LookupUnavailableError",
    "NaiveRetryComparison",
    "SafetyCheck",
    "SafetyReport",
    "SearchPage",
    "fake_payment_capability",
    "stop_heartbeat",
]

SAFE = "SAFE UNDER TESTED CONDITIONS"


def stop_heartbeat(oo: Any) -> Any:
    """Stop ``oo`` renewing the leases of its running calls, as if its process had been
    stopped (SIGSTOP), frozen or cut off from the ledger while a handler runs: with a
    FakeClock advanced past the lease, the effect can then expire into UNKNOWN."""
    oo.keeper.close()
    return oo


REPORT_SCHEMA_VERSION = 1


# -- the fake provider --------------------------------------------------------------------


class ChargeFault(StrEnum):
    """What goes wrong on one ``charge()`` call, in the order the faults are listed."""

    # The provider refuses before committing anything: an ordinary error, nothing charged.
    FAIL_BEFORE_COMMIT = "fail_before_commit"
    # The request times out before the provider commits: nothing charged, yet the caller
    # cannot tell this apart from the next fault.
    TIMEOUT_BEFORE_COMMIT = "timeout_before_commit"
    # The provider commits the charge, then the reply times out.
    TIMEOUT_AFTER_COMMIT = "timeout_after_commit"
    # The provider commits the charge, then the connection is reset: the reply is lost.
    LOST_REPLY = "lost_reply"


class ChargeDeclined(BusinessError):
    """The fake provider refused the charge before committing it (nothing was charged)."""


class LookupUnavailableError(Exception):
    """The fake provider's search is down; it says nothing about whether a charge exists."""


@dataclass(frozen=True, slots=True)
class Charge:
    """One committed charge at the fake provider."""

    id: str
    customer_id: str
    amount_cents: int
    client_reference: str | None
    created_at: float

    def receipt(self) -> dict[str, Any]:
        """The receipt a handler returns and a probe reports: the same fields, so a
        reconciled effect replays exactly what a successful call would have returned."""
        return {
            "charge_id": self.id,
            "customer_id": self.customer_id,
            "amount_cents": self.amount_cents,
        }


@dataclass(frozen=True, slots=True)
class SearchPage:
    """What one search returned. ``index_current`` is False while the index still lags
    behind committed writes: a miss on such a page proves nothing."""

    charges: tuple[Charge, ...]
    index_current: bool


class FakePaymentProvider:
    """A deterministic, thread-safe payment API with injectable faults.

    * ``charge_faults``: consumed one per ``charge()`` call, in order; calls after the
      list is used up succeed.
    * ``index_lag_lookups``: a charge is missing from the first N searches after its
      commit. ``index_lag_seconds``: a charge is missing from searches until it is that
      old. Either way the page says the index is not current.
    * ``lookup_outage``: every search raises :class:`LookupUnavailableError`.
    * ``wrong_identity``: searches return a charge of another client reference.
    * ``idempotency_window_seconds``: a repeated ``client_reference`` inside this window
      returns the original charge instead of charging again (like Stripe's 24 h keys).
    * ``latency_seconds``: how long a charge takes before it commits (to make concurrent
      duplicates overlap).

    The counters are what a suite judges by: ``charge_calls`` (requests that reached the
    provider), ``charges`` (charges that exist), ``search_calls``.
    """

    def __init__(
        self,
        charge_faults: Iterable[ChargeFault] = (),
        *,
        index_lag_lookups: int = 0,
        index_lag_seconds: float = 0.0,
        lookup_outage: bool = False,
        wrong_identity: bool = False,
        idempotency_window_seconds: float = 86_400.0,
        latency_seconds: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        faults = list(charge_faults)
        for fault in faults:
            if not isinstance(fault, ChargeFault):
                raise TypeError(f"charge_faults must hold ChargeFault values, got {fault!r}")
        if type(index_lag_lookups) is not int or index_lag_lookups < 0:
            raise ValueError("index_lag_lookups must be a non-negative integer")
        if index_lag_seconds < 0 or idempotency_window_seconds < 0 or latency_seconds < 0:
            raise ValueError("lags, windows and latency must be non-negative seconds")
        self.index_lag_lookups = index_lag_lookups
        self.index_lag_seconds = index_lag_seconds
        self.lookup_outage = lookup_outage
        self.wrong_identity = wrong_identity
        self.idempotency_window_seconds = idempotency_window_seconds
        self.latency_seconds = latency_seconds
        self.clock = clock
        self.charge_calls = 0
        self.search_calls = 0
        self.charges: list[Charge] = []
        self._faults: deque[ChargeFault] = deque(faults)
        self._by_reference: dict[str, Charge] = {}
        self._committed_at_search: dict[str, int] = {}  # charge id -> search_calls at commit
        self._lock = threading.Lock()

    @property
    def total_cents(self) -> int:
        with self._lock:
            return sum(c.amount_cents for c in self.charges)

    def charge(self, customer_id: str, amount_cents: int, client_reference: str | None) -> Charge:
        """Charge ``amount_cents``; a repeated ``client_reference`` returns the same charge.

        Faults raise what a real HTTP client would: ``ChargeDeclined`` (an answer, nothing
        charged), ``TimeoutError`` and ``ConnectionResetError`` (no answer; before or after
        the commit, the caller cannot tell).
        """
        if type(customer_id) is not str or not customer_id:
            raise ValueError("customer_id must be a non-empty string")
        if type(amount_cents) is not int or amount_cents <= 0:
            raise ValueError("amount_cents must be a positive integer")
        with self._lock:
            self.charge_calls += 1
            fault = self._faults.popleft() if self._faults else None
        if self.latency_seconds:
            time.sleep(self.latency_seconds)
        if fault is ChargeFault.FAIL_BEFORE_COMMIT:
            raise ChargeDeclined("card declined before anything was charged (injected fault)")
        if fault is ChargeFault.TIMEOUT_BEFORE_COMMIT:
            raise TimeoutError("charge request timed out before the provider committed")
        with self._lock:
            charge = self._commit(customer_id, amount_cents, client_reference)
        if fault is ChargeFault.TIMEOUT_AFTER_COMMIT:
            raise TimeoutError("charge reply timed out after the provider committed")
        if fault is ChargeFault.LOST_REPLY:
            raise ConnectionResetError("connection reset after the provider committed")
        return charge

    def _commit(self, customer_id: str, amount_cents: int, reference: str | None) -> Charge:
        at = self.clock()
        if reference is not None:
            earlier = self._by_reference.get(reference)
            if earlier is not None and at - earlier.created_at < self.idempotency_window_seconds:
                return earlier  # provider-side idempotency: same key, same charge
        charge = Charge(
            id=f"ch_{len(self.charges) + 1:04d}",
            customer_id=customer_id,
            amount_cents=amount_cents,
            client_reference=reference,
            created_at=at,
        )
        self.charges.append(charge)
        self._committed_at_search[charge.id] = self.search_calls
        if reference is not None:
            self._by_reference[reference] = charge
        return charge

    def search(self, client_reference: str) -> SearchPage:
        """Charges carrying ``client_reference`` that the search index has caught up with."""
        with self._lock:
            self.search_calls += 1
            if self.lookup_outage:
                raise LookupUnavailableError("payment search is unavailable (injected outage)")
            at = self.clock()
            current = all(self._indexed(c, at) for c in self.charges)
            if self.wrong_identity:
                # A wrapper or a query gone wrong: it answers, confidently, about someone
                # else's charge.
                decoy = Charge(
                    id="ch_9999",
                    customer_id="customer_other",
                    amount_cents=100,
                    client_reference=f"{client_reference}-other",
                    created_at=at,
                )
                return SearchPage((decoy,), index_current=True)
            found = tuple(
                c
                for c in self.charges
                if c.client_reference == client_reference and self._indexed(c, at)
            )
            return SearchPage(found, index_current=current)

    def _indexed(self, charge: Charge, at: float) -> bool:
        searches_since = self.search_calls - self._committed_at_search[charge.id]
        return (
            searches_since > self.index_lag_lookups
            and at - charge.created_at >= self.index_lag_seconds
        )


class FakePaymentProber:
    """Read-only prober for :class:`FakePaymentProvider` charges made with
    ``client_reference=current_effect().provider_key``.

    * a charge found: HAPPENED with its receipt (``charge_id``...). The result names the
      reference printed on the charge it found, never the one it asked for, so a search
      that answers about another charge cannot resolve this effect: the reconciler's
      binding check turns it into INCONCLUSIVE;
    * several charges: INCONCLUSIVE (duplicates are a person's call);
    * a search outage, or a miss while the index is behind its writes, or a miss younger
      than the provider's index lag: INCONCLUSIVE (could not verify is not did not happen);
    * a miss on a current index, past the lag: NOT_HAPPENED. Re-arming on it is safe
      because the provider dedups a re-sent reference inside its idempotency window.
    """

    capability = "fake_payment"

    def __init__(
        self, provider: FakePaymentProvider, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.provider = provider
        self.clock = clock

    def probe(self, effect: Effect) -> ProbeResult:
        reference = effect.provider_key
        try:
            page = self.provider.search(reference)
        except LookupUnavailableError as exc:
            return _inconclusive(f"payment search unavailable: {exc}")
        observed: dict[str, Any] = {
            "matches": len(page.charges),
            "index_current": page.index_current,
        }
        if len(page.charges) > 1:
            ids = ", ".join(c.id for c in page.charges)
            return _inconclusive(
                f"{len(page.charges)} charges found ({ids}): duplicates?", observed
            )
        if page.charges:
            charge = page.charges[0]
            return ProbeResult(
                ProbeOutcome.HAPPENED,
                receipt=charge.receipt(),
                detail=f"charge {charge.id} found by reference {charge.client_reference}",
                provider_reference=charge.client_reference,
                observed=observed,
            )
        if not page.index_current:
            return _inconclusive(
                "no charge found, but the search index lags behind committed charges:"
                " a miss proves nothing yet",
                observed,
            )
        age = self.clock() - effect.updated_at
        if age < self.provider.index_lag_seconds:
            return _inconclusive(
                f"no charge found {age:.1f}s after the attempt, inside the"
                f" {self.provider.index_lag_seconds:g}s index lag: a young miss",
                observed,
            )
        return ProbeResult(
            ProbeOutcome.NOT_HAPPENED,
            detail=f"no charge carries reference {reference}; index current, past its lag",
            provider_reference=reference,
            observed=observed,
        )


def _inconclusive(detail: str, observed: dict[str, Any] | None = None) -> ProbeResult:
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {})


def fake_payment_capability(tool: str = "charge_customer") -> Capability:
    """The capability of :class:`FakePaymentProvider` for ``tool``: tier 1, a mature miss
    may re-arm. Pass it to ``Reconciler(extra_capabilities=[...])``."""
    return Capability(
        name="fake_payment",
        tool_pattern=tool,
        tier=TIER_1_NATIVE_IDEMPOTENCY_KEY,
        key_strategy="current_effect().provider_key sent as the charge's client_reference",
        probe_basis="search by client_reference (lags behind writes; reports when it lags)",
        miss_semantics="inconclusive while the index lags or is down, then not-happened",
        can_auto_rearm_on_miss=True,
        default_grace_seconds=0,
        prober="FakePaymentProber",
        handler_requirements=("pass current_effect().provider_key as client_reference",),
        risk="none: a deterministic fake for the fault harness",
        required_receipt_fields=("charge_id",),
    )


# -- the report ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SafetyCheck:
    """One scenario's verdict. ``passed`` must be an exact bool: a truthy string such as
    ``"false"`` is refused rather than rendered as a pass."""

    name: str
    passed: bool
    detail: str = ""

    def __post_init__(self) -> None:
        if type(self.name) is not str or not self.name.strip():
            raise TypeError("SafetyCheck.name must be a non-empty str")
        if type(self.passed) is not bool:
            raise TypeError(
                f"SafetyCheck.passed must be exactly True or False, got {self.passed!r}"
                f" ({type(self.passed).__name__})"
            )
        if type(self.detail) is not str:
            raise TypeError("SafetyCheck.detail must be a str")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class NaiveRetryComparison:
    """The same timeout-after-commit, handled by a naive retry loop and by OpenOnce."""

    naive_calls: int
    naive_charges: int
    naive_total_cents: int
    calls: int
    charges: int
    execution: str
    verification: str
    final: str

    def __post_init__(self) -> None:
        for name in ("naive_calls", "naive_charges", "naive_total_cents", "calls", "charges"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise TypeError(f"NaiveRetryComparison.{name} must be a non-negative int")
        for name in ("execution", "verification", "final"):
            if type(getattr(self, name)) is not str:
                raise TypeError(f"NaiveRetryComparison.{name} must be a str")

    def lines(self) -> list[str]:
        return [
            "Timeout-after-commit comparison",
            f"  Naive retry: calls={self.naive_calls}, charges={self.naive_charges},"
            f" total={self.naive_total_cents} cents",
            f"  OpenOnce:    execution={self.execution}, verification={self.verification},"
            f" final={self.final}, calls={self.calls}, charges={self.charges}",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "naive_retry": {
                "calls": self.naive_calls,
                "charges": self.naive_charges,
                "total_cents": self.naive_total_cents,
            },
            "openonce": {
                "execution": self.execution,
                "verification": self.verification,
                "final": self.final,
                "calls": self.calls,
                "charges": self.charges,
            },
        }


@dataclass(frozen=True, slots=True, init=False)
class SafetyReport:
    """The verdicts of one suite. It is SAFE only if every check passed, and it refuses
    anything but :class:`SafetyCheck` entries, so no constructor path renders a pass that
    was not computed as an exact ``True``."""

    title: str
    checks: tuple[SafetyCheck, ...]
    comparison: NaiveRetryComparison | None

    def __init__(
        self,
        title: str,
        checks: Iterable[SafetyCheck],
        comparison: NaiveRetryComparison | None = None,
    ) -> None:
        if type(title) is not str or not title.strip():
            raise TypeError("SafetyReport.title must be a non-empty str")
        if isinstance(checks, (str, bytes)):
            raise TypeError("SafetyReport.checks must be SafetyCheck entries, not a string")
        entries = tuple(checks)
        if not entries:
            raise ValueError("a SafetyReport needs at least one check: no checks prove nothing")
        names: set[str] = set()
        for i, check in enumerate(entries):
            if type(check) is not SafetyCheck:
                raise TypeError(
                    f"SafetyReport.checks[{i}] is {type(check).__name__}, not a SafetyCheck"
                )
            # Re-checked here: object.__setattr__ can bypass a frozen dataclass's init.
            if type(check.passed) is not bool:
                raise TypeError(f"SafetyReport.checks[{i}].passed is not an exact bool")
            if check.name in names:
                raise ValueError(f"SafetyReport has two checks named {check.name!r}")
            names.add(check.name)
        if comparison is not None and type(comparison) is not NaiveRetryComparison:
            raise TypeError("SafetyReport.comparison must be a NaiveRetryComparison or None")
        object.__setattr__(self, "title", title)
        object.__setattr__(self, "checks", entries)
        object.__setattr__(self, "comparison", comparison)

    @property
    def failed(self) -> list[SafetyCheck]:
        return [c for c in self.checks if c.passed is not True]

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def classification(self) -> str:
        failed = len(self.failed)
        return SAFE if failed == 0 else f"UNSAFE: {failed} check(s) failed"

    def to_text(self) -> str:
        lines: list[str] = []
        if self.comparison is not None:
            lines += [*self.comparison.lines(), ""]
        lines += [self.title, ""]
        width = max(len(c.name) for c in self.checks) + 2
        for check in self.checks:
            lines.append(f"{check.name:<{width}}{'PASS' if check.passed else 'FAIL'}")
            if not check.passed and check.detail:
                lines.extend(f"    {line}" for line in check.detail.splitlines())
        lines += ["", "Final classification:", self.classification]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "title": self.title,
            "passed": self.passed,
            "classification": self.classification,
            "comparison": self.comparison.to_json() if self.comparison else None,
            "checks": [c.to_json() for c in self.checks],
        }
