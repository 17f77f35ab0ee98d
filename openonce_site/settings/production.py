"""Production: every secret from the environment, secure cookies, HSTS.

``manage.py check --deploy --settings=openonce_site.settings.production`` is clean.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from openonce_site.env import env_bool, env_int

from .base import *  # noqa: F403
from .base import SECRET_KEY

if len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
    raise ImproperlyConfigured(
        "OPENONCE_SECRET_KEY must be set to a long random value in production"
        ' (python -c "import secrets; print(secrets.token_urlsafe(64))")'
    )
DEBUG = False
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SECURE_SSL_REDIRECT = env_bool("OPENONCE_SSL_REDIRECT", True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("OPENONCE_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_AGE = 8 * 3600  # a working day
# The load balancer's health check speaks plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^health/$"]
