"""The test suite: Postgres by default (``OPENONCE_DATABASE``), fast password hashing."""

from __future__ import annotations

from openonce_site.env import env_float

from .base import *  # noqa: F403
from .base import SECRET_KEY

SECRET_KEY = SECRET_KEY or "test-only-insecure-key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
OPENONCE_PROBE_RETRY_BACKOFF = env_float("OPENONCE_PROBE_RETRY_BACKOFF", 0.2)
