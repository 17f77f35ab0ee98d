"""Second review of the call path: a tool's business errors never hide "may have run",
recording an exception never leaves an effect STARTED, text the ledger cannot hold is
refused before anything is written, late results and lost probe races keep their evidence,
and a handler that sent something is not retried blindly."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import stripe

from openonce_core import (
    BusinessError,
    EffectState,
    InvalidArgumentsError,
    LeaseLostError,
    OpenOnce,
    OutcomeUnknownError,
    ProbeOutcome,
    ProbeResult,
    Reconciler,
    current_effect,
)
from openonce_core.testing import FakeClock, stop_heartbeat
from tests.core.test_classify_real_sdks import HANG, HANG_TIMEOUT, FakeProvider

S = EffectState
PEPPER = b"pepper-for-tests-0123456789abcdef"
CARD = "4242424242424242"


def everything(oo: OpenOnce, effect_id: str) -> str:
    effect = oo.get(effect_id)
    return repr(effect) + "".join(repr(line) for line in oo.journal(effect_id))


def in_thread(fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


# -- 1. a tool's business_errors mean what Classifier(business=...) means -------------------


@pytest.fixture
def hanging_stripe(monkeypatch) -> Iterator[FakeProvider]:
    """The stripe module pointed at a server that reads the request and never answers."""
    fake = FakeProvider(HANG)
    monkeypatch.setattr(stripe, "api_key", "sk_test_round2")
    monkeypatch.setattr(stripe, "api_base", fake.url)
    monkeypatch.setattr(stripe, "max_network_retries", 0)
    monkeypatch.setattr(stripe, "default_http_client", stripe.RequestsClient(timeout=HANG_TIMEOUT))
    yield fake
    fake.close()


def test_a_stripe_read_timeout_stays_unknown_though_stripe_errors_are_declared_business(
    hanging_stripe,
):
    calls: list[str] = []
    with OpenOnce(":memory:", retry_delay=0) as oo:

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order,
                   business_errors=(stripe.StripeError,))  # fmt: skip
        def charge(order: str) -> dict[str, str]:
            calls.append(order)
            intent = stripe.PaymentIntent.create(
                amount=2_500, currency="usd", idempotency_key=current_effect().provider_key
            )
            return {"stripe_id": intent.id}

        with pytest.raises(OutcomeUnknownError) as parked:
            charge("order-7")
        assert type(parked.value.__cause__) is stripe.APIConnectionError
        effect = oo.get(parked.value.effect_id)
        assert effect.state == S.UNKNOWN  # parked for a probe: Stripe got the charge
        assert "ReadTimeout" in oo.journal(effect.id)[-1].reason
        with pytest.raises(OutcomeUnknownError):
            charge("order-7")
    assert calls == ["order-7"]
    assert len(hanging_stripe.wait_for_requests(1)) == 1


def test_a_stripe_card_error_declared_business_is_failed_and_replayed():
    calls: list[str] = []
    with OpenOnce(":memory:", retry_delay=0) as oo:

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order,
                   business_errors=(stripe.StripeError,))  # fmt: skip
        def charge(order: str) -> None:
            calls.append(order)
            raise stripe.CardError(
                "Your card was declined.", None, "card_declined", http_status=402,
                json_body={"error": {"type": "card_error", "code": "card_declined"}},
            )  # fmt: skip

        with pytest.raises(stripe.CardError):
            charge("order-8")
        with pytest.raises(stripe.CardError) as replayed:
            charge("order-8")
        assert replayed.value.openonce_replayed is True
        effect = oo.get(replayed.value.openonce_effect_id)
        assert effect.state == S.FAILED
        assert oo.journal(effect.id)[-1].reason == "stripe.CardError: declared a business error"
    assert calls == ["order-8"]


# -- 2. recording an exception never leaves the effect STARTED --------------------------------


def _cyclic_list() -> BaseException:
    args: list[Any] = [f"card {CARD} declined"]
    args.append(args)
    return BusinessError("declined", args)


def _cyclic_dict() -> BaseException:
    body: dict[str, Any] = {"card": CARD}
    body["self"] = body
    return ValueError(body)


def _own_cause() -> BaseException:
    exc = BusinessError(f"card {CARD} declined", [CARD])
    exc.__cause__ = exc
    return exc


@pytest.mark.parametrize(
    ("make", "state"),
    [(_cyclic_list, S.FAILED), (_cyclic_dict, S.UNKNOWN), (_own_cause, S.FAILED)],
    ids=["cyclic-list", "cyclic-dict", "own-cause"],
)
def test_a_cyclic_exception_on_a_tool_with_secrets_is_recorded(store, make, state):
    oo = OpenOnce(store, retry_delay=0, secret_pepper=PEPPER)
    calls: list[str] = []

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order, card: order,
               secret_fields=["card"])  # fmt: skip
    def charge(order: str, card: str) -> None:
        calls.append(order)
        raise make()

    expected = OutcomeUnknownError if state == S.UNKNOWN else BusinessError
    for _ in range(2):  # recorded, then replayed
        with pytest.raises(expected):
            charge("o1", CARD)
    effect = store.find("stripe.charge", "o1")
    assert effect.state == state
    assert CARD not in everything(oo, effect.id)
    assert calls == ["o1"]


def test_the_cycle_is_recorded_as_a_marker():
    with OpenOnce(":memory:", secret_pepper=PEPPER) as oo:

        @oo.effect(tool="t", idempotency_key=lambda card: "k", secret_fields=["card"])
        def charge(card: str) -> None:
            raise _cyclic_list()

        with pytest.raises(BusinessError):
            charge(CARD)
        effect = oo.store.find("t", "k")
        assert effect.error["args"] == ["declined", ["card [secret] declined", "<cycle>"]]


def test_an_exception_that_cannot_be_described_is_recorded_unknown(monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("describe broke")

    monkeypatch.setattr("openonce_core._calls.describe", broken)
    calls: list[str] = []
    with OpenOnce(":memory:", secret_pepper=PEPPER) as oo:

        @oo.effect(tool="t", idempotency_key=lambda card: "k", secret_fields=["card"])
        def charge(card: str) -> None:
            calls.append(card)
            raise BusinessError(f"card {card} declined")

        with pytest.raises(OutcomeUnknownError):
            charge(CARD)
        effect = oo.store.find("t", "k")
        assert effect.state == S.UNKNOWN
        assert effect.error == {
            "type": "openonce_core.errors.BusinessError",
            "message": "the exception could not be recorded (RuntimeError)",
            "args": None,
            "class": "unknown",
            "why": "the exception could not be recorded (RuntimeError)",
        }
        assert CARD not in everything(oo, effect.id)
        with pytest.raises(OutcomeUnknownError):
            charge(CARD)
    assert calls == [CARD]


# -- 3. text the ledger cannot hold is refused before anything is written --------------------


def _refused(store: Any, oo: OpenOnce, calls: list[Any], path: str, run: Callable[[], Any]):
    with pytest.raises(InvalidArgumentsError) as refused:
        run()
    assert refused.value.path == path
    assert "NUL" in str(refused.value)
    assert calls == []
    assert list(store.list_effects()) == []


def test_nul_in_a_scope_is_refused_on_every_store(store):
    oo = OpenOnce(store)
    calls: list[Any] = []

    @oo.effect(tool="t")
    def step(n: int) -> None:
        calls.append(n)

    def run() -> None:
        with oo.scope("run\x00-1"):
            step(1)

    _refused(store, oo, calls, "scope", run)


def test_nul_in_an_explicit_key_is_refused_on_every_store(store):
    oo = OpenOnce(store)
    calls: list[Any] = []

    @oo.effect(tool="t", idempotency_key=lambda order: f"refund\x00{order}")
    def refund(order: str) -> None:
        calls.append(order)

    _refused(store, oo, calls, "idempotency_key", lambda: refund("o1"))


def test_nul_in_a_tool_name_is_refused_when_declared(store):
    oo = OpenOnce(store)
    with pytest.raises(InvalidArgumentsError, match="NUL"):
        oo.effect(lambda n: n, tool="refund\x00")


EXPLICIT = {"idempotency_key": lambda order, note, extra: order}


@pytest.mark.parametrize(
    ("declaration", "path", "note", "extra"),
    [
        ({}, "$.note", "a\x00b", {}),  # the key derived from every argument
        ({"idempotency_fields": ["order"]}, "$.note", "a\x00b", {}),
        (EXPLICIT, "$.extra.items[1]", "n", {"items": ["x", "\x00"]}),
        (EXPLICIT, "$.extra.'k\\x00'", "n", {"k\x00": 1}),  # an object's key
    ],
    ids=["derived", "fields", "explicit-nested", "object-key"],
)
def test_nul_in_an_argument_is_refused_on_every_store(store, declaration, path, note, extra):
    oo = OpenOnce(store)
    calls: list[Any] = []

    @oo.effect(tool="t", **declaration)
    def step(order: str, note: str, extra: dict[str, Any]) -> None:
        calls.append(order)

    def run() -> None:
        with oo.scope("run-1"):
            step("o1", note, extra)

    _refused(store, oo, calls, path, run)


def test_text_that_only_looks_like_nul_and_a_secret_holding_nul_are_stored(store):
    oo = OpenOnce(store, secret_pepper=PEPPER)
    calls: list[Any] = []

    @oo.effect(tool="t", secret_fields=["pin"])
    def step(note: str, pin: str) -> str:
        calls.append(note)
        return note

    with oo.scope("run-1"):
        # A backslash before "u0000" is ordinary text; a secret is stored as a digest.
        assert step("\\u0000 is not NUL", "12\x0034") == "\\u0000 is not NUL"
        assert step("\\u0000 is not NUL", "12\x0034") == "\\u0000 is not NUL"
    effect = next(iter(store.list_effects()))
    assert effect.state == S.COMMITTED
    assert effect.args["note"] == "\\u0000 is not NUL"
    assert calls == ["\\u0000 is not NUL"]


# -- 4. a late result that keeps losing races is still journaled -----------------------------


def test_a_late_result_that_loses_every_race_is_journaled(store, monkeypatch):
    clock = FakeClock()
    oo = stop_heartbeat(OpenOnce(store, retry_delay=0, lease_seconds=60, clock=clock))

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        clock.advance(61)
        assert oo.expire_leases() == [current_effect().effect_id]  # our lease lapsed
        return {"message_id": "m-1"}

    real_move = oo.ledger.move
    lost: list[str] = []

    def losing_move(effect: Any, action: str, *args: Any, **kwargs: Any) -> bool:
        if action in ("late_result", "contradict"):
            lost.append(action)
            return False  # someone else moved it first, every time
        return real_move(effect, action, *args, **kwargs)

    monkeypatch.setattr(oo.ledger, "move", losing_move)
    with pytest.raises(LeaseLostError):
        send("a@b.c")
    assert lost == ["late_result"] * 5
    effect = next(iter(store.list_effects()))
    assert effect.state == S.UNKNOWN
    line = oo.journal(effect.id)[-1]
    assert (line.action, line.from_state, line.to_state) == ("note", S.UNKNOWN, S.UNKNOWN)
    assert line.reason.startswith("attempt 1 finished (returned) after losing its lease")
    assert "not compared with the recorded state" in line.reason
    assert line.evidence["result"] == {"message_id": "m-1"}
    assert line.evidence["observed"] == "returned"


# -- 5. a probe that loses to the attempt's own late result compares identity ----------------


@pytest.mark.parametrize(("found", "state"), [("pi_1", S.COMMITTED), ("pi_2", S.HUMAN_REVIEW)])
def test_a_probe_losing_to_the_late_result_compares_the_provider_object(store, found, state):
    clock = FakeClock()
    oo = stop_heartbeat(OpenOnce(store, retry_delay=0, lease_seconds=60, clock=clock))
    entered, release = threading.Event(), threading.Event()
    whole = {"id": "pi_1", "object": "payment_intent", "amount": 2500, "status": "succeeded"}

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, Any]:
        entered.set()
        assert release.wait(10), "the test never released the handler"
        return whole  # the handler returns the whole Stripe object

    first = in_thread(charge, "o1")
    assert entered.wait(10)
    clock.advance(61)
    (effect_id,) = oo.expire_leases()

    def prober(effect: Any) -> ProbeResult:
        # While the probe runs, the slow attempt returns: its late result commits first.
        release.set()
        assert first.result(timeout=10) == whole
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": found}, detail="found by metadata",
            provider_reference=effect.provider_key,
        )  # fmt: skip

    rec = Reconciler(oo, grace_seconds=0, owner="rec-1")
    try:
        rec.register("stripe.charge", prober)
        report = rec.run_once()
    finally:
        rec.close()
    assert report.lost_races == 1
    effect = oo.get(effect_id)
    assert effect.state == state
    assert effect.result == whole
    line = oo.journal(effect_id)[-1]
    assert line.evidence["observation"]["receipt"] == {"stripe_id": found}
    if state == S.COMMITTED:
        assert (line.action, line.to_state) == ("note", S.COMMITTED)
    else:
        assert (line.action, line.from_state) == ("contradict", S.COMMITTED)


# -- 6. a handler that sent something is not retried blindly ---------------------------------


def _two_call_handler(oo: OpenOnce, sent: list[str], mark: bool) -> Callable[[str], Any]:
    @oo.effect(tool="order.place", idempotency_key=lambda order: order, max_attempts=3)
    def place(order: str) -> None:
        sent.append("charge")  # the first external call succeeds
        if mark:
            current_effect().mark_sent()
        raise ConnectionRefusedError("the shipping API refused the connection")

    return place


def test_a_refused_second_call_after_mark_sent_is_unknown(store):
    oo = OpenOnce(store, retry_delay=0)
    sent: list[str] = []
    place = _two_call_handler(oo, sent, mark=True)
    with pytest.raises(OutcomeUnknownError) as parked:
        place("o1")
    assert sent == ["charge"]  # the first call ran once
    effect = oo.get(parked.value.effect_id)
    assert effect.state == S.UNKNOWN
    assert "mark_sent" in oo.journal(effect.id)[-1].reason
    with pytest.raises(OutcomeUnknownError):
        place("o1")
    assert sent == ["charge"]


def test_without_mark_sent_a_refused_second_call_reruns_the_first(store):
    # The documented behaviour: RETRYABLE means "nothing was sent", so the handler runs
    # again, first call included. Mark it sent, or make one effect per call.
    oo = OpenOnce(store, retry_delay=0)
    sent: list[str] = []
    place = _two_call_handler(oo, sent, mark=False)
    with pytest.raises(ConnectionRefusedError):
        place("o1")
    assert sent == ["charge"] * 3
    assert next(iter(store.list_effects())).state == S.FAILED
