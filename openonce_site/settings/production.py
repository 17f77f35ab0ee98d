"""Production: every secret from the environment, DEBUG off whatever the environment
says, hashed and compressed static files, secure cookies and HSTS behind TLS.

gunicorn (``openonce_site.wsgi``), an ASGI server (``openonce_site.asgi``) and Celery
(``-A openonce_site``) choose these settings unless DJANGO_SETTINGS_MODULE says otherwise.

Where TLS ends is the operator's statement, ``OPENONCE_TLS``:

* ``direct`` (the default): gunicorn terminates TLS itself (``--certfile``/``--keyfile``);
  no forwarded header is believed.
* ``proxy``: a reverse proxy in front terminates TLS (compose's Caddy service). Only then,
  and only from a peer in ``OPENONCE_TRUSTED_PROXIES`` (base.py; loopback by default), are
  ``X-Forwarded-Proto`` and ``X-Forwarded-For`` believed; from anyone else
  ``openonce_site.middleware.ForwardedHeadersMiddleware`` drops them, so a client that
  reaches gunicorn directly cannot claim HTTPS or another address.
* ``off``: plain HTTP, explicitly, for a private network. No HTTPS redirect (nothing
  would answer it), no HSTS, cookies without ``Secure``; ``check --deploy`` reports
  exactly those.

Secrets can come from files (Docker or Kubernetes secrets): ``OPENONCE_SECRET_KEY_FILE``,
``OPENONCE_SECRET_PEPPER_FILE``, ``OPENONCE_DB_PASSWORD_FILE``, ``OPENONCE_CACHE_URL_FILE``
name a file holding the value (``openonce_site.env.env_secret``); setting both forms of one
is refused.

``manage.py check --deploy --settings=openonce_site.settings.production`` is clean with
``direct`` or ``proxy``.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from openonce_site.env import env_choice, env_int, env_secret, env_str

from .base import *  # noqa: F403
from .base import (
    CELERY_BROKER_URL,
    SECRET_KEY,
    STATE_DIR,
    cache_from_url,
    ledger_database,
    state_path,
)

if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5 or SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfigured(
        "OPENONCE_SECRET_KEY must be set to a long random value in production, or"
        " OPENONCE_SECRET_KEY_FILE to a file holding one"
        ' (python -c "import secrets; print(secrets.token_urlsafe(64))")'
    )
DEBUG = False  # not read from the environment: nothing here can turn the debug page on

# No silent default ledger: a production process on a stray SQLite file would look
# healthy while agents write elsewhere.
OPENONCE_DATABASE, _ledger = ledger_database(None)
DATABASES = {"default": _ledger}

# Sign-in throttling must count across every gunicorn worker: Redis (the broker's, under
# its own key prefix, unless OPENONCE_CACHE_URL names another). The URL may hold Redis's
# password, so it can come from a file (OPENONCE_CACHE_URL_FILE) like the other secrets.
OPENONCE_CACHE_URL = env_secret("OPENONCE_CACHE_URL", CELERY_BROKER_URL)
CACHES = {"default": cache_from_url(OPENONCE_CACHE_URL)}

STATIC_ROOT = state_path(
    env_str("OPENONCE_STATIC_ROOT", "static"), STATE_DIR, "OPENONCE_STATIC_ROOT"
)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = False  # serve what collectstatic wrote, never the source tree

OPENONCE_TLS = env_choice("OPENONCE_TLS", ("direct", "proxy", "off"), "direct")
OPENONCE_BEHIND_PROXY = OPENONCE_TLS == "proxy"
if OPENONCE_BEHIND_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
HTTPS = OPENONCE_TLS != "off"
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = env_int("OPENONCE_HSTS_SECONDS", 31536000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_AGE = 8 * 3600  # a working day
# Health checks and monitors speak plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^(health|livez|readyz|metrics)/?$"]
