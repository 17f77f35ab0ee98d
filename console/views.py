"""Console views. Until the operator console lands, only the machine-readable health."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from reconciler.health import reconciler_health


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """For load balancers and monitors: 200 when sweeps progress, 503 when they stopped."""
    report = reconciler_health()
    return JsonResponse(report.to_json(), status=200 if report.healthy else 503)
