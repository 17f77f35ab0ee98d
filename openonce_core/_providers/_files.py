"""Capability files: a team's provider knowledge as JSON (schema_version 1), read and
checked field by field."""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import CapabilityError
from ._capability import SCHEMA_VERSION, Capability, _InvalidCapability
from ._matrix import BUILTIN_CAPABILITIES

# field -> (kind, required). Kinds: str, bool, int, str_or_null, strings, string_map.
_FIELDS: dict[str, tuple[str, bool]] = {
    "name": ("str", True),
    "tool_pattern": ("str", True),
    "tier": ("str", True),
    "key_strategy": ("str", True),
    "probe_basis": ("str", True),
    "miss_semantics": ("str", True),
    "can_auto_rearm_on_miss": ("bool", True),
    "default_grace_seconds": ("int", True),
    "risk": ("str", True),
    "prober": ("str_or_null", False),
    "handler_requirements": ("strings", False),
    "required_receipt_fields": ("strings", False),
    "required_receipt_source_fields": ("string_map", False),
    "required_args": ("strings", False),
    "required_idempotency_fields": ("strings", False),
}


def _type_problem(kind: str, value: Any) -> str | None:
    """Why ``value`` is not of ``kind``, or None. Exact types: JSON true is not 1."""
    if kind == "str":
        return None if type(value) is str and value.strip() else "must be a non-empty string"
    if kind == "bool":
        return None if type(value) is bool else "must be true or false"
    if kind == "int":
        ok = type(value) is int and value >= 0
        return None if ok else "must be a non-negative integer"
    if kind == "str_or_null":
        ok = value is None or _type_problem("str", value) is None
        return None if ok else "must be a non-empty string or null"
    if kind == "strings":
        ok = type(value) is list and all(type(v) is str and v.strip() for v in value)
        return None if ok else "must be a list of non-empty strings"
    ok = type(value) is dict and all(type(v) is str and v.strip() for v in value.values())
    return None if ok else "must be an object mapping receipt field to handler arg name"


def capability_from_json(doc: Any, where: str = "capability") -> Capability:
    """Build a capability from its JSON object, checking every field's type.

    ``where`` prefixes every error (``openonce-providers.json: capabilities[0]``).
    """
    if type(doc) is not dict:
        raise CapabilityError(f"{where}: must be a JSON object")
    label = f"{where} ({doc['name']})" if type(doc.get("name")) is str else where
    for key in doc:
        if key not in _FIELDS:
            raise CapabilityError(f"{label}.{key}: unknown field; expected {', '.join(_FIELDS)}")
    for key, (kind, required) in _FIELDS.items():
        if key not in doc:
            if required:
                raise CapabilityError(f"{label}.{key}: required field is missing")
            continue
        problem = _type_problem(kind, doc[key])
        if problem:
            raise CapabilityError(f"{label}.{key}: {problem}")
    try:
        return Capability(**doc)
    except _InvalidCapability as exc:
        raise CapabilityError(f"{label}.{exc.problem}") from None


def _read_json(path: str | os.PathLike[str], what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise CapabilityError(f"{os.fspath(path)}: cannot read {what}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CapabilityError(
            f"{os.fspath(path)}: {what} is not JSON: {exc.msg} at line {exc.lineno}"
            f" column {exc.colno}"
        ) from None


def _check_document(doc: Any, where: str, keys: tuple[str, ...]) -> None:
    if type(doc) is not dict:
        raise CapabilityError(f"{where}: must be a JSON object")
    for key in doc:
        if key not in keys:
            raise CapabilityError(f"{where}: unknown top-level field {key!r}")
    if doc.get("schema_version") != SCHEMA_VERSION or type(doc["schema_version"]) is not int:
        raise CapabilityError(
            f"{where}.schema_version: must be {SCHEMA_VERSION}, got {doc.get('schema_version')!r}"
        )


def load_capabilities_file(path: str | os.PathLike[str]) -> list[Capability]:
    """Read a team's capability file: ``{"schema_version": 1, "capabilities": [...]}``.

    Names must be unique and must not shadow a built-in: a file that quietly redefined
    ``stripe`` would change what every Stripe miss means without anyone reviewing it.
    """
    where = os.fspath(path)
    doc = _read_json(path, "capability file")
    _check_document(doc, where, ("schema_version", "capabilities"))
    entries = doc.get("capabilities")
    if type(entries) is not list:
        raise CapabilityError(f"{where}.capabilities: must be a list of capability objects")
    builtin_names = {cap.name for cap in BUILTIN_CAPABILITIES}
    capabilities: list[Capability] = []
    for i, entry in enumerate(entries):
        cap = capability_from_json(entry, f"{where}: capabilities[{i}]")
        if cap.name in builtin_names:
            raise CapabilityError(
                f"{where}: capabilities[{i}].name: {cap.name!r} is a built-in capability;"
                " choose another name"
            )
        if any(other.name == cap.name for other in capabilities):
            raise CapabilityError(
                f"{where}: capabilities[{i}].name: {cap.name!r} is defined twice in this file"
            )
        capabilities.append(cap)
    return capabilities
