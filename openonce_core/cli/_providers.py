"""``openonce providers``: the provider capability matrix, as a listing and as a CI gate.

Without gates it shows what a probe miss means per tool (the matrix, a tool's handler
requirements, its conformance plan). With ``--require-*`` flags it is a gate: every
requested check is evaluated and reported, and the exit status says whether all passed.

Exit status: 0 shown, or every gate passed; 1 a gate failed, or a capability or
conformance file was refused; 2 bad usage. Errors are one line on stderr.

The ``providers`` subcommand of ``openonce`` (``build_parser`` calls
``add_providers_parser``); ``main`` runs it on its own, as ``openonce providers``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._providers import (
    SCHEMA_VERSION,
    Capability,
    CapabilityMatrix,
    check_conformance_evidence,
    conformance_plan,
    conformance_template,
    load_capabilities_file,
    load_conformance_file,
    readiness_problems,
    suggest_capability,
)
from .._scan import (
    ScannedTool,
    ScanResult,
    handler_contract_problems,
    receipt_contract_problems,
    scan_tree,
)
from ..errors import CapabilityError, OpenOnceError

# Gate name (as in the JSON "checks") -> the flag that requests it, in report order.
GATE_FLAGS = {
    "known": "--require-known",
    "auto_rearm_on_miss": "--require-auto-rearm",
    "reviewed": "--require-reviewed",
    "handler_contract": "--require-handler-contract",
    "receipt_contract": "--require-receipt-contract",
    "conformance": "--require-conformance",
}
# Human output groups checks under the words the product documents use.
_GROUPS = {
    "known": "policy",
    "auto_rearm_on_miss": "policy",
    "reviewed": "readiness",
    "conformance": "conformance",
}
_SCAN_ONLY = ("handler_contract", "receipt_contract")


class UsageError(Exception):
    """Flags that cannot be combined or are missing what they need (exit 2)."""


@dataclass
class Check:
    """One requested gate: passed when it found no problems."""

    name: str
    problems: list[str]
    pass_reason: str

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        reason = self.pass_reason if self.passed else "; ".join(self.problems)
        return {"passed": self.passed, "reason": reason, "problems": self.problems}


# -- the parser ---------------------------------------------------------------------------


def add_providers_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``providers`` to the ``openonce`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "providers",
        help="provider capability matrix, handler contracts and CI gates",
        description="What a probe miss means per provider, and gates that prove it.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=cmd_providers)
    return parser


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tool", nargs="?", metavar="TOOL", help="a tool name, e.g. stripe.charge")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--requirements", action="store_true", help="the handler contract")
    p.add_argument("--conformance-plan", action="store_true", help="scenarios a prober must pass")
    p.add_argument("--capability", metavar="NAME", help="pin the capability for an ambiguous tool")
    p.add_argument("--capability-file", metavar="FILE", help="team provider capabilities (JSON)")
    p.add_argument("--validate-only", action="store_true", help="validate; do not list")
    p.add_argument("--scan", metavar="DIR", help="audit the effect tools declared under DIR")
    p.add_argument("--conformance-file", metavar="FILE", help="conformance evidence (JSON)")
    p.add_argument(
        "--conformance-file-template",
        action="store_true",
        help="print a fill-in conformance evidence file",
    )
    p.add_argument(
        "--suggest-capabilities",
        action="store_true",
        help="conservative capability stubs for unknown tools",
    )
    p.add_argument("--require-known", action="store_true", help="fail unknown tools")
    p.add_argument(
        "--require-auto-rearm", action="store_true", help="fail unless a miss may re-arm"
    )
    p.add_argument("--require-reviewed", action="store_true", help="fail TODO/unfinished entries")
    p.add_argument(
        "--require-handler-contract", action="store_true", help="prove signatures and keys"
    )
    p.add_argument(
        "--require-receipt-contract", action="store_true", help="prove every return's receipt"
    )
    p.add_argument(
        "--require-conformance", action="store_true", help="fail without passing evidence"
    )


def cmd_providers(args: argparse.Namespace) -> int:
    """The subcommand. Refused files raise ``CapabilityError`` for the caller to report."""
    try:
        return _run(args)
    except UsageError as exc:
        print(f"openonce providers: error: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="openonce providers",
        description="What a probe miss means per provider, and gates that prove it.",
    )
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_providers(args)
    except OpenOnceError as exc:
        print(f"openonce: {exc}", file=sys.stderr)
        return 1


# -- dispatch -----------------------------------------------------------------------------


def _requested_gates(args: argparse.Namespace) -> list[str]:
    return [gate for gate, flag in GATE_FLAGS.items() if getattr(args, _dest(flag))]


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _check_usage(args: argparse.Namespace, gates: list[str]) -> None:
    """Refuse combinations that would silently do less than the user asked."""
    if args.tool and args.scan:
        raise UsageError("give a TOOL or --scan DIR, not both")
    subject = bool(args.tool or args.scan)
    for gate in ("known", "auto_rearm_on_miss", "conformance"):
        if gate in gates and not subject:
            raise UsageError(f"{GATE_FLAGS[gate]} needs a TOOL or --scan DIR")
    for gate in _SCAN_ONLY:
        if gate in gates and not args.scan:
            raise UsageError(f"{GATE_FLAGS[gate]} reads handler source: add --scan DIR")
    if args.capability and not subject:
        raise UsageError("--capability pins the capability of a TOOL or of --scan DIR's tools")
    if args.require_conformance and not args.conformance_file:
        raise UsageError("--require-conformance needs --conformance-file FILE")
    if args.conformance_file and not args.require_conformance:
        raise UsageError("--conformance-file is read by --require-conformance; add it")
    generators = [
        flag
        for flag in ("--conformance-file-template", "--suggest-capabilities")
        if getattr(args, _dest(flag))
    ]
    if len(generators) > 1:
        raise UsageError("give --conformance-file-template or --suggest-capabilities, not both")
    if generators and gates:
        raise UsageError(f"{generators[0]} prints a file; run the gates separately")
    if args.suggest_capabilities and not subject:
        raise UsageError("--suggest-capabilities needs a TOOL or --scan DIR")
    if args.scan and (args.requirements or args.conformance_plan):
        raise UsageError("--requirements and --conformance-plan take a TOOL, not --scan")


def _run(args: argparse.Namespace) -> int:
    gates = _requested_gates(args)
    _check_usage(args, gates)
    extra = load_capabilities_file(args.capability_file) if args.capability_file else []
    matrix = CapabilityMatrix(extra)
    evidence = load_conformance_file(args.conformance_file) if args.conformance_file else None
    scan = _scan(args.scan) if args.scan else None
    pins = _Pins(matrix, args.capability, scan)

    if args.conformance_file_template:
        return _print_template(matrix, args, scan, pins)
    if args.suggest_capabilities:
        return _print_suggestions(matrix, args, scan, pins)
    if scan is not None:
        checks = _scan_checks(matrix, scan, pins, gates, evidence)
        return _report_scan(args, matrix, scan, pins, checks)
    if args.tool:
        caps = matrix.resolve(args.tool, args.capability)
        checks = _tool_checks(args.tool, caps, gates, evidence)
        return _report_tool(args, matrix, caps, checks)
    checks = [_matrix_readiness(matrix)] if gates else []
    return _report_matrix(args, matrix, checks)


def _scan(directory: str) -> ScanResult:
    if not Path(directory).exists():
        raise UsageError(f"--scan {directory}: no such file or directory")
    return scan_tree(directory)


class _Pins:
    """``--capability`` applied to the tools it matches; the rest resolve conservatively."""

    def __init__(self, matrix: CapabilityMatrix, pinned: str | None, scan: ScanResult | None):
        self.matrix = matrix
        self.pinned = pinned
        if pinned is None or scan is None:
            return
        cap = matrix.get(pinned)
        if cap is None:
            known = ", ".join(c.name for c in matrix.capabilities)
            raise CapabilityError(f"no provider capability named {pinned!r}; known: {known}")
        if not any(cap.matches(t) for t in scan.tool_names):
            raise CapabilityError(
                f"capability {pinned!r} covers {cap.tool_pattern!r}, which matches none of"
                f" the scanned tools"
            )

    def resolve(self, tool: str) -> list[Capability]:
        cap = self.matrix.get(self.pinned) if self.pinned else None
        if cap is not None and cap.matches(tool):
            return [cap]
        return self.matrix.for_tool(tool)


# -- the checks ---------------------------------------------------------------------------


def _known(tool: str, caps: list[Capability]) -> list[str]:
    if caps:
        return []
    return [
        f"no provider capability matches {tool!r}; add one with --capability-file"
        " (--suggest-capabilities writes a stub)"
    ]


def _auto_rearm(tool: str, caps: list[Capability]) -> list[str]:
    if not caps:
        return [f"{tool!r} is not safe to auto-rearm on a miss: no provider capability matches it"]
    blocking = [cap.name for cap in caps if not cap.can_auto_rearm_on_miss]
    if not blocking:
        return []
    return [
        f"{tool!r} is not safe to auto-rearm on a miss; blocking capabilities:"
        f" {', '.join(blocking)}"
    ]


def _no_contract(tool: str) -> list[str]:
    # Proof gates fail unknown tools: with no capability there is no contract to prove.
    return [f"no provider capability matches {tool!r}; there is no reviewed contract to prove"]


def _reviewed(tool: str, caps: list[Capability]) -> list[str]:
    if not caps:
        return _no_contract(tool)
    return [p for cap in caps for p in readiness_problems(cap)]


def _conformance(tool: str, caps: list[Capability], evidence: dict[str, Any] | None) -> list[str]:
    if not caps:
        return _no_contract(tool)
    return [p for cap in caps for p in check_conformance_evidence(cap, evidence or {})]


def _names(caps: Iterable[Capability]) -> str:
    return ", ".join(dict.fromkeys(cap.name for cap in caps)) or "no capability"


_PASS = {
    "known": "{subject} matches provider capability {names}",
    "auto_rearm_on_miss": "{subject} can auto-rearm on a miss past its grace window ({names})",
    "reviewed": "{names}: reviewed provider knowledge",
    "handler_contract": "{subject} meet the handler contract of {names}",
    "receipt_contract": "{subject} return receipts that meet {names}",
    "conformance": "{names}: evidence matches the current fingerprint and plan",
    "auditable": "{subject}: every tool is declared statically",
}


def _check(name: str, problems: Iterable[str], subject: str, caps: Iterable[Capability]) -> Check:
    reason = _PASS[name].format(subject=subject, names=_names(caps))
    return Check(name, list(dict.fromkeys(problems)), reason)


def _tool_checks(
    tool: str, caps: list[Capability], gates: list[str], evidence: dict[str, Any] | None
) -> list[Check]:
    rules = {
        "known": lambda: _known(tool, caps),
        "auto_rearm_on_miss": lambda: _auto_rearm(tool, caps),
        "reviewed": lambda: _reviewed(tool, caps),
        "conformance": lambda: _conformance(tool, caps, evidence),
    }
    return [_check(gate, rules[gate](), repr(tool), caps) for gate in gates]


def _matrix_readiness(matrix: CapabilityMatrix) -> Check:
    problems = [p for cap in matrix.capabilities for p in readiness_problems(cap)]
    return _check("reviewed", problems, "the matrix", matrix.capabilities)


def _scan_checks(
    matrix: CapabilityMatrix,
    scan: ScanResult,
    pins: _Pins,
    gates: list[str],
    evidence: dict[str, Any] | None,
) -> list[Check]:
    """Every gate over every scanned handler; dynamic tools fail the implicit audit."""
    if not gates:
        return []
    resolved = {name: pins.resolve(name) for name in scan.tool_names}
    used = [cap for caps in resolved.values() for cap in caps]
    handlers = [(t, t.tool) for t in scan.tools if t.tool is not None]
    subject = f"{len(handlers)} scanned handler(s)"

    def per_tool(rule: Callable[[str, list[Capability]], list[str]]) -> list[str]:
        return [p for name, caps in resolved.items() for p in rule(name, caps)]

    def per_handler(rule: Callable[[ScannedTool, list[Capability]], list[str]]) -> list[str]:
        problems: list[str] = []
        for handler, name in handlers:
            found = rule(handler, resolved[name]) if resolved[name] else _no_contract(name)
            problems.extend(f"{handler.location} {handler.function}: {p}" for p in found)
        return problems

    rules = {
        "known": lambda: per_tool(_known),
        "auto_rearm_on_miss": lambda: per_tool(_auto_rearm),
        "reviewed": lambda: per_tool(_reviewed),
        "handler_contract": lambda: per_handler(handler_contract_problems),
        "receipt_contract": lambda: per_handler(receipt_contract_problems),
        "conformance": lambda: per_tool(lambda n, c: _conformance(n, c, evidence)),
    }
    checks = [_check("auditable", _audit_problems(scan), subject, used)]
    checks.extend(_check(gate, rules[gate](), subject, used) for gate in gates)
    return checks


def _audit_problems(scan: ScanResult) -> list[str]:
    problems = [f"{error} (nothing in this file was audited)" for error in scan.errors]
    problems.extend(
        f"{t.location} {t.function}: unauditable tool expression {t.tool_expression!r};"
        " use a string literal or a module-level constant"
        for t in scan.unauditable
    )
    if not scan.tools:
        problems.append(f"found no effect tools under {scan.root}; check the --scan path")
    return problems


# -- output -------------------------------------------------------------------------------


def _print_json(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, indent=2, ensure_ascii=False))


def _exit_status(checks: list[Check]) -> int:
    return 0 if all(c.passed for c in checks) else 1


def _policy_json(checks: list[Check]) -> dict[str, Any]:
    return {
        "passed": all(c.passed for c in checks),
        "required": [c.name for c in checks],
        "checks": {c.name: c.to_json() for c in checks},
    }


def _gate_lines(checks: list[Check], group_of: dict[str, str], default: str) -> list[str]:
    """``policy: passed`` style lines, one per group, each failure listed beneath."""
    lines: list[str] = []
    groups = list(dict.fromkeys(group_of.get(c.name, default) for c in checks))
    for group in groups:
        members = [c for c in checks if group_of.get(c.name, default) == group]
        passed = all(c.passed for c in members)
        lines.append(f"{group}: {'passed' if passed else 'failed'}")
        # "conformance: conformance: ..." says nothing twice; name the check only if needed.
        lines.extend(
            f"  {c.name}: {p}" if c.name != group else f"  {p}" for c in members for p in c.problems
        )
    return lines


def _capability_json(cap: Capability) -> dict[str, Any]:
    doc = cap.to_json()
    doc["fingerprint"] = cap.fingerprint()
    doc["conformance_plan"] = [
        {"scenario": s.value, "expect": o.value, "receipt_fields": list(fields)}
        for s, o, fields in conformance_plan(cap)
    ]
    return doc


_COLUMNS = (("name", 20), ("tool", 19), ("tier", 41), ("auto_rearm", 12), ("grace_s", 8))


def matrix_table(caps: Sequence[Capability]) -> list[str]:
    """The matrix as aligned text; columns widen for long custom names."""
    rows = [
        [
            cap.name,
            cap.tool_pattern,
            cap.tier,
            "yes" if cap.can_auto_rearm_on_miss else "no",
            str(cap.default_grace_seconds),
            cap.prober or "-",
        ]
        for cap in caps
    ]
    widths = [
        max(minimum, *(len(row[i]) + 2 for row in rows)) if rows else minimum
        for i, (_, minimum) in enumerate(_COLUMNS)
    ]
    header = [name for name, _ in _COLUMNS] + ["prober"]
    return [
        "".join(cell.ljust(w) for cell, w in zip(line[:-1], widths, strict=True)) + line[-1]
        for line in [header, *rows]
    ]


def requirements_lines(cap: Capability) -> list[str]:
    lines = ["  requirements:"]
    if cap.handler_requirements:
        lines.append("    handler:")
        lines.extend(f"      - {item}" for item in cap.handler_requirements)
    for label, values in (
        ("required args", cap.required_args),
        ("idempotency fields", cap.required_idempotency_fields),
        ("receipt fields", cap.required_receipt_fields),
    ):
        if values:
            lines.append(f"    {label}: {', '.join(values)}")
    lines.extend(_source_lines(cap, "    "))
    return lines


def _source_lines(cap: Capability, indent: str) -> list[str]:
    return [
        f"{indent}receipt source: {field} = arg {arg}"
        for field, arg in cap.required_receipt_source_fields.items()
    ]


def conformance_plan_lines(cap: Capability) -> list[str]:
    lines = ["  conformance:"]
    for scenario, outcome, fields in conformance_plan(cap):
        if scenario.value == "happened":
            lines.append(f"    - {scenario.value}: expect {outcome.value} + receipt")
            if fields:
                lines.append(f"      receipt fields: {', '.join(fields)}")
            lines.extend(_source_lines(cap, "      "))
        else:
            lines.append(f"    - {scenario.value}: expect {outcome.value}")
    return lines


def _valid_line(matrix: CapabilityMatrix, capability_file: str | None) -> str:
    line = (
        f"provider capability matrix valid: {len(matrix.capabilities)} capability(ies),"
        f" {matrix.custom_count} custom"
    )
    return line + (f" from {capability_file}" if capability_file else "")


def _valid_json(matrix: CapabilityMatrix, capability_file: str | None) -> dict[str, Any]:
    return {
        "valid": True,
        "capability_count": len(matrix.capabilities),
        "custom_count": matrix.custom_count,
        "capability_file": capability_file,
    }


def _report_matrix(args: argparse.Namespace, matrix: CapabilityMatrix, checks: list[Check]) -> int:
    if args.json:
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        if args.validate_only:
            doc.update(_valid_json(matrix, args.capability_file))
        else:
            doc["capabilities"] = [_capability_json(c) for c in matrix.capabilities]
        if checks:
            doc["policy"] = _policy_json(checks)
        _print_json(doc)
        return _exit_status(checks)
    if checks:
        print("\n".join(_gate_lines(checks, _GROUPS, "policy")))
    elif args.validate_only:
        print(_valid_line(matrix, args.capability_file))
    else:
        print("provider capability matrix")
        print("\n".join(matrix_table(matrix.capabilities)))
        for cap in matrix.capabilities:
            _print_blocks(args, cap, f"{cap.name} ({cap.tier})")
    return _exit_status(checks)


def _print_blocks(args: argparse.Namespace, cap: Capability, header: str) -> None:
    """``--requirements`` and ``--conformance-plan`` for one capability, under ``header``."""
    if not (args.requirements or args.conformance_plan):
        return
    print(header)
    if args.requirements:
        print("\n".join(requirements_lines(cap)))
    if args.conformance_plan:
        print("\n".join(conformance_plan_lines(cap)))


def _report_tool(
    args: argparse.Namespace, matrix: CapabilityMatrix, caps: list[Capability], checks: list[Check]
) -> int:
    tool = args.tool
    if args.json:
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": tool}
        doc["pinned_capability"] = args.capability
        doc["known"] = bool(caps)
        doc["can_auto_rearm_on_miss"] = matrix.can_auto_rearm(tool, args.capability)
        doc["grace_seconds"] = matrix.grace_seconds(tool, args.capability)
        doc["capabilities"] = [_capability_json(c) for c in caps]
        if args.validate_only:
            doc.update(_valid_json(matrix, args.capability_file))
        if checks:
            doc["policy"] = _policy_json(checks)
        _print_json(doc)
        return _exit_status(checks)
    blocks = args.requirements or args.conformance_plan
    if not checks and not blocks:
        if args.validate_only:
            print(_valid_line(matrix, args.capability_file))
        elif caps:
            print(f"provider capability matrix for {tool}")
            print("\n".join(matrix_table(caps)))
    if not caps and not checks:
        print(
            f"no provider capability matches {tool!r}: an UNKNOWN effect of it goes to"
            " human review. --suggest-capabilities writes a stub to review."
        )
    for cap in caps:
        _print_blocks(args, cap, f"{tool} -> {cap.name} ({cap.tier})")
    if checks:
        print("\n".join(_gate_lines(checks, _GROUPS, "policy")))
    return _exit_status(checks)


def _report_scan(
    args: argparse.Namespace,
    matrix: CapabilityMatrix,
    scan: ScanResult,
    pins: _Pins,
    checks: list[Check],
) -> int:
    if args.json:
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "scan": scan.to_json()}
        for entry, tool in zip(doc["scan"]["tools"], scan.tools, strict=True):
            caps = pins.resolve(tool.tool) if tool.tool is not None else []
            entry["capabilities"] = [c.name for c in caps]
        if checks:
            doc["policy"] = _policy_json(checks)
        _print_json(doc)
        return _exit_status(checks)
    if checks:
        print("\n".join(_gate_lines(checks, {}, "scan")))
    elif args.validate_only:
        print(_valid_line(matrix, args.capability_file))
    else:
        print("\n".join(_scan_listing(scan, pins)))
    return _exit_status(checks)


def _scan_listing(scan: ScanResult, pins: _Pins) -> list[str]:
    rows: list[tuple[str, ...]] = []
    for t in scan.tools:
        if t.tool is None:
            rows.append((t.location, t.function, f"<{t.tool_expression}>", "unauditable"))
            continue
        caps = pins.resolve(t.tool)
        names = ", ".join(c.name for c in caps) if caps else "(no provider capability)"
        rows.append((t.location, t.function, t.tool, names))
    widths = [max((len(row[i]) for row in rows), default=0) + 2 for i in range(3)]
    lines = [f"scan {scan.root}: {len(scan.tools)} effect tool(s) in {scan.files_scanned} file(s)"]
    lines.extend(
        "  " + "".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + row[-1]
        for row in rows
    )
    lines.extend(f"  cannot audit {error}" for error in scan.errors)
    return lines


def _subject_tools(args: argparse.Namespace, scan: ScanResult | None) -> list[str]:
    if scan is not None:
        return scan.tool_names
    return [args.tool] if args.tool else []


def _print_template(
    matrix: CapabilityMatrix, args: argparse.Namespace, scan: ScanResult | None, pins: _Pins
) -> int:
    """A fill-in evidence file for the capabilities the TOOL or the scanned code uses."""
    if not args.tool and scan is None:
        caps: list[Capability] = list(matrix.capabilities)
    elif args.tool:
        caps = matrix.resolve(args.tool, args.capability)
    else:
        caps = [c for name in _subject_tools(args, scan) for c in pins.resolve(name)]
    unknown = [t for t in _subject_tools(args, scan) if not pins.resolve(t)]
    if args.tool and not caps:
        raise CapabilityError(f"no provider capability matches {args.tool!r}; nothing to template")
    if unknown:
        print(
            f"openonce: note: no capability (so no template) for {', '.join(unknown)};"
            " see --suggest-capabilities",
            file=sys.stderr,
        )
    _print_json(conformance_template(list(dict.fromkeys(caps))))
    return 0


def _print_suggestions(
    matrix: CapabilityMatrix, args: argparse.Namespace, scan: ScanResult | None, pins: _Pins
) -> int:
    """Conservative stubs for the tools no capability covers: review work, not knowledge."""
    if args.tool:
        unknown = [] if matrix.resolve(args.tool, args.capability) else [args.tool]
    else:
        unknown = [t for t in _subject_tools(args, scan) if not pins.resolve(t)]
    stubs = [suggest_capability(tool) for tool in unknown]
    if args.json:
        _print_json({"schema_version": SCHEMA_VERSION, "capabilities": stubs})
        return 0
    if not stubs:
        print("every tool matches a provider capability; nothing to suggest")
        return 0
    print(f"{len(stubs)} tool(s) match no provider capability; stubs to review:")
    for tool, stub in zip(unknown, stubs, strict=True):
        print(f"  {tool} -> {stub['name']} ({stub['tier']}, auto_rearm no)")
    print("write them to a capability file with --suggest-capabilities --json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
