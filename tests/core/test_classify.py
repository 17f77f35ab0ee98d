"""The classifier's rule, link by link, over real exception instances.

Each SDK error here is built the way that SDK builds it (the same constructor, the same
response objects, the same ``raise ... from``); tests/core/test_classify_real_sdks.py
provokes them from the real SDKs over real sockets instead.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.error

import aiohttp
import anthropic
import botocore.exceptions
import google.api_core.exceptions as google_exceptions
import grpc
import httpx
import httpx2
import openai
import pytest
import requests
import stripe
from stripe._api_requestor import _APIRequestor

from openonce_core import (
    BusinessError,
    Classifier,
    FailureClass,
    OpenOnce,
    OutcomeUnknownError,
    RetryableEffectError,
    UnknownOutcomeError,
)
from openonce_core._classify import DEFAULT_RETRYABLE, DEFAULT_UNKNOWN, MAX_CHAIN

FAILED = FailureClass.FAILED
RETRYABLE = FailureClass.RETRYABLE
UNKNOWN = FailureClass.UNKNOWN
READ_PHASE = "read timeout or lost reply, the request may have been processed"


def classify(exc: BaseException) -> FailureClass:
    return Classifier().classify(exc)


def reason(exc: BaseException) -> str:
    return Classifier().explain(exc)[1]


def raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` as Python leaves it after ``raise exc from cause`` (traceback and all)."""
    try:
        if cause is None:
            raise exc
        raise exc from cause
    except BaseException as caught:
        return caught


def while_handling(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` raised inside ``except`` of ``inner``: implicit ``__context__``."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 — the implicit chain is what is being tested
    except BaseException as caught:
        return caught


# -- SDK errors, built as the SDKs build them ----------------------------------------------


def stripe_error(status: int, error_type: str, code: str | None = None) -> stripe.StripeError:
    """What stripe's _APIRequestor.specific_v1_api_error makes of an error response."""
    body = {"error": {"type": error_type, "code": code, "message": "no", "param": None}}
    requestor = _APIRequestor._global_instance()
    return requestor.specific_v1_api_error("{}", status, body, {}, body["error"])


def openai_status(status: int, retries: int = 0, lib=openai) -> Exception:
    """What openai's (and anthropic's) _make_status_error makes of an httpx2.Response."""
    request = httpx2.Request(
        "POST", "http://127.0.0.1/v1/x", headers={"x-stainless-retry-count": str(retries)}
    )
    response = httpx2.Response(status, request=request, json={"error": {"message": "no"}})
    client_cls = lib.OpenAI if lib is openai else lib.Anthropic
    client = client_cls(api_key="x", base_url="http://127.0.0.1/v1")
    return client._make_status_error("no", body={"message": "no"}, response=response)


def botocore_error(code: str, status: int, retries: int = 0) -> Exception:
    response = {
        "Error": {"Code": code, "Message": "no"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}, "RetryAttempts": retries},
    }
    return botocore.exceptions.ClientError(response, "PutItem")


def http_response(lib, status: int, headers: dict[str, str] | None = None):
    request = lib.Request("POST", "http://127.0.0.1/charge")
    return lib.Response(status, request=request, headers=headers or {})


def requests_http_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    response = requests.Response()
    response.status_code = status
    response.headers.update(headers or {})
    response.url = "http://127.0.0.1/charge"
    try:
        response.raise_for_status()
    except requests.HTTPError as exc:
        return exc
    raise AssertionError("raise_for_status did not raise")


# -- 1. explicit raises win -------------------------------------------------------------------


def test_explicit_raises_win_over_what_they_inherit():
    class CheckedTimeout(RetryableEffectError, TimeoutError):
        pass

    class RefusedButMaybeSent(UnknownOutcomeError, ConnectionRefusedError):
        pass

    class Declined(BusinessError, TimeoutError):
        pass

    assert classify(CheckedTimeout()) is RETRYABLE
    assert classify(RefusedButMaybeSent()) is UNKNOWN
    assert classify(Declined()) is FAILED
    assert reason(Declined()).endswith(
        ".Declined: BusinessError raised by the handler, the provider said no"
    )


def test_explicit_raises_win_over_what_they_wrap():
    timeout = requests.ReadTimeout("read timed out")
    assert classify(raised(RetryableEffectError("checked: not sent"), timeout)) is RETRYABLE
    assert classify(raised(BusinessError("card declined"), timeout)) is FAILED
    refused = ConnectionRefusedError(111, "refused")
    assert classify(raised(UnknownOutcomeError("second hop may have sent it"), refused)) is UNKNOWN


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt(), asyncio.CancelledError(), SystemExit(1), GeneratorExit()],
    ids=lambda e: type(e).__name__,
)
def test_interruptions_mid_call_are_unknown(exc: BaseException):
    assert classify(exc) is UNKNOWN
    assert "interrupted mid-call" in reason(exc)


# -- 2. connect phase, read phase -------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError(111, "Connection refused"),
        socket.gaierror(-2, "Name or service not known"),
        requests.ConnectTimeout("connect timed out"),
        requests.exceptions.InvalidURL("no host"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.ConnectError("refused"),
        httpx.PoolTimeout("no free connection"),
        httpx2.ConnectError("refused"),
        aiohttp.ConnectionTimeoutError("connect timed out"),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1"),
        botocore.exceptions.ConnectTimeoutError(endpoint_url="http://127.0.0.1"),
    ],
    ids=lambda e: type(e).__module__ + "." + type(e).__qualname__,
)
def test_connect_phase_errors_are_retryable(exc: BaseException):
    assert classify(exc) is RETRYABLE
    assert "connect-phase error, nothing reached the provider" in reason(exc)


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("timed out"),
        ConnectionResetError(104, "reset by peer"),
        ConnectionAbortedError(103, "aborted"),
        BrokenPipeError(32, "broken pipe"),
        ConnectionError("ambiguous"),
        requests.ReadTimeout("read timed out"),
        requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead"),
        httpx.ReadTimeout("read timed out"),
        httpx.WriteTimeout("write timed out"),
        httpx.RemoteProtocolError("peer closed"),
        httpx2.ReadTimeout("read timed out"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.SocketTimeoutError("read timed out"),
        aiohttp.ClientOSError(104, "Connection reset by peer"),
        aiohttp.ClientPayloadError("cut off"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1"),
        botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1"),
    ],
    ids=lambda e: type(e).__module__ + "." + type(e).__qualname__,
)
def test_read_phase_timeouts_and_lost_replies_are_unknown(exc: BaseException):
    assert classify(exc) is UNKNOWN
    assert "read timeout or lost reply" in reason(exc)


def test_the_most_specific_class_decides():
    # requests.ConnectTimeout is also a ConnectionError and a Timeout (both unknown alone).
    assert requests.ConnectTimeout.__mro__.index(requests.ConnectionError) > 0
    assert classify(requests.ConnectTimeout()) is RETRYABLE
    # aiohttp's connect timeout is a ServerTimeoutError; its read timeout too.
    assert classify(aiohttp.ConnectionTimeoutError()) is RETRYABLE
    assert classify(aiohttp.ServerTimeoutError()) is UNKNOWN
    # botocore's ReadTimeoutError is also a (vendored) requests ConnectionError family member.
    assert classify(botocore.exceptions.ReadTimeoutError(endpoint_url="http://x")) is UNKNOWN


def test_vendored_copies_of_a_client_are_known_by_the_same_names():
    import botocore.vendored.requests.exceptions as botocore_requests
    import pip._vendor.requests.exceptions as pip_requests
    import pip._vendor.urllib3.exceptions as pip_urllib3

    assert classify(pip_requests.ConnectTimeout("connect")) is RETRYABLE
    assert classify(pip_requests.ReadTimeout("read")) is UNKNOWN
    assert classify(pip_urllib3.NewConnectionError(None, "refused")) is RETRYABLE
    assert classify(botocore_requests.ConnectTimeout("connect")) is RETRYABLE
    # A look-alike outside any client package is not taken for the client's class.
    look_alike = type("ConnectTimeout", (ConnectionError, TimeoutError), {"__module__": "app"})
    assert classify(look_alike("connect")) is UNKNOWN


def test_names_are_qualified_by_package():
    # builtins.ConnectionError alone is ambiguous (UNKNOWN); requests.ConnectionError is a
    # wrapper that defers to what it wraps: a refused connection underneath is RETRYABLE.
    refused = ConnectionRefusedError(111, "refused")
    assert classify(raised(requests.ConnectionError("failed"), refused)) is RETRYABLE
    assert classify(raised(ConnectionError("failed"), refused)) is UNKNOWN


# -- 2. answers with a status -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, FAILED),
        (401, FAILED),
        (402, FAILED),
        (403, FAILED),
        (404, FAILED),
        (422, FAILED),
        (408, RETRYABLE),
        (425, RETRYABLE),
        (429, RETRYABLE),
        (409, UNKNOWN),
        (500, UNKNOWN),
        (502, UNKNOWN),
        (503, UNKNOWN),
        (504, UNKNOWN),
        (529, UNKNOWN),
    ],
)
def test_http_status_table_holds_for_every_sdk(status: int, expected: FailureClass):
    errors = [
        openai_status(status),
        openai_status(status, lib=anthropic),
        httpx.HTTPStatusError("no", request=None, response=http_response(httpx, status)),  # type: ignore[arg-type]
        httpx2.HTTPStatusError("no", request=None, response=http_response(httpx2, status)),  # type: ignore[arg-type]
        requests_http_error(status),
        aiohttp.ClientResponseError(None, (), status=status, message="no"),
        urllib.error.HTTPError("http://127.0.0.1/charge", status, "no", {}, None),  # type: ignore[arg-type]
        google_exceptions.from_http_status(status, "no"),
    ]
    for exc in errors:
        assert (classify(exc), type(exc).__name__) == (expected, type(exc).__name__)
        if not isinstance(exc, google_exceptions.GoogleAPICallError):
            assert f" {status}" in reason(exc)  # google names the gRPC code when it has one


def test_stripe_errors_are_decided_by_their_http_status():
    declined = stripe_error(402, "card_error", "card_declined")
    assert type(declined) is stripe.CardError
    assert Classifier().explain(declined) == (
        FAILED,
        "stripe.CardError: Stripe 402, the provider answered no",
    )
    assert classify(stripe_error(400, "invalid_request_error", "parameter_missing")) is FAILED
    # The key already ran (or is running) at Stripe: evidence it happened (issue 18).
    assert classify(stripe_error(400, "idempotency_error")) is UNKNOWN
    assert classify(stripe_error(401, "invalid_request_error")) is FAILED
    assert classify(stripe_error(500, "api_error")) is UNKNOWN


def test_stripe_rate_limits_are_retryable_also_as_400():
    # Stripe's rate limiter runs before its idempotency layer: nothing ran. Older API
    # versions send it as 400 with code rate_limit; the SDK raises RateLimitError for both.
    for status, code in ((429, "rate_limit"), (400, "rate_limit"), (429, "lock_timeout")):
        exc = stripe_error(status, "invalid_request_error", code)
        assert type(exc) is stripe.RateLimitError
        assert classify(exc) is RETRYABLE


def test_stripe_409_and_424_are_unknown():
    # 409: "conflicts with another request (perhaps due to using the same idempotent key)",
    # which may be this very charge still running. 424: a dependency outside Stripe failed.
    assert classify(stripe_error(409, "idempotency_error")) is UNKNOWN
    assert classify(stripe_error(424, "api_error")) is UNKNOWN


def test_stripe_without_an_api_key_never_sent_anything():
    exc = stripe.AuthenticationError("No API key provided.")
    assert exc.http_status is None
    assert classify(exc) is RETRYABLE


def test_a_403_rate_limit_is_retryable():
    # GitHub's secondary rate limits answer 403 with Retry-After, primary ones with
    # X-RateLimit-Remaining: 0; nothing was processed.
    assert classify(requests_http_error(403, {"Retry-After": "60"})) is RETRYABLE
    assert classify(requests_http_error(403, {"x-ratelimit-remaining": "0"})) is RETRYABLE
    assert classify(requests_http_error(403, {"x-ratelimit-remaining": "12"})) is FAILED
    limited = aiohttp.ClientResponseError(None, (), status=403, headers={"Retry-After": "1"})  # type: ignore[arg-type]
    assert classify(limited) is RETRYABLE


def test_an_error_that_says_2xx_or_3xx_is_unknown():
    # openai raises APIResponseValidationError for a 200 whose body it cannot read: the
    # call happened. A redirect answer to a POST may follow processing (303).
    response = httpx2.Response(200, request=httpx2.Request("POST", "http://x"), json={})
    assert classify(openai.APIResponseValidationError(response, {})) is UNKNOWN
    assert classify(google_exceptions.from_http_status(303, "see other")) is UNKNOWN


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("ConditionalCheckFailedException", 400, FAILED),
        ("ValidationException", 400, FAILED),
        ("AccessDeniedException", 400, FAILED),
        ("IdempotentParameterMismatch", 400, FAILED),
        ("ProvisionedThroughputExceededException", 400, RETRYABLE),
        ("ThrottlingException", 400, RETRYABLE),
        ("SlowDown", 503, RETRYABLE),
        ("RequestLimitExceeded", 503, RETRYABLE),
        ("RequestTimeout", 400, RETRYABLE),
        ("TransactionInProgressException", 400, UNKNOWN),
        ("InternalServerError", 500, UNKNOWN),
        ("ServiceUnavailable", 503, UNKNOWN),
        ("ConflictException", 409, UNKNOWN),
    ],
)
def test_botocore_client_errors_by_code_and_status(code, status, expected):
    exc = botocore_error(code, status)
    assert classify(exc) is expected
    assert code in reason(exc)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, FAILED),
        (grpc.StatusCode.NOT_FOUND, FAILED),
        (grpc.StatusCode.PERMISSION_DENIED, FAILED),
        (grpc.StatusCode.UNAUTHENTICATED, FAILED),
        (grpc.StatusCode.FAILED_PRECONDITION, FAILED),
        (grpc.StatusCode.OUT_OF_RANGE, FAILED),
        (grpc.StatusCode.UNIMPLEMENTED, FAILED),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, RETRYABLE),
        (grpc.StatusCode.ABORTED, RETRYABLE),
        (grpc.StatusCode.DEADLINE_EXCEEDED, UNKNOWN),
        (grpc.StatusCode.UNAVAILABLE, UNKNOWN),
        (grpc.StatusCode.CANCELLED, UNKNOWN),
        (grpc.StatusCode.INTERNAL, UNKNOWN),
        (grpc.StatusCode.UNKNOWN, UNKNOWN),
        (grpc.StatusCode.DATA_LOSS, UNKNOWN),
        (grpc.StatusCode.ALREADY_EXISTS, UNKNOWN),
    ],
    ids=lambda c: getattr(c, "name", str(c)),
)
def test_google_api_core_errors_by_grpc_code(code, expected):
    by_enum = google_exceptions.from_grpc_status(code, "no")
    by_number = google_exceptions.from_grpc_status(code.value[0], "no")
    assert classify(by_enum) is expected
    assert classify(by_number) is expected
    assert f"gRPC {code.name}" in reason(by_enum)


def test_google_retry_error_is_unknown_whatever_its_last_cause():
    # Raised when retries ran out of time: every attempt but the last is invisible.
    last = google_exceptions.from_grpc_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota")
    exc = raised(google_exceptions.RetryError("Timeout of 1.0s exceeded", last), last)
    assert classify(last) is RETRYABLE
    assert classify(exc) is UNKNOWN


# -- 2. wrappers ------------------------------------------------------------------------------


def test_sdk_wrappers_defer_to_what_they_wrap():
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    # openai raises APITimeoutError for every httpx2 timeout, connect timeouts included.
    connect = raised(openai.APITimeoutError(request=request), httpx2.ConnectTimeout("connect"))
    read = raised(openai.APITimeoutError(request=request), httpx2.ReadTimeout("read"))
    assert classify(connect) is RETRYABLE
    assert classify(read) is UNKNOWN
    assert reason(read) == (
        "openai.APITimeoutError from httpx2.ReadTimeout: read timeout or lost reply,"
        " the request may have been processed"
    )
    refused = raised(anthropic.APIConnectionError(request=request), httpx2.ConnectError("x"))
    assert classify(refused) is RETRYABLE
    stripe_read = raised(
        stripe.APIConnectionError("Unexpected error communicating with Stripe.", should_retry=True),
        requests.ReadTimeout("read timed out"),
    )
    assert classify(stripe_read) is UNKNOWN


def test_a_wrapper_with_no_telling_cause_is_unknown():
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    bare = stripe.APIConnectionError("Unexpected error communicating with Stripe.")
    assert Classifier().explain(bare) == (
        UNKNOWN,
        "stripe.APIConnectionError: Stripe lost the connection mid-call",
    )
    assert classify(openai.APIConnectionError(request=request)) is UNKNOWN
    # Wrapping something no rule places: still the wrapper's UNKNOWN.
    assert classify(raised(openai.APIConnectionError(request=request), ValueError("x"))) is UNKNOWN


def test_botocore_connection_errors_are_connect_phase_even_without_a_cause():
    exc = botocore.exceptions.ProxyConnectionError(proxy_url="http://proxy:3128", error="x")
    assert Classifier().explain(exc)[0] is RETRYABLE
    assert "failed to establish a connection" in reason(exc)


def test_urllib_url_error_looks_at_its_reason():
    refused = urllib.error.URLError(ConnectionRefusedError(111, "refused"))
    assert refused.__cause__ is None and refused.__context__ is None
    assert classify(refused) is RETRYABLE
    assert classify(urllib.error.URLError(TimeoutError("timed out"))) is UNKNOWN
    assert classify(urllib.error.URLError("no host given")) is UNKNOWN


# -- 2. the chain -----------------------------------------------------------------------------


def test_an_unplaced_exception_raised_from_a_known_one_takes_its_class():
    assert classify(raised(RuntimeError("charge failed"), requests.ReadTimeout())) is UNKNOWN
    assert classify(raised(RuntimeError("charge failed"), httpx.ConnectError("x"))) is RETRYABLE
    declined = stripe_error(402, "card_error", "card_declined")
    assert classify(raised(RuntimeError("charge failed"), declined)) is FAILED
    assert reason(raised(RuntimeError("x"), declined)) == (
        "RuntimeError from stripe.CardError: Stripe 402, the provider answered no"
    )


def test_an_implicit_context_only_ever_adds_doubt():
    # ValueError raised while handling a lost reply: the reply was lost, UNKNOWN.
    assert classify(while_handling(ValueError("bad json"), TimeoutError("read"))) is UNKNOWN
    # Raised while handling a refused connection or a decline, the ValueError may come from
    # a second call (a fallback provider) that did go out: not RETRYABLE, not FAILED.
    after_refused = while_handling(ValueError("bad json"), ConnectionRefusedError(111, "x"))
    assert classify(after_refused) is UNKNOWN
    assert "raised while handling it" in reason(after_refused)
    after_decline = while_handling(KeyError("id"), stripe_error(402, "card_error"))
    assert classify(after_decline) is UNKNOWN
    # The same two, linked on purpose with ``from``, are trusted.
    assert classify(raised(ValueError("x"), ConnectionRefusedError(111, "x"))) is RETRYABLE


def test_raise_from_none_hides_the_context():
    try:
        try:
            raise TimeoutError("read")
        except TimeoutError:
            raise ValueError("translated") from None
    except ValueError as exc:
        assert exc.__suppress_context__
        verdict, why = Classifier().explain(exc)
    assert verdict is UNKNOWN  # the default, not the hidden timeout
    assert why.startswith("ValueError: placed by no rule")


def test_cycles_and_very_long_chains_end():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify(a) is UNKNOWN
    deep: BaseException = ConnectionRefusedError(111, "refused")
    for n in range(MAX_CHAIN + 5):
        deep = raised(RuntimeError(f"layer {n}"), deep)
    assert classify(deep) is UNKNOWN  # the refusal is too deep to be read
    assert reason(deep).endswith(f"not read past {MAX_CHAIN} links")
    assert Classifier(default="failed").classify(deep) is UNKNOWN  # whatever the default


def test_inner_explicit_raises_are_read_down_the_chain():
    assert classify(raised(RuntimeError("x"), UnknownOutcomeError("maybe"))) is UNKNOWN
    assert classify(raised(RuntimeError("x"), RetryableEffectError("not sent"))) is RETRYABLE
    assert classify(raised(RuntimeError("x"), BusinessError("declined"))) is FAILED
    assert classify(while_handling(RuntimeError("x"), RetryableEffectError("no"))) is UNKNOWN


def test_sdk_retries_turn_a_definite_answer_into_unknown():
    # openai and anthropic number each attempt in x-stainless-retry-count: a 400 after a
    # retried timeout or 500 does not prove the first attempt did nothing.
    assert classify(openai_status(400, retries=0)) is FAILED
    retried = openai_status(400, retries=2)
    assert classify(retried) is UNKNOWN
    assert "after 2 retries by the SDK an earlier attempt may have run" in reason(retried)
    assert classify(openai_status(429, retries=1, lib=anthropic)) is UNKNOWN
    assert classify(botocore_error("ConditionalCheckFailedException", 400, retries=0)) is FAILED
    assert classify(botocore_error("ConditionalCheckFailedException", 400, retries=1)) is UNKNOWN
    request = httpx2.Request(
        "POST", "http://127.0.0.1/v1/x", headers={"x-stainless-retry-count": "1"}
    )
    refused_after_retry = raised(
        openai.APIConnectionError(request=request), httpx2.ConnectError("x")
    )
    assert classify(refused_after_retry) is UNKNOWN


def test_exception_groups_are_unknown_whatever_their_members_say():
    # A task group cancels the other calls when one fails and lists only the failures: a
    # cancelled call that was already sent is not in the group.
    refused = ConnectionRefusedError(111, "refused")
    read = httpx.ReadTimeout("read")
    declined = stripe_error(402, "card_error")
    for members in ([refused, refused], [refused, read], [refused, declined], [ValueError()]):
        assert classify(ExceptionGroup("calls", members)) is UNKNOWN
    assert reason(ExceptionGroup("calls", [refused, read])) == (
        f"ExceptionGroup: member 2 of 2, httpx.ReadTimeout: {READ_PHASE}"
    )
    assert reason(ExceptionGroup("calls", [refused, declined])) == (
        "ExceptionGroup: member 2 of 2, stripe.CardError: Stripe 402, the provider answered no,"
        " but a task group cancels the other calls, which may have been sent, and does not"
        " list them"
    )
    nested = ExceptionGroup("outer", [refused, ExceptionGroup("inner", [read])])
    assert "member 1 of 1, httpx.ReadTimeout" in reason(nested)
    assert classify(BaseExceptionGroup("cancelled", [asyncio.CancelledError()])) is UNKNOWN
    # The handler that knows better says so explicitly.
    try:
        raise RetryableEffectError("both calls were refused") from ExceptionGroup("c", [refused])
    except RetryableEffectError as explicit:
        assert classify(explicit) is RETRYABLE


def test_a_reader_that_breaks_does_not_break_classification():
    class Odd(stripe.StripeError):
        broken = False

        def __getattribute__(self, name: str):
            if name == "http_status" and object.__getattribute__(self, "broken"):
                raise RuntimeError("unreadable")
            return super().__getattribute__(name)

    odd = Odd("x", http_status=402)
    odd.broken = True
    assert classify(odd) is UNKNOWN


# -- 3. nothing placed, and the rules users declare -------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [ValueError("card declined"), KeyError("missing"), RuntimeError("x"), OSError("disk")],
    ids=lambda e: type(e).__name__,
)
def test_an_exception_nothing_places_is_unknown(exc: BaseException):
    verdict, why = Classifier().explain(exc)
    assert verdict is UNKNOWN
    assert why == (
        f"{type(exc).__name__}: placed by no rule, and the request may have left (raise"
        " BusinessError or declare Classifier(business=...) for a business error)"
    )


def test_business_errors_can_be_declared_by_class_or_qualified_name():
    declined = type("Declined", (Exception,), {"__module__": "billing.errors"})
    refused = type("Refused", (declined,), {"__module__": "billing.errors"})
    for business in [
        (declined,),
        ("billing.Declined",),
        ("billing.errors.Declined",),
        ("Declined",),
    ]:
        classifier = Classifier(business=business)
        assert classifier.classify(declined("no")) is FAILED, business
        assert classifier.classify(refused("no")) is FAILED, business  # subclasses too
        assert classifier.classify(ValueError("x")) is UNKNOWN
    assert Classifier(business=("shipping.Declined",)).classify(declined("no")) is UNKNOWN
    assert Classifier(business=(declined,)).explain(declined()) == (
        FAILED,
        "billing.errors.Declined: declared a business error",
    )
    # Declared, it still decides down the chain.
    assert (
        Classifier(business=(ValueError,)).classify(raised(RuntimeError(), ValueError())) is FAILED
    )


def test_a_more_specific_built_in_rule_beats_a_broad_declaration():
    # "Every Stripe error is a business error" does not turn a lost reply into a decline:
    # APIConnectionError is more specific than StripeError.
    classifier = Classifier(business=(stripe.StripeError,))
    lost = raised(stripe.APIConnectionError("x"), requests.ReadTimeout("read"))
    assert classifier.classify(lost) is UNKNOWN
    # A declaration never hides "may have run": not a 5xx, not even the exact class.
    assert classifier.classify(stripe_error(500, "api_error")) is UNKNOWN
    assert classifier.classify(stripe_error(402, "card_error")) is FAILED  # as declared
    assert Classifier(business=(stripe.APIConnectionError,)).explain(lost) == (
        UNKNOWN,
        "stripe.APIConnectionError from requests.exceptions.ReadTimeout: read timeout or lost"
        " reply, the request may have been processed (declared a business error, but it may"
        " have run)",
    )


def test_failed_can_be_chosen_as_the_default_deliberately():
    classifier = Classifier(default=FailureClass.FAILED)
    assert Classifier(default="failed").default is FAILED
    verdict, why = classifier.explain(ValueError("x"))
    assert (verdict, why) == (FAILED, "ValueError: placed by no rule; FAILED by the chosen default")
    # Known classes and doubt still win over the default.
    assert classifier.classify(requests.ReadTimeout()) is UNKNOWN
    assert classifier.classify(while_handling(ValueError(), TimeoutError())) is UNKNOWN


@pytest.mark.parametrize("default", ["retryable", FailureClass.RETRYABLE, "maybe", None])
def test_a_default_other_than_unknown_or_failed_is_refused(default):
    with pytest.raises(ValueError, match=r"the default must be 'unknown' \(safe\) or 'failed'"):
        Classifier(default=default)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"business": "ValueError"}, r"Classifier\(business=...\) takes a collection"),
        ({"business": ValueError}, r"Classifier\(business=...\) takes a collection"),
        ({"business": (42,)}, r"42 is neither an exception class nor a qualified name"),
        ({"business": ("",)}, r"'' is neither"),
        ({"business": ("billing.",)}, r"'billing.' is neither"),
        ({"retryable": "Flaky"}, r"Classifier\(retryable=...\) takes a collection"),
        ({"unknown": (int,)}, r"is neither an exception class"),
    ],
)
def test_bad_declarations_get_a_clear_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        Classifier(**kwargs)


def test_the_name_sets_can_be_extended_for_new_clients():
    unavailable = type("Unavailable", (Exception,), {"__module__": "myrpc"})
    deadline = type("DeadlineExceeded", (Exception,), {"__module__": "myrpc"})
    classifier = Classifier(
        retryable=DEFAULT_RETRYABLE | {"myrpc.Unavailable"},
        unknown=DEFAULT_UNKNOWN | {"DeadlineExceeded"},
    )
    assert classifier.explain(unavailable()) == (RETRYABLE, "myrpc.Unavailable: declared retryable")
    assert classifier.explain(deadline()) == (UNKNOWN, "myrpc.DeadlineExceeded: declared unknown")
    assert classifier.classify(requests.ReadTimeout()) is UNKNOWN  # defaults kept
    assert classifier.classify(requests.ConnectTimeout()) is RETRYABLE
    # Classes are accepted as well as names.
    assert Classifier(retryable=(unavailable,)).classify(unavailable()) is RETRYABLE


def test_replacing_the_name_sets_drops_their_defaults_only():
    flaky = type("Flaky", (Exception,), {})
    classifier = Classifier(retryable={"Flaky"}, unknown=())
    assert classifier.classify(flaky()) is RETRYABLE
    assert classifier.classify(ConnectionRefusedError()) is UNKNOWN  # no longer known
    assert "placed by no rule" in classifier.explain(TimeoutError())[1]
    # Status readers, wrappers and explicit raises do not depend on the name sets.
    assert classifier.classify(stripe_error(402, "card_error")) is FAILED
    assert classifier.classify(RetryableEffectError()) is RETRYABLE
    assert classifier.classify(KeyboardInterrupt()) is UNKNOWN


def test_the_reason_never_carries_the_exception_message():
    card = "4242424242424242"
    declined = stripe.CardError(f"card {card} declined", "number", "card_declined", http_status=402)
    for exc in [
        declined,
        raised(RuntimeError(f"charging {card}"), declined),
        ValueError(f"bad card {card}"),
        requests.ReadTimeout(f"read timeout charging {card}"),
    ]:
        assert card not in reason(exc)


# -- through an effect ------------------------------------------------------------------------


def test_effects_park_an_unplaced_exception_as_unknown_and_record_a_business_error_as_failed():
    calls: list[str] = []
    with OpenOnce(":memory:", retry_delay=0) as oo:

        @oo.effect(idempotency_key=lambda order: order)
        def charge(order: str) -> str:
            calls.append(order)
            if order == "bug":
                raise ValueError("unexpected reply shape")
            raise BusinessError("card declined")

        with pytest.raises(OutcomeUnknownError) as unknown:
            charge("bug")
        assert isinstance(unknown.value.__cause__, ValueError)
        assert oo.get(unknown.value.effect_id).state == "unknown"
        with pytest.raises(OutcomeUnknownError):
            charge("bug")  # parked: never run again by a retry
        with pytest.raises(BusinessError, match="card declined"):
            charge("declined")
        with pytest.raises(BusinessError, match="card declined"):
            charge("declined")  # replayed, not run
    assert calls == ["bug", "declined"]


def test_openonce_uses_the_classifier_it_is_given():
    calls: list[str] = []
    declined = type("Declined", (Exception,), {})
    unavailable = type("GrpcUnavailable", (Exception,), {})
    classifier = Classifier(retryable=DEFAULT_RETRYABLE | {"GrpcUnavailable"}, business=(declined,))
    with OpenOnce(":memory:", retry_delay=0, classifier=classifier) as oo:

        @oo.effect(max_attempts=3, idempotency_key=lambda to: f"send-{to}")
        def send(to: str) -> str:
            calls.append(to)
            if len(calls) == 1:
                raise unavailable("try again")
            raise declined("mailbox refuses")

        with pytest.raises(declined):
            send("a@b.c")  # retried once, then the business error is recorded
        effect_id = next(iter(oo.store.list_effects())).id
        assert oo.get(effect_id).state == "failed"
        with pytest.raises(Exception, match="mailbox refuses"):
            send("a@b.c")
    assert calls == ["a@b.c", "a@b.c"]


def test_failed_as_default_records_an_unplaced_exception_as_failed():
    calls: list[int] = []
    with OpenOnce(":memory:", retry_delay=0, classifier=Classifier(default="failed")) as oo:

        @oo.effect(idempotency_key=lambda n: str(n))
        def step(n: int) -> None:
            calls.append(n)
            raise ValueError("no")

        for _ in range(2):
            with pytest.raises(ValueError, match="no"):
                step(1)
    assert calls == [1]
