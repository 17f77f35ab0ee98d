"""Settings shared by every deployment, read from the environment (see ``env.py``).

The one setting that matters most is ``OPENONCE_DATABASE``: the ledger. A file path means
SQLite (the embedded default), a ``postgresql://`` DSN means Postgres (production). Django's
own tables live beside the ledger's; the core installs the ledger tables on migrate.
"""

from __future__ import annotations

from pathlib import Path

from openonce_site.env import (
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent

SECRET_KEY = env_str("OPENONCE_SECRET_KEY", "")  # dev/test set a default; production requires it
DEBUG = env_bool("OPENONCE_DEBUG", False)
ALLOWED_HOSTS = env_list("OPENONCE_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("OPENONCE_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "console",
    "reconciler",
    "notifications",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "openonce_site.urls"
WSGI_APPLICATION = "openonce_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

OPENONCE_DATABASE = env_str("OPENONCE_DATABASE", "openonce.db")
DATABASES = {"default": database_from_url(OPENONCE_DATABASE, BASE_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("OPENONCE_LOG_LEVEL", "INFO")},
}

# -- provider knowledge: the same references the `openonce reconcile` CLI takes ----------
OPENONCE_PROBERS = env_str("OPENONCE_PROBERS", "") or None  # "package.module:NAME"
OPENONCE_CAPABILITY_FILES = env_list("OPENONCE_CAPABILITY_FILES")
OPENONCE_PROVIDER_CAPABILITIES = env_list("OPENONCE_PROVIDER_CAPABILITIES")  # TOOL=CAP,...
OPENONCE_REQUIRE_PROVIDER_CAPABILITY = env_bool("OPENONCE_REQUIRE_PROVIDER_CAPABILITY", False)
OPENONCE_CONFORMANCE_FILE = env_str("OPENONCE_CONFORMANCE_FILE", "") or None
OPENONCE_REQUIRE_CONFORMANCE = env_bool("OPENONCE_REQUIRE_CONFORMANCE", False)
OPENONCE_GRACE_SECONDS = env_float("OPENONCE_GRACE_SECONDS", None)  # None: per capability
OPENONCE_PROBE_TIMEOUT = env_float("OPENONCE_PROBE_TIMEOUT", 30.0, positive=True)
OPENONCE_PROBE_RETRIES = env_int("OPENONCE_PROBE_RETRIES", 3)
OPENONCE_PROBE_RETRY_BACKOFF = env_float("OPENONCE_PROBE_RETRY_BACKOFF", 5.0)

# -- the sweep ------------------------------------------------------------------------
OPENONCE_SWEEP_INTERVAL = env_float("OPENONCE_SWEEP_INTERVAL", 5.0, positive=True)  # seconds
OPENONCE_SWEEP_LIMIT = env_int("OPENONCE_SWEEP_LIMIT", 5000, minimum=1)  # due effects per tick
OPENONCE_SWEEP_BATCH = env_int("OPENONCE_SWEEP_BATCH", 100, minimum=1)  # effects per task
# A small backlog is split into at least this many batches so that several workers
# share it (40 due effects -> 8 batches of 5, not one batch of 40).
OPENONCE_SWEEP_SPREAD = env_int("OPENONCE_SWEEP_SPREAD", 8, minimum=1)
# How long a tick's claim on the effects it queued lasts. A worker that dies with a batch
# delays those effects by at most this long; a batch still queued after it may be
# handed out again (the fenced decisions keep that harmless).
OPENONCE_DISPATCH_TTL = env_float("OPENONCE_DISPATCH_TTL", 60.0, positive=True)
OPENONCE_SWEEP_RETENTION_DAYS = env_int("OPENONCE_SWEEP_RETENTION_DAYS", 14, minimum=1)

# -- Celery: Redis carries messages only; every decision is in the ledger -------------
CELERY_BROKER_URL = env_str("OPENONCE_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TIMEZONE = "UTC"  # DST once doubled and skipped beat runs (celery #1604, #10107)
CELERY_ENABLE_UTC = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True  # outcomes live in the ledger and the sweep records
# Ack after the task ran, and give the message back if the worker process dies, so a
# kill -9 mid-probe is retried. A task can therefore run twice: every write is fenced.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a dead worker holds at most one unacked batch
# Redis redelivers unacked messages after visibility_timeout; a task still running then
# would run twice, and an ETA beyond it repeats forever (celery #2599, kombu #337). Keep
# time limits and countdowns far below it.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True

# -- notifications: who is told when an effect starts waiting (notifications/config.py) --
OPENONCE_NOTIFY = env_str("OPENONCE_NOTIFY", "")  # a JSON list of channels, or @file.json
OPENONCE_CONSOLE_URL = env_str("OPENONCE_CONSOLE_URL", "http://127.0.0.1:8000")  # deep links
OPENONCE_NOTIFY_INTERVAL = env_float("OPENONCE_NOTIFY_INTERVAL", 5.0, positive=True)
DEFAULT_FROM_EMAIL = env_str("OPENONCE_MAIL_FROM", "openonce@localhost")

# The one place the periodic work is declared.
CELERY_BEAT_SCHEDULE = {
    "openonce-notify": {
        "task": "openonce.notify",
        "schedule": OPENONCE_NOTIFY_INTERVAL,
        "options": {"expires": OPENONCE_NOTIFY_INTERVAL},
    },
    "openonce-sweep": {
        "task": "openonce.tick",
        "schedule": OPENONCE_SWEEP_INTERVAL,
        # A tick not picked up before the next one is pointless: drop it, the next
        # tick selects the same due effects again.
        "options": {"expires": OPENONCE_SWEEP_INTERVAL},
    },
}
