"""The ``openonce`` command: install the ledger schema, read it, and decide on effects.

Exit status: 0 done, 1 refused (illegal transition, unknown id, bad receipt), 2 bad usage.
Every error is one line on stderr.

Everything printed goes through ``say`` (``_common``): the ledger holds text an agent or a
person wrote, and a character that hides or reorders text, or an escape sequence that
clears the screen or plants a link, reaches the terminal as a visible ``[U+001B]`` marker
instead, the same marker the console shows (``openonce_core._textsafe``).

One private module per command group: ``_ledger`` (migrate, review, show and a person's
decisions), ``_reconcile``, ``_retention``, ``_mcp`` (the MCP gateway), ``_providers`` and
``_test``; ``_common`` holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import OpenOnceError
from . import _ledger, _mcp, _reconcile, _retention
from ._common import say
from ._providers import add_providers_parser
from ._test import add_test_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openonce", description="Durable side effects for AI agent tool calls."
    )
    parser.add_argument(
        "--db", default="openonce.db", help="SQLite path or postgresql:// DSN (openonce.db)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _ledger.add_parsers(sub)
    _reconcile.add_parser(sub)
    _retention.add_parser(sub)
    _mcp.add_parser(sub)
    add_providers_parser(sub)
    add_test_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _retention.check_args(args)
    try:
        return int(args.func(args))
    except (OpenOnceError, ValueError) as exc:
        say(f"openonce: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a database that cannot be reached, say
        say(f"openonce: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
