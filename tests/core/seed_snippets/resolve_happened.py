oo.resolve_happened(
    effect_id,
    receipt={"stripe_id": "pi_1"},
    by="eric",
    reason="matched in Stripe dashboard",
)
