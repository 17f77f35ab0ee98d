"""What every ``openonce`` command shares: printing through ``say`` (hidden characters
shown as markers), times and ids as the listings show them, and opening the ledger with
the provider knowledge the flags name."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TextIO

from .._runtime import OpenOnce
from .._textsafe import marked
from .._wiring import build_openonce


def say(text: object = "", *, file: TextIO | None = None, flush: bool = False) -> None:
    """``print``, with every hidden character shown as a marker (the package's docstring)."""
    print(marked(str(text)), file=file, flush=flush)


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def short(effect_id: str) -> str:
    return effect_id[:8] + "…"


def open_ledger(args: argparse.Namespace) -> OpenOnce:
    return build_openonce(
        args.db,
        capability_files=getattr(args, "capability_file", None) or (),
        pins=getattr(args, "provider_capability", None) or (),
    )


def add_provider_knowledge(p: argparse.ArgumentParser, *, require_flag: bool = True) -> None:
    """``--capability-file`` and ``--provider-capability`` (and, unless the command adds it
    itself, ``--require-provider-capability``)."""
    p.add_argument(
        "--capability-file", action="append", default=[], metavar="FILE",
        help="extra provider capabilities (schema_version 1); repeatable",
    )  # fmt: skip
    p.add_argument(
        "--provider-capability", action="append", default=[], metavar="TOOL=CAPABILITY",
        help="pin the capability of a tool that maps to several; repeatable",
    )  # fmt: skip
    if require_flag:
        p.add_argument(
            "--require-provider-capability", action="store_true",
            help="fail closed for tools without reviewed provider capability metadata",
        )  # fmt: skip
