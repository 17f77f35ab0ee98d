"""`make demo`: the embedded default end to end, on one machine, with nothing but Python.

1. a SQLite ledger (demo.db) with Django's tables and the core's schema;
2. a demo operator account (admin role), whose password is printed;
3. the scripted agent run (examples/demo_agent.py) against a fake Stripe and SMTP relay;
4. the reconciler loop (manage.py reconcile --watch) using the real reference probers;
5. the notifier loop (manage.py notify --watch), its one channel a signed webhook to a
   receiver this script runs on 127.0.0.1, which checks the signature and prints each
   message (the effect's page lists the deliveries);
6. the console on http://127.0.0.1:8000 until Ctrl-C.

    python -m examples.demo [--port 8000] [--no-serve]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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


def processes(port: int) -> dict[str, list[str]]:
    """What runs until Ctrl-C, as the product runs it without Celery."""
    return {
        "reconciler": [sys.executable, "manage.py", "reconcile", "--watch"],
        "notifier": [sys.executable, "manage.py", "notify", "--watch"],
        "console": server_argv(port),
    }


def notify_env(inbox_url: str, secret: str, port: int) -> dict[str, str]:
    """The notifier's settings: one signed webhook to the demo's inbox on 127.0.0.1 (a
    private address, so the channel says allow_private), links to this console."""
    channel = {
        "name": "demo-inbox",
        "kind": "webhook",
        "url": f"{inbox_url}/openonce",
        "secret": secret,
        "allow_private": True,
    }
    return {
        "OPENONCE_NOTIFY": json.dumps([channel]),
        "OPENONCE_CONSOLE_URL": f"http://127.0.0.1:{port}",
        "OPENONCE_NOTIFY_INTERVAL": "2",
    }


class Inbox:
    """The demo's webhook receiver: checks each message's signature as a receiver should
    (HMAC-SHA256 of "<t>." + body) and prints it; answers 200, or 401 to a bad one."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.received: list[dict[str, Any]] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                signed = inbox.verify(self.headers.get("OpenOnce-Signature", ""), body)
                self.send_response(200 if signed else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                if signed:
                    inbox.show(json.loads(body))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def verify(self, header: str, body: bytes) -> bool:
        parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
        mac = hmac.new(self.secret.encode(), f"{parts.get('t')}.".encode() + body, hashlib.sha256)
        return hmac.compare_digest(mac.hexdigest(), parts.get("v1", ""))

    def show(self, message: dict[str, Any]) -> None:
        self.received.append(message)
        if message.get("type") == "digest":
            what = f"{message.get('count')} effects wait for a person"
        else:
            waits = {"requires_approval": "waits for approval", "human_review": "needs a person"}
            what = f"{message.get('tool')} {waits.get(str(message.get('state')), 'changed')}"
        print(f"== notification (signature verified): {what}: {message.get('link')}", flush=True)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-serve", action="store_true", help="set up, reconcile once, exit")
    options = parser.parse_args()

    for path in (LEDGER, Path(f"{LEDGER}-wal"), Path(f"{LEDGER}-shm"), WORLD):
        path.unlink(missing_ok=True)
    env = demo_env()
    inbox = Inbox(secrets.token_hex(16))
    env.update(notify_env(inbox.url, inbox.secret, options.port))

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True,
            text=True, capture_output=True,
        )  # fmt: skip

    print("== setting up the embedded ledger (SQLite: demo.db)")
    manage("migrate", "--noinput")
    account = manage("create_operator", "demo", "--role", "admin").stdout.strip()
    # The notifier tells of what happens from its first run on: run it once before the
    # agent, so the refund and the review the run leaves are announced.
    manage("notify")
    print("== the agent's run")
    subprocess.run(
        [sys.executable, "-m", "examples.demo_agent", str(LEDGER)], cwd=ROOT, env=env, check=True
    )
    if options.no_serve:
        time.sleep(5.5)  # past the demo's grace window
        print(manage("reconcile", "--once").stdout.strip())
        print(manage("notify").stdout.strip())
        inbox.close()
        return 0

    print("== starting the reconciler loop, the notifier loop and the console")
    running = {
        name: subprocess.Popen(argv, cwd=ROOT, env=env)
        for name, argv in processes(options.port).items()
    }
    print(
        f"\nOpen http://127.0.0.1:{options.port}/ and sign in as the demo operator:\n"
        f"  {account}\n"
        "In a few seconds the reconciler commits the charge whose reply was lost; the\n"
        "refund waits for your approval, and the SMTP email waits for your decision.\n"
        "The notifier announces both here (== notification) and on each effect's page.\n"
        "Ctrl-C stops them all.\n",
        flush=True,
    )
    try:
        while all(proc.poll() is None for proc in running.values()):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in running.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        inbox.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
