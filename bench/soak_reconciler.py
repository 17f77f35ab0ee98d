"""A reconciler process of the nemesis soak (bench/soak.py): ``python bench/soak_reconciler.py
JSON``, where JSON holds ``argv`` (``["manage.py", "reconcile", "--watch", ...]`` or
``["-m", "celery", "-A", "openonce_site", "worker", ...]``), ``clock_file`` and ``uid``.

It runs exactly that command (``manage.py reconcile --watch`` on SQLite, a Celery worker on
Postgres), with two things a real host can do to it and the plain command cannot show:

* **its host's clock steps**: ``clock_file`` holds an offset in seconds that the nemesis
  writes (``reconciler_clock_step``, an hour forward and back); ``time.time()`` of the whole
  process adds it, as ``date -s`` or an NTP step would. On SQLite the ledger's clock is this
  host's wall clock (``SystemClock``), so the reconciler reads every lease and every grace
  window an hour later; on Postgres the ledger's clock is the database's and must not care.
* **it runs as another user** (``uid``, only when started as root): it opens Django and the
  ledger as root, then drops to ``uid`` the way ``celery --uid`` does, before its first
  sweep. Reading ``/proc/<pid>/ns/pid`` of the agents (root's processes) then fails with
  EACCES: the agents are alive, and the reconciler must not read them as dead.

Everything the process will import is imported before the drop: the interpreter's own
library lives under a directory the other user cannot read.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from soak_clock import ClockOffset  # noqa: E402

_real_time = time.time

# Imported before dropping privileges (lazy imports of the standard library would fail
# after it: the interpreter lives under /root).
PRELOAD = (
    "encodings.ascii", "encodings.latin_1", "encodings.utf_8", "encodings.idna",
    "encodings.punycode", "encodings.unicode_escape", "encodings.raw_unicode_escape",
    "stringprep", "unicodedata", "http.client", "http.cookies", "urllib.request",
    "urllib.error", "urllib.parse", "urllib.response", "email.parser", "email.message",
    "email.feedparser", "email.utils", "email.header", "email.charset", "email.encoders",
    "email.mime.text", "email.mime.multipart", "email.generator", "email.policy",
    "email._header_value_parser", "mimetypes", "json", "json.decoder", "json.encoder",
    "decimal", "uuid", "hashlib", "hmac", "secrets", "base64", "binascii", "zlib", "gzip",
    "bz2", "lzma", "logging.handlers", "logging.config", "concurrent.futures",
    "concurrent.futures.thread", "queue", "sqlite3", "sqlite3.dbapi2", "socket", "ssl",
    "selectors", "select", "signal", "traceback", "linecache", "tokenize", "inspect",
    "dis", "calendar", "zoneinfo", "datetime", "locale", "gettext", "ipaddress",
    "difflib", "pprint", "textwrap", "string", "shlex", "fnmatch", "glob", "tempfile",
    "shutil", "platform", "subprocess", "copy", "pickle", "copyreg", "struct", "array",
    "statistics", "random", "bisect", "heapq", "weakref", "contextvars", "dataclasses",
    "typing", "functools", "operator", "itertools", "collections.abc", "numbers", "fractions",
    "csv", "io", "html", "html.parser", "xml.etree.ElementTree", "getpass", "pwd", "grp",
    "errno", "stat", "warnings", "atexit", "threading", "multiprocessing", "ctypes",
)  # fmt: skip
PROJECT = ("openonce_core", "ledger", "reconciler", "console", "notifications", "openonce_site")


def preload() -> None:
    """Import what the command will import (the standard library's lazy imports, every
    module of the project, the probers), and open the ledger and the Reconciler."""
    import pkgutil

    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    import django

    django.setup()
    for top in PROJECT:
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            if ".tests" in info.name or info.name.endswith(("__main__", ".settings.prod")):
                continue
            with contextlib.suppress(Exception):
                importlib.import_module(info.name)
    with contextlib.suppress(Exception):
        importlib.import_module("tests.support.provider_probers")
    import celery.app.trace  # noqa: F401  (also what a prefork worker would import)

    from ledger.clients import get_reconciler

    reconciler = get_reconciler()
    reconciler.oo.store.list_effects(None, 1)  # opens this thread's ledger connection


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def main(cfg: dict[str, Any]) -> None:
    offset = ClockOffset(cfg.get("clock_file"))
    time.time = lambda: _real_time() + offset.value  # this host's clock steps
    uid = cfg.get("uid")
    if uid is not None and os.geteuid() == 0:
        preload()
        drop_privileges(int(uid))
        print(f"soak_reconciler: running as uid {os.getuid()}", flush=True)
    argv = list(cfg["argv"])
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
