"""Local development and `make demo`: the embedded SQLite ledger in the checkout, DEBUG
on unless OPENONCE_DEBUG=false (the demo turns it off to show the product's own error
pages). ``manage.py`` chooses these; no other entry point does."""

from __future__ import annotations

from openonce_site.env import env_bool, env_str

from .base import *  # noqa: F403
from .base import CODE_ROOT, INSTALLED, SECRET_KEY, ledger_database, state_path

DEBUG = env_bool("OPENONCE_DEBUG", True)
SECRET_KEY = SECRET_KEY or "dev-only-insecure-key-never-use-in-production"

# In a checkout, state lives beside the code, where `make demo` keeps demo.db: every
# management command run there finds the demo ledger without a variable.
if not INSTALLED:
    STATE_DIR = state_path(
        env_str("OPENONCE_STATE_DIR", str(CODE_ROOT)), CODE_ROOT, "OPENONCE_STATE_DIR"
    )
    OPENONCE_DATABASE, _ledger = ledger_database(str(STATE_DIR / "demo.db"))
    DATABASES = {"default": _ledger}
