"""The test suite: Postgres by default (``OPENONCE_DATABASE``), fast password hashing."""

from __future__ import annotations

from openonce_site.env import env_float, env_int, env_str

from .base import *  # noqa: F403
from .base import SECRET_KEY

SECRET_KEY = SECRET_KEY or "test-only-insecure-key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
OPENONCE_PROBE_RETRY_BACKOFF = env_float("OPENONCE_PROBE_RETRY_BACKOFF", 0.2)
# Every test client signs in from 127.0.0.1, so a suite's worth of deliberate wrong
# passwords would add up to one address's lockout; the throttle's own tests set the
# limits they test.
OPENONCE_SIGNIN_ADDRESS_LIMIT = env_int("OPENONCE_SIGNIN_ADDRESS_LIMIT", 1000, minimum=1)
# The pytest process's probers limit on their own: a pause one test provokes must not hold
# the next test (or a concurrent run) through a shared Redis key. Daemon tests give their
# workers the shared limiter on the stack's own Redis database (tests/support/daemon.py).
OPENONCE_RATE_LIMIT_REDIS = env_str("OPENONCE_RATE_LIMIT_REDIS", "off")
