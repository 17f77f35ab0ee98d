"""Strict readers of the environment: a malformed value stops start-up with a message
that names the variable, instead of running with a silent default."""

from __future__ import annotations

import math
import os

from django.core.exceptions import ImproperlyConfigured

_MISSING = object()


def env_str(name: str, default: str | object = _MISSING) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is _MISSING:
            raise ImproperlyConfigured(f"set the environment variable {name}")
        return str(default)
    return value


def env_secret(name: str, default: str | object = _MISSING) -> str:
    """``name``, or the contents of the file ``name_FILE`` names (a Docker or Kubernetes
    secret such as ``/run/secrets/openonce_secret_key``), without its trailing newline.

    Both set is refused rather than one silently winning: an operator moving a secret
    into a file would otherwise keep running on the old value. An unreadable, empty or
    multi-line file stops start-up too (a half-written secret, or the wrong file). The
    messages name the variables, never the value."""
    path = os.environ.get(f"{name}_FILE", "")
    if not path:
        return env_str(name, default)
    if os.environ.get(name, ""):
        raise ImproperlyConfigured(f"set {name} or {name}_FILE, not both")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"{name}_FILE={path!r} cannot be read: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ImproperlyConfigured(f"{name}_FILE={path!r} is not UTF-8 text") from None
    value = text.removesuffix("\n").removesuffix("\r")  # what echo or an editor adds
    if not value.strip():
        raise ImproperlyConfigured(f"{name}_FILE={path!r} is empty")
    if "\n" in value or "\r" in value:
        raise ImproperlyConfigured(f"{name}_FILE={path!r} holds more than one line")
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false)")


def env_float(name: str, default: float | None, *, positive: bool = False) -> float | None:
    """A finite number, never negative; ``positive`` also refuses zero (an interval of 0
    is not "as fast as possible", it is a mistake)."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise ImproperlyConfigured(f"{name}={value!r} must be a finite number")
    if number < 0 or (positive and number == 0):
        raise ImproperlyConfigured(
            f"{name}={value!r} must be {'positive' if positive else 'zero or more'}"
        )
    return number


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name}={value!r} must be at least {minimum}")
    return number


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    """Comma-separated values; empty items are ignored."""
    value = os.environ.get(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def env_networks(name: str, default: list[str]) -> list[str]:
    """Comma-separated IP addresses or networks (``10.0.0.0/8``, ``::1``), each written
    back in its exact form (``192.0.2.7/32``). A name or a malformed address stops
    start-up: a typo must not silently trust nobody, or everybody."""
    import ipaddress

    networks = []
    for item in env_list(name, default):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not an IP address or network (e.g. 10.0.0.5, 172.16.0.0/12)"
            ) from None
    return networks


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered not in choices:
        raise ImproperlyConfigured(f"{name}={value!r}: use one of {', '.join(choices)}")
    return lowered


# Django's own connections, per process: a sync gunicorn worker needs one at a time, a
# threaded server (runserver, gunicorn --threads) one per thread in flight. The core's
# ledger client has its own pool (OPENONCE_LEDGER_POOL_MAX, read by ledger.clients).
def _pg_options() -> dict[str, object]:
    return {"pool": {"min_size": 1, "max_size": env_int("OPENONCE_DB_POOL_MAX", 4, minimum=1)}}


def database_from_parts() -> dict[str, object] | None:
    """The Postgres entry from OPENONCE_DB_NAME, _USER, _PASSWORD, _HOST, _PORT, or None
    when OPENONCE_DB_NAME is unset. Parts need no quoting: a password with ``/``, ``#``,
    ``@`` or ``:`` is passed to libpq as it is, which a URL cannot do without
    percent-encoding it."""
    name = os.environ.get("OPENONCE_DB_NAME", "")
    if not name:
        return None
    port = env_int("OPENONCE_DB_PORT", 5432, minimum=1)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": os.environ.get("OPENONCE_DB_USER", ""),
        "PASSWORD": env_secret("OPENONCE_DB_PASSWORD", ""),
        "HOST": os.environ.get("OPENONCE_DB_HOST", ""),
        "PORT": str(port),
        "OPTIONS": _pg_options(),
    }


def database_from_url(url: str, base_dir: os.PathLike[str] | str) -> dict[str, object]:
    """Django's DATABASES entry for the ledger: a SQLite path (relative to ``base_dir``)
    or a postgresql:// DSN (percent-encode special characters in its password, or use
    the OPENONCE_DB_* parts instead)."""
    from urllib.parse import unquote, urlsplit

    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        if not parts.path.strip("/"):
            raise ImproperlyConfigured("OPENONCE_DATABASE names no database")
        try:
            port = parts.port
        except ValueError:
            # The usual cause: an unencoded '/', '#' or ':' in the password. The message
            # never repeats the value, which holds that password.
            raise ImproperlyConfigured(
                "OPENONCE_DATABASE is not a valid DSN (percent-encode '/', '#', '@' and ':'"
                " in the password, or give OPENONCE_DB_NAME, _USER, _PASSWORD, _HOST, _PORT)"
            ) from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            # psycopg 3's pool: connections are reused, never opened per request.
            "OPTIONS": _pg_options(),
        }
    if "://" in url:
        raise ImproperlyConfigured(
            "OPENONCE_DATABASE: use a SQLite file path or a postgresql:// DSN"
        )
    path = url if os.path.isabs(url) else os.path.join(base_dir, url)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        "OPTIONS": {
            # WAL and a busy timeout so the console, the reconciler loop and agents can
            # share the embedded ledger file.
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
        },
        "TEST": {"NAME": os.path.join(base_dir, "test-openonce.db")},
    }
