"""The test suite: Postgres by default (``OPENONCE_DATABASE``), fast password hashing."""

from __future__ import annotations

from openonce_site.env import env_float, env_int

from .base import *  # noqa: F403
from .base import SECRET_KEY

SECRET_KEY = SECRET_KEY or "test-only-insecure-key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
OPENONCE_PROBE_RETRY_BACKOFF = env_float("OPENONCE_PROBE_RETRY_BACKOFF", 0.2)
# Every test client signs in from 127.0.0.1, so a suite's worth of deliberate wrong
# passwords would add up to one address's lockout; the throttle's own tests set the
# limits they test.
OPENONCE_SIGNIN_ADDRESS_LIMIT = env_int("OPENONCE_SIGNIN_ADDRESS_LIMIT", 1000, minimum=1)
