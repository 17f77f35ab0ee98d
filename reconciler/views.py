"""Machine endpoints, no sign-in and no ledger data: for load balancers, orchestrators and
Prometheus.

* ``/livez``  — the process answers (nothing else is checked: restart it if not);
* ``/readyz`` — the database is reachable and its schemas are current (the core's ledger
  schema version, Django's migrations): send it traffic;
* ``/metrics`` — Prometheus exposition (``reconciler.metrics``); with
  OPENONCE_METRICS_TOKEN set it needs ``Authorization: Bearer <token>``.

* ``/health/`` — reconciler progress (sweeps, probers, quarantine): 200 or 503 with
  ``{"healthy": …}`` for everyone; the reasons only with ``Authorization: Bearer
  <OPENONCE_HEALTH_TOKEN>`` or for a signed-in operator. A prober's reason can quote what
  a provider said about our credentials; a load balancer needs only the verdict.

Progress is separate from readiness: a stopped beat must not make the console unready,
and a down database must not read as a stopped beat.
"""

from __future__ import annotations

import hmac
import time

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ledger.clients import get_openonce
from openonce_core._schema import SCHEMA_VERSION
from openonce_core.errors import OpenOnceError

from .health import reconciler_health
from .metrics import registry


@never_cache
@require_safe  # GET or HEAD: load balancers probe with either
def livez(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"alive": True})


@never_cache
@require_safe  # GET or HEAD: load balancers probe with either
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    ready = True
    started = time.monotonic()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except DatabaseError as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
        return JsonResponse({"ready": False, "checks": checks}, status=503)
    try:
        store = get_openonce().store
        version = store.schema_version()
        oldest = store.schema_readable_from() if version > SCHEMA_VERSION else version
        if version == SCHEMA_VERSION:
            checks["ledger_schema"] = f"ok (version {version})"
        elif version > SCHEMA_VERSION and oldest <= SCHEMA_VERSION:
            # A newer release migrated it (rolling upgrades): this one can still use it.
            checks["ledger_schema"] = (
                f"ok (version {version}, newer than this code's {SCHEMA_VERSION}, which can"
                " still use it)"
            )
        elif version > SCHEMA_VERSION:
            ready = False
            checks["ledger_schema"] = (
                f"version {version} needs OpenOnce at {oldest} or newer, this code is at"
                f" {SCHEMA_VERSION}: deploy the newer release (migrating cannot help)"
            )
        else:
            ready = False
            checks["ledger_schema"] = (
                f"version {version}, this code needs {SCHEMA_VERSION}: run manage.py migrate"
            )
    except (DatabaseError, OpenOnceError, OSError) as exc:
        ready = False
        checks["ledger_schema"] = f"unreadable: {type(exc).__name__}: {exc}"[:200]
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        checks["migrations"] = "ok" if not plan else f"{len(plan)} unapplied: run manage.py migrate"
        ready = ready and not plan
    except DatabaseError as exc:
        ready = False
        checks["migrations"] = f"unreadable: {type(exc).__name__}"
    checks["seconds"] = f"{time.monotonic() - started:.3f}"
    return JsonResponse({"ready": ready, "checks": checks}, status=200 if ready else 503)


@never_cache
@require_safe  # GET or HEAD: load balancers probe with either
def health(request: HttpRequest) -> JsonResponse:
    report = reconciler_health()
    status = 200 if report.healthy else 503
    if _may_see_health_details(request):
        return JsonResponse(report.to_json(), status=status)
    return JsonResponse({"healthy": report.healthy}, status=status)


def _may_see_health_details(request: HttpRequest) -> bool:
    token = settings.OPENONCE_HEALTH_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.has_perm("console.view_ledger"))


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.OPENONCE_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return HttpResponse("metrics need Authorization: Bearer <token>\n", status=401,
                                content_type="text/plain")  # fmt: skip
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
