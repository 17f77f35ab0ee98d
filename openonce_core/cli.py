"""The ``openonce`` command: install the ledger schema, read it, and decide on effects.

Exit status: 0 done, 1 refused (illegal transition, unknown id, bad receipt), 2 bad usage.
Every error is one line on stderr.

Everything printed goes through ``_say``: the ledger holds text an agent or a person
wrote, and a character that hides or reorders text, or an escape sequence that clears the
screen or plants a link, reaches the terminal as a visible ``[U+001B]`` marker instead,
the same marker the console shows (``openonce_core._textsafe``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from ._reconcile import ReconcileReport
from ._records import Effect
from ._retention import RetentionPolicy, import_archive, parse_duration, run_retention
from ._runtime import OpenOnce
from ._textsafe import marked
from ._wiring import build_openonce, build_reconciler
from .cli_providers import add_providers_parser
from .cli_test import add_test_parser
from .errors import OpenOnceError
from .stores import open_store


def _say(text: object = "", *, file: TextIO | None = None, flush: bool = False) -> None:
    """``print``, with every hidden character shown as a marker (the module's docstring)."""
    print(marked(str(text)), file=file, flush=flush)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _short(effect_id: str) -> str:
    return effect_id[:8] + "…"


def _open(args: argparse.Namespace) -> OpenOnce:
    return build_openonce(
        args.db,
        capability_files=getattr(args, "capability_file", None) or (),
        pins=getattr(args, "provider_capability", None) or (),
    )


def cmd_migrate(args: argparse.Namespace) -> int:
    store = open_store(args.db)
    try:
        before = store.schema_version()
        after = store.migrate()
    finally:
        store.close()
    if before == after:
        _say(f"ledger schema already at version {after}")
    else:
        _say(f"ledger schema migrated from version {before} to {after}")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effects = oo.review(limit=args.limit)
    if args.json:
        _say(json.dumps([_effect_json(e) for e in effects], indent=2))
        return 0
    for e in effects:
        _say(
            f"* {_short(e.id)}  {e.state:<17} {e.tool:<15} "
            f"attempt {e.attempt}/{e.max_attempts}  {_when(e.updated_at)}"
        )
    _say(
        f"{len(effects)} effect(s) need a human. Use approve for pending approvals,"
        " resolve-happened to commit evidence, resolve-not-happened to retry,"
        " or deny pending approvals."
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.get(args.effect_id)
        journal = oo.journal(effect.id)
        approvals = oo.approvals(effect.id)
    if args.json:
        doc = _effect_json(effect)
        doc["journal"] = [
            {
                "at": j.at,
                "from": j.from_state,
                "to": j.to_state,
                "actor": j.actor,
                "reason": j.reason,
                "evidence": j.evidence,
            }
            for j in journal
        ]
        doc["approvals"] = [
            {"decision": a.decision, "by": a.by, "reason": a.reason, "at": a.at} for a in approvals
        ]
        _say(json.dumps(doc, indent=2))
        return 0
    _say(f"{effect.id}  {effect.tool}  {effect.state}")
    _say(f"  key:          {effect.idempotency_key}")
    _say(f"  scope:        {effect.scope or '-'}")
    _say(f"  provider key: {effect.provider_key}")
    _say(f"  attempt:      {effect.attempt}/{effect.max_attempts}")
    _say(f"  arguments:    {json.dumps(effect.args, ensure_ascii=False)}")
    _say(f"  execution:    {effect.execution_status or '-'}  {_j(effect.execution_evidence)}")
    _say(f"  verification: {effect.verification_status or '-'}  {_j(effect.verification_evidence)}")
    if effect.state == "committed":
        _say(f"  result:       {_j(effect.result)}")
    if effect.error:
        _say(f"  error:        {effect.error.get('type')}: {effect.error.get('message')}")
    _say("  journal:")
    for j in journal:
        extra = "  " + json.dumps(j.evidence, ensure_ascii=False) if j.evidence else ""
        why = f"  {j.actor}" + (f": {j.reason}" if j.reason else "")
        _say(f"    {_when(j.at)} {j.from_state or '':>17} -> {j.to_state}{why}{extra}")
    return 0


def _j(value: Any) -> str:
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _effect_json(e: Effect) -> dict[str, Any]:
    return {
        "id": e.id,
        "tool": e.tool,
        "state": str(e.state),
        "idempotency_key": e.idempotency_key,
        "scope": e.scope,
        "attempt": e.attempt,
        "max_attempts": e.max_attempts,
        "provider_key": e.provider_key,
        "args": e.args,
        "execution_status": e.execution_status,
        "execution_evidence": e.execution_evidence,
        "verification_status": e.verification_status,
        "verification_evidence": e.verification_evidence,
        "result": e.result,
        "error": e.error,
        "created_at": e.created_at,
        "updated_at": e.updated_at,
    }


def cmd_approve(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.approve(args.effect_id, by=args.by, reason=args.reason)
    _say(f"approved {_short(effect.id)} — now {effect.state}")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.deny(args.effect_id, by=args.by, reason=args.reason)
    _say(f"denied {_short(effect.id)}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.cancel(args.effect_id, by=args.by, reason=args.reason)
    _say(f"cancelled {_short(effect.id)}")
    return 0


def cmd_resolve_happened(args: argparse.Namespace) -> int:
    try:
        receipt = json.loads(args.receipt_json)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise OpenOnceError(f"--receipt-json is not JSON: {exc}") from None
    with _open(args) as oo:
        effect = oo.resolve_happened(
            args.effect_id,
            receipt=receipt,
            by=args.by,
            reason=args.reason,
            require_receipt_contract=args.require_receipt_contract or None,
            require_provider_capability=args.require_provider_capability or None,
        )
    _say(f"resolved {_short(effect.id)} as happened — committed with manual receipt")
    return 0


def cmd_resolve_not_happened(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.resolve_not_happened(
            args.effect_id,
            by=args.by,
            reason=args.reason,
            require_auto_rearm=args.require_auto_rearm,
            require_provider_capability=args.require_provider_capability,
        )
    _say(f"resolved {_short(effect.id)} as not happened — re-armed for retry")
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    oo = _open(args)
    reconciler = build_reconciler(
        oo,
        probers=args.probers,
        require_provider_capability=args.require_provider_capability,
        conformance_file=args.conformance_file,
        require_conformance=args.require_conformance,
        grace_seconds=args.grace_seconds,
        owner=args.owner,
    )

    def show(report: ReconcileReport) -> None:
        if args.json:
            _say(json.dumps(report.to_json()), flush=True)
        elif not args.watch or report.resolved or report.expired or report.lost_races:
            _say(f"{_when(time.time())} {report}", flush=True)

    try:
        if not args.watch:
            show(reconciler.run_once(limit=args.limit))
            return 0
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        _say(f"reconciling every {args.interval:g}s; Ctrl-C stops", file=sys.stderr)
        reconciler.watch(args.interval, stop=stopping.is_set, on_sweep=show)
        return 0
    finally:
        reconciler.close()
        oo.close()


def cmd_retention(args: argparse.Namespace) -> int:
    store: Any = open_store(args.db)
    try:
        if args.retention_command == "import":
            imported = import_archive(store, args.file)
            _say(json.dumps(imported.to_json()) if args.json else imported)
            return 0
        policy = RetentionPolicy(
            older_than=args.older_than, batch_size=args.batch, pause=args.pause
        )
        report = run_retention(store, policy, args.archive_dir, dry_run=args.dry_run)
    finally:
        store.close()
    _say(json.dumps(report.to_json()) if args.json else report)
    return 0


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


def _add_retention_parser(sub: Any) -> None:
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
    p.add_argument("--dry-run", action="store_true", help="count what it would archive")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=cmd_retention, retention_command=None)
    actions = p.add_subparsers(dest="retention_command", metavar="[import FILE]")
    imp = actions.add_parser("import", help="put an archive's effects back")
    imp.add_argument("file", metavar="FILE", help="an openonce-archive-*.jsonl.gz file")
    imp.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(retention_parser=p)


def _check_retention_args(args: argparse.Namespace) -> None:
    if getattr(args, "func", None) is not cmd_retention or args.retention_command == "import":
        return
    missing = [
        flag
        for flag, value in (("--older-than", args.older_than), ("--archive-dir", args.archive_dir))
        if value is None
    ]
    if missing:
        args.retention_parser.error(f"the following arguments are required: {', '.join(missing)}")


def _add_provider_knowledge(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--capability-file", action="append", default=[], metavar="FILE",
        help="extra provider capabilities (schema_version 1); repeatable",
    )  # fmt: skip
    p.add_argument(
        "--provider-capability", action="append", default=[], metavar="TOOL=CAPABILITY",
        help="pin the capability of a tool that maps to several; repeatable",
    )  # fmt: skip
    p.add_argument(
        "--require-provider-capability", action="store_true",
        help="fail closed for tools without reviewed provider capability metadata",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openonce", description="Durable side effects for AI agent tool calls."
    )
    parser.add_argument(
        "--db", default="openonce.db", help="SQLite path or postgresql:// DSN (openonce.db)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", help="install or upgrade the ledger schema").set_defaults(
        func=cmd_migrate
    )

    p = sub.add_parser("review", help="effects that need a human")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_review)

    p = sub.add_parser("show", help="one effect with its journal")
    p.add_argument("effect_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_show)

    for name, func, reason_required, help_text in (
        ("approve", cmd_approve, False, "approve a pending effect"),
        ("deny", cmd_deny, True, "deny a pending effect"),
        ("cancel", cmd_cancel, True, "cancel an effect that has not started"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("effect_id")
        p.add_argument("--by", required=True, help="who decides")
        p.add_argument("--reason", required=reason_required, default="", help="why")
        p.set_defaults(func=func)

    p = sub.add_parser("resolve-not-happened", help="re-arm: it did not happen")
    p.add_argument("effect_id")
    p.add_argument("--by", required=True, help="who decides")
    p.add_argument("--reason", required=True, help="the evidence: where you looked")
    p.add_argument(
        "--require-auto-rearm", action="store_true",
        help="refuse unless the provider matrix says a miss is safe to re-arm",
    )  # fmt: skip
    _add_provider_knowledge(p)
    p.set_defaults(func=cmd_resolve_not_happened)

    p = sub.add_parser("resolve-happened", help="commit a receipt: it did happen")
    p.add_argument("effect_id")
    p.add_argument("--receipt-json", required=True, help='e.g. \'{"stripe_id": "pi_1"}\'')
    p.add_argument("--by", required=True)
    p.add_argument("--reason", default="")
    p.add_argument(
        "--require-receipt-contract", action="store_true",
        help="refuse a receipt that breaks the tool's provider receipt contract",
    )  # fmt: skip
    _add_provider_knowledge(p)
    p.set_defaults(func=cmd_resolve_happened)

    p = sub.add_parser("reconcile", help="probe providers to resolve UNKNOWN effects")
    p.add_argument("--probers", metavar="MODULE:NAME", help="mapping of tool to prober")
    _add_provider_knowledge(p)
    p.add_argument("--conformance-file", metavar="FILE")
    p.add_argument(
        "--require-conformance", action="store_true",
        help="commit or re-arm only for capabilities with passing conformance evidence",
    )  # fmt: skip
    p.add_argument("--grace-seconds", type=float, help="override every capability's grace")
    p.add_argument("--limit", type=int, default=500, help="effects per sweep")
    p.add_argument("--watch", action="store_true", help="keep sweeping until stopped")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between sweeps")
    p.add_argument("--owner", default="cli", help="name in the journal (reconciler:NAME)")
    p.add_argument("--json", action="store_true", help="one JSON report per sweep")
    p.set_defaults(func=cmd_reconcile)

    _add_retention_parser(sub)
    add_providers_parser(sub)
    add_test_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check_retention_args(args)
    try:
        return int(args.func(args))
    except (OpenOnceError, ValueError) as exc:
        _say(f"openonce: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a database that cannot be reached, say
        _say(f"openonce: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
