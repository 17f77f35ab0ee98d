"""`make demo`: the embedded default end to end, on one machine, with nothing but Python.

1. a SQLite ledger (demo.db) with Django's tables and the core's schema;
2. a demo operator account (admin role), whose password is printed;
3. the scripted agent run (examples/demo_agent.py) against a fake Stripe and SMTP relay;
4. the reconciler loop (manage.py reconcile --watch) using the real reference probers;
5. the console on http://127.0.0.1:8000 until Ctrl-C.

    python -m examples.demo [--port 8000] [--no-serve]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(os.environ.get("OPENONCE_DEMO_DIR", ROOT))  # where the demo's files go
LEDGER = HERE / "demo.db"
WORLD = HERE / "demo-world.json"


def demo_env() -> dict[str, str]:
    """The environment every demo process runs with."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.dev",
        # The product's own 404 and 500 pages, not Django's debug pages (which list the
        # URLconf and print tracebacks to whoever opens the demo).
        "OPENONCE_DEBUG": "false",
        "OPENONCE_DATABASE": str(LEDGER),
        "OPENONCE_DEMO_WORLD": str(WORLD),
        "OPENONCE_PROBERS": "examples.demo_world:PROBERS",
        # Stripe's search index lags 2 minutes in real life; the demo waits 5 seconds.
        "OPENONCE_GRACE_SECONDS": "5",
        "OPENONCE_SWEEP_INTERVAL": "2",
        "PYTHONPATH": str(ROOT),
    }


def server_argv(port: int) -> list[str]:
    return [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-serve", action="store_true", help="set up, reconcile once, exit")
    options = parser.parse_args()

    for path in (LEDGER, Path(f"{LEDGER}-wal"), Path(f"{LEDGER}-shm"), WORLD):
        path.unlink(missing_ok=True)
    env = demo_env()

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
            text=True, capture_output=True,
        )  # fmt: skip

    print("== setting up the embedded ledger (SQLite: demo.db)")
    manage("migrate", "--noinput")
    account = manage("create_operator", "demo", "--role", "admin").stdout.strip()
    print("== the agent's run")
    subprocess.run(
        [sys.executable, "-m", "examples.demo_agent", str(LEDGER)], cwd=ROOT, env=env, check=True
    )
    if options.no_serve:
        time.sleep(5.5)  # past the demo's grace window
        print(manage("reconcile", "--once").stdout.strip())
        return 0

    print("== starting the reconciler loop and the console")
    reconciler = subprocess.Popen(
        [sys.executable, "manage.py", "reconcile", "--watch"], cwd=ROOT, env=env
    )
    server = subprocess.Popen(server_argv(options.port), cwd=ROOT, env=env)
    print(
        f"\nOpen http://127.0.0.1:{options.port}/ and sign in as the demo operator:\n"
        f"  {account}\n"
        "In a few seconds the reconciler commits the charge whose reply was lost; the\n"
        "refund waits for your approval, and the SMTP email waits for your decision.\n"
        "Ctrl-C stops both.\n",
        flush=True,
    )
    try:
        while server.poll() is None and reconciler.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in (server, reconciler):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (server, reconciler):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
