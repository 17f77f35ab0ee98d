"""``import openonce``: the name the distribution is installed as (``pip install openonce``).

``openonce`` is the same library as ``openonce_core``, not a copy: every public name is
the same object (``openonce.OpenOnce is openonce_core.OpenOnce``), and every submodule
is the same module object (``import openonce.integrations.langgraph`` gives
``openonce_core.integrations.langgraph``), so classes, ``isinstance`` and pickles agree
whichever name imported them. Submodules are mapped by a finder on ``sys.meta_path``;
a second copy of a module would hold a second set of classes and a second set of locks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openonce_core
from openonce_core import *  # noqa: F403 - the public surface, re-exported as is
from openonce_core import __all__ as __all__
from openonce_core import __version__ as __version__
from openonce_core._aliases import SameModules, install

if TYPE_CHECKING:  # loaded on first use at runtime (see __getattr__), typed all the same
    from openonce_core import PostgresStore as PostgresStore
    from openonce_core import testing as testing


def _real_name(fullname: str) -> str | None:
    if not fullname.startswith(__name__ + "."):
        return None
    return openonce_core.__name__ + fullname[len(__name__) :]


install(SameModules("openonce", _real_name))


def __getattr__(name: str) -> Any:
    # What openonce_core loads on first use (PostgresStore, testing) is loaded the same way.
    try:
        return getattr(openonce_core, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
