"""The web container's health check: ``python -m openonce_site.healthcheck``.

Healthy when gunicorn answers ``/health/`` for an allowed host: 200 (sweeps progress) or
503 (the reconciler is behind, which is the worker's and beat's problem, not the web
server's). Anything else — no answer, 400 for a refused Host, 500 — is unhealthy.

The request names the first of OPENONCE_ALLOWED_HOSTS as its Host, so it is never
refused the way a bare ``http://127.0.0.1`` would be when only ``localhost`` is allowed.
Standard library only: it must not load Django to judge whether Django serves.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

HEALTHY = (200, 503)


def main() -> int:
    url = os.environ.get("OPENONCE_HEALTHCHECK_URL", "http://127.0.0.1:8000/health/")
    hosts = [h.strip() for h in os.environ.get("OPENONCE_ALLOWED_HOSTS", "").split(",")]
    host = next((h.lstrip(".") for h in hosts if h and h != "*"), "localhost")
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status = response.status
    except urllib.error.HTTPError as err:
        status = err.code
    except OSError as err:
        print(f"unhealthy: {url} did not answer: {err}", file=sys.stderr)
        return 1
    if status not in HEALTHY:
        print(f"unhealthy: {url} answered {status} for Host {host}", file=sys.stderr)
        return 1
    print(f"serving: {url} answered {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
