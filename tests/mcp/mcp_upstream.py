"""A real MCP server (the SDK's MCPServer, FastMCP's v2 name) with a payment tool, for the
gateway's tests: every call it receives is appended to a file (``COUNTS``), one JSON line,
before it answers, so a test counts what reached the upstream.

Run as a program it serves stdio, or streamable HTTP with ``--http PORT``."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

_lock = threading.Lock()


def make_server(counts: Path) -> MCPServer:
    app = MCPServer("payments")

    def record(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
        meta = dict(ctx.request_context.meta or {})
        line = {"tool": tool, "args": arguments, "provider_key": meta.get("openonce/provider_key")}
        with _lock, counts.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())

    # A file the test creates when pay may answer: a slow provider the test holds, so that a
    # racing duplicate or a cancel arrives while the first call runs, whatever the load.
    gate = os.environ.get("OO_MCP_PAY_GATE")

    @app.tool()
    async def pay(order: str, amount_cents: int, ctx: Context, note: str = "") -> dict[str, Any]:
        """Charge an order once."""
        record("pay", {"order": order, "amount_cents": amount_cents, "note": note}, ctx)
        if gate:
            with anyio.fail_after(60):
                while not os.path.exists(gate):
                    await anyio.sleep(0.01)
        return {"order": order, "charged": amount_cents, "payment": f"pay_{order}"}

    @app.tool()
    def refund(charge: str, ctx: Context, idempotency_key: str = "") -> dict[str, Any]:
        """Refund a charge; the provider key arrives as an argument too."""
        record("refund", {"charge": charge, "idempotency_key": idempotency_key}, ctx)
        return {"refund": f"re_{charge}", "key": idempotency_key}

    @app.tool()
    def convert(order: str, rate: float, ctx: Context) -> str:
        """Convert an order's currency at a rate (a float: no key material)."""
        record("convert", {"order": order, "rate": rate}, ctx)
        return f"converted {order} at {rate}"

    @app.tool()
    def lookup(order: str, ctx: Context) -> str:
        """Read an order (a read-only lookup: not recorded)."""
        record("lookup", {"order": order}, ctx)
        return f"order {order}: open"

    @app.tool()
    def decline(order: str, ctx: Context) -> str:
        """The provider says no."""
        record("decline", {"order": order}, ctx)
        raise ToolError(f"card declined for {order}")

    @app.tool()
    async def hang(order: str, ctx: Context) -> str:
        """Takes the call and never answers (a lost reply)."""
        record("hang", {"order": order}, ctx)

        await anyio.sleep_forever()
        return "never"

    @app.tool()
    def crash(order: str, ctx: Context) -> str:
        """Takes the call, then the server dies before answering."""
        record("crash", {"order": order}, ctx)
        os._exit(3)

    return app


def main() -> None:
    counts = Path(os.environ["OO_MCP_COUNTS"])
    app = make_server(counts)
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()


if __name__ == "__main__":
    main()
