"""Evidence.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

from openonce_core import (
    OpenOnce,
)

from .helpers import (
    ambiguous_charge,
    only_effect,
    park_unknown,
)


def test_execution_and_verification_evidence_are_kept_apart(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    parked = oo.get(effect_id)
    assert parked.execution_status == "unknown"
    assert parked.execution_evidence["error"]["type"] == "builtins.TimeoutError"
    assert parked.execution_evidence["attempt"] == 1
    assert parked.verification_status is None
    oo.resolve_happened(
        effect_id, receipt={"stripe_id": "pi_9"}, by="eric", reason="in the dashboard"
    )
    resolved = oo.get(effect_id)
    # What the call established is unchanged; what a person verified is added beside it.
    assert resolved.execution_status == "unknown"
    assert resolved.execution_evidence == parked.execution_evidence
    assert resolved.verification_status == "confirmed_by_person"
    assert resolved.verification_evidence["receipt"] == {"stripe_id": "pi_9"}
    assert resolved.verification_evidence["by"] == "eric"
    assert resolved.verification_evidence["reason"] == "in the dashboard"
    assert resolved.result == {"stripe_id": "pi_9"}
    assert calls == [1]


def test_not_happened_is_recorded_as_verification_evidence(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    oo.resolve_not_happened(effect_id, by="eric", reason="absent in dashboard")
    effect = oo.get(effect_id)
    assert effect.execution_status == "unknown"
    assert effect.verification_status == "absent_by_person"
    assert effect.verification_evidence["reason"] == "absent in dashboard"
    assert calls == [1]


def test_plain_success_records_execution_evidence_only(store):
    oo = OpenOnce(store, retry_delay=0)

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        return {"message_id": "m-1"}

    send("a@b.c")
    effect = only_effect(store)
    assert effect.execution_status == "returned"
    assert effect.execution_evidence == {"attempt": 1}
    assert effect.verification_status is None
    assert effect.lease_owner is None
    assert effect.lease_expires_at is None
