"""Settings shared by every deployment, read from the environment (see ``env.py``).

The one setting that matters most is ``OPENONCE_DATABASE``: the ledger. A file path means
SQLite (the embedded default), a ``postgresql://`` DSN means Postgres (production). Django's
own tables live beside the ledger's; the core installs the ledger tables on migrate.
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP
from kombu import Exchange, Queue

from openonce_core._reconciler_options import ReconcilerOptions, setting_name
from openonce_site.env import (
    database_from_parts,
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_secret,
    env_str,
)

# Where the code is: a checkout, or site-packages after `pip install "openonce[server]"`.
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # openonce_site/
CODE_ROOT = PACKAGE_DIR.parent
INSTALLED = CODE_ROOT.name in ("site-packages", "dist-packages")
# The console's templates: shipped inside the package by the wheel (pyproject maps the
# repository's top-level templates/ to openonce_site/templates), read in place in a checkout.
TEMPLATES_DIR = PACKAGE_DIR / "templates"
if not TEMPLATES_DIR.is_dir():
    TEMPLATES_DIR = CODE_ROOT / "templates"


def state_path(value: str | os.PathLike[str], state_dir: Path, setting: str) -> Path:
    """A path for data the deployment writes (the SQLite ledger, collected static files):
    relative paths resolve under ``state_dir``; nothing is ever written into the
    installed package, where an upgrade would delete it."""
    path = Path(value)
    path = (path if path.is_absolute() else state_dir / path).resolve()
    if INSTALLED and path.is_relative_to(CODE_ROOT):
        raise ImproperlyConfigured(
            f"{setting} resolves to {path}, inside the installed packages: set"
            " OPENONCE_STATE_DIR (or an absolute path) to a folder of the deployment's own"
        )
    return path


# The folder relative state paths resolve under: the working directory unless set. The
# dev settings use the checkout, where `make demo` keeps demo.db.
STATE_DIR = state_path(env_str("OPENONCE_STATE_DIR", os.getcwd()), Path.cwd(), "OPENONCE_STATE_DIR")

SECRET_KEY = env_secret("OPENONCE_SECRET_KEY", "")  # dev/test set a default; production requires it
DEBUG = env_bool("OPENONCE_DEBUG", False)
ALLOWED_HOSTS = env_list("OPENONCE_ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("OPENONCE_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # WhiteNoise serves static files under runserver too, as it does under gunicorn.
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    # The ledger's read models and per-process clients, shared by the three apps below.
    "ledger",
    "console",
    "reconciler",
    "notifications",
]

MIDDLEWARE = [
    # Before SecurityMiddleware, whose HTTPS redirect reads X-Forwarded-Proto.
    "openonce_site.middleware.ForwardedHeadersMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight after security headers, before sessions and auth: the
    # stylesheet and htmx need neither, and are served compressed with far-future caching.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "openonce_site.middleware.PermissionsPolicyMiddleware",
    # Before anything reads request.GET or request.POST (sessions, CSRF).
    "openonce_site.middleware.RequestCharsetMiddleware",
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
        "DIRS": [TEMPLATES_DIR],
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


def ledger_database(default: str | None) -> tuple[str, dict[str, object]]:
    """OPENONCE_DATABASE (a SQLite path or a postgresql:// DSN), or the Postgres parts
    OPENONCE_DB_NAME/_USER/_PASSWORD/_HOST/_PORT; ``default`` when neither is set (None:
    refuse to start)."""
    parts = database_from_parts()
    url = os.environ.get("OPENONCE_DATABASE", "")
    if parts is not None and url:
        raise ImproperlyConfigured("set OPENONCE_DATABASE or OPENONCE_DB_NAME, not both")
    if parts is not None:
        return f"postgresql (OPENONCE_DB_NAME={parts['NAME']})", parts
    if not url:
        if default is None:
            raise ImproperlyConfigured(
                "set OPENONCE_DATABASE (a postgresql:// DSN or a SQLite path) or"
                " OPENONCE_DB_NAME with OPENONCE_DB_USER/_PASSWORD/_HOST/_PORT"
            )
        url = default
    entry = database_from_url(url, STATE_DIR)
    if entry["ENGINE"] == "django.db.backends.sqlite3":
        entry["NAME"] = str(state_path(str(entry["NAME"]), STATE_DIR, "OPENONCE_DATABASE"))
    return url, entry


OPENONCE_DATABASE, _ledger = ledger_database("openonce.db")
if _ledger["ENGINE"] == "django.db.backends.postgresql":
    # Nothing may outlive a statement on the server session, so that the console works
    # behind pgbouncer in transaction mode: no server-side cursors (.iterator() would
    # DECLARE one WITH HOLD) and no prepared statements (Django's default with psycopg 3,
    # stated here so that it stays so). Harmless on a direct connection: the console
    # iterates over one effect's journal, which a client-side cursor reads in one go.
    _ledger["DISABLE_SERVER_SIDE_CURSORS"] = True
    _ledger["OPTIONS"] = {**_ledger["OPTIONS"], "prepare_threshold": None}  # type: ignore
DATABASES = {"default": _ledger}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Secret-field digests are HMAC-SHA256 keyed with this pepper (the same value the agents
# give OpenOnce(secret_pepper=...)); without one a short secret can be recovered from its
# digest by trying every value.
OPENONCE_SECRET_PEPPER = env_secret("OPENONCE_SECRET_PEPPER", "")
if OPENONCE_SECRET_PEPPER and len(OPENONCE_SECRET_PEPPER) < 32:
    raise ImproperlyConfigured("OPENONCE_SECRET_PEPPER must be at least 32 characters")
# The core's own connection pool per process (Django's is OPENONCE_DB_POOL_MAX). The
# reconciler probes on 8 threads, each recording its decision: fewer connections than
# that make a worker's probes queue for the ledger.
OPENONCE_LEDGER_POOL_MAX = env_int("OPENONCE_LEDGER_POOL_MAX", 10, minimum=1)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

# Sign-in throttling (console.signin): failures counted per username and per client
# address over a window; past a limit, sign-in is refused with 429 for the lockout,
# before any password is hashed (hashing is what makes a flood expensive).
OPENONCE_SIGNIN_USER_LIMIT = env_int("OPENONCE_SIGNIN_USER_LIMIT", 5, minimum=1)
OPENONCE_SIGNIN_ADDRESS_LIMIT = env_int("OPENONCE_SIGNIN_ADDRESS_LIMIT", 20, minimum=1)
OPENONCE_SIGNIN_WINDOW = env_int("OPENONCE_SIGNIN_WINDOW", 900, minimum=1)  # seconds
OPENONCE_SIGNIN_LOCKOUT = env_int("OPENONCE_SIGNIN_LOCKOUT", 900, minimum=1)  # seconds
# Failures for one name from every address beyond which that name is slowed (each
# further failure doubles the wait for an address it never signed in from, up to the
# maximum, in seconds) instead of locked: a stranger cannot keep the owner out.
OPENONCE_SIGNIN_USER_CAP = env_int("OPENONCE_SIGNIN_USER_CAP", 20, minimum=1)
OPENONCE_SIGNIN_SLOWDOWN_MAX = env_int("OPENONCE_SIGNIN_SLOWDOWN_MAX", 60, minimum=1)  # seconds
# With OPENONCE_TLS=proxy, X-Forwarded-For and -Proto are believed only from these peers
# (openonce_site.middleware.ForwardedHeadersMiddleware). Loopback by default: a proxy on
# the same host; a proxy elsewhere (compose's Caddy) must be named.
OPENONCE_TRUSTED_PROXIES = env_networks("OPENONCE_TRUSTED_PROXIES", ["127.0.0.0/8", "::1"])


def cache_from_url(url: str) -> dict[str, object]:
    """The throttle's counters: ``redis://...`` shares them between every process (what
    production needs), ``locmem`` keeps them per process (one runserver)."""
    if url == "locmem":
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    if url.startswith(("redis://", "rediss://", "unix://")):
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "openonce",
        }
    raise ImproperlyConfigured("OPENONCE_CACHE_URL: use redis://HOST:PORT/DB or locmem")


OPENONCE_CACHE_URL = env_str("OPENONCE_CACHE_URL", "locmem")
CACHES = {"default": cache_from_url(OPENONCE_CACHE_URL)}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Where collectstatic writes (production: OPENONCE_STATIC_ROOT, default <state dir>/static).
# Dev and test serve the apps' files in place and collect nothing.
STATIC_ROOT: Path | None = (
    state_path(os.environ["OPENONCE_STATIC_ROOT"], STATE_DIR, "OPENONCE_STATIC_ROOT")
    if os.environ.get("OPENONCE_STATIC_ROOT")
    else None
)
# Production serves collected, hashed and compressed files (collectstatic writes them
# to STATIC_ROOT); dev and test read them from the apps, uncollected.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# -- browser hardening ------------------------------------------------------------------
# Nothing but the console's own files: no inline script or style (htmx is configured
# not to inject its indicator style), no frames, no plugins, forms post only here.
SECURE_CSP = {
    "default-src": [CSP.NONE],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    "connect-src": [CSP.SELF],  # htmx's requests
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "object-src": [CSP.NONE],
}
# Browser features the console never uses, switched off for it and anything it embeds.
PERMISSIONS_POLICY = {
    feature: []
    for feature in (
        "accelerometer", "autoplay", "camera", "display-capture", "encrypted-media",
        "fullscreen", "geolocation", "gyroscope", "magnetometer", "microphone", "midi",
        "payment", "picture-in-picture", "publickey-credentials-get", "screen-wake-lock",
        "serial", "usb", "xr-spatial-tracking",
    )
}  # fmt: skip
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# Where a debug page can exist (dev, the demo), it masks every setting that holds a
# credential: DSNs and broker URLs as well as Django's own names.
DEFAULT_EXCEPTION_REPORTER_FILTER = "openonce_site.debug.CredentialMaskingFilter"

# OPENONCE_LOG_FORMAT=json: one JSON object per line, with the effect id on every line
# that concerns an effect (reconciler.logs). Celery workers then log through this too.
OPENONCE_LOG_FORMAT = env_str("OPENONCE_LOG_FORMAT", "plain")
if OPENONCE_LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"OPENONCE_LOG_FORMAT={OPENONCE_LOG_FORMAT!r}: use plain or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # One line per record: control characters in a message (a %0A in a request path,
    # a username with a newline) are escaped, so request data cannot forge log lines.
    "filters": {
        "one_line": {"()": "ledger.logsafe.OneLineFilter"},
        "effect": {"()": "reconciler.logs.EffectIdFilter"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "reconciler.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": OPENONCE_LOG_FORMAT,
            "filters": ["one_line", "effect"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("OPENONCE_LOG_LEVEL", "INFO")},
}

# -- provider knowledge: the same references the `openonce reconcile` CLI takes ----------
OPENONCE_PROBERS = env_str("OPENONCE_PROBERS", "") or None  # "package.module:NAME"
OPENONCE_CAPABILITY_FILES = env_list("OPENONCE_CAPABILITY_FILES")
OPENONCE_PROVIDER_CAPABILITIES = env_list("OPENONCE_PROVIDER_CAPABILITIES")  # TOOL=CAP,...
# How the reconciler decides: one setting per ReconcilerOptions field, named as
# openonce_core._reconciler_options.setting_name says (OPENONCE_PROBE_TIMEOUT, ...), each read
# from the environment with the field's kind. The site's own defaults: a prober that
# raised is asked again 3 times, and the journal names the reconciler "daemon".
_RECONCILER_DEFAULTS = {"probe_retries": 3, "owner": "daemon"}


def reconciler_settings(defaults: dict[str, Any]) -> dict[str, Any]:
    """``{setting name: value}`` for every Reconciler option, from the environment."""
    values: dict[str, Any] = {}
    for option in fields(ReconcilerOptions):
        name, kind = setting_name(option), option.metadata["kind"]
        default = defaults.get(option.name, option.default)
        if kind is bool:
            values[name] = env_bool(name, default)
        elif kind is int:
            values[name] = env_int(name, default)
        elif kind is float:
            values[name] = env_float(name, default, positive=option.metadata["positive"])
        else:
            values[name] = env_str(name, "") or default
    return values


# OPENONCE_GRACE_SECONDS unset: each capability's own grace. OPENONCE_PROBE_TRANSIENT_*: a
# provider that is busy or down (429, 5xx, timeouts) is asked again this many times, or for
# this long, before a person is; a refused key never pages anyone (health turns red).
# OPENONCE_STALE_CALL_GRACE and OPENONCE_DEAD_OWNER_GRACE: a miss this soon after a call's
# lease ran out, or after its owner was found dead, is no evidence.
_reconciler = reconciler_settings(_RECONCILER_DEFAULTS)
globals().update(_reconciler)
# What the process's Reconciler (ledger.clients) wraps every prober in: the daemon's
# wrapper times and logs each probe for /metrics and health. A dotted path; None: none.
OPENONCE_PROBER_WRAPPER: str | None = "reconciler.probes.instrument"

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
# Backpressure: a tick queues no new batches while more than this many wait in the
# openonce.batches queue (reconciler/queue.py); it would only queue, behind them, effects
# those batches already carry. The default keeps one batch ready for each of the
# OPENONCE_SWEEP_SPREAD workers a tick spreads its work over, so a worker that frees up
# finds one without waiting for a tick; with more worker processes than that, set it
# near their total concurrency. 0: a tick queues only into an empty queue.
OPENONCE_DISPATCH_MAX_QUEUED = env_int(
    "OPENONCE_DISPATCH_MAX_QUEUED", OPENONCE_SWEEP_SPREAD, minimum=0
)
OPENONCE_SWEEP_RETENTION_DAYS = env_int("OPENONCE_SWEEP_RETENTION_DAYS", 14, minimum=1)
# After a beat or reconcile --watch starts, "no sweep yet" is not unhealthy for this long.
OPENONCE_HEALTH_STARTUP_GRACE = env_float("OPENONCE_HEALTH_STARTUP_GRACE", 60.0)
# A batch message whose worker died with it this many times is quarantined (reconciler
# .deliveries): split into single effects, then held for a person.
OPENONCE_TASK_MAX_DELIVERIES = env_int("OPENONCE_TASK_MAX_DELIVERIES", 3, minimum=1)
# /metrics answers only with "Authorization: Bearer <token>" when this is set.
OPENONCE_METRICS_TOKEN = env_str("OPENONCE_METRICS_TOKEN", "")
# Seconds a process keeps its count of terminal effects (committed, failed, ...) for
# /metrics: those rows are history, so counting them costs what the ledger holds (about
# 0.1 s a million). 0: /metrics has no terminal-state samples and never counts them.
OPENONCE_METRICS_TERMINAL_SECONDS = env_float("OPENONCE_METRICS_TERMINAL_SECONDS", 60.0)
# /health/ details (reasons, probers, sweeps) need ``Authorization: Bearer <token>`` or a
# signed-in operator; without either it answers only healthy or unhealthy.
OPENONCE_HEALTH_TOKEN = env_str("OPENONCE_HEALTH_TOKEN", "")

# -- Celery: Redis carries messages only; every decision is in the ledger -------------
CELERY_BROKER_URL = env_str("OPENONCE_BROKER_URL", "redis://127.0.0.1:6379/0")
# The probers' rate limiter every process shares (reconciler.ratelimit): a provider's limit
# is the account's, so N workers must not each spend it. The broker when it is Redis;
# "off": each process limits on its own.
OPENONCE_RATE_LIMIT_REDIS = env_str(
    "OPENONCE_RATE_LIMIT_REDIS",
    CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else "off",
)
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
# "priority": a worker that frees up looks at the queues in CELERY_TASK_QUEUES order, the
# tick's first, instead of round-robin: a tick is taken by the next free pool process
# (round-robin let ticks expire behind a backlog, one discarded per turn).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "queue_order_strategy": "priority"}
CELERY_TASK_TIME_LIMIT = env_float("OPENONCE_TASK_TIME_LIMIT", 300.0, positive=True)
# A batch stops taking effects in time to finish before this (reconciler.sweep), so the
# soft limit is a backstop and the hard limit never kills a worker child mid-probe.
CELERY_TASK_SOFT_TIME_LIMIT = env_float("OPENONCE_TASK_SOFT_TIME_LIMIT", 240.0, positive=True)
if not (
    CELERY_TASK_SOFT_TIME_LIMIT < CELERY_TASK_TIME_LIMIT
    < CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
):  # fmt: skip
    raise ImproperlyConfigured(
        "OPENONCE_TASK_SOFT_TIME_LIMIT must be below OPENONCE_TASK_TIME_LIMIT, and that"
        " below the broker's 3600s visibility timeout"
    )
_probe_timeout = _reconciler["OPENONCE_PROBE_TIMEOUT"]
if _probe_timeout + 0.5 > 0.8 * CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        f"OPENONCE_PROBE_TIMEOUT={_probe_timeout:g} leaves a batch no room to probe"
        f" one effect within OPENONCE_TASK_SOFT_TIME_LIMIT={CELERY_TASK_SOFT_TIME_LIMIT:g}"
        " (a probe may take at most 80% of the soft limit, less half a second)"
    )
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# The tick and the notifier have their own queues, so neither waits behind a backlog of
# batches in theirs. A worker consumes all three unless told otherwise; `celery worker -Q
# openonce.tick,openonce.notify` is a dedicated tick worker, `-Q openonce.batches` a
# batch-only one.
CELERY_TASK_QUEUES = tuple(
    # Each queue its own exchange and key: a bare Queue(name) would bind to the default
    # exchange and key, and both queues would receive every batch.
    Queue(name, Exchange(name, type="direct"), routing_key=name)
    for name in ("openonce.tick", "openonce.notify", "openonce.batches")
)
CELERY_TASK_DEFAULT_QUEUE = "openonce.batches"
CELERY_TASK_DEFAULT_EXCHANGE = "openonce.batches"
CELERY_TASK_DEFAULT_ROUTING_KEY = "openonce.batches"
CELERY_TASK_ROUTES = {
    "openonce.tick": {"queue": "openonce.tick"},
    "openonce.notify": {"queue": "openonce.notify"},
    "openonce.reconcile_batch": {"queue": "openonce.batches"},
}
# Task events (sent, started, succeeded, failed...) for Flower or `celery events`.
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_TASK_SEND_SENT_EVENT = True
# With JSON logs, workers keep Django's LOGGING instead of Celery's own root handler.
CELERY_WORKER_HIJACK_ROOT_LOGGER = OPENONCE_LOG_FORMAT != "json"

# -- notifications: who is told when an effect starts waiting (notifications/config.py) --
OPENONCE_NOTIFY = env_str("OPENONCE_NOTIFY", "")  # a JSON list of channels, or @file.json
OPENONCE_CONSOLE_URL = env_str("OPENONCE_CONSOLE_URL", "http://127.0.0.1:8000")  # deep links
OPENONCE_NOTIFY_INTERVAL = env_float("OPENONCE_NOTIFY_INTERVAL", 5.0, positive=True)
# Webhook and Slack destinations inside (loopback, private, link-local...) are refused
# unless this is set or the channel says allow_private (notifications/destinations.py).
OPENONCE_NOTIFY_ALLOW_PRIVATE = env_bool("OPENONCE_NOTIFY_ALLOW_PRIVATE", False)
# When set, the only hosts a webhook or Slack message may go to (*.example.com: subdomains).
OPENONCE_NOTIFY_ALLOWED_HOSTS = env_list("OPENONCE_NOTIFY_ALLOWED_HOSTS", [])
DEFAULT_FROM_EMAIL = env_str("OPENONCE_MAIL_FROM", "openonce@localhost")

# -- retention: archive, then delete, old terminal effects (reconciler/retention.py) -----
# Off by default: archiving deletes ledger rows and sets a dedup horizon (a duplicate of
# an archived call is refused with EffectArchivedError instead of replayed), so how long
# to keep effects, and where the archives go (a disk that is backed up), is the operator's
# decision. Days after an effect's last change; 0 keeps everything.
OPENONCE_RETENTION_DAYS = env_int("OPENONCE_RETENTION_DAYS", 0, minimum=0)
OPENONCE_RETENTION_ARCHIVE_DIR = state_path(
    env_str("OPENONCE_RETENTION_ARCHIVE_DIR", "archive"),
    STATE_DIR,
    "OPENONCE_RETENTION_ARCHIVE_DIR",
)
OPENONCE_RETENTION_BATCH = env_int("OPENONCE_RETENTION_BATCH", 500, minimum=1)  # per commit
OPENONCE_RETENTION_PAUSE = env_float("OPENONCE_RETENTION_PAUSE", 0.05)  # seconds between
# The retention's pace: at most this many effects a second (0: no cap), and at most this
# share of a run's time spent in batches, so that agents keep the database (issue 19).
OPENONCE_RETENTION_RATE = env_float("OPENONCE_RETENTION_RATE", 500.0)
OPENONCE_RETENTION_BUSY = env_float("OPENONCE_RETENTION_BUSY", 0.5, positive=True)
if OPENONCE_RETENTION_BUSY > 1:
    raise ImproperlyConfigured("OPENONCE_RETENTION_BUSY must be more than 0 and at most 1")
OPENONCE_RETENTION_HOUR = env_int("OPENONCE_RETENTION_HOUR", 3)  # UTC hour of the daily run
if OPENONCE_RETENTION_HOUR > 23:
    raise ImproperlyConfigured("OPENONCE_RETENTION_HOUR must be 0 to 23")
if OPENONCE_RETENTION_BATCH > 10000:
    raise ImproperlyConfigured("OPENONCE_RETENTION_BATCH must be 1 to 10000")
if OPENONCE_RETENTION_DAYS > 36500:
    raise ImproperlyConfigured("OPENONCE_RETENTION_DAYS must be 0 to 36500")

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
    # Daily: expired console sessions always; the ledger's retention when
    # OPENONCE_RETENTION_DAYS is set. A run bounded by the task's time limit queues the rest.
    "openonce-retention": {
        "task": "openonce.retention",
        "schedule": crontab(hour=OPENONCE_RETENTION_HOUR, minute=17),
        "options": {"expires": 3600},
    },
}
