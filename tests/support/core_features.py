"""What the core on this branch can do, for tests written against behaviour that another
part of the work delivers (the lead's reconcile change for probe errors).

``CORE_CLASSIFIES_PROBE_ERRORS`` is true once ``ReconcileReport`` carries
``prober_failures``: the reconciler then keeps an effect UNKNOWN after a
``ProbeTransientError`` (re-probed with backoff honouring ``retry_after``) or a
``ProbeCredentialError`` (prober marked failing), instead of counting it as a probe error
that ends in human review. Tests of that behaviour are strict xfails until then, so they
start to count the moment the change lands.
"""

from __future__ import annotations

import dataclasses

import pytest

from openonce_core.reconcile import ReconcileReport

CORE_CLASSIFIES_PROBE_ERRORS = "prober_failures" in {
    f.name for f in dataclasses.fields(ReconcileReport)
}

needs_probe_error_classification = pytest.mark.xfail(
    not CORE_CLASSIFIES_PROBE_ERRORS,
    reason="needs the core's reconcile change: ProbeTransientError/ProbeCredentialError keep"
    " the effect UNKNOWN for a re-probe instead of sending it to a person",
    strict=True,
)
