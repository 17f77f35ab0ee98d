"""``openonce retention``: archive, then delete, old terminal effects, or import an archive
back; its flags are checked here, before any store is opened."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from .._retention import RetentionPolicy, import_archive, parse_duration, run_retention
from ..stores import open_store
from ._common import say

_PACE = RetentionPolicy(older_than=1.0)  # the policy's own pace, the flags' defaults


def cmd_retention(args: argparse.Namespace) -> int:
    store: Any = open_store(args.db)
    try:
        if args.retention_command == "import":
            imported = import_archive(store, args.file)
            say(json.dumps(imported.to_json()) if args.json else imported)
            return 0
        report = run_retention(store, policy_of(args), args.archive_dir, dry_run=args.dry_run)
    finally:
        store.close()
    say(json.dumps(report.to_json()) if args.json else report)
    return 0


def policy_of(args: argparse.Namespace) -> RetentionPolicy:
    return RetentionPolicy(
        older_than=args.older_than,
        batch_size=args.batch,
        pause=args.pause,
        max_rate=args.rate,
        max_busy=args.busy,
    )


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 to 10000")
    return value


def _pause(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds from 0 to 3600")
    return value


def _rate(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give effects a second, more than 0, or 'none' for no cap"
        )
    return value


def _busy(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give the share of the run's time spent in its batches, more than 0"
            " and at most 1"
        )
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "retention",
        help="archive, then delete, old terminal effects (or import an archive)",
        description="Archive to a gzip JSON lines file, then delete, effects that ended"
        " (committed, failed, denied, cancelled, released) longer ago than --older-than,"
        " with their journal lines and approvals. A duplicate call of an archived effect is"
        " refused, never run again; `retention import FILE` brings the effects back.",
    )
    p.add_argument("--older-than", type=_duration, metavar="AGE", help="90d, 12h, 30m")
    p.add_argument("--archive-dir", metavar="DIR", help="where the archive file is written")
    p.add_argument("--batch", type=_batch_size, default=500, help="effects per transaction")
    p.add_argument("--pause", type=_pause, default=0.0, help="seconds between batches (0)")
    p.add_argument(
        "--rate", type=_rate, default=_PACE.max_rate, metavar="N",
        help=f"archive at most N effects a second ({_PACE.max_rate:g}; 'none': no cap)",
    )  # fmt: skip
    p.add_argument(
        "--busy", type=_busy, default=_PACE.max_busy, metavar="SHARE",
        help=f"spend at most this share of the run in its batches ({_PACE.max_busy:g})",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="count what it would archive")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=cmd_retention, retention_command=None)
    actions = p.add_subparsers(dest="retention_command", metavar="[import FILE]")
    imp = actions.add_parser("import", help="put an archive's effects back")
    imp.add_argument("file", metavar="FILE", help="an openonce-archive-*.jsonl.gz file")
    imp.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(retention_parser=p)


def check_args(args: argparse.Namespace) -> None:
    if getattr(args, "func", None) is not cmd_retention or args.retention_command == "import":
        return
    missing = [
        flag
        for flag, value in (("--older-than", args.older_than), ("--archive-dir", args.archive_dir))
        if value is None
    ]
    if missing:
        args.retention_parser.error(f"the following arguments are required: {', '.join(missing)}")
