"""``import openonce``: the name the distribution is installed as (``pip install openonce``).

``openonce`` is the same library as ``openonce_core``, not a copy: every public name is
the same object (``openonce.OpenOnce is openonce_core.OpenOnce``), and every submodule
is the same module object (``import openonce.integrations.langgraph`` gives
``openonce_core.integrations.langgraph``), so classes, ``isinstance`` and pickles agree
whichever name imported them. Submodules are mapped by a finder on ``sys.meta_path``;
a second copy of a module would hold a second set of classes and a second set of locks.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import openonce_core
from openonce_core import *  # noqa: F403 - the public surface, re-exported as is
from openonce_core import __all__ as __all__
from openonce_core import __version__ as __version__

if TYPE_CHECKING:  # loaded on first use at runtime (see __getattr__), typed all the same
    from openonce_core import PostgresStore as PostgresStore
    from openonce_core import testing as testing

_PREFIX = __name__ + "."
_TARGET = openonce_core.__name__


class _SameModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``openonce.<sub>`` as ``openonce_core.<sub>`` and hands back that very
    module object, which sys.modules then holds under both names."""

    def __init__(self) -> None:
        self._real_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_PREFIX):
            return None
        real = _real_name(fullname)
        if real not in sys.modules and importlib.util.find_spec(real) is None:
            return None  # ModuleNotFoundError names openonce.<sub>, as the user wrote it
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(_real_name(spec.name))
        # The import system writes the alias's spec onto the module next; the real one is
        # put back in exec_module, so the module keeps its own name (relative imports
        # inside functions, reload, pickle).
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        alias = module.__spec__.name if module.__spec__ else ""
        if alias in self._real_specs:
            module.__spec__ = self._real_specs.pop(alias)


def _real_name(alias: str) -> str:
    return _TARGET + alias[len(__name__) :]


def _install() -> None:
    # Once per interpreter, even if this package is reloaded.
    if not any(type(f).__name__ == _SameModules.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _SameModules())


_install()


def __getattr__(name: str) -> Any:
    # What openonce_core loads on first use (PostgresStore, testing) is loaded the same way.
    try:
        return getattr(openonce_core, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
