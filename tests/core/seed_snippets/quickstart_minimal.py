import openonce

oo = openonce.OpenOnce("openonce.db")   # or ":memory:" — zero infrastructure

@oo.effect                              # tool name = function name
def send_email(to: str, subject: str) -> str:
    ...

with oo.scope():                        # auto run id: in-run dedup
    send_email("a@b.c", "hi")
    send_email("a@b.c", "hi")           # LLM retry → replayed, not re-sent

protected = oo.effect(existing_tool)    # or wrap an existing callable directly
