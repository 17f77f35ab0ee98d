"""Building a Reconciler from references: the one place the CLI and the Django settings
turn ``module:NAME``, capability files and ``TOOL=CAPABILITY`` pins into objects, so the
daemon enforces exactly the provider knowledge that passed CI."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ._providers import Capability, load_capabilities_file
from ._reconcile import Reconciler
from ._reconciler_options import ReconcilerOptions
from ._runtime import OpenOnce
from .errors import WiringError


def load_object(ref: str) -> Any:
    """``package.module:NAME`` -> the object; a callable NAME is called to build it."""
    module_name, sep, name = ref.partition(":")
    if not sep or not module_name or not name:
        raise WiringError(f"{ref!r} is not of the form package.module:NAME")
    # Like celery and gunicorn: the working directory's modules are importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WiringError(f"cannot import {module_name!r} for {ref!r}: {exc}") from None
    try:
        obj = getattr(module, name)
    except AttributeError:
        raise WiringError(f"{module_name!r} has no {name!r}") from None
    if isinstance(obj, Mapping) or hasattr(obj, "probe") or not callable(obj):
        return obj
    return obj()  # a factory that builds the probers


def parse_pins(pins: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(pins, Mapping):
        return dict(pins)
    parsed: dict[str, str] = {}
    for pin in pins:
        tool, sep, capability = pin.partition("=")
        if not sep or not tool or not capability:
            raise WiringError(f"provider capability pin {pin!r} is not TOOL=CAPABILITY")
        parsed[tool] = capability
    return parsed


def load_capabilities(files: Iterable[str]) -> list[Capability]:
    return [cap for path in files for cap in load_capabilities_file(path)]


def build_openonce(
    target: str,
    *,
    capability_files: Iterable[str] = (),
    pins: Iterable[str] | Mapping[str, str] = (),
    migrate: bool | None = False,
    **options: Any,
) -> OpenOnce:
    return OpenOnce(
        target,
        migrate=migrate,
        extra_capabilities=load_capabilities(capability_files),
        provider_capabilities=parse_pins(pins),
        **options,
    )


def build_reconciler(
    oo: OpenOnce,
    *,
    options: ReconcilerOptions | None = None,
    probers: str | Mapping[str, Any] | None = None,
    pins: Iterable[str] | Mapping[str, str] = (),
    grace_overrides: Mapping[str, float] | None = None,
    **option_values: Any,
) -> Reconciler:
    """A Reconciler over ``oo``'s store with the probers named by ``probers``: a mapping
    tool -> prober (or -> (prober, capability)), or a ``module:NAME`` reference to one.
    ``options`` and ``option_values`` (any ``ReconcilerOptions`` field as a keyword) say
    how it decides, as for ``Reconciler``."""
    opts = (options or ReconcilerOptions()).replace(**option_values)
    if opts.require_conformance and not opts.conformance_file:
        raise WiringError("--require-conformance needs --conformance-file")
    reconciler = Reconciler(oo, options=opts, grace_overrides=grace_overrides)
    table = load_object(probers) if isinstance(probers, str) else (probers or {})
    if not isinstance(table, Mapping):
        raise WiringError(f"probers must be a mapping of tool to prober, got {type(table)}")
    pinned = {**oo.provider_capabilities, **parse_pins(pins)}
    for tool, entry in table.items():
        prober, capability = entry if isinstance(entry, tuple) else (entry, None)
        reconciler.register(tool, prober, capability or pinned.get(tool))
    return reconciler
