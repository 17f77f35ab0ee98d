"""Conformance: the scenarios every prober of a capability must pass, and the JSON
evidence CI checks, bound to the capability's fingerprint."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from .._probe import ProbeOutcome, ProbeResult
from ..errors import CapabilityError, ConformanceError
from ._capability import SCHEMA_VERSION, TODO, Capability
from ._files import _check_document, _read_json
from ._receipts import _receipt_problems


class ConformanceScenario(StrEnum):
    """The standard situations every prober of a capability is tested in."""

    HAPPENED = "happened"  # the effect exists at the provider
    YOUNG_MISS = "young_miss"  # not found, still inside the grace (index lag) window
    MATURE_MISS = "mature_miss"  # not found, past the grace window
    AMBIGUOUS = "ambiguous"  # duplicates, unrelated objects, errors: nothing decisive


PlanStep = tuple[ConformanceScenario, ProbeOutcome, tuple[str, ...]]


def conformance_plan(capability: Capability) -> list[PlanStep]:
    """Scenario, expected outcome and required receipt fields, per scenario that applies.

    A young miss only exists where there is a lag window (grace > 0). A mature miss is
    NOT_HAPPENED only where a miss may re-arm; elsewhere (tier 3) a prober that claims
    NOT_HAPPENED would turn a lost sent copy into a duplicate send.
    """
    cap = capability
    plan: list[PlanStep] = [
        (ConformanceScenario.HAPPENED, ProbeOutcome.HAPPENED, cap.required_receipt_fields)
    ]
    if cap.default_grace_seconds > 0:
        plan.append((ConformanceScenario.YOUNG_MISS, ProbeOutcome.INCONCLUSIVE, ()))
    mature = ProbeOutcome.NOT_HAPPENED if cap.can_auto_rearm_on_miss else ProbeOutcome.INCONCLUSIVE
    plan.append((ConformanceScenario.MATURE_MISS, mature, ()))
    plan.append((ConformanceScenario.AMBIGUOUS, ProbeOutcome.INCONCLUSIVE, ()))
    return plan


def conformance_problems(
    capability: Capability,
    results: Mapping[ConformanceScenario, ProbeResult],
    source_args: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why ``results`` do not conform to the capability's plan (empty: they do)."""
    return _compare_with_plan(capability, results, source_args, reported=set())


def _compare_with_plan(
    cap: Capability,
    results: Mapping[ConformanceScenario, ProbeResult],
    source_args: Mapping[str, Any] | None,
    reported: set[str],
) -> list[str]:
    """Problems per planned scenario; ``reported`` ones already have a better message."""
    plan = conformance_plan(cap)
    planned = {scenario for scenario, _, _ in plan}
    problems = [
        f"{cap.name}: scenario {ConformanceScenario(s).value} is not in the conformance plan"
        for s in results
        if s not in planned
    ]
    for scenario, expected, _ in plan:
        result = results.get(scenario)
        if result is None and scenario.value in reported:
            continue
        if result is None:
            problems.append(f"{cap.name}: scenario {scenario.value} has no result")
            continue
        if result.outcome != expected:
            problems.append(
                f"{cap.name}: scenario {scenario.value} expected {expected.value},"
                f" got {ProbeOutcome(result.outcome).value}"
            )
            continue
        if expected is ProbeOutcome.HAPPENED:
            problems.extend(_happened_receipt_problems(cap, result.receipt, source_args))
    return problems


def _happened_receipt_problems(
    cap: Capability, receipt: Any, source_args: Mapping[str, Any] | None
) -> list[str]:
    prefix = f"{cap.name}: scenario happened"
    # Runtime reconciliation refuses a HAPPENED probe without a receipt, so must this.
    if type(receipt) is not dict or not receipt:
        return [f"{prefix} must return a non-empty receipt object"]
    if cap.required_receipt_source_fields and source_args is None:
        return [
            f"{prefix}: pass source_args so receipt fields"
            f" {', '.join(cap.required_receipt_source_fields)} can be checked against them"
        ]
    return [f"{prefix}: {p}" for p in _receipt_problems(cap, receipt, source_args or {})]


def assert_conformance(
    capability: Capability,
    results: Mapping[ConformanceScenario, ProbeResult],
    *,
    source_args: Mapping[str, Any] | None = None,
) -> None:
    """Raise ``ConformanceError`` listing every way ``results`` miss the plan.

    ``source_args`` are the fixture call's arguments; capabilities with receipt source
    fields (github_pr's head) need them to check the receipt belongs to that call.
    """
    problems = conformance_problems(capability, results, source_args)
    if problems:
        raise ConformanceError(
            f"prober does not conform to capability {capability.name!r}:\n  - "
            + "\n  - ".join(problems)
        )


def load_conformance_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read conformance evidence: ``{"schema_version": 1, "capabilities": {name: {...}}}``.

    Only the envelope is checked here; ``check_conformance_evidence`` judges each entry
    against the current capability, so one stale entry does not hide the others.
    """
    where = os.fspath(path)
    doc = _read_json(path, "conformance file")
    _check_document(doc, where, ("schema_version", "capabilities"))
    entries = doc.get("capabilities")
    if type(entries) is not dict:
        raise CapabilityError(f"{where}.capabilities: must be an object keyed by capability name")
    for name, entry in entries.items():
        if type(entry) is not dict:
            raise CapabilityError(f"{where}.capabilities.{name}: must be a JSON object")
    result: dict[str, Any] = doc
    return result


_EVIDENCE_KEYS = ("capability_fingerprint", "source_args", "scenarios")
_SCENARIO_KEYS = ("outcome", "receipt", "detail")


def _is_filled(value: Any) -> bool:
    """False for null and for text still holding TODO: a template is not evidence."""
    if value is None:
        return False
    return not (isinstance(value, str) and (TODO in value or not value.strip()))


def source_arg_names(capability: Capability) -> tuple[str, ...]:
    """The fixture call's arguments evidence must record: the full provider key."""
    names = [
        *capability.required_args,
        *capability.required_idempotency_fields,
        *capability.required_receipt_source_fields.values(),
    ]
    return tuple(dict.fromkeys(names))


def check_conformance_evidence(
    capability: Capability, evidence_doc: Mapping[str, Any]
) -> list[str]:
    """Why the evidence document does not prove ``capability``'s conformance (empty: it does).

    The evidence must be for the current fingerprint, cover every planned scenario with
    the planned outcome, carry a fixture detail, and its HAPPENED receipt must hold the
    required fields with source fields equal to ``source_args``.
    """
    cap = capability
    entry = (evidence_doc.get("capabilities") or {}).get(cap.name)
    if entry is None:
        return [
            f"{cap.name}: no conformance evidence; generate a template with"
            " --conformance-file-template and fill it in"
        ]
    if type(entry) is not dict:
        return [f"{cap.name}: evidence must be a JSON object"]
    problems = [f"{cap.name}: unknown field {key!r}" for key in entry if key not in _EVIDENCE_KEYS]
    found = entry.get("capability_fingerprint")
    if found != cap.fingerprint():
        problems.append(
            f"{cap.name}: evidence is for fingerprint {found!r}, the capability is now"
            f" {cap.fingerprint()}; re-run the scenarios and regenerate the evidence"
        )
    source_args = entry.get("source_args")
    if type(source_args) is not dict:
        problems.append(f"{cap.name}: source_args must be an object of the fixture call's args")
        source_args = {}
    for name in source_arg_names(cap):
        if not _is_filled(source_args.get(name)):
            problems.append(f"{cap.name}: source_args.{name} is not filled in")
    scenarios = entry.get("scenarios")
    if type(scenarios) is not dict:
        return [*problems, f"{cap.name}: scenarios must be an object keyed by scenario name"]
    results, entry_problems = _results_from_evidence(cap, scenarios)
    problems.extend(entry_problems)
    # Scenarios present but not filled in were reported above with the reason why.
    problems.extend(_compare_with_plan(cap, results, source_args, reported=set(scenarios)))
    return problems


def _results_from_evidence(
    cap: Capability, scenarios: Mapping[str, Any]
) -> tuple[dict[ConformanceScenario, ProbeResult], list[str]]:
    """Turn filled-in scenario entries into probe results; report the ones that are not."""
    results: dict[ConformanceScenario, ProbeResult] = {}
    problems: list[str] = []
    valid = {s.value for s in ConformanceScenario}
    planned = ", ".join(s.value for s, _, _ in conformance_plan(cap))
    outcomes = {o.value for o in ProbeOutcome}
    for name, item in scenarios.items():
        where = f"{cap.name}: scenarios.{name}"
        if name not in valid:
            problems.append(f"{where}: unknown scenario; the plan has {planned}")
            continue
        if type(item) is not dict:
            problems.append(f"{where}: must be an object with outcome, receipt and detail")
            continue
        problems.extend(f"{where}: unknown field {k!r}" for k in item if k not in _SCENARIO_KEYS)
        outcome, detail = item.get("outcome"), item.get("detail")
        if not _is_filled(detail) or type(detail) is not str:
            problems.append(f"{where}.detail: describe the fixture (still TODO or missing)")
        if outcome is None:
            problems.append(f"{where}.outcome: null; record the outcome the prober returned")
            continue
        if outcome not in outcomes:
            problems.append(
                f"{where}.outcome: {outcome!r} is not an observed outcome;"
                f" record {', '.join(sorted(outcomes))}"
            )
            continue
        receipt = item.get("receipt")
        if type(receipt) is dict and not all(_is_filled(v) for v in receipt.values()):
            problems.append(f"{where}.receipt: fill in the receipt the prober returned")
        results[ConformanceScenario(name)] = ProbeResult(
            ProbeOutcome(outcome), receipt=receipt, detail=str(detail or "")
        )
    return results, problems


def conformance_template(capabilities: Iterable[Capability]) -> dict[str, Any]:
    """A fill-in evidence document for ``capabilities``: a scaffold that fails until done.

    Fingerprints and scenario names are copied from the current contract so nobody types
    them by hand; outcomes and receipts are null and details say TODO, so an unfilled
    template can never pass ``--require-conformance``.
    """
    entries: dict[str, Any] = {}
    for cap in capabilities:
        scenarios: dict[str, Any] = {}
        for scenario, expected, receipt_fields in conformance_plan(cap):
            item: dict[str, Any] = {"outcome": None}
            if scenario is ConformanceScenario.HAPPENED:
                item["receipt"] = None
            hint = f"expect {expected.value}"
            if receipt_fields:
                hint += " with receipt fields " + ", ".join(receipt_fields)
            item["detail"] = f"{TODO}: describe the fixture for {scenario.value} ({hint})"
            scenarios[scenario.value] = item
        entries[cap.name] = {
            "capability_fingerprint": cap.fingerprint(),
            "source_args": {name: TODO for name in source_arg_names(cap)},
            "scenarios": scenarios,
        }
    return {"schema_version": SCHEMA_VERSION, "capabilities": entries}
