"""The ledger as the Django side uses it: one OpenOnce client and one Reconciler per
process, opened on the same database as Django's ``default`` connection (which, under the
test runner, is the test database).

Console actions and reconciler tasks change effects only through these (ARCHITECTURE.md
invariant 1); the ORM models in ``ledger.models`` are the read side.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string
from psycopg.conninfo import make_conninfo

from openonce_core import OpenOnce, ReconcilerOptions, Store, open_store
from openonce_core._due import Grace
from openonce_core._providers import CapabilityMatrix
from openonce_core._reconcile import Reconciler
from openonce_core._reconciler_options import option_fields, setting_name
from openonce_core._wiring import build_openonce, build_reconciler, load_object

_lock = threading.Lock()
_clients: dict[str, OpenOnce] = {}
_reconcilers: dict[str, Reconciler] = {}


def ledger_target(alias: str = "default") -> str:
    """The core's target string for Django's database ``alias``."""
    db = connections[alias].settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return str(db["NAME"])
    return make_conninfo(
        dbname=db["NAME"],
        user=db.get("USER") or None,
        password=db.get("PASSWORD") or None,
        host=db.get("HOST") or None,
        port=str(db.get("PORT") or "") or None,
    )


def _open_store(target: str) -> Store:
    if connections["default"].settings_dict["ENGINE"] == "django.db.backends.sqlite3":
        return open_store(target)
    from openonce_core.stores.postgres import PostgresStore

    # A bounded pool per process, so that web workers, Celery workers and beat together
    # stay below Postgres's max_connections (README: connection limits).
    return PostgresStore(target, max_size=settings.OPENONCE_LEDGER_POOL_MAX)


def get_openonce() -> OpenOnce:
    target = ledger_target()
    with _lock:
        client = _clients.get(target)
        if client is None:
            pepper = settings.OPENONCE_SECRET_PEPPER
            client = _clients[target] = build_openonce(
                _open_store(target),  # type: ignore[arg-type]
                capability_files=settings.OPENONCE_CAPABILITY_FILES,
                pins=settings.OPENONCE_PROVIDER_CAPABILITIES,
                owner="console",
                secret_pepper=pepper.encode() if pepper else None,
            )
        return client


def get_reconciler() -> Reconciler:
    target = ledger_target()
    with _lock:
        reconciler = _reconcilers.get(target)
    if reconciler is None:
        reconciler = build_reconciler(
            get_openonce(), options=reconciler_options(), probers=_wrapped_probers()
        )
        with _lock:
            reconciler = _reconcilers.setdefault(target, reconciler)
    return reconciler


def reconciler_options() -> ReconcilerOptions:
    """The Reconciler's options from the settings: one setting per field, as the core
    names it (``OPENONCE_PROBE_TIMEOUT``; openonce_site/settings/base.py reads them)."""
    return ReconcilerOptions(
        **{f.name: getattr(settings, setting_name(f)) for f in option_fields()}
    )


def _wrapped_probers() -> str | Mapping[str, Any] | None:
    """OPENONCE_PROBERS passed through ``OPENONCE_PROBER_WRAPPER``, a dotted path (the
    project names the daemon's ``reconciler.probes.instrument``, which times and logs
    every probe for /metrics and health); unwrapped when it is unset or None. A setting,
    so that this shared app never imports the daemon."""
    wrapper = getattr(settings, "OPENONCE_PROBER_WRAPPER", None)
    if not wrapper:
        return settings.OPENONCE_PROBERS
    try:
        wrap = import_string(wrapper)
    except ImportError as exc:
        raise ImproperlyConfigured(f"OPENONCE_PROBER_WRAPPER={wrapper!r}: {exc}") from None
    return wrap(settings.OPENONCE_PROBERS)


def reset() -> None:
    """Forget cached clients (tests that change settings or databases call this)."""
    with _lock:
        for reconciler in _reconcilers.values():
            reconciler.close()
        for client in _clients.values():
            client.close()
        _reconcilers.clear()
        _clients.clear()


_graces: dict[tuple[object, ...], Grace] = {}


def get_grace() -> Grace:
    """The grace windows the reconciler uses (``openonce_core._due``), for a process that
    only asks what is due (the console's queue, /metrics, health): the reconciler's own
    when this process built one, else the same settings, capability files and pins
    (``OPENONCE_PROVIDER_CAPABILITIES`` and the capabilities ``OPENONCE_PROBERS`` names)
    without a Reconciler's probe pool. Kept per configuration, so a changed setting is
    seen at once."""
    target = ledger_target()
    with _lock:
        reconciler = _reconcilers.get(target)
    if reconciler is not None:
        return reconciler.grace
    probers = settings.OPENONCE_PROBERS
    key = (
        target,
        settings.OPENONCE_GRACE_SECONDS,
        tuple(settings.OPENONCE_CAPABILITY_FILES),
        tuple(settings.OPENONCE_PROVIDER_CAPABILITIES),
        probers if isinstance(probers, str | None) else id(probers),
    )
    with _lock:
        grace = _graces.get(key)
    if grace is None:
        oo = get_openonce()
        table = load_object(probers) if isinstance(probers, str) else (probers or {})
        pins = dict(oo.provider_capabilities)
        for tool, entry in table.items():
            if isinstance(entry, tuple) and entry[1]:
                pins[tool] = entry[1]
        grace = Grace(
            CapabilityMatrix(extra=oo.extra_capabilities),
            grace_seconds=settings.OPENONCE_GRACE_SECONDS,
            pins=pins,
        )
        with _lock:
            grace = _graces.setdefault(key, grace)
    return grace
