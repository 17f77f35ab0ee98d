oo = openonce.OpenOnce(
    "openonce.db",
    enforce_provider_receipts=True,
    require_provider_capability_for_receipts=True,
    provider_capabilities={"github.create_pr": "github_pr"},
)
