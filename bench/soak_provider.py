"""The nemesis soak's provider: a Stripe-like API over real HTTP that takes payments and keeps
the independent truth of what it did (bench/soak.py).

* ``POST /v1/payment_intents`` (form-encoded, as Stripe takes it: ``amount``, ``currency``,
  ``metadata[...]``) creates a PaymentIntent carrying the metadata the handler stamped, so
  the reference ``StripeProber`` finds it by ``metadata['openonce_provider_key']`` through
  the search ``tests/support/fake_stripe.py`` serves. An order whose number is a multiple
  of ``DECLINE_EVERY`` is declined (402, ``card_declined``): a business error, no object.
* ``Idempotency-Key`` works as Stripe documents it (the backstop the Stripe prober's re-arm
  on a miss rests on): a re-send with a key whose request executed or was declined gets the
  saved answer, not a second charge; one while the first is still running gets 409
  (``idempotency_key_in_use``); 429s and 5xx answered before executing are not saved.
  ``idempotency=False`` turns the backstop off: every request executes.
* Every POST it receives is written to ``record_path`` as one JSON line, flushed and
  fsynced before the answer leaves: ``exec`` (a PaymentIntent was created: the only kind
  that moves money), ``replay`` (the backstop answered a re-send), ``declined``,
  ``refused`` (429/503 before executing), ``conflict`` (409). The checker reads this file,
  never the ledger's opinion of it.
* Faults for the next POSTs, armed by the nemesis with ``arm(kind, count)``: ``429``,
  ``503`` (refused before executing), ``500_after`` (executed, then 500), ``lost_reply``
  (executed, then the connection is cut without an answer), ``no_answer`` (executed or not,
  by a coin the nemesis tossed, then no answer until the client gives up), ``slow``
  (executes after a delay of up to ``MAX_DELAY`` seconds, within the reconciler's grace).
  Searches (the prober's reads) take ``fail_next`` faults as in the test fake.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from tests.support.fake_http import Reply
from tests.support.fake_stripe import FakeStripeServer, _error

DECLINE_EVERY = 17
MAX_DELAY = 3.0  # a slow answer executes within this; the soak's grace is longer
NO_ANSWER_HOLD = 6.0  # how long a no-answer request holds the connection (> client timeout)
LATENCY = (0.01, 0.25)  # seconds a payment takes before it executes
POST_FAULTS = ("429", "503", "500_after", "lost_reply", "no_answer", "slow", "stall")


@dataclass
class PostFault:
    kind: str
    delay: float = 0.0
    execute: bool = True  # no_answer: whether the request executed before going silent


def order_number(order: str) -> int:
    return int(order.rsplit("-", 1)[1])


def declined(order: str) -> bool:
    return order_number(order) % DECLINE_EVERY == 0


class SoakStripe(FakeStripeServer):
    def __init__(self, record_path: str, *, idempotency: bool = True) -> None:
        super().__init__(api_keys=("sk_test_good",), search_lag=0.0)
        self.record_path = record_path
        self.idempotency = idempotency
        self._record = open(record_path, "a", encoding="utf-8")  # noqa: SIM115
        self._seq = 0
        self.post_faults: deque[PostFault] = deque()
        self.saved: dict[str, tuple[int, dict[str, Any]]] = {}  # idempotency key -> answer
        self.running: Counter[str] = Counter()  # idempotency key -> requests executing now
        self.received: set[str] = set()  # every idempotency key any POST carried
        self.executed: dict[str, dict[str, Any]] = {}  # provider key -> first object
        self.counts: Counter[str] = Counter()
        self.faults_served: Counter[str] = Counter()
        self.stalled: deque[str] = deque()  # effect ids whose request is stalled right now

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> SoakStripe:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._handle(self)

            def do_POST(self) -> None:
                fake._post(self)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.request_queue_size = 128
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.05), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        super().stop()
        with self.lock:
            self._record.close()

    # -- the nemesis' controls ------------------------------------------------------------

    def arm(self, kind: str, count: int = 1, *, delay: float = 0.0, execute: bool = True) -> None:
        if kind not in POST_FAULTS:
            raise ValueError(f"unknown provider fault {kind!r}")
        with self.lock:
            for _ in range(count):
                self.post_faults.append(PostFault(kind, delay, execute))

    def calm(self) -> None:
        with self.lock:
            self.post_faults.clear()
            self.faults.clear()
            self.delay = 0.0

    # -- what a person can look up (the dashboard) ------------------------------------------

    def lookup(self, provider_key: str) -> tuple[dict[str, Any] | None, bool]:
        """(the PaymentIntent created with this key, whether a request with it is being
        processed right now): what a person sees on the dashboard."""
        with self.lock:
            obj = self.executed.get(provider_key)
            return (dict(obj) if obj else None), bool(self.running[provider_key])

    # -- serving ----------------------------------------------------------------------------

    def _write(self, line: dict[str, Any]) -> None:
        # Called under self.lock: the record's order is the provider's order.
        self._seq += 1
        line = {"seq": self._seq, "t": round(time.time(), 3), **line}
        self._record.write(json.dumps(line, sort_keys=True) + "\n")
        self._record.flush()
        os.fsync(self._record.fileno())
        self.counts[line["kind"]] += 1

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        form = parse_qs(handler.rfile.read(length).decode())
        headers = {k.lower(): v for k, v in handler.headers.items()}
        auth = headers.get("authorization", "")
        if handler.path != "/v1/payment_intents":
            return self._answer(handler, Reply(404, _error(f"no route {handler.path}")))
        if not auth.startswith("Bearer ") or auth[7:] not in self.api_keys:
            return self._answer(handler, Reply(401, _error("Invalid API Key provided")))
        metadata = {
            k[len("metadata[") : -1]: v[0] for k, v in form.items() if k.startswith("metadata[")
        }
        key = headers.get("idempotency-key", "")
        order = metadata.get("soak_key", "")
        about = {"idem": key, "order": order, "effect_id": metadata.get("openonce_effect_id")}
        with self.lock:
            fault = self.post_faults.popleft() if self.post_faults else None
            if fault is not None:
                self.faults_served[fault.kind] += 1
            self.received.add(key)
            if fault is not None and fault.kind in ("429", "503"):
                status = int(fault.kind)
                self._write({"kind": "refused", "status": status, **about})
                body = _error("Too many requests", code="rate_limit") if status == 429 else (
                    _error("Service unavailable", kind="api_error"))  # fmt: skip
                reply = Reply(status, body, {"Retry-After": "0"} if status == 429 else {})
                return self._answer(handler, reply)
            if self.idempotency and key in self.saved:
                status, body = self.saved[key]
                self._write({"kind": "replay", "status": status, "id": body.get("id"), **about})
                reply = Reply(status, body, {"Idempotent-Replayed": "true"})
                return self._answer(handler, reply, fault)
            if self.idempotency and self.running[key]:
                self._write({"kind": "conflict", "status": 409, **about})
                body = _error(
                    "There is currently another in-progress request using this Stripe API"
                    " Key's idempotency key.", code="idempotency_key_in_use")  # fmt: skip
                return self._answer(handler, Reply(409, body))
            self.running[key] += 1
        try:
            # Every payment takes a moment (the card network): a kill or a stop of the
            # caller lands while its request is in flight.
            if fault is not None and fault.kind == "stall":
                # Held longer than the reconciler's grace: the nemesis kills the caller now.
                self.stalled.append(str(about["effect_id"]))
            slow = fault is not None and fault.kind in ("slow", "stall")
            time.sleep(fault.delay if fault is not None and slow else random.uniform(*LATENCY))
            if fault is not None and fault.kind == "no_answer" and not fault.execute:
                with self.lock:
                    self._write({"kind": "silent", **about})
                return self._silence(handler)
            with self.lock:
                if declined(order):
                    status, body = (
                        402,
                        _error("Your card was declined.", kind="card_error", code="card_declined"),
                    )
                    self._write({"kind": "declined", "status": 402, **about})
                else:
                    obj = self.add(
                        "payment_intents", metadata.get("openonce_provider_key", ""),
                        amount=int((form.get("amount") or ["0"])[0]),
                        currency=(form.get("currency") or ["usd"])[0],
                    )  # fmt: skip
                    obj["metadata"] = dict(metadata)
                    self.executed.setdefault(key, obj)
                    status, body = 200, obj
                    self._write({"kind": "exec", "status": 200, "id": obj["id"],
                                 "amount": obj["amount"], **about})  # fmt: skip
                if self.idempotency:
                    self.saved[key] = (status, body)
        finally:
            with self.lock:
                self.running[key] -= 1
                if not self.running[key]:
                    del self.running[key]
        self._answer(handler, Reply(status, body), fault)

    def _answer(
        self, handler: BaseHTTPRequestHandler, reply: Reply, fault: PostFault | None = None
    ) -> None:
        if fault is not None and fault.kind == "lost_reply":
            return self._cut(handler)
        if fault is not None and fault.kind == "no_answer":
            return self._silence(handler)
        if fault is not None and fault.kind == "500_after":
            reply = Reply(500, _error("An unknown error occurred", kind="api_error"))
        payload = json.dumps(reply.body).encode()
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except OSError:
            pass  # the client gave up (its timeout, or it was killed)

    def _cut(self, handler: BaseHTTPRequestHandler) -> None:
        """The work is done; the answer never leaves (a load balancer dropped it)."""
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.connection.shutdown(socket.SHUT_RDWR)

    def _silence(self, handler: BaseHTTPRequestHandler) -> None:
        time.sleep(NO_ANSWER_HOLD)
        self._cut(handler)


def read_record(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
