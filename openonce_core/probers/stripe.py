"""Tier 1, native idempotency keys: is there a Stripe object for this effect?

The handler contract (``openonce providers stripe.charge --requirements``):

* send ``current_effect().provider_key`` as the ``Idempotency-Key`` header, and
* stamp ``effect_metadata(current_effect())`` (``metadata["openonce_provider_key"]`` and
  ``metadata["openonce_effect_id"]``) on the object it creates;
* a refund tool passes the refunded ``charge`` or ``payment_intent`` id in its arguments.

Stripe has no read-only lookup by Idempotency-Key: replaying the POST with the key would
*make* the charge if it never happened. So the prober looks for the metadata instead,
with the read Stripe documents for each object:

=====================  ==============================================  ===================
the tool creates       the read                                        index lag
=====================  ==============================================  ===================
PaymentIntents         ``GET /v1/payment_intents/search`` by metadata  yes (search)
Charges                ``GET /v1/charges/search`` by metadata          yes (search)
Refunds                ``GET /v1/refunds?charge=`` or ``?payment_intent=``  no (list)
=====================  ==============================================  ===================

Refunds are not searchable, so a refund is found by listing the refunds of the charge or
payment intent it refunded (a list reads the primary store) and matching the metadata.
``StripeProber(objects=...)`` picks the read; by default a tool whose name contains
"refund" lists refunds and every other tool searches PaymentIntents.

The search index is eventually consistent (usually under a minute, up to an hour during
incidents), which shapes the rules:

* one object stamped with this effect's provider key: HAPPENED, with a receipt;
* several: INCONCLUSIVE, they may be duplicates and that is a person's call;
* none while the attempt is younger than ``index_lag_seconds`` (searches only):
  INCONCLUSIVE, a young miss (the index may not have the object yet);
* none past the lag: NOT_HAPPENED, a mature miss. What makes re-arming on it safe is the
  backstop: for 24 hours after a key's first use Stripe answers a re-send carrying the
  same Idempotency-Key with the original result instead of charging again, so a miss the
  index got wrong cannot become a double charge. Past that window the detail says the
  miss rests on the read alone;
* Stripe could not be asked (429, 5xx, a timeout, a revoked key): the client raises a
  ``ProbeError`` (``ProbeTransientError`` / ``ProbeCredentialError``) and the reconciler
  decides when to ask again. A malformed answer is INCONCLUSIVE. Could not verify is not
  did not happen.

Every request carries a pinned ``Stripe-Version`` (search needs 2020-08-27 or later) and,
for Connect, ``Stripe-Account``.
"""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError
from ..probe import ProbeOutcome, ProbeResult
from ..records import Effect
from ._http import (
    USER_AGENT,
    RateLimiter,
    error_message,
    header,
    read_json,
    retry_after_seconds,
    shared_limiter,
    transport_error,
)

PROVIDER_KEY_FIELD = "openonce_provider_key"
EFFECT_ID_FIELD = "openonce_effect_id"
PROVIDER = "stripe"
# Pinned so the wire format cannot change under the prober when the account's default
# API version is upgraded; search needs 2020-08-27 or later. The version Stripe's search
# guide uses in its own Stripe-Version example.
STRIPE_VERSION = "2025-03-31.basil"
# Stripe allows about 20 search reads per second per account; the default stays a tenth
# under it because requests leave with jitter (a bucket at exactly the limit can put 21
# into one second at the provider). Per worker process: with N processes probing one
# account, give each 18 / N.
SEARCH_REQUESTS_PER_SECOND = 18.0
OBJECTS = ("payment_intents", "charges", "refunds")
_NAMES = {"payment_intents": "PaymentIntent", "charges": "Charge", "refunds": "Refund"}
# Where a refund tool's arguments name what it refunded, and which list filter that is.
REFUND_PARENT_ARGS = (
    ("payment_intent", "payment_intent"),
    ("payment_intent_id", "payment_intent"),
    ("charge", "charge"),
    ("charge_id", "charge"),
)


class _HasKeys(Protocol):
    @property
    def effect_id(self) -> str: ...
    @property
    def provider_key(self) -> str: ...


def effect_metadata(ctx: _HasKeys) -> dict[str, str]:
    """The metadata a handler stamps on the object it creates, for the prober to find::

    ctx = current_effect()
    stripe.PaymentIntent.create(..., metadata=effect_metadata(ctx),
                                idempotency_key=ctx.provider_key)
    """
    return {EFFECT_ID_FIELD: ctx.effect_id, PROVIDER_KEY_FIELD: ctx.provider_key}


class StripeSearchClient(Protocol):
    """What :class:`StripeProber` needs from Stripe for PaymentIntents: one read.

    ``search_payment_intents`` returns the PaymentIntents whose
    ``metadata["openonce_provider_key"]`` equals ``provider_key``, each as Stripe renders
    it (``id``, ``amount``, ``currency``, ``status``, ``metadata``...). It must raise on
    any failure (a ``ProbeError`` when Stripe could not be asked): returning ``[]`` for an
    answer it did not get would read as "not happened".

    Clients for the other objects add ``search_charges(provider_key)`` and
    ``list_refunds(charge=..., payment_intent=...)`` (every refund of that charge or
    payment intent); :class:`StripeRestClient` has all three.
    """

    def search_payment_intents(self, provider_key: str) -> list[dict[str, Any]]: ...


class StripeReadError(ProbeError):
    """Stripe's answer could not be used (a client's own failure); the probe is not an
    observation of the effect."""

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(PROVIDER, detail, status=status)


class StripeProber:
    """Probes ``stripe.*`` effects by the metadata the handler stamped (see module doc).

    ``objects`` is what the tool creates: ``"payment_intents"``, ``"charges"`` or
    ``"refunds"``; None picks refunds for tools named ``*refund*`` and PaymentIntents for
    the rest. ``account_arg`` names an effect argument holding a Connect account id
    (``acct_...``) to read as, when effects act on connected accounts.
    """

    capability = "stripe"
    provider = PROVIDER  # names this prober in health and metrics

    def __init__(
        self,
        client: StripeSearchClient,
        *,
        objects: str | None = None,
        index_lag_seconds: float = 120.0,
        idempotency_window_seconds: float = 86400.0,
        account_arg: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if index_lag_seconds < 0 or idempotency_window_seconds < 0:
            raise ValueError("index_lag_seconds and idempotency_window_seconds must be >= 0")
        if objects is not None and objects not in OBJECTS:
            raise ValueError(f"objects must be one of {', '.join(OBJECTS)}, not {objects!r}")
        self.client = client
        self.objects = objects
        self.index_lag_seconds = index_lag_seconds
        self.idempotency_window_seconds = idempotency_window_seconds
        self.account_arg = account_arg
        self.clock = clock

    @classmethod
    def from_api_key(
        cls,
        api_key: str,
        *,
        objects: str | None = None,
        index_lag_seconds: float = 120.0,
        idempotency_window_seconds: float = 86400.0,
        timeout: float = 10.0,
        stripe_account: str | None = None,
        account_arg: str | None = None,
        requests_per_second: float = SEARCH_REQUESTS_PER_SECOND,
        base_url: str = "https://api.stripe.com",
    ) -> StripeProber:
        """A prober reading Stripe's REST API with a (restricted, read-only) secret key.

        ``requests_per_second`` is this process's share of the account's read limit."""
        return cls(
            StripeRestClient(
                api_key,
                base_url=base_url,
                timeout=timeout,
                stripe_account=stripe_account,
                requests_per_second=requests_per_second,
            ),
            objects=objects,
            index_lag_seconds=index_lag_seconds,
            idempotency_window_seconds=idempotency_window_seconds,
            account_arg=account_arg,
        )

    def objects_for(self, tool: str) -> str:
        """The Stripe objects this prober reads for ``tool``."""
        if self.objects is not None:
            return self.objects
        return "refunds" if "refund" in tool.rpartition(".")[2].lower() else "payment_intents"

    def probe(self, effect: Effect) -> ProbeResult:
        key = effect.provider_key
        objects = self.objects_for(effect.tool)
        name = _NAMES[objects]
        options: dict[str, Any] = {}
        if self.account_arg is not None:
            account = effect.args.get(self.account_arg)
            if not (isinstance(account, str) and account.startswith("acct_")):
                return _inconclusive(
                    f"cannot probe: the effect's {self.account_arg!r} argument should hold"
                    f" the Connect account id (acct_...), got {account!r}"
                )
            options["stripe_account"] = account
        parent = _refund_parent(effect.args) if objects == "refunds" else None
        if objects == "refunds" and parent is None:
            return _inconclusive(
                "cannot probe a refund: Refunds are not searchable, and the effect's"
                " args name no charge or payment_intent whose refunds could be listed"
            )
        where = f"the refunds of {parent[1]}" if parent is not None else f"Stripe's {name} search"
        try:
            if parent is not None:
                found = _call(self.client, "list_refunds", **{parent[0]: parent[1]}, **options)
            elif objects == "charges":
                found = _call(self.client, "search_charges", key, **options)
            else:
                found = _call(self.client, "search_payment_intents", key, **options)
        except ProbeError:
            raise  # Stripe could not be asked: the reconciler decides when to ask again
        except (TimeoutError, ConnectionError) as exc:
            raise ProbeTransientError(PROVIDER, f"{where}: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise transport_error(PROVIDER, exc, where) from exc
        except Exception as exc:  # a client's own bug: nothing observed, a person looks
            return _inconclusive(f"{where} failed: {type(exc).__name__}: {exc}"[:500])
        if not isinstance(found, list) or not all(isinstance(o, dict) for o in found):
            return _inconclusive(f"{where} returned {type(found).__name__}, not a list of objects")
        # The read asked for this key; anything not stamped with it is a wrapper or a
        # query gone wrong (or, for refunds, another refund of the same charge). It is
        # ignored, and if a search returned only such objects, the read is suspect.
        mine = [o for o in found if _metadata(o).get(PROVIDER_KEY_FIELD) == key]
        ignored = len(found) - len(mine)
        observed: dict[str, Any] = {"objects": objects, "matches": len(mine)}
        observed["ignored_unrelated"] = ignored
        if not mine and ignored and objects != "refunds":
            return _inconclusive(
                f"{where} for provider key {key} returned {ignored} {name}(s),"
                " none stamped with that key: a suspicious read, not evidence",
                observed,
            )
        strangers = [o for o in mine if _metadata(o).get(EFFECT_ID_FIELD) not in (None, effect.id)]
        if strangers:
            other = _metadata(strangers[0]).get(EFFECT_ID_FIELD)
            return _inconclusive(
                f"{name} {strangers[0].get('id')!r} carries provider key {key} but"
                f" effect id {other!r}, not {effect.id}: wrong identity",
                observed,
            )
        if len(mine) > 1:
            ids = [str(o.get("id")) for o in mine]
            observed["stripe_ids"] = ids
            return _inconclusive(
                f"{len(mine)} {name}s carry provider key {key} ({', '.join(ids)}):"
                " possible duplicates, a person must decide",
                observed,
            )
        if mine:
            return self._found(effect, mine[0], name, observed)
        return self._missed(effect, objects, where, observed)

    def _found(
        self, effect: Effect, obj: dict[str, Any], name: str, observed: dict[str, Any]
    ) -> ProbeResult:
        stripe_id = obj.get("id")
        if not isinstance(stripe_id, str) or not stripe_id:
            return _inconclusive(
                f"the {name} stamped with {effect.provider_key} has no id", observed
            )
        receipt: dict[str, Any] = {"stripe_id": stripe_id}
        amount = obj.get("amount")
        if type(amount) is int:
            receipt["amount"] = amount
        for field in ("currency", "status"):
            value = obj.get(field)
            if isinstance(value, str):
                receipt[field] = value
        status = f" (status {receipt['status']})" if "status" in receipt else ""
        return ProbeResult(
            ProbeOutcome.HAPPENED,
            receipt=receipt,
            detail=f"{name} {stripe_id}{status} carries provider key {effect.provider_key}",
            provider_reference=effect.provider_key,
            observed=observed,
        )

    def _missed(
        self, effect: Effect, objects: str, where: str, observed: dict[str, Any]
    ) -> ProbeResult:
        at = self.clock()
        # The latest timestamp is the conservative one: the request left no later than
        # the effect went UNKNOWN, and Stripe may have indexed it only after that.
        age = at - max(effect.created_at, effect.updated_at)
        observed["age_seconds"] = round(age, 3)
        key = effect.provider_key
        name = _NAMES[objects]
        # A list reads the primary store; only the search index lags behind writes.
        lag = 0.0 if objects == "refunds" else self.index_lag_seconds
        if age < lag:
            return _inconclusive(
                f"young miss: no {name} carries provider key {key} yet, but the attempt"
                f" is {age:.0f}s old and Stripe's search index may lag {lag:g}s;"
                " probe again later",
                observed,
            )
        # The key was first sent no earlier than the effect was created, so measuring its
        # age from created_at never overstates how long Stripe still remembers it.
        key_age = at - effect.created_at
        if lag:
            detail = (
                f"mature miss: no {name} carries provider key {key}"
                f" {age:.0f}s after the attempt, past the {lag:g}s index lag"
            )
        else:
            detail = (
                f"miss: {where} (a list, not the search index) holds no {name}"
                f" with provider key {key}"
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
                f" request, so this miss rests on the {'search index' if lag else 'refund list'}"
                " alone"
            )
            observed["idempotency_backstop"] = False
        return ProbeResult(
            ProbeOutcome.NOT_HAPPENED,
            detail=detail,
            provider_reference=key,
            observed=observed,
        )


class StripeRestClient:
    """Stripe's REST API, standard library only: PaymentIntent and Charge search by
    metadata, and the refunds of a charge or payment intent (paged through).

    Every request waits its turn on ``limiter`` (by default shared by every Stripe client
    of this process at ``requests_per_second``), carries ``Stripe-Version`` and, when
    given, ``Stripe-Account``. A 429 pauses the limiter for the ``Retry-After`` Stripe
    asked for (at least a second), so the other probes of this process stop too.
    ``open_url`` is ``urllib.request.urlopen`` unless a test passes a stand-in.
    """

    max_refund_pages = 10

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = "https://api.stripe.com",
        timeout: float = 10.0,
        stripe_account: str | None = None,
        stripe_version: str = STRIPE_VERSION,
        requests_per_second: float = SEARCH_REQUESTS_PER_SECOND,
        limiter: RateLimiter | None = None,
        open_url: Callable[..., Any] = urllib.request.urlopen,
    ) -> None:
        if not api_key:
            raise ValueError("a Stripe API key is required")
        if stripe_account is not None and not stripe_account.startswith("acct_"):
            raise ValueError(
                f"stripe_account must be a Connect account id (acct_...), not {stripe_account!r}"
            )
        self._api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.stripe_account = stripe_account
        self.stripe_version = stripe_version
        self.limiter = limiter or shared_limiter(PROVIDER, requests_per_second)
        self._open_url = open_url

    def __repr__(self) -> str:  # never show the key in logs or probe details
        return f"StripeRestClient(base_url={self.base_url!r})"

    def search_payment_intents(
        self, provider_key: str, *, stripe_account: str | None = None
    ) -> list[dict[str, Any]]:
        return self._search("payment_intents", provider_key, stripe_account)

    def search_charges(
        self, provider_key: str, *, stripe_account: str | None = None
    ) -> list[dict[str, Any]]:
        return self._search("charges", provider_key, stripe_account)

    def list_refunds(
        self,
        *,
        charge: str | None = None,
        payment_intent: str | None = None,
        stripe_account: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every refund of ``charge`` or of ``payment_intent`` (exactly one of them)."""
        if (charge is None) == (payment_intent is None):
            raise ValueError("list_refunds needs exactly one of charge or payment_intent")
        params: dict[str, Any] = {"limit": 100}
        if charge is not None:
            params["charge"] = charge
        else:
            params["payment_intent"] = payment_intent
        refunds: list[dict[str, Any]] = []
        for _ in range(self.max_refund_pages):
            body = self._get("/v1/refunds", params, stripe_account, "listing refunds")
            page = _data(body, "refund list")
            refunds.extend(page)
            if body.get("has_more") is not True:
                return refunds
            last = page[-1].get("id") if page else None
            if not isinstance(last, str):
                raise StripeReadError("the refund list says has_more but its last item has no id")
            params["starting_after"] = last
        raise StripeReadError(
            f"more than {self.max_refund_pages * 100} refunds on {charge or payment_intent};"
            " look by hand"
        )

    def _search(
        self, objects: str, provider_key: str, stripe_account: str | None
    ) -> list[dict[str, Any]]:
        query = f"metadata['{PROVIDER_KEY_FIELD}']:'{_search_literal(provider_key)}'"
        # More than one hit is already inconclusive, so one short page is the whole answer.
        body = self._get(
            f"/v1/{objects}/search", {"query": query, "limit": 10}, stripe_account,
            f"searching {objects}",
        )  # fmt: skip
        return _data(body, "search answer")

    def _get(
        self, path: str, params: Mapping[str, Any], stripe_account: str | None, what: str
    ) -> dict[str, Any]:
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Accept": "application/json",
            "Stripe-Version": self.stripe_version,
            "User-Agent": USER_AGENT,
        }
        account = stripe_account or self.stripe_account
        if account:
            headers["Stripe-Account"] = account
        request = urllib.request.Request(
            f"{self.base_url}{path}?{urllib.parse.urlencode(params)}", headers=headers
        )
        self.limiter.acquire(max_wait=self.timeout)
        body, _ = read_json(
            PROVIDER, self._open_url, request, timeout=self.timeout, what=what,
            classify=self._classify,
        )  # fmt: skip
        if not isinstance(body, dict):
            raise StripeReadError(f"{what}: Stripe's answer is not a JSON object")
        return body

    def _classify(self, status: int, headers: Any, body: bytes) -> ProbeError:
        message = error_message(body) or f"HTTP {status}"
        detail = f"Stripe answered HTTP {status}: {message}"
        if status == 429:
            wait = retry_after_seconds(header(headers, "Retry-After"))
            self.limiter.pause(max(1.0, wait or 0.0), f"Stripe answered 429: {message}")
            return ProbeTransientError(PROVIDER, detail, status=status, retry_after=wait)
        if status >= 500 or header(headers, "Stripe-Should-Retry") == "true":
            wait = retry_after_seconds(header(headers, "Retry-After"))
            return ProbeTransientError(PROVIDER, detail, status=status, retry_after=wait)
        if status in (401, 403):
            return ProbeCredentialError(
                PROVIDER, detail + " (check the API key and its read permissions)", status=status
            )
        return StripeReadError(detail, status=status)


def _call(client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """Call the client's read; a client without it cannot probe these objects."""
    read = getattr(client, method, None)
    if read is None:
        raise StripeReadError(
            f"{type(client).__name__} has no {method}(): it cannot read these objects"
        )
    return read(*args, **kwargs)


def _refund_parent(args: Mapping[str, Any]) -> tuple[str, str] | None:
    """(``"charge"`` or ``"payment_intent"``, its id) from a refund effect's arguments.
    An id's prefix wins over the argument's name (``pi_`` is a PaymentIntent)."""
    for name, kind in REFUND_PARENT_ARGS:
        value = args.get(name)
        if isinstance(value, str) and value:
            if value.startswith("pi_"):
                return "payment_intent", value
            if value.startswith(("ch_", "py_")):
                return "charge", value
            return kind, value
    return None


def _data(body: dict[str, Any], what: str) -> list[dict[str, Any]]:
    data = body.get("data")
    if not isinstance(data, list):
        raise StripeReadError(f"Stripe's {what} has no 'data' list")
    return data


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _search_literal(value: str) -> str:
    """A value for a quoted Stripe search clause: backslash escapes quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _inconclusive(detail: str, observed: dict[str, Any] | None = None) -> ProbeResult:
    return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {})
