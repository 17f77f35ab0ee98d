"""Django's own SQLite connection to the ledger file never crosses a fork.

The core's SQLite store closes its connections before ``fork``; in the site, Django's
``default`` connection is open on the same file, and SQLite's lock state is per process
and per file, so it must be closed too (ledger/apps.py). Run in a subprocess: the test
process's Django is on Postgres.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, sys, django
    django.setup()
    from django.db import connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert connection.connection is not None, "the parent's connection should be open"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        # What the child inherited: Django's connection object, and whether it is open.
        os.write(write, b"open" if connection.connection is not None else b"closed")
        os._exit(0)
    os.waitpid(pid, 0)
    print("child:", os.read(read, 16).decode())
    # The parent reopens on its next use.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    print("parent: ok")
    """
)


def test_django_sqlite_connection_is_closed_before_fork(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.test",
        "OPENONCE_DATABASE": str(tmp_path / "ledger.db"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "child: closed" in done.stdout
    assert "parent: ok" in done.stdout
