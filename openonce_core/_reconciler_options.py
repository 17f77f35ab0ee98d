"""The Reconciler's options, written once.

``ReconcilerOptions`` is the one list: the ``Reconciler`` constructor takes it (or any of
its fields as keywords), ``build_reconciler`` passes it through, the ``openonce
reconcile`` command makes one flag per field (``--probe-timeout``), and the site reads one
setting per field (``OPENONCE_PROBE_TIMEOUT``). A field added here appears in all four.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The settings named before the options were written once; every other field's setting
# is OPENONCE_<FIELD>.
_SETTINGS = {
    "retry_backoff": "OPENONCE_PROBE_RETRY_BACKOFF",
    "transient_retries": "OPENONCE_PROBE_TRANSIENT_RETRIES",
    "transient_window": "OPENONCE_PROBE_TRANSIENT_WINDOW",
    "owner": "OPENONCE_RECONCILER_OWNER",
}


def _option(
    default: Any, kind: type, help: str, *, metavar: str = "", positive: bool = False
) -> Any:
    """A field with what a flag and a setting need: its kind (bool, int, float or str),
    a one-line help, and whether zero is refused (``positive``)."""
    metadata = {"kind": kind, "help": help, "metavar": metavar, "positive": positive}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ReconcilerOptions:
    """How a Reconciler decides; every field has a default.

    ``Reconciler(oo, options=ReconcilerOptions(probe_timeout=10))``, or the same fields as
    keywords: ``Reconciler(oo, probe_timeout=10)``.
    """

    grace_seconds: float | None = _option(
        None, float, "override every capability's grace", metavar="SECONDS"
    )
    require_provider_capability: bool = _option(
        False, bool, "fail closed for tools without reviewed provider capability metadata"
    )
    conformance_file: str | None = _option(
        None, str, "conformance evidence (JSON) for --require-conformance", metavar="FILE"
    )
    require_conformance: bool = _option(
        False, bool, "commit or re-arm only for capabilities with passing conformance evidence"
    )
    probe_timeout: float = _option(
        30.0, float, "seconds one probe may take", metavar="SECONDS", positive=True
    )
    probe_retries: int = _option(
        0, int, "ask a prober that raised or timed out again this many times", metavar="N"
    )
    retry_backoff: float = _option(
        5.0, float, "seconds before the first such retry; each pause doubles", metavar="SECONDS"
    )
    transient_retries: int = _option(
        8, int, "times a busy or down provider is asked again before a person is", metavar="N"
    )
    transient_window: float = _option(
        3600.0,
        float,
        "seconds a busy or down provider is asked again for, at most",
        metavar="SECONDS",
        positive=True,
    )
    stale_call_grace: float = _option(
        300.0, float, "seconds after a lease ran out before a miss re-arms", metavar="SECONDS"
    )
    dead_owner_grace: float = _option(
        60.0, float, "seconds after an owner died before a miss re-arms", metavar="SECONDS"
    )
    young_reprobes: int = _option(
        20,
        int,
        "times a prober that answers 'not yet' is asked again before a person is",
        metavar="N",
    )
    maturity_window: float = _option(
        7200.0,
        float,
        "seconds after a first 'not yet' that a prober is asked again for, at most",
        metavar="SECONDS",
    )
    owner: str = _option("reconciler", str, "name in the journal (reconciler:NAME)", metavar="NAME")

    def __post_init__(self) -> None:
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            if not _fits(value, option):
                raise TypeError(
                    f"ReconcilerOptions.{option.name}: expected {_kind_name(option)}, got {value!r}"
                )

    def replace(self, **changes: Any) -> ReconcilerOptions:
        """A copy with ``changes``; an unknown name is refused with the known ones."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(
                f"unknown Reconciler option(s) {', '.join(unknown)}; known:"
                f" {', '.join(f.name for f in dataclasses.fields(self))}"
            )
        return dataclasses.replace(self, **changes)


def option_fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(ReconcilerOptions)


def setting_name(option: dataclasses.Field[Any]) -> str:
    """The site's setting (and environment variable) for ``option``."""
    return _SETTINGS.get(option.name, f"OPENONCE_{option.name.upper()}")


def flag_name(option: dataclasses.Field[Any]) -> str:
    """The ``openonce reconcile`` flag for ``option``."""
    return "--" + option.name.replace("_", "-")


def _fits(value: Any, option: dataclasses.Field[Any]) -> bool:
    kind = option.metadata["kind"]
    if value is None:
        return option.default is None
    if kind is float:
        return type(value) in (int, float)
    return type(value) is kind


def _kind_name(option: dataclasses.Field[Any]) -> str:
    name: str = option.metadata["kind"].__name__
    return f"{name} or None" if option.default is None else name
