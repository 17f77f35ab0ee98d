"""Local development and `make demo`: the embedded SQLite ledger, DEBUG on."""

from __future__ import annotations

from openonce_site.env import env_bool

from .base import *  # noqa: F403
from .base import SECRET_KEY

DEBUG = env_bool("OPENONCE_DEBUG", True)
SECRET_KEY = SECRET_KEY or "dev-only-insecure-key-never-use-in-production"
