"""A Stripe-like API over real HTTP: the reads the Stripe prober makes, in Stripe's wire
format, and the ways Stripe fails.

* ``GET /v1/payment_intents/search`` and ``GET /v1/charges/search`` with
  ``query=metadata['KEY']:'VALUE'`` (``search_result`` objects); an object becomes
  searchable only ``search_lag`` seconds after it was created, like Stripe's eventually
  consistent index;
* ``GET /v1/refunds?charge=...`` or ``?payment_intent=...`` (``list`` objects, paged with
  ``limit``/``starting_after``/``has_more``), read straight, no lag;
* ``Authorization: Bearer <key>`` checked against ``api_keys`` (401 otherwise, Stripe's
  error body); ``Stripe-Version`` and ``Stripe-Account`` recorded;
* faults: ``fail_next(429, headers={"Retry-After": "2"})``, ``fail_next(503)``,
  ``delay``, and ``rate_limit`` requests per sliding second answered 429 above it.

Run in the test process; worker subprocesses reach it at ``url``.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from typing import Any

from .fake_http import FakeHTTPServer, Reply, Seen

_QUERY = re.compile(r"^metadata\['(?P<field>[^']+)'\]:'(?P<value>(?:[^'\\]|\\.)*)'$")


def _error(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict:
    error: dict[str, Any] = {"message": message, "type": kind}
    if code:
        error["code"] = code
    return {"error": error}


class FakeStripeServer(FakeHTTPServer):
    def __init__(
        self,
        *,
        api_keys: tuple[str, ...] = ("sk_test_good",),
        search_lag: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock=clock)
        self.api_keys = set(api_keys)
        self.search_lag = search_lag
        self.objects: dict[str, list[dict[str, Any]]] = {
            "payment_intents": [],
            "charges": [],
            "refunds": [],
        }
        self._ids = itertools.count(1)
        self._created: dict[str, float] = {}  # object id -> server clock at creation

    # -- the provider's state, written by the test (the handler's side of the world) ----

    def add(
        self, objects: str, provider_key: str, *, effect_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        prefix = {"payment_intents": "pi", "charges": "ch", "refunds": "re"}[objects]
        metadata = {"openonce_provider_key": provider_key}
        if effect_id is not None:
            metadata["openonce_effect_id"] = effect_id
        obj: dict[str, Any] = {
            "id": f"{prefix}_fake{next(self._ids)}",
            "object": objects[:-1],
            "amount": 500,
            "currency": "usd",
            "status": "succeeded",
            "metadata": metadata,
            "created": int(time.time()),
        }
        obj.update(fields)
        with self.lock:
            self.objects[objects].append(obj)
            self._created[obj["id"]] = self.clock()
        return obj

    def accept_keys(self, *keys: str) -> None:
        """Which API keys authenticate (revoke one by leaving it out)."""
        with self.lock:
            self.api_keys = set(keys)

    # -- serving -------------------------------------------------------------------------

    def route(self, seen: Seen) -> Reply:
        auth = seen.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.api_keys:
            return Reply(401, _error("Invalid API Key provided: " + auth[7:15] + "***"))
        if seen.path in ("/v1/payment_intents/search", "/v1/charges/search"):
            return self._search(seen.path.split("/")[2], seen)
        if seen.path == "/v1/refunds":
            return self._refunds(seen)
        return Reply(404, _error(f"Unrecognized request URL (GET: {seen.path})"))

    def rate_limited(self, seen: Seen) -> Reply:
        body = _error(
            "Request rate limit exceeded. Learn more about rate limits here"
            " https://stripe.com/docs/rate-limits.",
            code="rate_limit",
        )
        return Reply(429, body, {"Retry-After": "1"})

    def _search(self, objects: str, seen: Seen) -> Reply:
        query = (seen.query.get("query") or [""])[0]
        match = _QUERY.match(query)
        if match is None:
            return Reply(400, _error(f"Invalid query: {query!r}", code="parameter_invalid_string"))
        field, value = match.group("field"), re.sub(r"\\(.)", r"\1", match.group("value"))
        limit = int((seen.query.get("limit") or ["10"])[0])
        visible_before = self.clock() - self.search_lag
        hits = [
            o
            for o in self.objects[objects]
            if self._created[o["id"]] <= visible_before and o["metadata"].get(field) == value
        ]
        body = {
            "object": "search_result",
            "url": seen.path,
            "has_more": len(hits) > limit,
            "data": hits[:limit],
            "next_page": None,
        }
        return Reply(200, body)

    def _refunds(self, seen: Seen) -> Reply:
        charge = (seen.query.get("charge") or [None])[0]
        intent = (seen.query.get("payment_intent") or [None])[0]
        limit = int((seen.query.get("limit") or ["10"])[0])
        after = (seen.query.get("starting_after") or [None])[0]
        rows = [
            r
            for r in reversed(self.objects["refunds"])  # newest first, as Stripe lists
            if (charge is None or r.get("charge") == charge)
            and (intent is None or r.get("payment_intent") == intent)
        ]
        if after is not None:
            ids = [r["id"] for r in rows]
            rows = rows[ids.index(after) + 1 :] if after in ids else []
        return Reply(
            200,
            {"object": "list", "url": "/v1/refunds", "has_more": len(rows) > limit,
             "data": rows[:limit]},
        )  # fmt: skip
