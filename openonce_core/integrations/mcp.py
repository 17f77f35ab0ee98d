"""The MCP gateway: OpenOnce in front of the MCP servers an agent already uses, for agents
that cannot import a Python library (Claude Code, Cursor, agents in TypeScript or Go).

Most people run it as a command::

    openonce --db ledger.db mcp-proxy --config openonce-mcp.json            # stdio
    openonce --db postgresql://... mcp-proxy --config openonce-mcp.json --listen 127.0.0.1:8765

Embedded, the same parts::

    config = load_config("openonce-mcp.json")
    oo = make_client("ledger.db", config)
    async with open_gateway(config, oo) as gateway:
        await serve_stdio(gateway)          # or serve_http(gateway, host, port)

``build_server(gateway)`` is the low-level ``mcp.server.Server`` itself, to mount or to
connect to in-process (``mcp.Client(build_server(gateway))``). The configuration's keys,
the scopes and what each upstream answer becomes are in ``openonce_core._mcp_gateway``'s
docstring and the README's "MCP gateway" section. Needs ``pip install openonce[mcp]``.
"""

from __future__ import annotations

from .._mcp_config import GatewayConfig, ToolEffect, Upstream, load_config, parse_config
from .._mcp_gateway import (
    META_EFFECT_ID,
    META_OUTCOME,
    META_PROVIDER_KEY,
    META_SCOPE,
    META_SESSION,
    Caller,
    Gateway,
    build_server,
    make_client,
    open_gateway,
    serve_http,
    serve_stdio,
)

__all__ = [
    "META_EFFECT_ID",
    "META_OUTCOME",
    "META_PROVIDER_KEY",
    "META_SCOPE",
    "META_SESSION",
    "Caller",
    "Gateway",
    "GatewayConfig",
    "ToolEffect",
    "Upstream",
    "build_server",
    "load_config",
    "make_client",
    "open_gateway",
    "parse_config",
    "serve_http",
    "serve_stdio",
]
