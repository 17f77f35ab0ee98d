@oo.effect(idempotency_fields=["owner", "repo", "head"])
def create_pr(owner: str, repo: str, head: str, title: str, body: str) -> dict:
    ...  # your real tool code

with oo.scope("run-2026-07-02-a"):          # stable id: crash-resume dedup too
    create_pr(owner="acme", repo="api", head="fix-login", title="Fix login", body="...")
    # The LLM retries with a reworded body — same intent fingerprint, replayed:
    create_pr(owner="acme", repo="api", head="fix-login", title="Fix login", body="reworded")
