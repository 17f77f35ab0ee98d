"""The part the fake Stripe and GitHub servers share: a real HTTP server on 127.0.0.1 (a
free port) that records every request and misbehaves on cue.

Faults are scripted per request (``fail_next``), by rate (``rate_limit`` requests in any
sliding second, answered 429 above it), or by delay (``delay`` seconds before answering).
Time comes from ``clock`` (``time.monotonic`` unless a test passes one it moves by hand),
so lag windows and rate windows need no sleeping.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    """One request as the server saw it."""

    at: float
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    status: int = 0


@dataclass
class Fault:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    delay: float = 0.0


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class ManualClock:
    """A clock a test moves by hand."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeHTTPServer:
    """Subclasses implement ``route(seen) -> Reply`` and ``rate_limited(seen) -> Reply``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.requests: list[Seen] = []
        self.faults: deque[Fault] = deque()
        self.delay = 0.0
        self.rate_limit: int | None = None
        self._window: deque[float] = deque()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeHTTPServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        server = self._server
        # stop() waits for the loop's next poll: keep it short, tests stop many servers.
        self._thread = threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.01), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHTTPServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- misbehaving on cue ------------------------------------------------------------

    def fail_next(
        self,
        status: int,
        *,
        count: int = 1,
        headers: dict[str, str] | None = None,
        body: Any = None,
        delay: float = 0.0,
    ) -> None:
        with self.lock:
            for _ in range(count):
                self.faults.append(Fault(status, dict(headers or {}), body, delay))

    # -- what was seen -------------------------------------------------------------------

    def seen(self, path_prefix: str = "") -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.path.startswith(path_prefix)]

    def max_in_window(self, window: float = 1.0) -> int:
        """The most requests that arrived within any ``window`` seconds (half-open)."""
        with self.lock:
            times = sorted(r.at for r in self.requests)
        best, start = 0, 0
        for end, at in enumerate(times):
            while at - times[start] >= window:
                start += 1
            best = max(best, end - start + 1)
        return best

    def statuses(self) -> dict[int, int]:
        with self.lock:
            out: dict[int, int] = {}
            for r in self.requests:
                out[r.status] = out.get(r.status, 0) + 1
            return out

    # -- serving -------------------------------------------------------------------------

    def route(self, seen: Seen) -> Reply:
        raise NotImplementedError

    def rate_limited(self, seen: Seen) -> Reply:
        raise NotImplementedError

    def answering(self, seen: Seen) -> None:
        """Called once a reply is ready, before its first byte is sent: from then on the
        client may read it and send its next request."""

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        seen = Seen(
            at=self.clock(),
            method=handler.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={k.lower(): v for k, v in handler.headers.items()},
        )
        with self.lock:
            self.requests.append(seen)
            fault = self.faults.popleft() if self.faults else None
            over = self._over_rate(seen.at)
            delay = self.delay
        if fault is not None and fault.delay:
            time.sleep(fault.delay)  # a slow provider, in the server's own thread
        elif delay:
            time.sleep(delay)
        if fault is not None:
            reply = Reply(fault.status, fault.body if fault.body is not None else {}, fault.headers)
        elif over:
            reply = self.rate_limited(seen)
        else:
            with self.lock:
                reply = self.route(seen)
        seen.status = reply.status
        payload = json.dumps(reply.body).encode()
        self.answering(seen)
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout): what it saw is its business

    def _over_rate(self, at: float) -> bool:
        if self.rate_limit is None:
            return False
        while self._window and at - self._window[0] >= 1.0:
            self._window.popleft()
        self._window.append(at)
        return len(self._window) > self.rate_limit


class WebhookReceiver:
    """A notification receiver on 127.0.0.1 that records every request (any method) and
    answers on cue: ``fail_next`` answers 500; ``status``, ``reason``, ``headers`` and
    ``body`` set every other answer (a redirect is ``status=302`` with a Location)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_next = 0
        self.status = 200
        self.reason = ""  # the status line's phrase; "" lets the server choose
        self.headers: dict[str, str] = {}
        self.body = b"ok"
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length", 0) or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append(
                    {"method": self.command, "path": self.path, "headers": headers, "body": body}
                )
                status = 500 if receiver.fail_next > 0 else receiver.status
                receiver.fail_next = max(0, receiver.fail_next - 1)
                self.send_response(status, receiver.reason or None)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(receiver.body)))
                self.end_headers()
                self.wfile.write(receiver.body)

            do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
        self.server = server_class((host, 0), Handler)
        self.server.daemon_threads = True
        port = self.server.server_address[1]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self.port = port
        self.thread = threading.Thread(
            target=lambda: self.server.serve_forever(poll_interval=0.01), daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def json(self, i: int) -> Any:
        return json.loads(self.requests[i]["body"])


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class ConnectionCounter:
    """A TCP listener on 127.0.0.1 that only counts connections (an FTP or other
    internal service a redirect could point at): it accepts, counts and closes."""

    def __init__(self) -> None:
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
