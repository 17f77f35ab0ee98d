"""The ``openonce`` command: install the ledger schema, read it, and decide on effects.

Exit status: 0 done, 1 refused (illegal transition, unknown id, bad receipt), 2 bad usage.
Every error is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .errors import OpenOnceError
from .records import Effect
from .runtime import OpenOnce
from .stores import open_store


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _short(effect_id: str) -> str:
    return effect_id[:8] + "…"


def _open(args: argparse.Namespace) -> OpenOnce:
    return OpenOnce(args.db, migrate=False)


def cmd_migrate(args: argparse.Namespace) -> int:
    store = open_store(args.db)
    try:
        before = store.schema_version()
        after = store.migrate()
    finally:
        store.close()
    if before == after:
        print(f"ledger schema already at version {after}")
    else:
        print(f"ledger schema migrated from version {before} to {after}")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effects = oo.review(limit=args.limit)
    if args.json:
        print(json.dumps([_effect_json(e) for e in effects], indent=2))
        return 0
    for e in effects:
        print(
            f"* {_short(e.id)}  {e.state:<17} {e.tool:<15} "
            f"attempt {e.attempt}/{e.max_attempts}  {_when(e.updated_at)}"
        )
    print(
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
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{effect.id}  {effect.tool}  {effect.state}")
    print(f"  key:          {effect.idempotency_key}")
    print(f"  scope:        {effect.scope or '-'}")
    print(f"  provider key: {effect.provider_key}")
    print(f"  attempt:      {effect.attempt}/{effect.max_attempts}")
    print(f"  arguments:    {json.dumps(effect.args, ensure_ascii=False)}")
    print(f"  execution:    {effect.execution_status or '-'}  {_j(effect.execution_evidence)}")
    print(
        f"  verification: {effect.verification_status or '-'}  {_j(effect.verification_evidence)}"
    )
    if effect.state == "committed":
        print(f"  result:       {_j(effect.result)}")
    print("  journal:")
    for j in journal:
        extra = "  " + json.dumps(j.evidence, ensure_ascii=False) if j.evidence else ""
        why = f"  {j.actor}" + (f": {j.reason}" if j.reason else "")
        print(f"    {_when(j.at)} {j.from_state or '':>17} -> {j.to_state}{why}{extra}")
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
    print(f"approved {_short(effect.id)} — now {effect.state}")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.deny(args.effect_id, by=args.by, reason=args.reason)
    print(f"denied {_short(effect.id)}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.cancel(args.effect_id, by=args.by, reason=args.reason)
    print(f"cancelled {_short(effect.id)}")
    return 0


def cmd_resolve_happened(args: argparse.Namespace) -> int:
    try:
        receipt = json.loads(args.receipt_json)
    except json.JSONDecodeError as exc:
        raise OpenOnceError(f"--receipt-json is not JSON: {exc}") from None
    with _open(args) as oo:
        effect = oo.resolve_happened(
            args.effect_id, receipt=receipt, by=args.by, reason=args.reason
        )
    print(f"resolved {_short(effect.id)} as happened — committed with manual receipt")
    return 0


def cmd_resolve_not_happened(args: argparse.Namespace) -> int:
    with _open(args) as oo:
        effect = oo.resolve_not_happened(args.effect_id, by=args.by, reason=args.reason)
    print(f"resolved {_short(effect.id)} as not happened — re-armed for retry")
    return 0


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
        ("resolve-not-happened", cmd_resolve_not_happened, True, "re-arm: it did not happen"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("effect_id")
        p.add_argument("--by", required=True, help="who decides")
        p.add_argument("--reason", required=reason_required, default="", help="why")
        p.set_defaults(func=func)

    p = sub.add_parser("resolve-happened", help="commit a receipt: it did happen")
    p.add_argument("effect_id")
    p.add_argument("--receipt-json", required=True, help='e.g. \'{"stripe_id": "pi_1"}\'')
    p.add_argument("--by", required=True)
    p.add_argument("--reason", default="")
    p.set_defaults(func=cmd_resolve_happened)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (OpenOnceError, ValueError) as exc:
        print(f"openonce: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a database that cannot be reached, say
        print(f"openonce: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
