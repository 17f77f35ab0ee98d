"""When an effect is due: the one rule the reconciler, the console's queue, ``/metrics``
and health share, on the ledger's clock.

* A STARTED effect is due when its lease ran out (``leases.lease_lapsed`` judges it) or
  its owner, a process on this host, is gone.
* An UNKNOWN effect is due at its next probe time: ``next_probe_at`` once the reconciler
  asked again later (a failed probe's backoff, a young miss: ``probe_pause`` after the
  move that wrote it), else its last change plus its tool's grace window (:class:`Grace`).

Both are found through indexes of pending rows only (schema v5): UNKNOWN effects never
asked again later by their last change (``openonce_effects_unknown_fresh``), those in
backoff by their next probe time (``openonce_effects_unknown_next``), so a sweep, a
queue page or a scrape costs what is due, not what waits or what is history.

A probe claim (a reconciler asking now) does not change when an effect is due; who may
probe it is the reconciler's own business (``Reconciler._is_due``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._clock import Clock
from ._leases import HOST, dead_owner, lease_lapsed, wait_over
from ._providers import CapabilityMatrix
from ._records import Effect
from ._states import EffectState
from .stores.base import Store
from .stores.sql import Cutoff

S = EffectState
PAGE = 500  # rows read per query when counting every due effect


class Grace:
    """A tool's grace window as the reconciler reads it: the tool's override, else one
    grace for every tool, else its provider capability's default (the pinned capability's,
    or the longest of those matching the tool), else none.

    Built from what configures a Reconciler, without one: a web process that only asks
    what is due needs no probers. ``pins`` is kept by reference, so a pin the reconciler
    adds when a prober is registered counts here too."""

    def __init__(
        self,
        matrix: CapabilityMatrix,
        *,
        grace_seconds: float | None = None,
        overrides: Mapping[str, float] | None = None,
        pins: dict[str, str] | None = None,
    ) -> None:
        self.matrix = matrix
        self.grace_seconds = grace_seconds
        self.overrides = dict(overrides or {})
        self.pins = pins if pins is not None else {}

    def for_tool(self, tool: str) -> float:
        if tool in self.overrides:
            return float(self.overrides[tool])
        if self.grace_seconds is not None:
            return float(self.grace_seconds)
        grace = self.matrix.grace_seconds(tool, self.pins.get(tool))
        return float(grace) if grace is not None else 0.0

    def uniform(self) -> float | None:
        """The grace of every tool, when one grace applies to all; else None."""
        if self.grace_seconds is not None and not self.overrides:
            return float(self.grace_seconds)
        return None


def probe_pause(tool: str, failures: Mapping[str, Any] | None, grace: Grace) -> float:
    """How long after a re-probe's move the effect waits, from the ``probe_failures`` that
    move writes: the wait a young miss asked for (its grace was spent before the first
    probe), else the longer of the tool's grace and the failed probe's backoff."""
    failures = failures or {}
    wait = float(failures.get("wait", 0.0))
    if failures.get("maturing"):
        return wait
    return max(grace.for_tool(tool), wait)


def next_probe(effect: Effect, grace: Grace) -> tuple[float, float]:
    """When an UNKNOWN effect may next be probed, and the pause that ends then."""
    if effect.next_probe_at is not None:
        return effect.next_probe_at, max(0.0, effect.next_probe_at - effect.updated_at)
    pause = grace.for_tool(effect.tool)
    return effect.updated_at + pause, pause


def unknown_due(effect: Effect, grace: Grace, clock: Clock, at: float) -> bool:
    """Whether an UNKNOWN effect's next probe time has come at ``at``. A time further
    ahead than its pause was written by a clock that has since stepped back: it is then
    counted on this process's monotonic clock (``leases.wait_over``)."""
    if effect.state != S.UNKNOWN:
        return False
    until, pause = next_probe(effect, grace)
    return wait_over(clock, ("pause", effect.id, effect.fence), until, at, pause)


def started_due(effect: Effect, clock: Clock, at: float) -> bool:
    """Whether a STARTED effect's attempt has stopped: its lease lapsed, or its owner on
    this host is gone."""
    if effect.state != S.STARTED:
        return False
    return lease_lapsed(effect, clock, at) or dead_owner(effect.lease_owner) is not None


def stopped_calls(store: Store, at: float, limit: int) -> list[Effect]:
    """STARTED effects whose lease's end has passed, then those whose owner on this host
    is gone: the candidates ``started_due`` judges (the reconciler judges each again)."""
    found = store.expired_leases(at, limit)
    seen = {e.id for e in found}
    for effect in store.started_by(HOST + ":", limit):
        if effect.id not in seen and dead_owner(effect.lease_owner):
            found.append(effect)
    return found[:limit]


def overdue_unknown(
    store: Store,
    grace: Grace,
    clock: Clock,
    at: float,
    limit: int,
    accept: Callable[[Effect], bool] | None = None,
) -> list[Effect]:
    """Up to ``limit`` UNKNOWN effects due at ``at``, longest overdue first. ``accept``
    leaves some out (the reconciler: those another reconciler is probing); the search
    reads on past them, so they never hide due effects behind them."""

    def keep(effect: Effect) -> bool:
        return unknown_due(effect, grace, clock, at) and (accept is None or accept(effect))

    cutoffs = fresh_cutoffs(store, grace, at)
    found = [
        *_read(lambda n, after: store.fresh_unknown(cutoffs, n, after), _by_change, keep, limit),
        *_read(lambda n, after: store.backoff_unknown(at, n, after), _by_next, keep, limit),
        *_read(lambda n, after: store.unknown_changed_after(at, n, after), _by_change, keep,
               limit),
    ]  # fmt: skip
    found.sort(key=lambda e: (next_probe(e, grace)[0], e.id))
    return found[:limit]


def count_overdue_unknown(store: Store, grace: Grace, clock: Clock, at: float) -> int:
    """How many UNKNOWN effects are due at ``at``: exact, counted by the database over the
    UNKNOWN rows' indexes (never over history)."""
    cutoffs = fresh_cutoffs(store, grace, at)
    stepped = _read(
        lambda n, after: store.unknown_changed_after(at, n, after),
        _by_change,
        lambda e: unknown_due(e, grace, clock, at),
        None,
    )
    return store.count_fresh_unknown(cutoffs) + store.count_backoff_unknown(at) + len(stepped)


def fresh_cutoffs(store: Store, grace: Grace, at: float) -> list[Cutoff]:
    """Per grace window, the last change that is past it at ``at``, with the tools it is
    theirs (all tools, when one grace applies to every tool)."""
    uniform = grace.uniform()
    if uniform is not None:
        return [Cutoff(at - uniform)]
    tools: dict[float, list[str]] = {}
    for tool in store.fresh_unknown_tools():
        tools.setdefault(grace.for_tool(tool), []).append(tool)
    return [Cutoff(at - g, tuple(sorted(names))) for g, names in sorted(tools.items())]


def _by_change(effect: Effect) -> tuple[float, str]:
    return effect.updated_at, effect.id


def _by_next(effect: Effect) -> tuple[float, str]:
    assert effect.next_probe_at is not None
    return effect.next_probe_at, effect.id


def _read(
    fetch: Callable[[int, tuple[float, str] | None], list[Effect]],
    key: Callable[[Effect], tuple[float, str]],
    keep: Callable[[Effect], bool],
    limit: int | None,
) -> list[Effect]:
    """Page through one index range (keyset on ``key``) until ``limit`` rows are kept, or
    to its end (``limit`` None)."""
    page = PAGE if limit is None else max(limit, 100)
    found: list[Effect] = []
    after: tuple[float, str] | None = None
    while limit is None or len(found) < limit:
        rows = fetch(page, after)
        found += [e for e in rows if keep(e)]
        if len(rows) < page:
            break
        after = key(rows[-1])
    return found if limit is None else found[:limit]
