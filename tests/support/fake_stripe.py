"""A Stripe-like API over real HTTP: the reads the Stripe prober makes, in Stripe's wire
format, and the ways Stripe fails.

* ``GET /v1/payment_intents/search`` and ``GET /v1/charges/search`` with
  ``query=metadata['KEY']:'VALUE'`` (``search_result`` objects); an object becomes
  searchable only ``search_lag`` seconds after it was created, like Stripe's eventually
  consistent index;
* ``GET /v1/refunds?charge=...`` or ``?payment_intent=...`` (``list`` objects, paged with
  ``limit``/``starting_after``/``has_more``), read straight, no lag;
* ``GET /v1/payment_intents`` and ``GET /v1/charges`` with ``created[gte]``/``created[lte]``
  (Unix seconds, Stripe's ``created`` of each object, from ``wall_clock``), newest first,
  paged like the refunds, no lag: the list APIs read the primary store;
* ``GET /v1/payment_intents/{id}``, ``/v1/charges/{id}``, ``/v1/refunds/{id}``: one object,
  or 404 ``resource_missing`` as Stripe answers for an id it does not have;
* ``search_unavailable = True``: every search answers 400 with the message Stripe gives
  accounts that have no search (India);
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
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock=clock)
        self.api_keys = set(api_keys)
        self.search_lag = search_lag
        self.search_unavailable = False
        self.wall_clock = wall_clock  # Stripe's own clock: an object's ``created``
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
            "created": int(self.wall_clock()),
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
            if self.search_unavailable:
                # What Stripe has answered accounts without search (seen in the wild).
                message = "The search feature is temporarily unavailable in your region."
                return Reply(400, _error(message))
            return self._search(seen.path.split("/")[2], seen)
        if seen.path == "/v1/refunds":
            return self._refunds(seen)
        if seen.path in ("/v1/payment_intents", "/v1/charges"):
            return self._created_between(seen.path.split("/")[2], seen)
        parts = seen.path.split("/")
        if len(parts) == 4 and parts[1] == "v1" and parts[2] in self.objects:
            return self._retrieve(parts[2], parts[3])
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

    def _created_between(self, objects: str, seen: Seen) -> Reply:
        def bound(name: str) -> int | None:
            value = (seen.query.get(name) or [None])[0]
            return int(value) if value is not None else None

        try:
            gte, lte = bound("created[gte]"), bound("created[lte]")
        except ValueError:
            return Reply(400, _error("Invalid integer", code="parameter_invalid_integer"))
        rows = [
            o
            for o in sorted(self.objects[objects], key=lambda o: o["created"], reverse=True)
            if (gte is None or o["created"] >= gte) and (lte is None or o["created"] <= lte)
        ]
        return self._page(f"/v1/{objects}", rows, seen)

    def _page(self, url: str, rows: list[dict[str, Any]], seen: Seen) -> Reply:
        limit = int((seen.query.get("limit") or ["10"])[0])
        after = (seen.query.get("starting_after") or [None])[0]
        if after is not None:
            ids = [r["id"] for r in rows]
            rows = rows[ids.index(after) + 1 :] if after in ids else []
        return Reply(
            200,
            {"object": "list", "url": url, "has_more": len(rows) > limit, "data": rows[:limit]},
        )

    def _retrieve(self, objects: str, stripe_id: str) -> Reply:
        for obj in self.objects[objects]:
            if obj["id"] == stripe_id:
                return Reply(200, obj)
        kind = objects[:-1]
        return Reply(
            404,
            {"error": {"message": f"No such {kind}: '{stripe_id}'", "type": "invalid_request_error",
                       "code": "resource_missing", "param": "id"}},
        )  # fmt: skip
