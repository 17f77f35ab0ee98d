"""Any MCP agent, made safe by a configuration file: ``openonce mcp-proxy`` between an
agent and the MCP server it already uses. Nothing here imports OpenOnce to run a tool:
the agent is a plain ``mcp`` client; only the person's decisions use the ledger.

The gateway (``openonce --db LEDGER mcp-proxy --config openonce-mcp.json``) starts the
payment provider's MCP server (``payments_server.py``), lists its tools unchanged, and
runs ``charge`` and ``refund`` through the ledger; ``get_order`` passes through.

What happens:

1. the agent charges order A, then (a retry after a timeout of its own) charges it again:
   replayed from the ledger, the provider charged once;
2. the refund needs approval: the agent is told so (a tool error naming the effect and
   its console page), eric approves, the agent calls again and the refund runs once;
3. the provider charges order B and dies before answering: the gateway answers "outcome
   unknown, do not retry", and the agent's retry is not sent; eric finds the charge in
   the provider's book and resolves it as happened; the next call replays his receipt.

    python examples/mcp/agent.py [ledger.db]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters

import openonce_core as openonce

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def gateway_config(book: Path, lose_reply_for: str) -> Path:
    """``openonce-mcp.json`` as shipped, with this Python and the provider's book."""
    config = json.loads((HERE / "openonce-mcp.json").read_text())
    upstream = config["upstream"]["payments"]
    upstream["command"] = sys.executable
    upstream["args"] = [str(HERE / "payments_server.py")]
    upstream["env"] = {"PAYMENTS_BOOK": str(book), "PAYMENTS_LOSE_REPLY_FOR": lose_reply_for}
    path = Path(tempfile.mkdtemp(prefix="openonce-mcp-")) / "openonce-mcp.json"
    path.write_text(json.dumps(config))
    return path


def book_of(book: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in book.read_text().splitlines() if line]


def executed(book: Path, kind: str) -> int:
    return sum(1 for entry in book_of(book) if entry["kind"] == kind)


def times(n: int) -> str:
    return f"{n} time" + ("" if n == 1 else "s")


async def agent(ledger: str, book: Path, run: str) -> None:
    order_a, order_b = f"A-{run}", f"B-{run}"
    gateway = StdioServerParameters(
        command=sys.executable,
        args=["-m", "openonce_core.cli", "--db", ledger, "mcp-proxy", "--config",
              str(gateway_config(book, lose_reply_for=order_b))],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    me = types.Implementation(name="example-agent", version="1")
    async with Client(gateway, client_info=me) as client:
        tools = [tool.name for tool in (await client.list_tools()).tools]
        print(f"tools listed through the gateway: {', '.join(tools)}")
        print(await text(client, "get_order", {"order": order_a}))

        # 1. A duplicate.
        first = await client.call_tool("charge", {"order": order_a, "amount_cents": 2500})
        again = await client.call_tool("charge", {"order": order_a, "amount_cents": 2500})
        charge_id = (first.structured_content or {})["charge_id"]
        assert again.structured_content == first.structured_content
        print(
            f"payments.charge {order_a}: {charge_id}, duplicate replayed"
            f" ({(again.meta or {}).get('openonce/outcome')}; provider charged"
            f" {times(executed(book, 'charge'))})"
        )

        # 2. An approval.
        asked = await client.call_tool("refund", {"charge_id": charge_id})
        effect_id = (asked.structured_content or {})["effect_id"]
        print(f"payments.refund: approval required ({effect_id}); the agent was told:")
        print("    " + first_line(asked))
        with openonce.OpenOnce(ledger) as oo:
            oo.approve(effect_id, by="eric", reason="customer asked by phone")
        refunded = await client.call_tool("refund", {"charge_id": charge_id})
        await client.call_tool("refund", {"charge_id": charge_id})
        print(
            f"payments.refund: approved by eric, executed once"
            f" ({(refunded.structured_content or {})['refund_id']};"
            f" provider refunded {times(executed(book, 'refund'))})"
        )

        # 3. A lost reply.
        lost = await client.call_tool("charge", {"order": order_b, "amount_cents": 900})
        unknown_id = (lost.structured_content or {})["effect_id"]
        print(f"payments.charge {order_b}: outcome unknown, parked as unknown ({unknown_id})")
        print("    " + first_line(lost))
        retry = await client.call_tool("charge", {"order": order_b, "amount_cents": 900})
        assert (retry.structured_content or {})["status"] == "outcome_unknown"
        charges = [e for e in book_of(book) if e["kind"] == "charge"]
        charged_b = sum(e["answer"]["order"] == order_b for e in charges)
        print(
            f"payments.charge {order_b}: the agent's retry was not sent to the provider"
            f" (provider charged {order_b} {times(charged_b)})"
        )
        found = next(e for e in charges if e["answer"]["order"] == order_b)
        with openonce.OpenOnce(ledger) as oo:
            oo.resolve_happened(
                unknown_id, receipt=found["answer"], by="eric",
                reason=f"{found['answer']['charge_id']} is in the provider's book",
            )  # fmt: skip
        print(f"payments.charge {order_b}: resolved as happened by eric")
        replayed = await client.call_tool("charge", {"order": order_b, "amount_cents": 900})
        print(
            f"payments.charge {order_b}: replayed eric's receipt"
            f" {(replayed.structured_content or {})['charge_id']}"
        )


def first_line(result: types.CallToolResult) -> str:
    block = result.content[0]
    return block.text.splitlines()[0] if isinstance(block, types.TextContent) else ""


async def text(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    return first_line(await client.call_tool(tool, arguments))


def main() -> None:
    ledger = sys.argv[1] if len(sys.argv) > 1 else "examples-mcp.db"
    book = Path(ledger).with_suffix(".payments-book.jsonl")
    with openonce.OpenOnce(ledger):  # install the schema once, before the gateway starts
        pass
    run = os.urandom(3).hex()  # each run is a new conversation about new orders
    anyio.run(agent, ledger, book, run)
    print(f"ledger: {ledger} (openonce --db {ledger} show <effect id>)")


if __name__ == "__main__":
    main()
