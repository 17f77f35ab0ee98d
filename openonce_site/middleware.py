"""Response headers Django has no setting for."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class PermissionsPolicyMiddleware:
    """``Permissions-Policy`` from ``settings.PERMISSIONS_POLICY``: feature -> allowed
    origins (an empty list switches the feature off, ``["self"]`` keeps it for the console)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        policy: dict[str, list[str]] = getattr(settings, "PERMISSIONS_POLICY", {})
        self.header = ", ".join(
            f"{feature}=({' '.join(_origin(o) for o in origins)})"
            for feature, origins in policy.items()
        )

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.header:
            response.headers.setdefault("Permissions-Policy", self.header)
        return response


def _origin(origin: str) -> str:
    return origin if origin in ("self", "*") else f'"{origin}"'
