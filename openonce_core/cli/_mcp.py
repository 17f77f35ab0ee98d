"""``openonce mcp-proxy``: the MCP gateway, an MCP server in front of upstream MCP servers
whose listed tools run through the ledger (``openonce_core._mcp_gateway``).

On stdio the protocol owns stdout: everything this command says goes to stderr. The
configuration is checked before anything connects, and again against the upstreams' tool
lists before the first request is answered; either failure exits 1 naming the field."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import ConfigurationError, OpenOnceError
from ._common import say


def cmd_mcp_proxy(args: argparse.Namespace) -> int:
    try:
        import anyio

        from .._mcp_config import load_config
        from .._mcp_gateway import make_client, open_gateway, serve_http, serve_stdio
    except ImportError as exc:  # the SDK is an extra
        raise ConfigurationError(
            f"mcp-proxy needs the MCP SDK ({exc.name} is not installed):"
            " pip install 'openonce[mcp]'"
        ) from None
    config = load_config(args.config)
    listen = _listen(args.listen) if args.listen else None
    oo = make_client(args.db, config)

    async def run() -> None:
        async with open_gateway(config, oo) as gateway:
            names = ", ".join(sorted(config.tools)) or "none"
            where = f"http://{listen[0]}:{listen[1]}/mcp" if listen else "stdio"
            say(f"openonce mcp-proxy: {len(gateway.tools)} tools, recorded: {names}; on {where}",
                file=sys.stderr, flush=True)  # fmt: skip
            if listen is None:
                await serve_stdio(gateway)
            else:
                await serve_http(gateway, *listen)

    try:
        anyio.run(run)
    except BaseExceptionGroup as group:  # the SDK's task groups wrap what went wrong
        raise _first(group) from None
    except KeyboardInterrupt:
        return 0
    finally:
        oo.close()
    return 0


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The error a person should read: an OpenOnce error (a configuration that does not
    fit the upstreams) before any other."""
    found: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            found.append(exc)

    walk(group)
    for exc in found:
        if isinstance(exc, OpenOnceError):
            return exc
    return found[0] if found else group


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"--listen {text!r}: give HOST:PORT, e.g. 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "mcp-proxy",
        help="an MCP server in front of MCP servers: listed tools run through the ledger",
        description=(
            "Serve MCP (stdio, or streamable HTTP with --listen) in front of the upstream MCP"
            " servers the config names; their tools are listed unchanged, the ones the config"
            " maps to effects run once through the ledger, the rest pass through."
        ),
    )
    p.add_argument("--config", required=True, metavar="FILE", help="openonce-mcp.json")
    p.add_argument(
        "--listen", metavar="HOST:PORT", default=None,
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio",
    )  # fmt: skip
    p.set_defaults(func=cmd_mcp_proxy)
