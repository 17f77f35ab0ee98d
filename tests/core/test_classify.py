"""Which failure class an exception from a handler falls in.

The classifier needs none of requests, httpx, urllib3 or aiohttp installed: it reads class
names across the MRO. So these tests rebuild each library's exception hierarchy with
classes of the same names and shapes, and check the class a real error would get.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest

from openonce_core import (
    Classifier,
    FailureClass,
    OpenOnce,
    OutcomeUnknownError,
    RetryableEffectError,
    UnknownOutcomeError,
)
from openonce_core.classify import DEFAULT_RETRYABLE, DEFAULT_UNKNOWN

FAILED = FailureClass.FAILED
RETRYABLE = FailureClass.RETRYABLE
UNKNOWN = FailureClass.UNKNOWN


def _requests() -> SimpleNamespace:
    """requests.exceptions, as requests 2.x declares it."""

    class RequestException(OSError):
        pass

    class HTTPError(RequestException):
        pass

    class ConnectionError(RequestException):
        pass

    class ProxyError(ConnectionError):
        pass

    class SSLError(ConnectionError):
        pass

    class Timeout(RequestException):
        pass

    class ConnectTimeout(ConnectionError, Timeout):
        pass

    class ReadTimeout(Timeout):
        pass

    class ChunkedEncodingError(RequestException):
        pass

    class InvalidURL(RequestException, ValueError):
        pass

    return SimpleNamespace(**locals())


def _httpx() -> SimpleNamespace:
    """httpx's exception tree."""

    class HTTPError(Exception):
        pass

    class RequestError(HTTPError):
        pass

    class TransportError(RequestError):
        pass

    class TimeoutException(TransportError):
        pass

    class ConnectTimeout(TimeoutException):
        pass

    class ReadTimeout(TimeoutException):
        pass

    class WriteTimeout(TimeoutException):
        pass

    class PoolTimeout(TimeoutException):
        pass

    class NetworkError(TransportError):
        pass

    class ConnectError(NetworkError):
        pass

    class ReadError(NetworkError):
        pass

    class WriteError(NetworkError):
        pass

    class ProtocolError(TransportError):
        pass

    class RemoteProtocolError(ProtocolError):
        pass

    class HTTPStatusError(HTTPError):
        pass

    return SimpleNamespace(**locals())


def _urllib3() -> SimpleNamespace:
    """urllib3.exceptions (2.x)."""

    class HTTPError(Exception):
        pass

    class PoolError(HTTPError):
        pass

    class RequestError(PoolError):
        pass

    class TimeoutError(HTTPError):
        pass

    class ReadTimeoutError(TimeoutError, RequestError):
        pass

    class ConnectTimeoutError(TimeoutError):
        pass

    class NewConnectionError(ConnectTimeoutError, HTTPError):
        pass

    class NameResolutionError(NewConnectionError):
        pass

    class ProtocolError(HTTPError):
        pass

    return SimpleNamespace(**locals())


def _aiohttp() -> SimpleNamespace:
    """aiohttp.client_exceptions (3.10+)."""

    class ClientError(Exception):
        pass

    class ClientResponseError(ClientError):
        pass

    class ClientConnectionError(ClientError):
        pass

    class ClientOSError(ClientConnectionError, OSError):
        pass

    class ClientConnectorError(ClientOSError):
        pass

    class ClientSSLError(ClientConnectorError):
        pass

    class ClientConnectorCertificateError(ClientSSLError):
        pass

    class ServerConnectionError(ClientConnectionError):
        pass

    class ServerDisconnectedError(ServerConnectionError):
        pass

    class ServerTimeoutError(ServerConnectionError, asyncio.TimeoutError):
        pass

    class ConnectionTimeoutError(ServerTimeoutError):
        pass

    class SocketTimeoutError(ServerTimeoutError):
        pass

    class ClientPayloadError(ClientError):
        pass

    return SimpleNamespace(**locals())


requests = _requests()
httpx = _httpx()
urllib3 = _urllib3()
aiohttp = _aiohttp()


def classify(exc: BaseException) -> FailureClass:
    return Classifier().classify(exc)


# -- the three classes, for real clients -----------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(requests.ConnectTimeout("connect timed out"), id="requests.ConnectTimeout"),
        pytest.param(httpx.ConnectTimeout("connect timed out"), id="httpx.ConnectTimeout"),
        pytest.param(httpx.ConnectError("refused"), id="httpx.ConnectError"),
        pytest.param(httpx.PoolTimeout("no free connection"), id="httpx.PoolTimeout"),
        pytest.param(urllib3.ConnectTimeoutError("timed out"), id="urllib3.ConnectTimeoutError"),
        pytest.param(urllib3.NewConnectionError("refused"), id="urllib3.NewConnectionError"),
        pytest.param(urllib3.NameResolutionError("no dns"), id="urllib3.NameResolutionError"),
        pytest.param(aiohttp.ClientConnectorError("refused"), id="aiohttp.ClientConnectorError"),
        pytest.param(
            aiohttp.ClientConnectorCertificateError("bad cert"),
            id="aiohttp.ClientConnectorCertificateError",
        ),
        pytest.param(aiohttp.ConnectionTimeoutError("connect"), id="aiohttp.ConnectionTimeout"),
        pytest.param(ConnectionRefusedError(111, "Connection refused"), id="ConnectionRefused"),
        pytest.param(socket.gaierror(-2, "Name or service not known"), id="socket.gaierror"),
    ],
)
def test_connect_phase_errors_are_retryable(exc: BaseException):
    assert classify(exc) is RETRYABLE


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(requests.ReadTimeout("read timed out"), id="requests.ReadTimeout"),
        pytest.param(requests.ConnectionError("aborted"), id="requests.ConnectionError"),
        pytest.param(requests.ProxyError("proxy dropped"), id="requests.ProxyError"),
        pytest.param(httpx.ReadTimeout("read timed out"), id="httpx.ReadTimeout"),
        pytest.param(httpx.WriteTimeout("write timed out"), id="httpx.WriteTimeout"),
        pytest.param(httpx.TimeoutException("timed out"), id="httpx.TimeoutException"),
        pytest.param(httpx.ReadError("reset"), id="httpx.ReadError"),
        pytest.param(httpx.WriteError("broken"), id="httpx.WriteError"),
        pytest.param(httpx.RemoteProtocolError("eof"), id="httpx.RemoteProtocolError"),
        pytest.param(urllib3.ReadTimeoutError("read"), id="urllib3.ReadTimeoutError"),
        pytest.param(urllib3.ProtocolError("aborted"), id="urllib3.ProtocolError"),
        pytest.param(aiohttp.ServerDisconnectedError(), id="aiohttp.ServerDisconnectedError"),
        pytest.param(aiohttp.ServerTimeoutError("read"), id="aiohttp.ServerTimeoutError"),
        pytest.param(aiohttp.SocketTimeoutError("read"), id="aiohttp.SocketTimeoutError"),
        pytest.param(aiohttp.ClientPayloadError("cut"), id="aiohttp.ClientPayloadError"),
        pytest.param(TimeoutError("timed out"), id="TimeoutError"),
        pytest.param(ConnectionResetError(104, "reset by peer"), id="ConnectionResetError"),
        pytest.param(ConnectionAbortedError(103, "aborted"), id="ConnectionAbortedError"),
        pytest.param(BrokenPipeError(32, "broken pipe"), id="BrokenPipeError"),
        pytest.param(ConnectionError("ambiguous"), id="ConnectionError"),
    ],
)
def test_read_phase_timeouts_and_disconnects_are_unknown(exc: BaseException):
    assert classify(exc) is UNKNOWN


@pytest.mark.parametrize(
    "exc",
    [
        # aiohttp raises ClientOSError when the connection drops while the response is
        # read (ResponseHandler.connection_lost); connect-phase failures are the subclass
        # ClientConnectorError instead. After the request went out, it may have happened.
        pytest.param(
            aiohttp.ClientOSError(104, "Connection reset by peer"), id="aiohttp.ClientOSError"
        ),
        # requests raises ChunkedEncodingError when the response body is cut off mid-read
        # (urllib3 ProtocolError "Connection broken: IncompleteRead"): sent, reply lost.
        pytest.param(
            requests.ChunkedEncodingError("Connection broken: IncompleteRead"),
            id="requests.ChunkedEncodingError",
        ),
    ],
)
def test_client_wrapped_read_phase_disconnects_are_unknown(exc: BaseException):
    assert classify(exc) is UNKNOWN


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(ValueError("card declined"), id="ValueError"),
        pytest.param(KeyError("missing"), id="KeyError"),
        pytest.param(requests.HTTPError("402 Payment Required"), id="requests.HTTPError"),
        pytest.param(requests.InvalidURL("no scheme"), id="requests.InvalidURL"),
        pytest.param(httpx.HTTPStatusError("400 Bad Request"), id="httpx.HTTPStatusError"),
        pytest.param(aiohttp.ClientResponseError("409"), id="aiohttp.ClientResponseError"),
        pytest.param(PermissionError(13, "denied"), id="PermissionError"),
        pytest.param(OSError("disk"), id="OSError"),
    ],
)
def test_ordinary_exceptions_are_failed(exc: BaseException):
    assert classify(exc) is FAILED


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(KeyboardInterrupt(), id="KeyboardInterrupt"),
        pytest.param(asyncio.CancelledError(), id="CancelledError"),
        pytest.param(SystemExit(1), id="SystemExit"),
    ],
)
def test_interruptions_mid_call_are_unknown(exc: BaseException):
    assert classify(exc) is UNKNOWN


# -- the most specific class wins ------------------------------------------------------------


def test_connect_timeout_is_retryable_although_it_is_also_a_connection_error():
    exc = requests.ConnectTimeout("connect timed out")
    names = [cls.__name__ for cls in type(exc).__mro__]
    assert names.index("ConnectTimeout") < names.index("ConnectionError")
    assert "ConnectionError" in DEFAULT_UNKNOWN  # on its own, ambiguous
    assert classify(exc) is RETRYABLE


def test_httpx_connect_timeout_is_retryable_although_its_base_is_unknown():
    assert "TimeoutException" in DEFAULT_UNKNOWN
    assert classify(httpx.ConnectTimeout("connect")) is RETRYABLE
    assert classify(httpx.ReadTimeout("read")) is UNKNOWN


def test_aiohttp_connect_timeout_is_retryable_although_its_base_is_a_server_timeout():
    assert classify(aiohttp.ConnectionTimeoutError("connect")) is RETRYABLE
    assert classify(aiohttp.SocketTimeoutError("read")) is UNKNOWN


def test_a_subclass_of_a_known_class_inherits_its_class():
    class StripeReadTimeout(requests.ReadTimeout):
        pass

    class StripeConnectTimeout(requests.ConnectTimeout):
        pass

    class Declined(ValueError):
        pass

    assert classify(StripeReadTimeout()) is UNKNOWN
    assert classify(StripeConnectTimeout()) is RETRYABLE
    assert classify(Declined()) is FAILED


# -- an explicit raise always wins ------------------------------------------------------------


def test_explicit_retryable_and_unknown_errors():
    assert classify(RetryableEffectError("nothing sent")) is RETRYABLE
    assert classify(UnknownOutcomeError("reply lost")) is UNKNOWN


def test_explicit_retryable_wins_over_the_class_name():
    read_timeout = type("ReadTimeout", (RetryableEffectError,), {})
    assert classify(read_timeout("verified not sent")) is RETRYABLE

    class CheckedTimeout(RetryableEffectError, TimeoutError):
        pass

    assert classify(CheckedTimeout()) is RETRYABLE


def test_explicit_unknown_wins_over_the_class_name():
    connect_timeout = type("ConnectTimeout", (UnknownOutcomeError,), {})
    assert classify(connect_timeout("may be out")) is UNKNOWN

    class RefusedButMaybeSent(UnknownOutcomeError, ConnectionRefusedError):
        pass

    assert classify(RefusedButMaybeSent()) is UNKNOWN


def test_the_cause_of_an_explicit_raise_does_not_matter():
    try:
        try:
            raise requests.ReadTimeout("read timed out")
        except Exception as exc:
            raise RetryableEffectError("checked: not sent") from exc
    except RetryableEffectError as explicit:
        assert classify(explicit) is RETRYABLE
    try:
        try:
            raise ConnectionRefusedError("refused")
        except Exception as exc:
            raise UnknownOutcomeError("second hop may have sent it") from exc
    except UnknownOutcomeError as explicit:
        assert classify(explicit) is UNKNOWN


def test_wrapping_does_not_reclassify_a_plain_exception():
    # A business error raised while handling a timeout is still a business error.
    try:
        try:
            raise TimeoutError("slow")
        except TimeoutError as exc:
            raise ValueError("card declined") from exc
    except ValueError as business:
        assert classify(business) is FAILED


# -- configuring the name sets ---------------------------------------------------------------


def test_the_name_sets_can_be_extended_for_new_clients():
    class GrpcUnavailable(Exception):
        pass

    class GrpcDeadlineExceeded(Exception):
        pass

    assert classify(GrpcUnavailable()) is FAILED
    classifier = Classifier(
        retryable=DEFAULT_RETRYABLE | {"GrpcUnavailable"},
        unknown=DEFAULT_UNKNOWN | {"GrpcDeadlineExceeded"},
    )
    assert classifier.classify(GrpcUnavailable()) is RETRYABLE
    assert classifier.classify(GrpcDeadlineExceeded()) is UNKNOWN
    assert classifier.classify(requests.ReadTimeout()) is UNKNOWN  # defaults kept
    assert classifier.classify(RetryableEffectError()) is RETRYABLE


def test_replacing_the_name_sets_drops_the_defaults():
    classifier = Classifier(retryable={"Flaky"}, unknown=())
    flaky = type("Flaky", (Exception,), {})
    assert classifier.classify(flaky()) is RETRYABLE
    assert classifier.classify(TimeoutError()) is FAILED
    # Explicit raises and interruptions do not depend on the name sets.
    assert classifier.classify(UnknownOutcomeError()) is UNKNOWN
    assert classifier.classify(KeyboardInterrupt()) is UNKNOWN


def test_openonce_uses_the_classifier_it_is_given():
    calls: list[str] = []
    unavailable = type("GrpcUnavailable", (Exception,), {})
    deadline = type("GrpcDeadlineExceeded", (Exception,), {})
    classifier = Classifier(
        retryable=DEFAULT_RETRYABLE | {"GrpcUnavailable"},
        unknown=DEFAULT_UNKNOWN | {"GrpcDeadlineExceeded"},
    )
    with OpenOnce(":memory:", retry_delay=0, classifier=classifier) as oo:

        @oo.effect(max_attempts=3, idempotency_key=lambda to: f"send-{to}")
        def send(to: str) -> str:
            calls.append(to)
            if len(calls) == 1:
                raise unavailable("try again")
            if len(calls) == 2:
                raise deadline("deadline exceeded")
            return "sent"

        with pytest.raises(OutcomeUnknownError):
            send("a@b.c")  # retried once, then parked: never a third call
        with pytest.raises(OutcomeUnknownError):
            send("a@b.c")
    assert calls == ["a@b.c", "a@b.c"]
