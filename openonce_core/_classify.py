"""Which of the three failure classes an exception from a handler belongs to.

* ``FAILED``: the provider answered no (a business error). Recorded and replayed.
* ``RETRYABLE``: the call definitely did not happen (nothing was sent). Run again.
* ``UNKNOWN``: the call may have happened (the request may have left). Park it.

The rule, in the order it is applied:

1. **Explicit raises win.** ``RetryableEffectError`` is RETRYABLE, ``UnknownOutcomeError``
   UNKNOWN, ``BusinessError`` FAILED, whatever else they inherit or wrap. An interruption
   that is not an ``Exception`` (cancellation, ``KeyboardInterrupt``) is UNKNOWN: the
   request may be out already.
2. **The chain is read, outermost first**: the exception, then its ``__cause__``, else its
   ``__context__`` unless ``__suppress_context__`` (``raise ... from None``), guarded
   against cycles (the walk stops) and chains longer than ``MAX_CHAIN`` links (UNKNOWN).
   The first link that decides, decides. For each link the classes of its MRO are looked
   at, most specific first, by name qualified with their package
   (``requests.ConnectionError`` is not ``builtins.ConnectionError``):

   * your declarations first, class by class: ``Classifier(business=...)`` (FAILED), then
     the ``retryable`` and ``unknown`` name sets (so a built-in rule for a more specific
     class still beats a broad declaration such as ``business=(stripe.StripeError,)``);
     a business declaration never hides "may have run": when the rules without it place
     the exception UNKNOWN (a read timeout, a lost connection, a 409 or a 5xx, even of a
     declared class), it is UNKNOWN. A tool's own ``@oo.effect(business_errors=...)``
     are declarations of the same kind, for that tool's calls only;
   * connect-phase errors (refused, DNS, connect timeout, no pooled connection, a URL the
     client would not send to) are RETRYABLE: nothing reached the provider;
   * read-phase timeouts, resets and lost replies are UNKNOWN;
   * SDK errors that carry the provider's answer are decided by its status: Stripe's
     ``http_status``, openai/anthropic ``APIStatusError.status_code``, httpx/requests
     ``.response.status_code``, aiohttp ``.status``, ``urllib.error.HTTPError.code``,
     botocore ``ClientError``'s ``ResponseMetadata.HTTPStatusCode`` and ``Error.Code``,
     google-api-core's ``grpc_status_code`` or ``code``, ``grpc.RpcError.code()``:

     ====================================  ==========  ===================================
     answer                                class       why
     ====================================  ==========  ===================================
     4xx (400-499 not listed below)        FAILED      the provider answered no
     408, 425, 429; 403 with Retry-After   RETRYABLE   the provider did not process it
     or ``X-RateLimit-Remaining: 0``                   (a timeout waiting for the request,
                                                       too early, a rate limit)
     409                                   UNKNOWN     a conflict with another request,
                                                       perhaps this one still in flight
                                                       (Stripe: the same idempotency key;
                                                       the openai and anthropic SDKs
                                                       retry it as a lock timeout)
     5xx, 2xx/3xx on an error, Stripe 424  UNKNOWN     the call may have run
     Stripe ``IdempotencyError`` (400,     UNKNOWN     proof that a request with this
     ``idempotency_error``); a 422 whose               key ran or is running; the thing
     JSON body says "already exists"                   exists, perhaps made by an earlier
     (GitHub's "A pull request already                 attempt: evidence it happened,
     exists for ...", code                             never "the provider said no" (a
     ``already_exists``)                               business declaration cannot make
                                                       it FAILED)
     AWS throttling codes (``Throttling``, RETRYABLE   throttled requests are rejected
     ``SlowDown``, ...); S3                            before they run; an S3
     ``RequestTimeout``                                ``RequestTimeout`` never got the
                                                       whole body
     AWS ``TransactionInProgress           UNKNOWN     the same transaction is running
     Exception``
     gRPC INVALID_ARGUMENT, NOT_FOUND,     FAILED      the server refused it
     PERMISSION_DENIED, UNAUTHENTICATED,
     FAILED_PRECONDITION, OUT_OF_RANGE,
     UNIMPLEMENTED
     gRPC RESOURCE_EXHAUSTED, ABORTED      RETRYABLE   rejected (quota) or rolled back
     gRPC DEADLINE_EXCEEDED, UNAVAILABLE,  UNKNOWN     the call may have executed
     CANCELLED, INTERNAL, UNKNOWN,
     DATA_LOSS, ALREADY_EXISTS
     ====================================  ==========  ===================================

   * wrappers (``stripe.APIConnectionError``, openai's and anthropic's
     ``APIConnectionError``/``APITimeoutError``, ``requests.ConnectionError``, urllib3's
     ``MaxRetryError``, ``urllib.error.URLError``, botocore's ``HTTPClientError``, ...)
     defer to what they wrap; when nothing they wrap decides they are UNKNOWN, except
     botocore's ``ConnectionError`` family, documented as "failed to establish a
     connection", which is RETRYABLE. google-api-core's ``RetryError`` is UNKNOWN outright:
     several attempts ran and only the last one is visible.

   Three things make a RETRYABLE or FAILED found down the chain untrustworthy, and it is
   recorded as UNKNOWN instead: reaching it through the implicit ``__context__`` of an
   exception no rule places (a later call, made while handling the first error, may have
   left); an SDK's own retries (openai/anthropic ``x-stainless-retry-count``, botocore
   ``RetryAttempts``): an earlier attempt may have run, so turn the SDK's retries off inside
   an effect, or let the provider's idempotency key cover them; and an exception group
   (``asyncio.TaskGroup``, anyio, trio): when one call fails the group cancels the others
   and does not list them, though they may have been sent.
3. **Nothing placed: UNKNOWN**, because the request may have left. A handler says
   "business error" by raising ``BusinessError`` (or a subclass), or the application
   declares its own classes: ``Classifier(business=(MyDeclined, "billing.Refused"))``.
   ``Classifier(default=FailureClass.FAILED)`` restores the old "anything else is a
   business error" default; it is unsafe: a reply lost in a way no rule knows is then
   replayed forever as "the provider said no" and never probed.

``Classifier.explain(exc)`` returns the class and a reason that names the deciding link
and rule, e.g. ``"stripe.APIConnectionError from requests.exceptions.ReadTimeout: read
timeout or lost reply, the request may have been processed"``. The reason names classes,
statuses and provider error codes only, never an exception's message, so no secret in a
message reaches the journal through it.

OpenOnce imports none of these SDKs: classes are recognised by qualified name and their
attributes are read duck-typed, so the core stays stdlib-only.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from .errors import BusinessError, RetryableEffectError, UnknownOutcomeError


class FailureClass(StrEnum):
    FAILED = "failed"
    RETRYABLE = "retryable"
    UNKNOWN = "unknown"


FAILED = FailureClass.FAILED
RETRYABLE = FailureClass.RETRYABLE
UNKNOWN = FailureClass.UNKNOWN

# Links followed down one chain. Real SDK chains are 2-5 deep; past this, UNKNOWN.
MAX_CHAIN = 32

# httpx and httpx2 (the fork openai and anthropic use), and the httpcore under each, share
# one exception tree.
_HTTPX = ("httpx", "httpx2", "httpcore", "httpcore2")

# Nothing reached the provider: no connection, no free pooled slot, or a request the
# client refused to send at all.
DEFAULT_RETRYABLE = frozenset(
    {
        "builtins.ConnectionRefusedError",
        "socket.gaierror",  # DNS failure
        "ssl.SSLCertVerificationError",  # the handshake failed; no request was written
        "requests.exceptions.ConnectTimeout",
        "requests.exceptions.InvalidURL",
        "requests.exceptions.MissingSchema",
        "requests.exceptions.InvalidSchema",
        "urllib3.exceptions.ConnectTimeoutError",
        "urllib3.exceptions.NewConnectionError",
        "urllib3.exceptions.NameResolutionError",
        "urllib3.exceptions.EmptyPoolError",
        "urllib3.exceptions.ClosedPoolError",
        "urllib3.exceptions.LocationValueError",
        "aiohttp.ClientConnectorError",  # also DNS, proxy-connect and TLS-handshake failures
        "aiohttp.ConnectionTimeoutError",  # aiohttp >= 3.10: the connect phase timed out
        "aiohttp.InvalidURL",
        *(f"{lib}.{name}" for lib in _HTTPX for name in ("ConnectTimeout", "ConnectError")),
        *(f"{lib}.{name}" for lib in _HTTPX for name in ("PoolTimeout", "UnsupportedProtocol")),
        "botocore.exceptions.EndpointConnectionError",
        "botocore.exceptions.ConnectTimeoutError",
    }
)

# The request may have been sent: the reply was lost, cut off or late.
DEFAULT_UNKNOWN = frozenset(
    {
        "builtins.TimeoutError",  # also socket.timeout and asyncio.TimeoutError
        "builtins.ConnectionError",  # on its own, ambiguous
        "builtins.ConnectionResetError",
        "builtins.ConnectionAbortedError",
        "builtins.BrokenPipeError",
        "http.client.RemoteDisconnected",
        "http.client.IncompleteRead",
        "http.client.BadStatusLine",
        "ssl.SSLError",  # mid-stream, or a handshake error other than verification
        "requests.exceptions.Timeout",
        "requests.exceptions.ReadTimeout",
        "requests.exceptions.ChunkedEncodingError",  # the body was cut off after sending
        "requests.exceptions.ContentDecodingError",
        "requests.exceptions.RetryError",  # urllib3 retried on statuses: several attempts
        "urllib3.exceptions.TimeoutError",
        "urllib3.exceptions.ReadTimeoutError",
        "urllib3.exceptions.ProtocolError",  # "Connection aborted." once connected
        "urllib3.exceptions.IncompleteRead",
        "urllib3.exceptions.InvalidChunkLength",
        "urllib3.exceptions.ResponseError",
        *(
            f"{lib}.{name}"
            for lib in _HTTPX
            for name in (
                "TimeoutException",
                "ReadTimeout",
                "WriteTimeout",  # part of the body may have been sent
                "NetworkError",
                "ReadError",
                "WriteError",
                "CloseError",
                "ProtocolError",
                "RemoteProtocolError",
                "LocalProtocolError",
                "ProxyError",
            )
        ),
        "aiohttp.ClientConnectionError",
        "aiohttp.ClientOSError",  # reset while reading; connect failures are a subclass
        "aiohttp.ServerConnectionError",
        "aiohttp.ServerDisconnectedError",
        "aiohttp.ServerTimeoutError",
        "aiohttp.SocketTimeoutError",  # aiohttp >= 3.10: the read phase timed out
        "aiohttp.ClientPayloadError",
        "botocore.exceptions.ReadTimeoutError",
        "botocore.exceptions.ConnectionClosedError",
        "botocore.exceptions.ResponseStreamingError",
        "botocore.exceptions.IncompleteReadError",
    }
)

_CONNECT_PHASE = "connect-phase error, nothing reached the provider"
_READ_PHASE = "read timeout or lost reply, the request may have been processed"


@dataclass(frozen=True)
class _Verdict:
    kind: FailureClass
    rule: str
    declared: bool = False  # a business declaration decided it
    placed: bool = True  # False: no rule placed it, the default did


@dataclass(frozen=True)
class _Wrapper:
    """An SDK class that wraps the transport error it caught."""

    fallback: FailureClass
    rule: str  # why ``fallback`` holds when nothing it wraps decides
    inner: str | None = None  # attribute holding the wrapped error, besides the chain


_Reader = Callable[[BaseException], _Verdict | None]


# -- reading the provider's answer ------------------------------------------------------------


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    value = headers.get(name) if hasattr(headers, "get") else None
    if value is None and isinstance(headers, Mapping):
        # A plain dict keeps the server's spelling; header names are case-insensitive.
        value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    return None if value is None else str(value)


def _by_status(status: Any, headers: Any = None, who: str = "HTTP") -> _Verdict | None:
    if isinstance(status, bool) or not isinstance(status, int):
        return None
    if status in (408, 425, 429):
        return _Verdict(RETRYABLE, f"{who} {status}, the provider did not process the request")
    if status == 403 and (
        _header(headers, "retry-after") is not None
        or _header(headers, "x-ratelimit-remaining") == "0"
    ):
        return _Verdict(RETRYABLE, f"{who} 403 rate limit, the provider did not process it")
    if status == 409:
        return _Verdict(
            UNKNOWN, f"{who} 409 conflict with another request, perhaps this one in flight"
        )
    if 400 <= status < 500:
        return _Verdict(FAILED, f"{who} {status}, the provider answered no")
    if 500 <= status < 600:
        return _Verdict(UNKNOWN, f"{who} {status} server error, the call may have run")
    return _Verdict(UNKNOWN, f"{who} {status} on an error, the call may have run")


def _stripe(exc: BaseException) -> _Verdict | None:
    status = getattr(exc, "http_status", None)
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "RateLimitError" in names:
        # Also raised for HTTP 400 with code "rate_limit" (and 429 lock_timeout): Stripe's
        # rate limiter runs before its idempotency layer, so nothing ran.
        return _Verdict(RETRYABLE, f"Stripe rate limit (HTTP {status}), nothing ran")
    if status is None and "AuthenticationError" in names:
        return _Verdict(RETRYABLE, "Stripe refused to send without an API key")
    if status == 424:
        return _Verdict(UNKNOWN, "Stripe 424, a dependency outside Stripe failed mid-call")
    if "IdempotencyError" in names or _stripe_error_type(exc) == "idempotency_error":
        return _Verdict(UNKNOWN, _ALREADY_RAN.format(who=f"Stripe {status} idempotency_error"))
    return _by_status(status, getattr(exc, "headers", None), "Stripe")


def _stripe_error_type(exc: BaseException) -> Any:
    body = getattr(exc, "json_body", None)
    error = body.get("error") if isinstance(body, Mapping) else None
    return error.get("type") if isinstance(error, Mapping) else None


# The provider says it has this already: evidence that the call (an earlier attempt of it,
# or one still running) happened, never "the provider said no" (invariant 8).
_RAN = "a request with this key already ran or is running"
_EXISTS = "says the resource already exists"
_ALREADY_RAN = "{who}, " + _RAN + ": it may have happened"
_ALREADY_EXISTS = "{who} " + _EXISTS + ": an earlier attempt may have made it"


def provider_had_it(why: str) -> bool:
    """Whether a classification's reason (``explain``'s second half, kept as the call's
    ``error["why"]``) says the provider reported it has this already. A miss after that
    is no evidence the call did not happen (reconcile.py sends it to a person)."""
    return _RAN in why or _EXISTS in why


# Read no more of an error body than this when looking for "already exists".
_MAX_BODY = 64 * 1024


def _already_exists(body: Any) -> bool:
    """A validation error (GitHub's 422 shape) saying the thing already exists: a top-level
    ``message`` ("Reference already exists"), or an entry of ``errors`` with the code
    ``already_exists`` or a message such as "A pull request already exists for o:b."."""
    if not isinstance(body, Mapping):
        return False
    entries = body.get("errors")
    entries = list(entries) if isinstance(entries, (list, tuple)) else []
    for entry in [body, *entries]:
        if isinstance(entry, str):
            entry = {"message": entry}
        if not isinstance(entry, Mapping):
            continue
        if entry.get("code") == "already_exists":
            return True
        message = entry.get("message")
        if isinstance(message, str) and "already exists" in message.lower():
            return True
    return False


def _response_body(exc: BaseException, response: Any) -> Any:
    """The error's JSON body, when it is already in memory (nothing is read off the wire)."""
    body = getattr(exc, "body", None)  # openai/anthropic parse it
    if isinstance(body, Mapping):
        return body
    if response is None:
        return None
    if getattr(response, "_content", None) is False:
        return None  # requests, streamed and not read: reading it could block
    try:
        content = response.content  # httpx raises ResponseNotRead rather than read
    except Exception:
        return None
    if not isinstance(content, (bytes, bytearray)) or len(content) > _MAX_BODY:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return None


def _response_status(exc: BaseException) -> _Verdict | None:
    """openai/anthropic ``APIStatusError``, httpx ``HTTPStatusError``, ``requests.HTTPError``."""
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if status is None and response is not None:
        status = getattr(response, "status_code", None)
    if status == 422 and _already_exists(_response_body(exc, response)):
        return _Verdict(UNKNOWN, _ALREADY_EXISTS.format(who="HTTP 422"))
    return _by_status(status, getattr(response, "headers", None))


def _aiohttp(exc: BaseException) -> _Verdict | None:
    return _by_status(getattr(exc, "status", None), getattr(exc, "headers", None))


def _urllib(exc: BaseException) -> _Verdict | None:
    return _by_status(getattr(exc, "code", None), getattr(exc, "headers", None))


# botocore's own list of throttling codes (botocore.retries.standard), minus the two that
# mean "another request is still running", which follow.
_AWS_THROTTLED = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",  # Route 53 rejected this one while a prior change runs
        "EC2ThrottledException",
    }
)


def _botocore(exc: BaseException) -> _Verdict | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return None
    error = response.get("Error") or {}
    meta = response.get("ResponseMetadata") or {}
    code = error.get("Code") if isinstance(error, Mapping) else None
    status = meta.get("HTTPStatusCode") if isinstance(meta, Mapping) else None
    if code == "TransactionInProgressException":
        return _Verdict(UNKNOWN, f"AWS {code}, the same transaction is still running")
    if code in _AWS_THROTTLED:
        return _Verdict(RETRYABLE, f"AWS {code} (HTTP {status}), throttled before it ran")
    if code == "RequestTimeout":
        return _Verdict(RETRYABLE, "AWS RequestTimeout, the service never got the whole request")
    headers = meta.get("HTTPHeaders") if isinstance(meta, Mapping) else None
    verdict = _by_status(status, headers, "AWS")
    if verdict is not None and code:
        verdict = _Verdict(verdict.kind, f"{verdict.rule} ({code})")
    return verdict


_GRPC = {
    "INVALID_ARGUMENT": FAILED,
    "NOT_FOUND": FAILED,
    "PERMISSION_DENIED": FAILED,
    "UNAUTHENTICATED": FAILED,
    "FAILED_PRECONDITION": FAILED,
    "OUT_OF_RANGE": FAILED,
    "UNIMPLEMENTED": FAILED,
    "RESOURCE_EXHAUSTED": RETRYABLE,  # quota or rate limit: rejected before it ran
    "ABORTED": RETRYABLE,  # a concurrency conflict aborted it: it did not take effect
    "DEADLINE_EXCEEDED": UNKNOWN,  # "may be returned even if the operation has completed"
    "UNAVAILABLE": UNKNOWN,
    "CANCELLED": UNKNOWN,
    "INTERNAL": UNKNOWN,
    "UNKNOWN": UNKNOWN,
    "DATA_LOSS": UNKNOWN,
    "ALREADY_EXISTS": UNKNOWN,  # perhaps created by this very call's earlier attempt
}
# grpc.StatusCode values are (int, str) pairs; google-api-core may also hold a bare int.
_GRPC_NUMBERED = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
_GRPC_BY_NUMBER = dict(enumerate(_GRPC_NUMBERED))


def _by_grpc_code(code: Any) -> _Verdict | None:
    name = getattr(code, "name", None)
    if name is None and isinstance(code, int) and not isinstance(code, bool):
        name = _GRPC_BY_NUMBER.get(code)
    kind = _GRPC.get(str(name)) if name is not None else None
    if kind is None:
        return None
    why = {
        FAILED: "the server refused it",
        RETRYABLE: "rejected before it took effect",
        UNKNOWN: "the call may have executed",
    }[kind]
    return _Verdict(kind, f"gRPC {name}, {why}")


def _grpc(exc: BaseException) -> _Verdict | None:
    code = getattr(exc, "code", None)
    return _by_grpc_code(code()) if callable(code) else None


def _google(exc: BaseException) -> _Verdict | None:
    verdict = _by_grpc_code(getattr(exc, "grpc_status_code", None))
    return verdict or _by_status(getattr(exc, "code", None), None, "Google API")


# Built-in rules for classes that need more than a name: readers of the provider's answer,
# and wrappers. Keys are qualified names, matched like the name sets.
_RULES: dict[str, _Reader | _Wrapper | _Verdict] = {
    "stripe.StripeError": _stripe,
    "stripe.APIConnectionError": _Wrapper(UNKNOWN, "Stripe lost the connection mid-call"),
    "openai.APIStatusError": _response_status,
    "openai.APIResponseValidationError": _response_status,
    "openai.APIConnectionError": _Wrapper(UNKNOWN, "the connection failed mid-call"),
    "anthropic.APIStatusError": _response_status,
    "anthropic.APIResponseValidationError": _response_status,
    "anthropic.APIConnectionError": _Wrapper(UNKNOWN, "the connection failed mid-call"),
    **{f"{lib}.HTTPStatusError": _response_status for lib in _HTTPX},
    "requests.exceptions.HTTPError": _response_status,
    "requests.exceptions.ConnectionError": _Wrapper(UNKNOWN, "the connection failed mid-call"),
    "urllib3.exceptions.MaxRetryError": _Wrapper(UNKNOWN, "retries ran out", inner="reason"),
    "urllib3.exceptions.SSLError": _Wrapper(UNKNOWN, "a TLS error mid-call"),
    "urllib3.exceptions.ProxyError": _Wrapper(UNKNOWN, "the proxy failed mid-call"),
    "urllib.error.HTTPError": _urllib,
    "urllib.error.URLError": _Wrapper(UNKNOWN, "the connection failed mid-call", inner="reason"),
    "aiohttp.ClientResponseError": _aiohttp,
    "botocore.exceptions.ClientError": _botocore,
    "botocore.exceptions.HTTPClientError": _Wrapper(UNKNOWN, "the HTTP client failed mid-call"),
    "botocore.exceptions.ConnectionError": _Wrapper(
        RETRYABLE, "botocore failed to establish a connection"
    ),
    "google.api_core.exceptions.GoogleAPICallError": _google,
    "google.api_core.exceptions.RetryError": _Verdict(
        UNKNOWN, "google-api-core retried until its deadline; any attempt may have run"
    ),
    "grpc.RpcError": _grpc,
}


def _sdk_retries(exc: BaseException) -> int:
    """How many times the SDK itself retried before raising this (0 when it cannot tell)."""
    cls: type = type(exc)
    names = _mro_names(cls)
    try:
        count: Any = None
        if names & {"openai.APIError", "anthropic.APIError"}:
            # Both SDKs number each attempt in a request header they send.
            request = getattr(exc, "request", None)
            count = _header(getattr(request, "headers", None), "x-stainless-retry-count")
        elif "botocore.exceptions.ClientError" in names:
            response = getattr(exc, "response", None)
            meta = response.get("ResponseMetadata") if isinstance(response, Mapping) else None
            count = meta.get("RetryAttempts") if isinstance(meta, Mapping) else None
        return max(int(count), 0) if count is not None else 0
    except Exception:  # unreadable: no evidence of retries either way
        return 0


# -- names ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2048)
def _names(cls: type) -> frozenset[str]:
    """Every name a declaration may use for ``cls``: the bare name, and the name after any
    run of its module's dotted parts. ``requests.exceptions.ReadTimeout`` is also
    ``requests.ReadTimeout``; a vendored copy (``pip._vendor.requests.exceptions``,
    ``botocore.vendored.requests...``) is known by the same names as the original; a private
    module also goes without its underscore (``stripe._error.CardError`` is
    ``stripe.error.CardError`` and ``stripe.CardError``)."""
    qualname = cls.__qualname__
    names = {qualname}
    for module in {cls.__module__, cls.__module__.replace("._", ".")}:
        parts = module.split(".")
        for start in range(len(parts)):
            for end in range(start + 1, len(parts) + 1):
                names.add(".".join([*parts[start:end], qualname]))
    return frozenset(names)


@functools.lru_cache(maxsize=2048)
def _mro_names(cls: type) -> frozenset[str]:
    return frozenset(name for base in cls.__mro__ for name in _names(base))


def _display(cls: type) -> str:
    name = cls.__qualname__.rpartition("<locals>.")[2]  # a class defined in a function
    if cls.__module__ == "builtins":
        return name
    public = [p for p in cls.__module__.split(".") if not p.startswith("_")]
    return ".".join([*public, name])


def _declared(
    values: Iterable[type[BaseException] | str], argument: str
) -> tuple[frozenset[str], tuple[type, ...]]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(
            f"Classifier({argument}=...) takes a collection of exception classes or qualified"
            f" names, not {values!r}; wrap a single one in a tuple"
        )
    names: set[str] = set()
    classes: list[type] = []
    for value in values:
        if isinstance(value, type) and issubclass(value, BaseException):
            classes.append(value)
        elif isinstance(value, str) and value.strip(". ") == value and value:
            names.add(value)
        else:
            raise TypeError(
                f"Classifier({argument}=...): {value!r} is neither an exception class nor a"
                " qualified name such as 'billing.CardDeclined'"
            )
    return frozenset(names), tuple(classes)


# -- the classifier ---------------------------------------------------------------------------


@dataclass
class _Walk:
    """One chain being read: where it went, and why a definite answer may not be trusted."""

    seen: set[int]
    doubt: str | None = None
    business: tuple[type, ...] = ()  # one call's own business errors, besides the classifier's
    ignore_business: bool = False  # read the chain as if nothing were declared a business error


class Classifier:
    """Maps an exception from a handler to a FailureClass; see the module docstring.

    ``retryable`` and ``unknown`` are name sets (bare names match any module, qualified
    ones only that package); passing one replaces its defaults, so extend them with
    ``DEFAULT_RETRYABLE | {...}``. ``business`` declares the application's business
    errors, as classes or qualified names. ``default`` is what an exception nothing places
    becomes: UNKNOWN, or FAILED deliberately (unsafe).
    """

    def __init__(
        self,
        retryable: Iterable[type[BaseException] | str] = DEFAULT_RETRYABLE,
        unknown: Iterable[type[BaseException] | str] = DEFAULT_UNKNOWN,
        *,
        business: Iterable[type[BaseException] | str] = (),
        default: FailureClass | str = FailureClass.UNKNOWN,
    ) -> None:
        try:
            chosen = FailureClass(default)
        except ValueError:
            chosen = None
        if chosen not in (UNKNOWN, FAILED):
            raise ValueError(
                f"Classifier(default={default!r}): the default must be 'unknown' (safe) or"
                " 'failed' (unsafe); a retryable default would re-run calls that may have"
                " happened"
            )
        self.default: FailureClass = chosen
        self.retryable, self._retryable_classes = _declared(retryable, "retryable")
        self.unknown, self._unknown_classes = _declared(unknown, "unknown")
        self.business, self._business_classes = _declared(business, "business")

    def classify(self, exc: BaseException) -> FailureClass:
        return self.explain(exc)[0]

    def explain(
        self, exc: BaseException, business: Iterable[type[BaseException]] = ()
    ) -> tuple[FailureClass, str]:
        """The class, and the reason: the deciding link and the rule it met. ``business``
        adds one tool's own business errors (``@oo.effect(business_errors=...)``) to the
        classifier's, with the same meaning."""
        verdict = self._decide(exc, _Walk(seen=set(), business=tuple(business)), outermost=True)
        if verdict.declared:
            # "The provider said no" is the application's word; "the request may have been
            # processed" is what the rules know (invariant 8): the known doubt wins.
            known = self._decide(exc, _Walk(seen=set(), ignore_business=True), outermost=True)
            if known.kind is UNKNOWN and known.placed:
                return UNKNOWN, f"{known.rule} (declared a business error, but it may have run)"
        return verdict.kind, verdict.rule

    # -- the walk -----------------------------------------------------------------------------

    def _decide(self, exc: BaseException, walk: _Walk, outermost: bool) -> _Verdict:
        path: list[str] = []
        fallback: _Verdict | None = None
        link: BaseException | None = exc
        edge = ""
        while link is not None:
            if id(link) in walk.seen:
                break  # a cycle: nothing new below
            if len(walk.seen) >= MAX_CHAIN:
                # Longer than any SDK builds; what decides may lie below, unread.
                where = " ".join(path)
                return _Verdict(UNKNOWN, f"{where}: not read past {MAX_CHAIN} links")
            walk.seen.add(id(link))
            path.append(edge + _display(type(link)))
            retries = _sdk_retries(link)
            if retries and walk.doubt is None:
                walk.doubt = f"after {retries} retries by the SDK an earlier attempt may have run"
            step = self._place(link, walk, outermost and not path[1:])
            where = " ".join(path)
            if isinstance(step, _Verdict):
                return self._trusted(step, where, walk)
            if isinstance(step, _Wrapper):
                if fallback is None:
                    fallback = self._trusted(_Verdict(step.fallback, step.rule), where, walk)
                inner = getattr(link, step.inner, None) if step.inner else None
                if link.__cause__ is not None:
                    link, edge = link.__cause__, "from "
                elif isinstance(inner, BaseException):
                    link, edge = inner, "from "
                elif not link.__suppress_context__:
                    # An SDK wrapper raised inside its except block: the context is what it
                    # wraps, not a later call.
                    link, edge = link.__context__, "from "
                else:
                    link = None
                continue
            if link.__cause__ is not None:
                link, edge = link.__cause__, "from "
            elif link.__context__ is not None and not link.__suppress_context__:
                if walk.doubt is None:
                    walk.doubt = (
                        f"{_display(type(link))} was raised while handling it, by code that"
                        " may have called out again"
                    )
                link, edge = link.__context__, "while handling "
            else:
                link = None
        if fallback is not None:
            return fallback
        where = " ".join(path) or _display(type(exc))
        if self.default is FAILED:
            return _Verdict(
                FAILED, f"{where}: placed by no rule; FAILED by the chosen default", placed=False
            )
        return _Verdict(
            UNKNOWN,
            f"{where}: placed by no rule, and the request may have left (raise BusinessError"
            " or declare Classifier(business=...) for a business error)",
            placed=False,
        )

    def _trusted(self, verdict: _Verdict, where: str, walk: _Walk) -> _Verdict:
        if verdict.kind is not UNKNOWN and walk.doubt is not None:
            return _Verdict(UNKNOWN, f"{where}: {verdict.rule}, but {walk.doubt}")
        return _Verdict(verdict.kind, f"{where}: {verdict.rule}", verdict.declared)

    def _place(
        self, exc: BaseException, walk: _Walk, outermost: bool
    ) -> _Verdict | _Wrapper | None:
        """What this one link says: a verdict, a wrapper to look through, or nothing."""
        by = "raised by the handler" if outermost else "raised inside"
        if isinstance(exc, RetryableEffectError):
            return _Verdict(RETRYABLE, f"RetryableEffectError {by}, it did not happen")
        if isinstance(exc, UnknownOutcomeError):
            return _Verdict(UNKNOWN, f"UnknownOutcomeError {by}, it may have happened")
        if isinstance(exc, BusinessError):
            return _Verdict(FAILED, f"BusinessError {by}, the provider said no")
        if isinstance(exc, BaseExceptionGroup):
            return self._group(exc, walk)
        if not isinstance(exc, Exception):
            return _Verdict(UNKNOWN, "interrupted mid-call, the request may be out already")
        for cls in type(exc).__mro__:
            names = _names(cls)
            if not walk.ignore_business and (
                cls in self._business_classes or cls in walk.business or names & self.business
            ):
                return _Verdict(FAILED, "declared a business error", declared=True)
            if cls in self._retryable_classes or names & self.retryable:
                why = _CONNECT_PHASE if names & DEFAULT_RETRYABLE else "declared retryable"
                return _Verdict(RETRYABLE, why)
            if cls in self._unknown_classes or names & self.unknown:
                why = _READ_PHASE if names & DEFAULT_UNKNOWN else "declared unknown"
                return _Verdict(UNKNOWN, why)
            rule = _rule(cls)
            if isinstance(rule, (_Verdict, _Wrapper)):
                return rule
            if rule is not None:
                try:
                    verdict = rule(exc)
                except Exception:  # a reader must never break classification: look further
                    verdict = None
                if verdict is not None:
                    return verdict
        return None

    def _group(self, group: BaseExceptionGroup[BaseException], walk: _Walk) -> _Verdict:
        """Calls run together (asyncio.TaskGroup, anyio, trio) failed together. When one
        fails the group cancels the others and lists only the failures, so a cancelled call
        that was already sent is invisible: a group is UNKNOWN whatever its members say. The
        reason names the member that tells most (one that may have happened, if any)."""
        verdicts = [
            # Each member is its own chain; the links above the group still end a cycle.
            self._decide(member, replace(walk, seen=set(walk.seen)), outermost=False)
            for member in group.exceptions
        ]
        for kind in (UNKNOWN, FAILED, RETRYABLE):
            for number, verdict in enumerate(verdicts, 1):
                if verdict.kind is kind:
                    rule = f"member {number} of {len(verdicts)}, {verdict.rule}"
                    if kind is not UNKNOWN:
                        rule += (
                            ", but a task group cancels the other calls, which may have been"
                            " sent, and does not list them"
                        )
                    return _Verdict(UNKNOWN, rule)
        return _Verdict(UNKNOWN, "an empty exception group")


@functools.lru_cache(maxsize=2048)
def _rule(cls: type) -> _Reader | _Wrapper | _Verdict | None:
    for name in _names(cls):
        rule = _RULES.get(name)
        if rule is not None:
            return rule
    return None
