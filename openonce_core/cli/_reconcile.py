"""``openonce reconcile``: probe providers to resolve UNKNOWN effects, once or in a loop
until stopped."""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .._reconcile import ReconcileReport
from .._reconciler_options import ReconcilerOptions, flag_name, option_fields
from .._wiring import build_reconciler
from ._common import add_provider_knowledge, open_ledger, say, when


def cmd_reconcile(args: argparse.Namespace) -> int:
    oo = open_ledger(args)
    options = ReconcilerOptions(**{f.name: getattr(args, f.name) for f in option_fields()})
    reconciler = build_reconciler(oo, options=options, probers=args.probers)

    def show(report: ReconcileReport) -> None:
        if args.json:
            say(json.dumps(report.to_json()), flush=True)
        elif not args.watch or report.resolved or report.expired or report.lost_races:
            say(f"{when(time.time())} {report}", flush=True)

    try:
        if not args.watch:
            show(reconciler.run_once(limit=args.limit))
            return 0
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        say(f"reconciling every {args.interval:g}s; Ctrl-C stops", file=sys.stderr)
        reconciler.watch(args.interval, stop=stopping.is_set, on_sweep=show)
        return 0
    finally:
        reconciler.close()
        oo.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("reconcile", help="probe providers to resolve UNKNOWN effects")
    p.add_argument("--probers", metavar="MODULE:NAME", help="mapping of tool to prober")
    add_provider_knowledge(p, require_flag=False)
    add_options(p.add_argument_group("how it decides (ReconcilerOptions)"), CLI_DEFAULTS)
    p.add_argument("--limit", type=int, default=500, help="effects per sweep")
    p.add_argument("--watch", action="store_true", help="keep sweeping until stopped")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between sweeps")
    p.add_argument("--json", action="store_true", help="one JSON report per sweep")
    p.set_defaults(func=cmd_reconcile)


# Where the command's default differs from ReconcilerOptions's.
CLI_DEFAULTS = {"owner": "cli"}


def add_options(p: Any, defaults: dict[str, Any]) -> None:
    """One flag per ``ReconcilerOptions`` field: its name, kind, default and help."""
    for option in option_fields():
        kind, text = option.metadata["kind"], option.metadata["help"]
        default = defaults.get(option.name, option.default)
        if kind is bool:
            p.add_argument(flag_name(option), action="store_true", default=default, help=text)
            continue
        parse = _number(kind, option.metadata["positive"]) if kind in (int, float) else kind
        metavar = option.metadata["metavar"] or None
        if default is not None:
            text += f" (default {default:g})" if kind in (int, float) else f" (default {default})"
        p.add_argument(flag_name(option), type=parse, default=default, metavar=metavar, help=text)


def _number(kind: type, positive: bool) -> Callable[[str], float]:
    """A flag's number: finite, never negative, and above zero if ``positive``."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            least = "above 0" if positive else "0 or more"
            raise argparse.ArgumentTypeError(f"{text!r}: give a {kind.__name__} {least}")
        return value  # type: ignore[no-any-return]

    return parse
