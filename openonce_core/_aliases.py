"""One module under two names: the ``openonce`` package (the distribution's name) and the
implementation modules' old, public-looking names (``openonce_core.reconcile``, now
``openonce_core._reconcile``).

An alias is the very same module object, not a copy: a second copy of a module would hold
a second set of classes (``isinstance`` and pickles would disagree) and a second set of
locks. A finder on ``sys.meta_path`` answers for the alias's name, imports the real module
and hands that object back, which ``sys.modules`` then holds under both names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any


class SameModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each name ``real_name`` maps (or ``None``: not an alias) as that module.
    ``on_import(alias, real)`` runs when an alias is first imported."""

    def __init__(
        self,
        key: str,
        real_name: Callable[[str], str | None],
        on_import: Callable[[str, str], None] | None = None,
    ) -> None:
        self.key = key  # one finder per key and interpreter, even if a package is reloaded
        self._real_name = real_name
        self._on_import = on_import
        self._real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        real = self._real_name(fullname)
        if real is None:
            return None
        if real not in sys.modules and importlib.util.find_spec(real) is None:
            return None  # ModuleNotFoundError names the module as the user wrote it
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        real = self._real_name(spec.name)
        assert real is not None
        if self._on_import is not None:
            self._on_import(spec.name, real)
        module = importlib.import_module(real)
        # The import system writes the alias's spec onto the module next; the real one is
        # put back in exec_module, so the module keeps its own name (relative imports
        # inside functions, reload, pickle).
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        alias = module.__spec__.name if module.__spec__ else ""
        if alias in self._real_specs:
            module.__spec__ = self._real_specs.pop(alias)


def install(finder: SameModules) -> None:
    if not any(getattr(f, "key", None) == finder.key for f in sys.meta_path):
        sys.meta_path.insert(0, finder)


# -- the implementation modules' old names, kept for one release -----------------------

MOVED = frozenset(
    {
        *("bridge", "calls", "canonical", "classify", "clock", "contracts", "decisions"),
        *("due", "failures", "forksafe", "helpers", "keys", "leases", "ledger", "observe"),
        *("policy", "probe", "providers", "reconcile", "records", "redact", "retention"),
        *("runtime", "scan", "schema", "states", "textsafe", "wiring"),
    }
)

# Old names whose module moved somewhere else than ``_<name>``: old -> new, both under
# ``openonce_core``.
RENAMED = {"cli_providers": "cli._providers", "cli_test": "cli._test"}


def moved_real_name(fullname: str) -> str | None:
    package, _, rest = fullname.partition(".")
    if package != "openonce_core" or not rest:
        return None
    first, dot, tail = rest.partition(".")
    if first in RENAMED:
        return f"openonce_core.{RENAMED[first]}{dot}{tail}"
    return f"openonce_core._{first}{dot}{tail}" if first in MOVED else None


def warn_moved(alias: str, real: str) -> None:
    frame = _importing_frame()
    if real.startswith("openonce_core._"):  # MOVED: the same name with an underscore
        message = (
            f"{alias} is an implementation module and will be removed in the next release:"
            " import its public names from openonce_core (e.g. `from openonce_core import"
            " Reconciler, Prober`)"
        )
    else:  # RENAMED: a command's module, now inside the cli package
        message = (
            f"{alias} moved to {real} and will be removed in the next release: run the"
            " `openonce` command, or call openonce_core.cli.main(argv)"
        )
    if frame is None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return
    # Attributed to the line that imported the old name, so the default filters show it
    # there and ``-W error`` points at the line to change.
    warnings.warn_explicit(
        message,
        DeprecationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )


def _importing_frame() -> FrameType | None:
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or frame.f_code.co_filename == __file__
        or frame.f_globals.get("__name__", "").startswith("importlib")
    ):
        frame = frame.f_back  # type: ignore[assignment]
    return frame


def moved_attribute(name: str) -> ModuleType | None:
    """``openonce_core.<old name>`` read as an attribute, without importing it first."""
    if name not in MOVED and name not in RENAMED:
        return None
    return importlib.import_module(f"openonce_core.{name}")
