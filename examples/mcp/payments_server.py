"""A payment provider's MCP server, offline: the MCP SDK's ``MCPServer`` (FastMCP in v1)
with a ``charge`` tool, a ``refund`` tool and a read-only ``get_order``.

Like Stripe it keeps a book of what it executed (``PAYMENTS_BOOK``, one JSON line per
charge or refund) and honours an idempotency key: the provider key OpenOnce sends in the
request's ``_meta`` (``openonce/provider_key``). A request whose key it has seen gets the
saved answer and executes nothing.

``PAYMENTS_LOSE_REPLY_FOR=<order>``: the charge for that order executes, then the server
dies before answering: the lost reply the gateway must park as UNKNOWN.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

BOOK = Path(os.environ.get("PAYMENTS_BOOK", "payments-book.jsonl"))
app = MCPServer("payments")


def _book() -> list[dict[str, Any]]:
    if not BOOK.exists():
        return []
    return [json.loads(line) for line in BOOK.read_text().splitlines() if line]


def _execute(kind: str, key: str | None, answer: dict[str, Any]) -> dict[str, Any]:
    for entry in _book():
        if key and entry["key"] == key:
            return dict(entry["answer"])  # the same request again: the saved answer
    with BOOK.open("a") as f:
        f.write(json.dumps({"kind": kind, "key": key, "answer": answer}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return answer


@app.tool()
def charge(order: str, amount_cents: int, ctx: Context) -> dict[str, Any]:
    """Charge the customer for an order (amount in cents)."""
    key = (ctx.request_context.meta or {}).get("openonce/provider_key")
    number = sum(1 for e in _book() if e["kind"] == "charge") + 1
    answer = _execute("charge", key, {"charge_id": f"ch_{number:04d}", "order": order,
                                      "amount_cents": amount_cents})  # fmt: skip
    if os.environ.get("PAYMENTS_LOSE_REPLY_FOR") == order:
        os._exit(1)  # executed, and the reply never leaves
    return answer


@app.tool()
def refund(charge_id: str, ctx: Context) -> dict[str, Any]:
    """Refund a charge in full."""
    key = (ctx.request_context.meta or {}).get("openonce/provider_key")
    return _execute("refund", key, {"refund_id": f"re_{charge_id}", "charge_id": charge_id})


@app.tool()
def get_order(order: str) -> str:
    """Look an order up (read-only)."""
    return f"order {order}: awaiting payment"


if __name__ == "__main__":
    app.run()
