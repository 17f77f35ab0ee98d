oo.resolve_not_happened(
    effect_id,
    by="eric",
    reason="not found in provider dashboard",
)
