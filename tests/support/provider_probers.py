"""Probers for the daemon tests against the fake providers, loaded by worker processes
through OPENONCE_PROBERS=tests.support.provider_probers:PROBERS (or :KILLING_PROBERS).

The real ``StripeProber`` over its real HTTP client, pointed at the test's fake Stripe
(``OPENONCE_TEST_STRIPE_URL``) with ``OPENONCE_TEST_STRIPE_KEY`` and this process's share of
the provider's rate limit (``OPENONCE_TEST_STRIPE_RPS``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from openonce_core._probe import ProbeResult
from openonce_core._records import Effect
from openonce_core.probers import StripeProber
from tests.support.probers import ArgsProber


def _stripe() -> StripeProber:
    return StripeProber.from_api_key(
        os.environ.get("OPENONCE_TEST_STRIPE_KEY", "sk_test_good"),
        base_url=os.environ.get("OPENONCE_TEST_STRIPE_URL", "http://127.0.0.1:9"),
        requests_per_second=float(os.environ.get("OPENONCE_TEST_STRIPE_RPS", "18")),
        timeout=float(os.environ.get("OPENONCE_TEST_STRIPE_TIMEOUT", "10")),
        index_lag_seconds=0,
    )


class LazyStripe:
    """Builds the prober in the process that probes (after the worker forked), bound to
    the clock the reconciler hands it (the ledger's): unbound, a young miss would be judged
    on this host's clock, and a host clock stepped an hour back would read every attempt
    as an hour in the future."""

    capability = "stripe"
    provider = "stripe"

    def __init__(self) -> None:
        self._prober: StripeProber | None = None
        self._clock: Callable[[], float] | None = None

    def bind_clock(self, now: Callable[[], float]) -> None:
        self._clock = now
        if self._prober is not None:
            self._prober.bind_clock(now)

    def probe(self, effect: Effect) -> ProbeResult:
        if self._prober is None:
            self._prober = _stripe()
            if self._clock is not None:
                self._prober.bind_clock(self._clock)
        return self._prober.probe(effect)


class KillingProber(ArgsProber):
    """Kills the process probing an effect whose order starts with "poison-" (a driver
    that segfaults on one effect's data); others answer like ArgsProber."""

    def probe(self, effect: Effect) -> Any:
        if str(effect.args.get("order", "")).startswith("poison-"):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().probe(effect)


PROBERS = {"stripe.charge": LazyStripe()}
KILLING_PROBERS = {"stripe.charge": KillingProber()}
