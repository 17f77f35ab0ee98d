"""Functions the seed implementation (openonce 0.1.0) exposed for calling directly.

Each is a thin door onto the module that does the work, so it answers exactly what the
decorator, the reconciler or ``openonce providers --scan`` would: the key ``@oo.effect``
derives (keys.py), the default classifier's verdict (classify.py), the capabilities and
the human-review note the reconciler uses (_providers/, _reconcile.py), the tools the
scanner finds (scan.py).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._canonical import canonical, check_json
from ._classify import Classifier, FailureClass
from ._keys import Spec, check_text, prepare
from ._providers import Capability, CapabilityMatrix, capability_from_json
from ._reconcile import _guidance
from ._scan import scan_tree
from .errors import CapabilityError, InvalidArgumentsError

__all__ = [
    "ScannedEffectTool",
    "canonicalize",
    "capabilities_for_tool",
    "capability_from_dict",
    "capability_guidance_for_tool",
    "classify_exception",
    "derive_key",
    "scan_effect_tools",
]


def canonicalize(value: Any) -> str:
    """The RFC 8785 (JCS) text of ``value``, as key material is hashed.

    Floats are refused (:class:`FloatInKeyMaterialError`: pass integer minor units), as
    are integers beyond 2**53-1 and anything that is not strict JSON
    (:class:`InvalidArgumentsError`, naming where)."""
    return canonical(value, plain=check_json(value, key_material=True))


def derive_key(
    tool: str,
    args: Mapping[str, Any],
    *,
    scope: str,
    fields: Sequence[str] | None = None,
) -> str:
    """The idempotency key ``@oo.effect(tool=tool, idempotency_fields=fields)`` stores for
    a call with the arguments ``args`` (by name) inside ``oo.scope(scope)``.

    ``fields=None`` keys on every argument. Secret fields are not covered: their digests
    depend on the client's pepper."""
    if not isinstance(args, Mapping) or not all(type(name) is str for name in args):
        raise InvalidArgumentsError("args", "must map argument names to values")
    if isinstance(fields, str):
        raise ValueError("fields takes a list of argument names")
    for name in fields or ():
        if name not in args:
            raise ValueError(f"{name!r} is not one of the arguments: {', '.join(args)}")
    if type(tool) is not str or not tool:
        raise ValueError("tool must be a non-empty string")
    check_text(tool, "tool")
    names = tuple(args)
    spec = Spec(
        fn=derive_key,  # never called: prepare only reads the declaration
        tool=tool,
        signature=inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        ),
        idempotency_fields=tuple(fields) if fields else None,
        idempotency_key=None,
        secret_fields=frozenset(),
        business_errors=(),
        max_attempts=1,
        lease_seconds=1.0,
        wait_seconds=0.0,
        is_async=False,
        plain_names=names,
    )
    return prepare(spec, (), dict(args), scope, None).key


_DEFAULT_CLASSIFIER = Classifier()


def classify_exception(exc: BaseException) -> FailureClass:
    """What the default classifier makes of ``exc``: ``"failed"`` (the provider said no;
    recorded and replayed), ``"retryable"`` (nothing was sent; run again) or
    ``"unknown"`` (it may have happened; parked and reconciled). A ``FailureClass``, which
    is a ``str``."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"classify_exception takes an exception, not {type(exc).__name__}")
    return _DEFAULT_CLASSIFIER.classify(exc)


def capabilities_for_tool(
    tool: str,
    capability: str | None = None,
    *,
    capabilities: Iterable[Capability] | None = None,
) -> tuple[Capability, ...]:
    """The provider capabilities that govern ``tool``: the built-in ones and
    ``capabilities`` (a team's, e.g. from ``load_capabilities_file``) that match it, or
    only ``capability`` when one is pinned (a pin that names nothing, or another tool's
    capability, raises :class:`CapabilityError`)."""
    return tuple(CapabilityMatrix(extra=capabilities or ()).resolve(tool, capability))


def capability_guidance_for_tool(
    tool: str,
    capability: str | None = None,
    *,
    capabilities: Iterable[Capability] | None = None,
    prober_registered: bool = False,
) -> str:
    """The guidance the reconciler writes into the human-review note of an UNKNOWN
    ``tool`` effect (by default as when no prober is registered for it): the missing
    prober, miss semantics, handler requirements, required idempotency and receipt
    fields, receipt source contracts."""
    found = list(capabilities_for_tool(tool, capability, capabilities=capabilities))
    return _guidance(tool, found, prober_registered)


def capability_from_dict(mapping: Mapping[str, Any]) -> Capability:
    """One entry of a capability file (``openonce-providers.json``'s ``capabilities``
    list) as a :class:`Capability`, every field checked as the file loader checks it."""
    if not isinstance(mapping, Mapping):
        raise CapabilityError(f"capability: must be a mapping, not {type(mapping).__name__}")
    return capability_from_json(dict(mapping))


@dataclass(frozen=True)
class ScannedEffectTool:
    """One decorated handler ``openonce providers --scan`` found: where, and its tool
    (None when the tool expression is computed at runtime, so it cannot be audited)."""

    path: str
    line: int
    function: str
    tool: str | None


def scan_effect_tools(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> list[ScannedEffectTool]:
    """The effect tools declared under ``paths`` (directories or files), read with
    ``ast`` and never imported, as ``openonce providers --scan`` reads them.

    A file that cannot be parsed raises ``SyntaxError`` naming it: the tools in it would
    otherwise be missing from the answer without a word."""
    roots = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    found: list[ScannedEffectTool] = []
    for root in roots:
        result = scan_tree(root)
        if result.errors:
            raise SyntaxError(f"scan {os.fspath(root)}: " + "; ".join(result.errors))
        base = os.fspath(root)
        for tool in result.tools:
            path = base if os.path.isfile(base) else os.path.join(base, tool.file)
            found.append(ScannedEffectTool(path, tool.line, tool.function, tool.tool))
    return found
