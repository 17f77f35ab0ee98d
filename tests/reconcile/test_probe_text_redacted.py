"""A prober's words become journal reasons, which the console shows and notifications send:
a provider error that quotes the API key or a card number is masked before it is stored
(issue 18, items 12 and 13)."""

from __future__ import annotations

from typing import Any

import pytest

from openonce_core import EffectState, OpenOnce
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core.errors import OutcomeUnknownError, ProbeCredentialError

KEY = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
CARD = "4242424242424242"


class Refusing:
    def probe(self, effect: Any) -> ProbeResult:
        raise ProbeCredentialError("stripe", f"Invalid API Key provided: {KEY} (card {CARD})")


class Saying:
    def probe(self, effect: Any) -> ProbeResult:
        return ProbeResult(
            ProbeOutcome.INCONCLUSIVE, detail=f"lookup failed: Authorization: Bearer {KEY}"
        )


class Crashing:
    def probe(self, effect: Any) -> ProbeResult:
        raise RuntimeError(f"GET https://user:{KEY}@api.example/ failed for {CARD}")


@pytest.mark.parametrize("prober", [Refusing(), Saying(), Crashing()], ids=type)
def test_a_probers_words_are_stored_without_the_key_or_card(store, clock, prober) -> None:
    oo = OpenOnce(store, retry_delay=0, clock=clock)

    @oo.effect(tool="stripe.charge")
    def charge(amount: int) -> dict[str, Any]:
        raise TimeoutError("read timed out")

    with oo.scope("run"), pytest.raises(OutcomeUnknownError) as info:
        charge(amount=5)
    effect = oo.get(info.value.effect_id)
    assert effect.state == EffectState.UNKNOWN
    clock.advance(3600)
    reconciler = Reconciler(oo, grace_seconds=0, probe_retries=0)
    reconciler.register("stripe.charge", prober)
    reconciler.run_once()
    lines = [f"{j.reason} {j.evidence}" for j in oo.journal(effect.id)]
    text = " ".join(lines)
    assert "[secret]" in text
    assert KEY not in text and CARD not in text
    assert "4eC39HqLyjWDarjtT1zdp7dc" not in text
