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
outages) and not available to every account (India: Stripe answers 400, "The search
feature is temporarily unavailable in your region."). The list API
(``GET /v1/payment_intents`` or ``/v1/charges`` with ``created[gte]``/``created[lte]``)
reads the primary store; the prober lists the objects created from the effect's creation
less ``CREATED_SKEW_SECONDS`` to now plus that skew, every page, and matches the metadata.
The rules:

* one object stamped with this effect's provider key: HAPPENED, with a receipt;
* several: INCONCLUSIVE, they may be duplicates and that is a person's call;
* no hit on the search while the attempt is younger than ``index_lag_seconds``:
  INCONCLUSIVE, a young miss, with ``retry_after`` = the time left until the lag has passed
  plus ``maturity_margin_seconds``: the reconciler asks again then, not a person now. The
  age runs from when the effect went UNKNOWN (``probe.attempt_ended_at``) on the clock the
  reconciler binds (``bind_clock``: the ledger's, the database's on Postgres);
* no hit on the search past the lag: the list decides (an outage can hold the index back
  far longer than its normal lag). The list is also the read when search is unavailable;
* a miss on a list, within Stripe's idempotency window (``idempotency_window_seconds``,
  24 hours after the key's first use): NOT_HAPPENED. What makes re-arming on it safe is
  the backstop: Stripe answers a re-send carrying the same Idempotency-Key with the
  original result instead of charging again;
* a miss past that window: INCONCLUSIVE, for a person. A re-send would be a new request,
  and a miss alone (a handler that forgot the stamp) is not enough to charge again;
* Stripe could not be asked (429, 5xx, a timeout, a revoked key): the client raises a
  ``ProbeError`` (``ProbeTransientError`` / ``ProbeCredentialError``) and the reconciler
  decides when to ask again. A malformed answer is INCONCLUSIVE. Could not verify is not
  did not happen.

A client with only ``search_payment_intents`` (the protocol's minimum) cannot list: a
mature search miss then rests on the search, inside the idempotency window only.

``StripeProber.verify(effect, receipt)`` checks a receipt a person offers (the console):
it retrieves the object ``receipt["stripe_id"]`` names (``GET /v1/refunds/{id}``,
``/v1/payment_intents/{id}`` or ``/v1/charges/{id}`` by its prefix: ``re_``, ``pi_``,
``ch_``/``py_``, which must be what the tool creates) and answers HAPPENED, with a receipt
of Stripe's own values and ``provider_reference`` the effect's provider key, only when the
object's metadata carries this effect's provider key and, if it has one, its effect id.
Anything else is INCONCLUSIVE saying why (another kind of object, no stamp, another
effect's stamp, an id Stripe does not have, Stripe could not be asked); it never raises for
Stripe's failures and sends nothing for an id that cannot be the tool's object.

Every request carries a pinned ``Stripe-Version`` (search needs 2020-08-27 or later) and,
for Connect, ``Stripe-Account``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .._probe import (
    MATURITY_MARGIN_SECONDS,
    ProbeOutcome,
    ProbeResult,
    age_words,
    attempt_ended_at,
    young_miss_wait,
)
from .._records import Effect
from ..errors import ProbeCredentialError, ProbeError, ProbeTransientError
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
# into one second at the provider). The daemon shares it across worker processes through
# Redis (reconciler.ratelimit); processes without it each take the whole rate.
SEARCH_REQUESTS_PER_SECOND = 18.0
OBJECTS = ("payment_intents", "charges", "refunds")
_NAMES = {"payment_intents": "PaymentIntent", "charges": "Charge", "refunds": "Refund"}
# Which objects an id names, by its prefix (py_ is a Charge made by a non-card method).
ID_PREFIXES = {"payment_intents": ("pi_",), "charges": ("ch_", "py_"), "refunds": ("re_",)}
_STRIPE_ID = re.compile(r"[A-Za-z0-9_]{4,255}")  # also keeps an id from changing the path
# How far Stripe's clock (an object's ``created``) and the ledger's (the effect's
# created_at) may disagree: the list window is widened by this much on both sides.
CREATED_SKEW_SECONDS = 300.0
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
    payment intent). ``list_payment_intents`` / ``list_charges(created_gte,
    created_lte)`` return every object created in that window (Unix seconds, both
    ends included), for accounts without search and to confirm a mature search miss; a
    client without them leaves a mature search miss to the search alone. ``retrieve(
    objects, stripe_id)`` returns one object (a ``StripeReadError`` with status 404 when
    Stripe has none) for :meth:`StripeProber.verify`. :class:`StripeRestClient` has all.
    """

    def search_payment_intents(self, provider_key: str) -> list[dict[str, Any]]: ...


class StripeReadError(ProbeError):
    """Stripe's answer could not be used (a client's own failure); the probe is not an
    observation of the effect."""

    def __init__(self, detail: str, *, status: int | None = None) -> None:
        super().__init__(PROVIDER, detail, status=status)


class StripeSearchUnavailableError(StripeReadError):
    """Stripe's search is not available to this account (India): the prober reads the
    list API instead."""


def _search_unavailable(status: int, message: str) -> bool:
    """Stripe answers 400 (invalid_request_error) when the account has no search; the words
    seen so far: "The search feature is temporarily unavailable in your region.",
    "search feature unavailable for merchant"."""
    text = message.lower()
    return status == 400 and "search" in text and ("unavailable" in text or "not available" in text)


class StripeProber:
    """Probes ``stripe.*`` effects by the metadata the handler stamped (see module doc).

    ``objects`` is what the tool creates: ``"payment_intents"``, ``"charges"`` or
    ``"refunds"``; None picks refunds for tools named ``*refund*`` and PaymentIntents for
    the rest. ``account_arg`` names an effect argument holding a Connect account id
    (``acct_...``) to read as, when effects act on connected accounts.

    ``clock`` is the time an effect's age is measured against. Leave it None: a
    :class:`~openonce_core._reconcile.Reconciler` binds its own (``bind_clock``), the clock
    the effect's timestamps were written with; unbound, this host's ``time.time``.
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
        maturity_margin_seconds: float = MATURITY_MARGIN_SECONDS,
        account_arg: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        for name, seconds in (
            ("index_lag_seconds", index_lag_seconds),
            ("idempotency_window_seconds", idempotency_window_seconds),
            ("maturity_margin_seconds", maturity_margin_seconds),
        ):
            # NaN would make every miss mature at once (age < NaN is never true).
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, not {seconds!r}")
        if objects is not None and objects not in OBJECTS:
            raise ValueError(f"objects must be one of {', '.join(OBJECTS)}, not {objects!r}")
        self.client = client
        self.objects = objects
        self.index_lag_seconds = index_lag_seconds
        self.idempotency_window_seconds = idempotency_window_seconds
        self.maturity_margin_seconds = maturity_margin_seconds
        self.account_arg = account_arg
        self.clock = clock
        self._bound: Callable[[], float] | None = None

    def bind_clock(self, now: Callable[[], float]) -> None:
        """Measure ages on ``now`` (the reconciler's clock) unless a clock was given."""
        self._bound = now

    def now(self) -> float:
        clock = self.clock or self._bound
        return clock() if clock is not None else time.time()

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
        options, problem = self._options(effect)
        if problem:
            return _inconclusive(problem)
        if objects == "refunds":
            parent = _refund_parent(effect.args)
            if parent is None:
                return _inconclusive(
                    "cannot probe a refund: Refunds are not searchable, and the effect's"
                    " args name no charge or payment_intent whose refunds could be listed"
                )
            where = f"the refunds of {parent[1]}"
            found = self._read(where, "list_refunds", **{parent[0]: parent[1]}, **options)
            if isinstance(found, ProbeResult):
                return found
            listed: dict[str, Any] = {"objects": objects, "read": "list"}
            miss = f"miss: {where} (a list, not the search index) holds no {name} with"
            return self._match(effect, name, where, found, listed, listed=True) or self._miss(
                effect, f"{miss} provider key {key}", listed
            )
        where = f"Stripe's {name} search"
        try:
            found = self._read(where, f"search_{objects}", key, **options)
        except StripeSearchUnavailableError as exc:
            # Some accounts have no search (India): the list API reads the same objects.
            why = f"search is not available to this account ({exc.detail})"
            return self._by_list(effect, objects, options, why, {"objects": objects})
        if isinstance(found, ProbeResult):
            return found
        observed: dict[str, Any] = {"objects": objects, "read": "search"}
        hit = self._match(effect, name, where, found, observed, listed=False)
        if hit is not None:
            return hit
        at = self.now()
        age = at - max(effect.created_at, attempt_ended_at(effect))
        observed["age_seconds"] = round(age, 3)
        lag = self.index_lag_seconds
        # Ask again once the lag has passed, plus a margin: the request may have reached
        # Stripe a little after the attempt ended, and a clock not bound to the ledger's
        # may read a little behind it.
        wait = young_miss_wait(age, lag, self.maturity_margin_seconds)
        if wait is not None:
            return _inconclusive(
                f"young miss: no {name} carries provider key {key} yet, but the attempt"
                f" is {age_words(age)} and Stripe's search index may lag {lag:g}s;"
                f" probe again in {wait:.0f}s",
                observed,
                retry_after=wait,
            )
        # Past the normal lag the index is still no proof: during an outage it lags up to
        # an hour. The list API reads Stripe's primary store: it decides.
        why = f"mature miss: no {name} carries provider key {key} {age:.0f}s after the attempt"
        why += f", past the {lag:g}s index lag"
        return self._by_list(effect, objects, options, why, observed)

    def _options(self, effect: Effect) -> tuple[dict[str, Any], str]:
        """The Connect account to read as, or why the effect cannot be probed."""
        if self.account_arg is None:
            return {}, ""
        account = effect.args.get(self.account_arg)
        if not (isinstance(account, str) and account.startswith("acct_")):
            return {}, (
                f"cannot probe: the effect's {self.account_arg!r} argument should hold"
                f" the Connect account id (acct_...), got {account!r}"
            )
        return {"stripe_account": account}, ""

    def _read(self, where: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The client's answer, or an inconclusive result for a client's own bug. Stripe
        not answering raises a ``ProbeError``: the reconciler decides when to ask again."""
        try:
            found = _call(self.client, method, *args, **kwargs)
        except ProbeError:
            raise
        except (TimeoutError, ConnectionError) as exc:
            raise ProbeTransientError(PROVIDER, f"{where}: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise transport_error(PROVIDER, exc, where) from exc
        except Exception as exc:  # a client's own bug: nothing observed, a person looks
            return _inconclusive(f"{where} failed: {type(exc).__name__}: {exc}"[:500])
        if not isinstance(found, list) or not all(isinstance(o, dict) for o in found):
            return _inconclusive(f"{where} returned {type(found).__name__}, not a list of objects")
        return found

    def _by_list(
        self,
        effect: Effect,
        objects: str,
        options: dict[str, Any],
        why: str,
        observed: dict[str, Any],
    ) -> ProbeResult:
        """Look for the object in Stripe's list of the objects created around the effect:
        from its creation less ``CREATED_SKEW_SECONDS`` (Stripe's clock and the ledger's
        differ; nothing the attempt made is older) to now plus the skew (a request still
        in flight when the attempt ended lands later)."""
        name = _NAMES[objects]
        method = f"list_{objects}"
        if not callable(getattr(self.client, method, None)):
            # A client with search only (the protocol's minimum): the search decides, and
            # within the idempotency window the backstop covers a lagging index.
            observed["read"] = "search"
            return self._miss(
                effect, f"{why} (not checked on a list: the client has no {method}())", observed
            )
        gte = math.floor(effect.created_at - CREATED_SKEW_SECONDS)
        lte = math.ceil(self.now() + CREATED_SKEW_SECONDS)
        where = f"the {name}s created between {gte} and {lte} (Stripe's list API)"
        found = self._read(where, method, gte, lte, **options)
        if isinstance(found, ProbeResult):
            return found
        observed.update(read="list", created_gte=gte, created_lte=lte)
        hit = self._match(effect, name, where, found, observed, listed=True)
        if hit is not None:
            return dataclasses.replace(hit, detail=f"{hit.detail}; {why}, found on {where}")
        return self._miss(effect, f"{why}; {where} holds none either", observed)

    def _match(
        self,
        effect: Effect,
        name: str,
        where: str,
        found: list[dict[str, Any]],
        observed: dict[str, Any],
        *,
        listed: bool,
    ) -> ProbeResult | None:
        """What the objects read say: HAPPENED, INCONCLUSIVE, or None for a clean miss."""
        key = effect.provider_key
        # The read asked for this key; anything not stamped with it is, for a search, a
        # wrapper or a query gone wrong, and if it returned only such objects the read is
        # suspect. A list returns every object of the window (or refund of the charge).
        mine = [o for o in found if _metadata(o).get(PROVIDER_KEY_FIELD) == key]
        ignored = len(found) - len(mine)
        observed.update(matches=len(mine), ignored_unrelated=ignored)
        if not mine and ignored and not listed:
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
        return None

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

    def _miss(self, effect: Effect, detail: str, observed: dict[str, Any]) -> ProbeResult:
        """A miss on a read that has had time to see the object. Within Stripe's
        idempotency window it is NOT_HAPPENED: a re-send with the same key cannot charge
        twice. Past it nothing backs a miss up (a handler that forgot the stamp, an object
        the read cannot see): a person decides."""
        key = effect.provider_key
        # The key was first sent no earlier than the effect was created, so measuring its
        # age from created_at never overstates how long Stripe still remembers it.
        key_age = self.now() - effect.created_at
        window = self.idempotency_window_seconds
        if key_age < window:
            observed["idempotency_backstop"] = True
            return ProbeResult(
                ProbeOutcome.NOT_HAPPENED,
                detail=(
                    f"{detail}. Backstop: Stripe deduplicates Idempotency-Key {key} for"
                    f" {window:g}s after its first use and the key is at most {key_age:.0f}s"
                    f" old, so a re-send with it in the next {window - key_age:.0f}s returns"
                    " the original result instead of charging twice"
                ),
                provider_reference=key,
                observed=observed,
            )
        observed["idempotency_backstop"] = False
        return _inconclusive(
            f"{detail}. The key is {key_age:.0f}s old, past Stripe's {window:g}s idempotency"
            " window: a re-send would be a new request, so a miss is not enough to re-arm it;"
            f" a person should check Stripe for provider key {key}",
            observed,
        )

    def verify(self, effect: Effect, receipt: Any) -> ProbeResult:
        """Is ``receipt`` (``{"stripe_id": ...}``, offered by a person) this effect's?

        Retrieves the object it names, read where the tool creates objects (``re_`` a
        Refund, ``pi_`` a PaymentIntent, ``ch_``/``py_`` a Charge), and answers HAPPENED,
        with the receipt Stripe's own values make, only when its metadata carries this
        effect's provider key (and its effect id, if it has one). Anything else is
        INCONCLUSIVE with the reason: another kind of object, no stamp, another effect's
        stamp, an id Stripe does not have, or Stripe could not be asked. Never raises for
        Stripe's failures; sends nothing for an id that cannot be the tool's object."""
        objects = self.objects_for(effect.tool)
        name = _NAMES[objects]
        stripe_id = receipt.get("stripe_id") if isinstance(receipt, dict) else None
        if not isinstance(stripe_id, str) or not stripe_id:
            return _inconclusive("the receipt has no stripe_id naming a Stripe object")
        if not _STRIPE_ID.fullmatch(stripe_id):
            return _inconclusive(f"{stripe_id[:64]!r} is not a Stripe object id")
        kind = next((o for o, prefixes in ID_PREFIXES.items() if stripe_id.startswith(prefixes)),
                    None)  # fmt: skip
        if kind is None:
            return _inconclusive(
                f"{stripe_id} is not an id of a {name} ({', '.join(ID_PREFIXES[objects])}...),"
                f" what {effect.tool} creates"
            )
        if kind != objects:
            return _inconclusive(
                f"{stripe_id} is a {_NAMES[kind]}, but {effect.tool} creates {name}s:"
                " the receipt names another kind of object"
            )
        options, problem = self._options(effect)
        if problem:
            return _inconclusive(problem)
        try:
            obj = _call(self.client, "retrieve", objects, stripe_id, **options)
        except StripeReadError as exc:
            if exc.status == 404:
                return _inconclusive(f"Stripe has no {name} {stripe_id} (404): {exc.detail}")
            return _could_not_ask(name, stripe_id, exc)
        except ProbeError as exc:
            return _could_not_ask(name, stripe_id, exc)
        except OSError as exc:
            return _could_not_ask(name, stripe_id, transport_error(PROVIDER, exc, "retrieve"))
        if not isinstance(obj, dict) or obj.get("id") != stripe_id:
            return _inconclusive(f"Stripe's answer for {stripe_id} is not that {name}")
        metadata = _metadata(obj)
        key = metadata.get(PROVIDER_KEY_FIELD)
        observed = {"objects": objects, "read": "retrieve"}
        if key is None:
            return _inconclusive(
                f"{name} {stripe_id} carries no {PROVIDER_KEY_FIELD}: nothing ties it to"
                f" this effect (provider key {effect.provider_key})",
                observed,
            )
        if key != effect.provider_key:
            return _inconclusive(
                f"{name} {stripe_id} carries provider key {key!r}, not this effect's"
                f" {effect.provider_key}: another call's object",
                observed,
            )
        other = metadata.get(EFFECT_ID_FIELD)
        if other not in (None, effect.id):
            return _inconclusive(
                f"{name} {stripe_id} carries effect id {other!r}, not {effect.id}: wrong identity",
                observed,
            )
        return self._found(effect, obj, name, observed)


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
    max_list_pages = 10  # of a created window: more is a person's look, not a guess
    list_page_size = 100

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
        # The budget is this key's at this API (and Connect account): its limiter is named
        # by a digest of them, never the key itself (names show up in Redis and logs).
        self.account = _budget_account(self.base_url, api_key, stripe_account)
        self.limiter = limiter or shared_limiter(
            PROVIDER, requests_per_second, account=self.account
        )
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

    def list_payment_intents(
        self, created_gte: int, created_lte: int, *, stripe_account: str | None = None
    ) -> list[dict[str, Any]]:
        return self._created_between("payment_intents", created_gte, created_lte, stripe_account)

    def list_charges(
        self, created_gte: int, created_lte: int, *, stripe_account: str | None = None
    ) -> list[dict[str, Any]]:
        return self._created_between("charges", created_gte, created_lte, stripe_account)

    def retrieve(
        self, objects: str, stripe_id: str, *, stripe_account: str | None = None
    ) -> dict[str, Any]:
        """One object by id: ``GET /v1/{objects}/{stripe_id}``."""
        if objects not in OBJECTS or not _STRIPE_ID.fullmatch(stripe_id):
            raise ValueError(f"cannot retrieve {objects!r} {stripe_id!r}")
        return self._get(
            f"/v1/{objects}/{stripe_id}", {}, stripe_account, f"retrieving {stripe_id}"
        )

    def _created_between(
        self, objects: str, gte: int, lte: int, stripe_account: str | None
    ) -> list[dict[str, Any]]:
        """Every object created in [gte, lte], newest first, paged through."""
        params: dict[str, Any] = {
            "created[gte]": int(gte), "created[lte]": int(lte), "limit": self.list_page_size,
        }  # fmt: skip
        found: list[dict[str, Any]] = []
        for _ in range(self.max_list_pages):
            body = self._get(f"/v1/{objects}", params, stripe_account, f"listing {objects}")
            page = _data(body, f"{objects} list")
            found.extend(page)
            if body.get("has_more") is not True:
                return found
            last = page[-1].get("id") if page else None
            if not isinstance(last, str):
                raise StripeReadError(
                    f"the {objects} list says has_more but its last item has no id"
                )
            params["starting_after"] = last
        raise StripeReadError(
            f"more than {self.max_list_pages * self.list_page_size} {objects} created between"
            f" {gte} and {lte}; look by hand"
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
        if _search_unavailable(status, message):
            return StripeSearchUnavailableError(detail, status=status)
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


def _budget_account(base_url: str, api_key: str, stripe_account: str | None) -> str:
    """The name of one key's rate budget: the same in every process, and no use to anyone
    who reads it (a truncated SHA-256 of the API base, the key and the Connect account)."""
    text = f"{base_url}\n{api_key}\n{stripe_account or ''}"
    return "key-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _search_literal(value: str) -> str:
    """A value for a quoted Stripe search clause: backslash escapes quotes."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _inconclusive(
    detail: str, observed: dict[str, Any] | None = None, *, retry_after: float | None = None
) -> ProbeResult:
    return ProbeResult(
        ProbeOutcome.INCONCLUSIVE, detail=detail, observed=observed or {}, retry_after=retry_after
    )


def _could_not_ask(name: str, stripe_id: str, exc: ProbeError) -> ProbeResult:
    """verify() answers a person: Stripe's failure is said, not raised."""
    observed: dict[str, Any] = {"probe_error": True, "provider": PROVIDER}
    if exc.status is not None:
        observed["status"] = exc.status
    if isinstance(exc, ProbeTransientError):
        observed["transient"] = True
    return _inconclusive(
        f"Stripe could not be asked for {name} {stripe_id}: {exc.detail}; try again later",
        observed,
    )
