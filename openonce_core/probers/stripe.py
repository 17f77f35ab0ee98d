"""Tier 1, native idempotency keys: is there a Stripe PaymentIntent for this effect?

The handler contract (``openonce providers stripe.charge --requirements``):

* send ``current_effect().provider_key`` as the ``Idempotency-Key`` header, and
* stamp ``metadata["openonce_provider_key"]`` (and ``metadata["openonce_effect_id"]``) on
  the PaymentIntent it creates.

Stripe has no read-only lookup by Idempotency-Key: replaying the POST with the key would
*make* the charge if it never happened. So the prober searches PaymentIntents by that
metadata instead. Stripe's search index is eventually consistent (usually under a
minute, longer during incidents), which shapes the rules:

* one PaymentIntent stamped with this effect's provider key: HAPPENED, with a receipt;
* several: INCONCLUSIVE, they may be duplicates and that is a person's call;
* none while the attempt is younger than ``index_lag_seconds``: INCONCLUSIVE, a young
  miss (the index may not have the object yet);
* none past the lag: NOT_HAPPENED, a mature miss. What makes re-arming on it safe is the
  backstop: for 24 hours after a key's first use Stripe answers a re-send carrying the
  same Idempotency-Key with the original result instead of charging again, so a miss the
  index got wrong cannot become a double charge. Past that window the detail says the
  miss rests on the search alone;
* an error, a timeout or a malformed answer: INCONCLUSIVE. Could not verify is not did
  not happen.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

from ..probe import ProbeOutcome, ProbeResult
from ..records import Effect
from ..runtime import EffectContext

PROVIDER_KEY_FIELD = "openonce_provider_key"
EFFECT_ID_FIELD = "openonce_effect_id"


def effect_metadata(ctx: EffectContext) -> dict[str, str]:
    """The metadata a handler stamps on the object it creates, for the prober to find::

    ctx = current_effect()
    stripe.PaymentIntent.create(..., metadata=effect_metadata(ctx),
                                idempotency_key=ctx.provider_key)
    """
    return {EFFECT_ID_FIELD: ctx.effect_id, PROVIDER_KEY_FIELD: ctx.provider_key}


class StripeSearchClient(Protocol):
    """What :class:`StripeProber` needs from Stripe: one read.

    ``search_payment_intents`` returns the PaymentIntents whose
    ``metadata["openonce_provider_key"]`` equals ``provider_key``, each as Stripe renders
    it (``id``, ``amount``, ``currency``, ``status``, ``metadata``...). It must raise on
    any failure (HTTP error, timeout, unreadable body): returning ``[]`` for an answer it
    did not get would read as "not happened".
    """

    def search_payment_intents(self, provider_key: str) -> list[dict[str, Any]]: ...


class StripeReadError(Exception):
    """Stripe's search could not be read; the probe stays inconclusive."""


class StripeProber:
    """Probes ``stripe.*`` effects by the metadata the handler stamped (see module doc)."""

    capability = "stripe"

    def __init__(
        self,
        client: StripeSearchClient,
        *,
        index_lag_seconds: float = 120.0,
        idempotency_window_seconds: float = 86400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if index_lag_seconds < 0 or idempotency_window_seconds < 0:
            raise ValueError("index_lag_seconds and idempotency_window_seconds must be >= 0")
        self.client = client
        self.index_lag_seconds = index_lag_seconds
        self.idempotency_window_seconds = idempotency_window_seconds
        self.clock = clock

    @classmethod
    def from_api_key(
        cls,
        api_key: str,
        *,
        index_lag_seconds: float = 120.0,
        idempotency_window_seconds: float = 86400.0,
        timeout: float = 10.0,
    ) -> StripeProber:
        """A prober reading Stripe's REST API with a (restricted, read-only) secret key."""
        return cls(
            StripeRestClient(api_key, timeout=timeout),
            index_lag_seconds=index_lag_seconds,
            idempotency_window_seconds=idempotency_window_seconds,
        )

    def probe(self, effect: Effect) -> ProbeResult:
        key = effect.provider_key
        try:
            found = self.client.search_payment_intents(key)
        except Exception as exc:
            return _inconclusive(f"Stripe search failed: {type(exc).__name__}: {exc}"[:500])
        if not isinstance(found, list) or not all(isinstance(o, dict) for o in found):
            return _inconclusive(
                f"Stripe search returned {type(found).__name__}, not a list of objects"
            )
        # The search asked for this key; anything not stamped with it is a wrapper or a
        # query gone wrong. It is ignored, and if it is all we got, the read is suspect.
        mine = [o for o in found if _metadata(o).get(PROVIDER_KEY_FIELD) == key]
        ignored = len(found) - len(mine)
        observed: dict[str, Any] = {"matches": len(mine), "ignored_unrelated": ignored}
        if not mine and ignored:
            return _inconclusive(
                f"Stripe search for provider key {key} returned {ignored} PaymentIntent(s),"
                " none stamped with that key: a suspicious read, not evidence",
                observed,
            )
        strangers = [o for o in mine if _metadata(o).get(EFFECT_ID_FIELD) not in (None, effect.id)]
        if strangers:
            other = _metadata(strangers[0]).get(EFFECT_ID_FIELD)
            return _inconclusive(
                f"PaymentIntent {strangers[0].get('id')!r} carries provider key {key} but"
                f" effect id {other!r}, not {effect.id}: wrong identity",
                observed,
            )
        if len(mine) > 1:
            ids = [str(o.get("id")) for o in mine]
            observed["stripe_ids"] = ids
            return _inconclusive(
                f"{len(mine)} PaymentIntents carry provider key {key} ({', '.join(ids)}):"
                " possible duplicates, a person must decide",
                observed,
            )
        if mine:
            return self._found(effect, mine[0], observed)
        return self._missed(effect, observed)

    def _found(
        self, effect: Effect, intent: dict[str, Any], observed: dict[str, Any]
    ) -> ProbeResult:
        stripe_id = intent.get("id")
        if not isinstance(stripe_id, str) or not stripe_id:
            return _inconclusive(
                f"the PaymentIntent stamped with {effect.provider_key} has no id", observed
            )
        receipt: dict[str, Any] = {"stripe_id": stripe_id}
        amount = intent.get("amount")
        if type(amount) is int:
            receipt["amount"] = amount
        for name in ("currency", "status"):
            value = intent.get(name)
            if isinstance(value, str):
                receipt[name] = value
        status = f" (status {receipt['status']})" if "status" in receipt else ""
        return ProbeResult(
            ProbeOutcome.HAPPENED,
            receipt=receipt,
            detail=f"PaymentIntent {stripe_id}{status} carries provider key {effect.provider_key}",
            provider_reference=effect.provider_key,
            observed=observed,
        )

    def _missed(self, effect: Effect, observed: dict[str, Any]) -> ProbeResult:
        at = self.clock()
        # The latest timestamp is the conservative one: the request left no later than
        # the effect went UNKNOWN, and Stripe may have indexed it only after that.
        age = at - max(effect.created_at, effect.updated_at)
        observed["age_seconds"] = round(age, 3)
        key = effect.provider_key
        if age < self.index_lag_seconds:
            return _inconclusive(
                f"young miss: no PaymentIntent carries provider key {key} yet, but the attempt"
                f" is {age:.0f}s old and Stripe's search index may lag"
                f" {self.index_lag_seconds:g}s; probe again later",
                observed,
            )
        # The key was first sent no earlier than the effect was created, so measuring its
        # age from created_at never overstates how long Stripe still remembers it.
        key_age = at - effect.created_at
        detail = (
            f"mature miss: no PaymentIntent carries provider key {key}"
            f" {age:.0f}s after the attempt, past the {self.index_lag_seconds:g}s index lag"
        )
        if key_age < self.idempotency_window_seconds:
            remaining = self.idempotency_window_seconds - key_age
            detail += (
                f". Backstop: Stripe deduplicates Idempotency-Key {key} for"
                f" {self.idempotency_window_seconds:g}s after its first use and the key is at"
                f" most {key_age:.0f}s old, so a re-send with it in the next {remaining:.0f}s"
                " returns the original result instead of charging twice"
            )
            observed["idempotency_backstop"] = True
        else:
            detail += (
                f". The key is {key_age:.0f}s old, past Stripe's"
                f" {self.idempotency_window_seconds:g}s idempotency window: a re-send is a new"
                " charge, so this miss rests on the search index alone"
            )
            observed["idempotency_backstop"] = False
        return ProbeResult(
            ProbeOutcome.NOT_HAPPENED,
            detail=detail,
            provider_reference=key,
            observed=observed,
        )


class StripeRestClient:
    """:class:`StripeSearchClient` over Stripe's REST API, standard library only.

    ``open_url`` is ``urllib.request.urlopen`` unless a test passes a stand-in.
    """

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = "https://api.stripe.com",
        timeout: float = 10.0,
        open_url: Callable[..., Any] = urllib.request.urlopen,
    ) -> None:
        if not api_key:
            raise ValueError("a Stripe API key is required")
        self._api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._open_url = open_url

    def __repr__(self) -> str:  # never show the key in logs or probe details
        return f"StripeRestClient(base_url={self.base_url!r})"

    def search_payment_intents(self, provider_key: str) -> list[dict[str, Any]]:
        query = f"metadata['{PROVIDER_KEY_FIELD}']:'{_search_literal(provider_key)}'"
        # More than one hit is already inconclusive, so one short page is the whole answer.
        params = urllib.parse.urlencode({"query": query, "limit": 10})
        request = urllib.request.Request(
            f"{self.base_url}/v1/payment_intents/search?{params}",
            headers={
                "Authorization": f"Bearer {self._api_key}",
                "Accept": "application/json",
                "User-Agent": "openonce-prober",
            },
        )
        try:
            with self._open_url(request, timeout=self.timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise StripeReadError(f"Stripe answered HTTP {exc.code}: {_error_text(exc)}") from exc
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            raise StripeReadError("Stripe's search answer has no 'data' list")
        data: list[dict[str, Any]] = body["data"]
        return data


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _search_literal(value: str) -> str:
    """A value for a quoted Stripe search clause: backslash escapes quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
        return str(body["error"]["message"])[:200]
    except Exception:
        return str(exc.reason)[:200]


def _inconclusive(detail: str, observed: dict[str, Any] | None = None) -> ProbeResult:
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {})
