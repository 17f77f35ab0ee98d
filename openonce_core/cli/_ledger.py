"""The ledger's own commands: ``migrate`` installs the schema, ``review`` and ``show`` read
effects, and ``approve``, ``deny``, ``cancel`` and the two ``resolve-*`` commands are a
person's decisions on one effect."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import _schema as schema
from .._records import Effect
from ..errors import OpenOnceError
from ..stores import open_store
from ._common import add_provider_knowledge, open_ledger, say, short, when


def cmd_migrate(args: argparse.Namespace) -> int:
    store = open_store(args.db)
    try:
        before = store.schema_version()
        after = store.migrate()
    finally:
        store.close()
    if after > schema.SCHEMA_VERSION:
        # A newer OpenOnce migrated it, and this one may still use it (else migrate raised).
        say(
            f"ledger schema is at version {after}, newer than this OpenOnce"
            f" ({schema.SCHEMA_VERSION}), which can still use it: nothing to migrate"
        )
    elif before == after:
        say(f"ledger schema already at version {after}")
    else:
        say(f"ledger schema migrated from version {before} to {after}")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    with open_ledger(args) as oo:
        effects = oo.review(limit=args.limit)
    if args.json:
        say(json.dumps([_effect_json(e) for e in effects], indent=2))
        return 0
    for e in effects:
        say(
            f"* {short(e.id)}  {e.state:<17} {e.tool:<15} "
            f"attempt {e.attempt}/{e.max_attempts}  {when(e.updated_at)}"
        )
    say(
        f"{len(effects)} effect(s) need a human. Use approve for pending approvals,"
        " resolve-happened to commit evidence, resolve-not-happened to retry,"
        " or deny pending approvals."
    )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with open_ledger(args) as oo:
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
        say(json.dumps(doc, indent=2))
        return 0
    say(f"{effect.id}  {effect.tool}  {effect.state}")
    say(f"  key:          {effect.idempotency_key}")
    say(f"  scope:        {effect.scope or '-'}")
    say(f"  provider key: {effect.provider_key}")
    say(f"  attempt:      {effect.attempt}/{effect.max_attempts}")
    say(f"  arguments:    {json.dumps(effect.args, ensure_ascii=False)}")
    say(f"  execution:    {effect.execution_status or '-'}  {_j(effect.execution_evidence)}")
    say(f"  verification: {effect.verification_status or '-'}  {_j(effect.verification_evidence)}")
    if effect.state == "committed":
        say(f"  result:       {_j(effect.result)}")
    if effect.error:
        say(f"  error:        {effect.error.get('type')}: {effect.error.get('message')}")
    say("  journal:")
    for j in journal:
        extra = "  " + json.dumps(j.evidence, ensure_ascii=False) if j.evidence else ""
        why = f"  {j.actor}" + (f": {j.reason}" if j.reason else "")
        say(f"    {when(j.at)} {j.from_state or '':>17} -> {j.to_state}{why}{extra}")
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
    with open_ledger(args) as oo:
        effect = oo.approve(args.effect_id, by=args.by, reason=args.reason)
    say(f"approved {short(effect.id)} — now {effect.state}")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    with open_ledger(args) as oo:
        effect = oo.deny(args.effect_id, by=args.by, reason=args.reason)
    say(f"denied {short(effect.id)}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with open_ledger(args) as oo:
        effect = oo.cancel(args.effect_id, by=args.by, reason=args.reason)
    say(f"cancelled {short(effect.id)}")
    return 0


def cmd_resolve_happened(args: argparse.Namespace) -> int:
    try:
        receipt = json.loads(args.receipt_json)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise OpenOnceError(f"--receipt-json is not JSON: {exc}") from None
    with open_ledger(args) as oo:
        effect = oo.resolve_happened(
            args.effect_id,
            receipt=receipt,
            by=args.by,
            reason=args.reason,
            require_receipt_contract=args.require_receipt_contract or None,
            require_provider_capability=args.require_provider_capability or None,
        )
    say(f"resolved {short(effect.id)} as happened — committed with manual receipt")
    return 0


def cmd_resolve_not_happened(args: argparse.Namespace) -> int:
    with open_ledger(args) as oo:
        effect = oo.resolve_not_happened(
            args.effect_id,
            by=args.by,
            reason=args.reason,
            require_auto_rearm=args.require_auto_rearm,
            require_provider_capability=args.require_provider_capability,
        )
    say(f"resolved {short(effect.id)} as not happened — re-armed for retry")
    return 0


def add_parsers(sub: Any) -> None:
    """``migrate``, ``review``, ``show`` and the decisions, on the command's subparsers."""
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
    add_provider_knowledge(p)
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
    add_provider_knowledge(p)
    p.set_defaults(func=cmd_resolve_happened)
