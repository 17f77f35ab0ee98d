"""The real provider SDKs against real local sockets: what they raise, how it is classified,
and what an ``@oo.effect`` records for it.

A fake provider here is a thread with a listening socket that misbehaves on cue: it reads
the whole request and then never answers, drops the connection, or answers with a status
and a body in the provider's own error shape. A refused connection is a port bound by the
test and never listened on. Against a provider that never answers, the client's timeout is
a real socket timeout of a fraction of a second; where it answers, the timeout is long, so
a loaded machine cannot turn the answer into a timeout. Nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anthropic
import botocore.config
import botocore.session
import google.api_core.exceptions as google_exceptions
import grpc
import httpx
import openai
import pytest
import requests
import stripe
import urllib3
from google.api_core import grpc_helpers
from google.api_core import retry as google_retry

from openonce_core import (
    Classifier,
    FailureClass,
    OpenOnce,
    OutcomeUnknownError,
    current_effect,
)

FAILED = FailureClass.FAILED
RETRYABLE = FailureClass.RETRYABLE
UNKNOWN = FailureClass.UNKNOWN

HANG_TIMEOUT = 0.15  # the client's read timeout against a provider that never answers
ANSWERED = 10.0  # the client's timeout where the provider answers
READ_PHASE = "read timeout or lost reply, the request may have been processed"
CONNECT_PHASE = "connect-phase error, nothing reached the provider"


# -- a fake provider that misbehaves on cue ---------------------------------------------------

HANG = "hang"  # read the request, never answer
DROP = "drop"  # read the request, close the connection without a word


@dataclass
class Answer:
    status: int
    body: Any = None  # JSON-encoded unless bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FakeProvider:
    """An HTTP/1.1 server on 127.0.0.1. Each request takes the next cue; the last repeats."""

    def __init__(self, *cues: str | Answer) -> None:
        self.cues = list(cues) or [HANG]
        self.received: list[Received] = []
        self._changed = threading.Condition()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._spawn(self._accept)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # close() shut the listening socket down
                return
            self._conns.append(conn)
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn)
            if request is None:
                return
            with self._changed:
                cue = self.cues[min(len(self.received), len(self.cues) - 1)]
                self.received.append(request)
                self._changed.notify_all()
            if cue == HANG:
                self._closing.wait()
            elif isinstance(cue, Answer):
                conn.sendall(_encode(cue))
        except OSError:
            pass
        finally:
            conn.close()

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[Received]:
        """The requests received, once there are ``count`` (the server thread may lag)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.received) >= count, timeout)
            return list(self.received)

    def close(self) -> None:
        if self._closing.is_set():  # a test may close it before the fixture does
            return
        self._closing.set()
        self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop at once
        self._sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):  # the client may have closed it already
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)


def _read_request(conn: socket.socket) -> Received | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return Received(method, path, headers, body)


def _encode(answer: Answer) -> bytes:
    body = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
    headers = {
        "Content-Type": "application/json",
        **answer.headers,
        "Content-Length": str(len(body)),
        "Connection": "close",
    }
    head = f"HTTP/1.1 {answer.status} Status\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    return head.encode() + b"\r\n" + body


@pytest.fixture
def provider() -> Iterator[Callable[..., FakeProvider]]:
    started: list[FakeProvider] = []

    def start(*cues: str | Answer) -> FakeProvider:
        started.append(FakeProvider(*cues))
        return started[-1]

    yield start
    for fake in started:
        fake.close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A port that is bound (so nobody else takes it) and never listened on: connecting to
    it is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def caught(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except BaseException as exc:
        return exc
    raise AssertionError("the call did not fail")


def explain(exc: BaseException) -> tuple[FailureClass, str]:
    return Classifier().explain(exc)


# -- the SDKs, each making one call the way an agent's tool would ------------------------------


def stripe_error(status: int, error_type: str, code: str | None = None) -> Answer:
    error = {"type": error_type, "code": code, "message": f"{error_type} {code}", "param": None}
    return Answer(status, {"error": error}, {"Request-Id": "req_test"})


INTENT = Answer(200, {"id": "pi_123", "object": "payment_intent", "status": "succeeded"})


@pytest.fixture
def stripe_at(monkeypatch) -> Callable[[str], None]:
    """Point the stripe module's global client at a URL, with no SDK retries."""

    def point(url: str, timeout: float = ANSWERED) -> None:
        monkeypatch.setattr(stripe, "api_key", "sk_test_classify")
        monkeypatch.setattr(stripe, "api_base", url)
        monkeypatch.setattr(stripe, "max_network_retries", 0)
        monkeypatch.setattr(stripe, "default_http_client", stripe.RequestsClient(timeout=timeout))

    return point


def charge(idempotency_key: str = "order-7") -> Any:
    return stripe.PaymentIntent.create(
        amount=2_500, currency="usd", idempotency_key=idempotency_key
    )


def openai_chat(url: str, max_retries: int = 0, timeout: float = ANSWERED) -> Any:
    client = openai.OpenAI(
        api_key="sk-test", base_url=url + "/v1", timeout=timeout, max_retries=max_retries
    )
    return client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "refund order 7"}]
    )


def anthropic_message(url: str, timeout: float = ANSWERED) -> Any:
    client = anthropic.Anthropic(api_key="sk-test", base_url=url, timeout=timeout, max_retries=0)
    return client.messages.create(
        model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "refund"}]
    )


def httpx_post(url: str, timeout: float = ANSWERED) -> Any:
    return httpx.post(url + "/charge", content=b"{}", timeout=timeout).raise_for_status()


def requests_post(url: str, timeout: float = ANSWERED) -> Any:
    return requests.post(url + "/charge", data=b"{}", timeout=timeout).raise_for_status()


def urllib3_post(url: str, timeout: float = ANSWERED) -> Any:
    with urllib3.PoolManager(retries=False, timeout=timeout) as pool:
        return pool.request("POST", url + "/charge", body=b"{}")


def urllib_post(url: str, timeout: float = ANSWERED) -> Any:
    request = urllib.request.Request(url + "/charge", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def aiohttp_post(url: str, timeout: float = ANSWERED) -> Any:
    async def post() -> bytes:
        limits = aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout)
        async with (
            aiohttp.ClientSession(timeout=limits) as session,
            session.post(url + "/charge", data=b"{}", raise_for_status=True) as response,
        ):
            return await response.read()

    return asyncio.run(post())


def dynamodb_put(url: str, attempts: int = 1, timeout: float = ANSWERED) -> Any:
    config = botocore.config.Config(
        retries={"total_max_attempts": attempts, "mode": "standard"},
        connect_timeout=timeout,
        read_timeout=timeout,
    )
    client = botocore.session.get_session().create_client(
        "dynamodb",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="AKIDTEST",
        aws_secret_access_key="secret",
        config=config,
    )
    return client.put_item(TableName="orders", Item={"order": {"S": "7"}})


def dynamodb_error(status: int, code: str) -> Answer:
    return Answer(
        status,
        {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": code},
        {"Content-Type": "application/x-amz-json-1.0"},
    )


SDKS: dict[str, Callable[[str], Any]] = {
    "openai": openai_chat,
    "anthropic": anthropic_message,
    "httpx": httpx_post,
    "requests": requests_post,
    "urllib3": urllib3_post,
    "urllib": urllib_post,
    "aiohttp": aiohttp_post,
    "botocore": dynamodb_put,
}


# -- every SDK: no answer, a refusal, a dropped connection ------------------------------------


def test_stripe_against_a_server_that_never_answers_is_unknown(provider, stripe_at):
    fake = provider(HANG)
    stripe_at(fake.url, timeout=HANG_TIMEOUT)
    exc = caught(charge)
    assert type(exc) is stripe.APIConnectionError
    assert explain(exc) == (
        UNKNOWN,
        f"stripe.APIConnectionError from requests.exceptions.ReadTimeout: {READ_PHASE}",
    )
    (request,) = fake.wait_for_requests(1)
    assert (request.method, request.path) == ("POST", "/v1/payment_intents")
    assert request.headers["idempotency-key"] == "order-7"


@pytest.mark.parametrize("sdk", list(SDKS))
def test_a_server_that_never_answers_is_unknown(provider, sdk):
    fake = provider(HANG)
    exc = caught(lambda: SDKS[sdk](fake.url, timeout=HANG_TIMEOUT))
    verdict, why = explain(exc)
    assert verdict is UNKNOWN, why
    assert why.endswith(READ_PHASE)
    assert len(fake.wait_for_requests(1)) == 1  # the request did reach the provider


def test_stripe_against_a_refused_connection_is_retryable(refused_url, stripe_at):
    stripe_at(refused_url)
    exc = caught(charge)
    assert type(exc) is stripe.APIConnectionError
    verdict, why = explain(exc)
    assert verdict is RETRYABLE
    assert why.startswith("stripe.APIConnectionError from requests.exceptions.ConnectionError")
    assert why.endswith(f"urllib3.exceptions.NewConnectionError: {CONNECT_PHASE}")


@pytest.mark.parametrize("sdk", list(SDKS))
def test_a_refused_connection_is_retryable(refused_url, sdk):
    exc = caught(lambda: SDKS[sdk](refused_url))
    verdict, why = explain(exc)
    assert verdict is RETRYABLE, why
    assert why.endswith(CONNECT_PHASE)


@pytest.mark.parametrize("sdk", ["stripe", *SDKS])
def test_a_connection_dropped_after_the_request_is_unknown(provider, stripe_at, sdk):
    fake = provider(DROP)
    if sdk == "stripe":
        stripe_at(fake.url)
        exc = caught(charge)
    else:
        exc = caught(lambda: SDKS[sdk](fake.url))
    verdict, why = explain(exc)
    assert verdict is UNKNOWN, why
    assert len(fake.wait_for_requests(1)) == 1


# -- answers in each provider's own shape -----------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "error_class", "expected"),
    [
        (stripe_error(402, "card_error", "card_declined"), stripe.CardError, FAILED),
        (
            stripe_error(400, "invalid_request_error", "parameter_missing"),
            stripe.InvalidRequestError,
            FAILED,
        ),
        (stripe_error(401, "invalid_request_error"), stripe.AuthenticationError, FAILED),
        (
            stripe_error(429, "invalid_request_error", "rate_limit"),
            stripe.RateLimitError,
            RETRYABLE,
        ),
        (
            stripe_error(400, "invalid_request_error", "rate_limit"),
            stripe.RateLimitError,
            RETRYABLE,
        ),
        (stripe_error(409, "idempotency_error"), stripe.APIError, UNKNOWN),
        (stripe_error(500, "api_error"), stripe.APIError, UNKNOWN),
        (
            Answer(502, b"<html>bad gateway</html>", {"Content-Type": "text/html"}),
            stripe.APIError,
            UNKNOWN,
        ),
    ],
    ids=lambda v: str(getattr(v, "status", getattr(v, "__name__", v))),
)
def test_stripe_answers(provider, stripe_at, answer, error_class, expected):
    fake = provider(answer)
    stripe_at(fake.url)
    exc = caught(charge)
    assert type(exc) is error_class
    assert explain(exc)[0] is expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [(400, FAILED), (401, FAILED), (404, FAILED), (422, FAILED), (408, RETRYABLE),
     (429, RETRYABLE), (409, UNKNOWN), (500, UNKNOWN), (503, UNKNOWN), (529, UNKNOWN)],
)  # fmt: skip
@pytest.mark.parametrize("sdk", ["openai", "anthropic", "httpx", "requests", "urllib", "aiohttp"])
def test_http_answers(provider, sdk, status, expected):
    body = {"type": "error", "error": {"type": "api_error", "message": "no"}}
    fake = provider(Answer(status, body))
    exc = caught(lambda: SDKS[sdk](fake.url))
    verdict, why = explain(exc)
    assert verdict is expected, why
    assert f" {status}" in why


def test_a_github_style_403_rate_limit_is_retryable(provider):
    fake = provider(Answer(403, {"message": "secondary rate limit"}, {"Retry-After": "60"}))
    exc = caught(lambda: requests_post(fake.url))
    assert explain(exc) == (
        RETRYABLE,
        "requests.exceptions.HTTPError: HTTP 403 rate limit, the provider did not process it",
    )


def test_openai_retries_make_a_final_400_unknown(provider):
    # The SDK retried a 500 (which may have run) and then got a 400: the 400 does not say
    # the first attempt did nothing.
    fake = provider(Answer(500, {"error": {}}, {"retry-after-ms": "1"}), Answer(400, {"error": {}}))
    exc = caught(lambda: openai_chat(fake.url, max_retries=1))
    assert type(exc) is openai.BadRequestError
    first, second = fake.wait_for_requests(2)
    assert (
        first.headers["x-stainless-retry-count"],
        second.headers["x-stainless-retry-count"],
    ) == ("0", "1")
    verdict, why = explain(exc)
    assert verdict is UNKNOWN
    assert why == (
        "openai.BadRequestError: HTTP 400, the provider answered no, but after 1 retries by the"
        " SDK an earlier attempt may have run"
    )


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (dynamodb_error(400, "ConditionalCheckFailedException"), FAILED),
        (dynamodb_error(400, "ValidationException"), FAILED),
        (dynamodb_error(400, "ProvisionedThroughputExceededException"), RETRYABLE),
        (dynamodb_error(400, "ThrottlingException"), RETRYABLE),
        (dynamodb_error(400, "TransactionInProgressException"), UNKNOWN),
        (dynamodb_error(500, "InternalServerError"), UNKNOWN),
    ],
    ids=lambda v: (
        getattr(v, "body", {}).get("message", str(v)) if isinstance(v, Answer) else str(v)
    ),
)
def test_botocore_answers(provider, answer, expected):
    fake = provider(answer)
    exc = caught(lambda: dynamodb_put(fake.url))
    verdict, why = explain(exc)
    assert verdict is expected, why
    assert answer.body["message"] in why


def test_botocore_retries_make_a_final_400_unknown(provider):
    fake = provider(
        dynamodb_error(500, "InternalServerError"),
        dynamodb_error(400, "ConditionalCheckFailedException"),
    )
    exc = caught(lambda: dynamodb_put(fake.url, attempts=2))
    assert exc.response["Error"]["Code"] == "ConditionalCheckFailedException"  # type: ignore[attr-defined]
    assert len(fake.wait_for_requests(2)) == 2
    verdict, why = explain(exc)
    assert verdict is UNKNOWN
    assert why.endswith("but after 1 retries by the SDK an earlier attempt may have run")


def test_an_httpx_pool_timeout_never_sent_anything(provider):
    fake = provider(HANG)
    client = httpx.Client(
        limits=httpx.Limits(max_connections=1), timeout=httpx.Timeout(10, pool=0.2)
    )
    first: list[BaseException] = []
    holder = threading.Thread(
        target=lambda: first.append(caught(lambda: client.post(fake.url, content=b"1")))
    )
    holder.start()
    fake.wait_for_requests(1)  # the only connection is now busy
    exc = caught(lambda: client.post(fake.url, content=b"2"))
    assert type(exc) is httpx.PoolTimeout
    assert explain(exc) == (RETRYABLE, f"httpx.PoolTimeout: {CONNECT_PHASE}")
    fake.close()  # lets the first request fail
    holder.join(timeout=10)
    assert [r.body for r in fake.received] == [b"1"]
    assert explain(first[0])[0] is UNKNOWN
    client.close()


def test_a_task_group_hides_the_calls_it_cancelled(provider, refused_url):
    # Two concurrent calls: one refused, one sent and waiting for its reply. The refusal
    # makes the TaskGroup cancel the other, and the group lists only the refusal.
    fake = provider(HANG)

    async def post(session: aiohttp.ClientSession, url: str) -> None:
        async with session.post(url, data=b"{}") as response:
            await response.read()

    async def both() -> None:
        async with aiohttp.ClientSession() as session, asyncio.TaskGroup() as group:
            group.create_task(post(session, fake.url))
            await asyncio.to_thread(fake.wait_for_requests, 1)  # the first call is out
            group.create_task(post(session, refused_url))

    exc = caught(lambda: asyncio.run(both()))
    assert isinstance(exc, ExceptionGroup)
    assert [type(e) for e in exc.exceptions] == [aiohttp.ClientConnectorError]
    assert len(fake.received) == 1  # yet the cancelled call did reach the provider
    verdict, why = explain(exc)
    assert verdict is UNKNOWN
    assert why == (
        f"ExceptionGroup: member 1 of 1, aiohttp.client_exceptions.ClientConnectorError:"
        f" {CONNECT_PHASE}, but a task group cancels the other calls, which may have been"
        " sent, and does not list them"
    )


# -- gRPC and google-api-core -----------------------------------------------------------------


@pytest.fixture(scope="module")
def grpc_target() -> Iterator[str]:
    """A gRPC server whose one method aborts with the status code named in the request, or
    never answers for b"HANG"."""
    release = threading.Event()

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        name = request.decode()
        if name == "HANG":
            release.wait(30)
            return b"too late"
        context.abort(getattr(grpc.StatusCode, name), f"status {name}")
        raise AssertionError("abort returned")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    method = grpc.unary_unary_rpc_method_handler(handle)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("t.Orders", {"Place": method}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    release.set()
    server.stop(None)


def place(target: str, payload: bytes, timeout: float = 5.0) -> Any:
    with grpc.insecure_channel(target) as channel:
        return channel.unary_unary("/t.Orders/Place")(payload, timeout=timeout)


GRPC_CODES = {
    "INVALID_ARGUMENT": FAILED,
    "NOT_FOUND": FAILED,
    "PERMISSION_DENIED": FAILED,
    "UNAUTHENTICATED": FAILED,
    "FAILED_PRECONDITION": FAILED,
    "OUT_OF_RANGE": FAILED,
    "UNIMPLEMENTED": FAILED,
    "RESOURCE_EXHAUSTED": RETRYABLE,
    "ABORTED": RETRYABLE,
    "UNAVAILABLE": UNKNOWN,
    "INTERNAL": UNKNOWN,
    "UNKNOWN": UNKNOWN,
    "DATA_LOSS": UNKNOWN,
    "ALREADY_EXISTS": UNKNOWN,
    "CANCELLED": UNKNOWN,
    "DEADLINE_EXCEEDED": UNKNOWN,
}


@pytest.mark.parametrize(("code", "expected"), list(GRPC_CODES.items()))
def test_grpc_status_codes(grpc_target, code, expected):
    exc = caught(lambda: place(grpc_target, code.encode()))
    assert isinstance(exc, grpc.RpcError)
    assert exc.code().name == code  # type: ignore[attr-defined]
    assert explain(exc)[0] is expected
    wrapped = caught(
        lambda: grpc_helpers.wrap_errors(lambda p: place(grpc_target, p))(code.encode())
    )
    assert isinstance(wrapped, google_exceptions.GoogleAPICallError)
    assert explain(wrapped)[0] is expected


def test_a_grpc_deadline_against_a_server_that_never_answers_is_unknown(grpc_target):
    exc = caught(lambda: place(grpc_target, b"HANG", timeout=HANG_TIMEOUT))
    assert exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert explain(exc) == (
        UNKNOWN,
        "grpc._InactiveRpcError: gRPC DEADLINE_EXCEEDED, the call may have executed",
    )
    wrapped = caught(
        lambda: grpc_helpers.wrap_errors(lambda p: place(grpc_target, p, HANG_TIMEOUT))(b"HANG")
    )
    assert type(wrapped) is google_exceptions.DeadlineExceeded
    assert explain(wrapped)[0] is UNKNOWN


def test_grpc_against_a_refused_connection_is_unavailable_and_unknown(refused_url):
    # gRPC reports "failed to connect" as UNAVAILABLE, which servers also send after they
    # may have started the call: the code alone cannot tell them apart, so UNKNOWN.
    exc = caught(lambda: place(refused_url.removeprefix("http://"), b"x"))
    assert exc.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert explain(exc)[0] is UNKNOWN


def test_a_google_retry_that_runs_out_of_time_is_unknown(grpc_target):
    retry = google_retry.Retry(
        predicate=google_retry.if_exception_type(google_exceptions.ResourceExhausted),
        initial=0.01, maximum=0.02, timeout=0.2,
    )  # fmt: skip
    call = retry(grpc_helpers.wrap_errors(lambda p: place(grpc_target, p)))
    exc = caught(lambda: call(b"RESOURCE_EXHAUSTED"))
    assert type(exc) is google_exceptions.RetryError
    assert explain(exc)[0] is UNKNOWN  # each attempt was rejected, but only the last is seen


def test_google_api_core_http_errors(provider):
    for status, expected in ((404, FAILED), (429, RETRYABLE), (503, UNKNOWN)):
        fake = provider(Answer(status, {"error": {"code": status, "message": "no"}}))
        response = requests.post(fake.url + "/v1/orders", data=b"{}", timeout=5)
        exc = google_exceptions.from_http_response(response)
        assert explain(exc)[0] is expected


# -- end to end: what an effect records -------------------------------------------------------


@pytest.fixture
def oo() -> Iterator[OpenOnce]:
    with OpenOnce(":memory:", retry_delay=0) as ledger:
        yield ledger


def stripe_charge_effect(oo: OpenOnce, calls: list[str]) -> Callable[[str], Any]:
    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge_order(order: str) -> dict[str, str]:
        calls.append(order)
        intent = stripe.PaymentIntent.create(
            amount=2_500, currency="usd", idempotency_key=current_effect().provider_key
        )
        return {"stripe_id": intent.id}

    return charge_order


def assert_parked_unknown(oo: OpenOnce, exc: OutcomeUnknownError) -> None:
    assert oo.get(exc.effect_id).state == "unknown"
    assert oo.journal(exc.effect_id)[-1].to_state == "unknown"


def test_a_stripe_charge_that_times_out_is_parked_unknown(oo, provider, stripe_at):
    fake = provider(HANG)
    stripe_at(fake.url, timeout=HANG_TIMEOUT)
    calls: list[str] = []
    charge_order = stripe_charge_effect(oo, calls)
    with pytest.raises(OutcomeUnknownError) as parked:
        charge_order("order-7")
    assert type(parked.value.__cause__) is stripe.APIConnectionError
    assert_parked_unknown(oo, parked.value)
    (request,) = fake.wait_for_requests(1)
    assert request.headers["idempotency-key"] == oo.get(parked.value.effect_id).provider_key
    # A duplicate call neither runs the handler nor reaches Stripe again.
    with pytest.raises(OutcomeUnknownError):
        charge_order("order-7")
    assert calls == ["order-7"]
    assert len(fake.received) == 1


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_an_llm_call_that_times_out_is_parked_unknown(oo, provider, sdk):
    fake = provider(HANG)
    calls: list[str] = []

    @oo.effect(tool=f"{sdk}.send", idempotency_key=lambda ticket: ticket)
    def answer_ticket(ticket: str) -> str:
        calls.append(ticket)
        SDKS[sdk](fake.url, timeout=HANG_TIMEOUT)
        return "sent"

    with pytest.raises(OutcomeUnknownError) as parked:
        answer_ticket("T-1")
    assert (
        type(parked.value.__cause__) is (openai if sdk == "openai" else anthropic).APITimeoutError
    )
    assert_parked_unknown(oo, parked.value)
    with pytest.raises(OutcomeUnknownError):
        answer_ticket("T-1")
    assert calls == ["T-1"]
    assert len(fake.wait_for_requests(1)) == 1


def test_a_refused_stripe_charge_runs_again_and_commits(oo, provider, refused_url, stripe_at):
    fake = provider(INTENT)
    urls = [refused_url, fake.url]  # Stripe is unreachable, then reachable again
    calls: list[str] = []

    @oo.effect(tool="stripe.charge.retrying", idempotency_key=lambda order: order)
    def charge_order(order: str) -> dict[str, str]:
        stripe_at(urls.pop(0))
        calls.append(order)
        intent = stripe.PaymentIntent.create(
            amount=2_500, currency="usd", idempotency_key=current_effect().provider_key
        )
        return {"stripe_id": intent.id}

    assert charge_order("order-8") == {"stripe_id": "pi_123"}
    assert calls == ["order-8", "order-8"]
    assert len(fake.wait_for_requests(1)) == 1


def test_a_stripe_charge_refused_every_time_fails_after_its_attempts(oo, refused_url, stripe_at):
    stripe_at(refused_url)
    calls: list[str] = []
    charge_order = stripe_charge_effect(oo, calls)
    with pytest.raises(stripe.APIConnectionError):
        charge_order("order-9")
    assert calls == ["order-9"] * 3
    (effect,) = oo.store.list_effects()
    assert effect.state == "failed"
    assert oo.journal(effect.id)[-1].reason == "retryable error, 3 attempts used"


def test_a_declined_stripe_charge_is_failed_and_not_run_again(oo, provider, stripe_at):
    fake = provider(stripe_error(402, "card_error", "card_declined"))
    stripe_at(fake.url)
    calls: list[str] = []
    charge_order = stripe_charge_effect(oo, calls)
    with pytest.raises(stripe.CardError):
        charge_order("order-10")
    (effect,) = oo.store.list_effects()
    assert effect.state == "failed"
    with pytest.raises(Exception, match="card_error card_declined"):
        charge_order("order-10")  # replayed: the handler does not run, Stripe is not asked
    assert calls == ["order-10"]
    assert len(fake.received) == 1


def test_a_declined_stripe_charge_replays_as_the_same_exception_class(oo, provider, stripe_at):
    fake = provider(stripe_error(402, "card_error", "card_declined"))
    stripe_at(fake.url)
    charge_order = stripe_charge_effect(oo, [])
    with pytest.raises(stripe.CardError) as first:
        charge_order("order-11")
    # Its body and headers (an OrderedDict, a header mapping) are stored as plain JSON, so
    # the replay is the same class with the same code the agent can branch on.
    with pytest.raises(stripe.CardError) as replayed:
        charge_order("order-11")
    assert replayed.value.code == first.value.code == "card_declined"
    assert replayed.value.openonce_replayed is True
    assert len(fake.received) == 1


def test_a_stripe_500_is_parked_unknown(oo, provider, stripe_at):
    fake = provider(stripe_error(500, "api_error"))
    stripe_at(fake.url)
    calls: list[str] = []
    charge_order = stripe_charge_effect(oo, calls)
    with pytest.raises(OutcomeUnknownError) as parked:
        charge_order("order-12")
    assert type(parked.value.__cause__) is stripe.APIError
    assert_parked_unknown(oo, parked.value)
    assert calls == ["order-12"]
