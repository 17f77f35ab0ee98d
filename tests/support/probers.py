"""Probers for the daemon integration tests, loaded by worker processes through
OPENONCE_PROBERS=tests.support.probers:PROBERS.

The fake provider's state is the effect's own arguments: an effect whose ``order`` starts
with "paid-" was charged (HAPPENED, receipt bound to its provider key); "lost-" was not.
OPENONCE_TEST_PROBE_SLEEP makes every probe slow (to kill a worker mid-probe), and every
probe appends a line to OPENONCE_TEST_PROBE_LOG when set, so tests can count probes.
"""

from __future__ import annotations

import os
import time

from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._records import Effect


class ArgsProber:
    def probe(self, effect: Effect) -> ProbeResult:
        log = os.environ.get("OPENONCE_TEST_PROBE_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(f"{effect.id} {os.getpid()}\n")
        time.sleep(float(os.environ.get("OPENONCE_TEST_PROBE_SLEEP", "0")))
        order = str(effect.args.get("order", ""))
        if order.startswith("paid-"):
            return ProbeResult(
                ProbeOutcome.HAPPENED,
                receipt={"stripe_id": "pi_" + order},
                detail="found by metadata search",
                provider_reference=effect.provider_key,
            )
        if order.startswith("lost-"):
            return ProbeResult(
                ProbeOutcome.NOT_HAPPENED,
                detail="no charge carries this provider key",
                provider_reference=effect.provider_key,
            )
        return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail="search index unavailable")


PROBERS = {"stripe.charge": ArgsProber()}
