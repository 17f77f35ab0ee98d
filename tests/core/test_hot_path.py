"""The hot path's lean replay and its JSON helpers do what the long way does.

A duplicate of a settled effect that this process has seen takes a short path in
``CallPath._execute`` (one read, no trace); anything the short path does not settle goes
the long way. These pin what a caller sees on either path: the value or the failure
handed back, the refusals, the statements run, the counts and the observers' events."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from openonce_core import OpenOnce
from openonce_core._canonical import dumps, loads
from openonce_core.errors import IdempotencyMismatchError, OutcomeUnknownError
from openonce_core.stores.sqlite import SQLiteStore


def _ledger(store: Any, **options: Any) -> OpenOnce:
    return OpenOnce(store, **options)


def test_a_replay_returns_the_recorded_result_and_runs_nothing(store):
    oo = _ledger(store)
    runs: list[int] = []

    @oo.effect(tool="send", idempotency_key=lambda n: f"k{n}")
    def send(n: int) -> dict[str, Any]:
        runs.append(n)
        return {"n": n, "items": [1, "é"]}

    assert send(1) == {"n": 1, "items": [1, "é"]}
    assert send(1) == {"n": 1, "items": [1, "é"]}
    assert send(1) == {"n": 1, "items": [1, "é"]}
    assert runs == [1]
    assert oo.stats == {"executed": 1, "replayed": 2}


def test_a_replayed_failure_raises_it_again_and_counts_as_a_replay(store):
    oo = _ledger(store)
    runs: list[int] = []

    @oo.effect(tool="send", idempotency_key=lambda n: f"k{n}", business_errors=[ValueError])
    def send(n: int) -> None:
        runs.append(n)
        raise ValueError(f"card {n} declined")

    for _ in range(3):
        with pytest.raises(ValueError, match="card 1 declined"):
            send(1)
    assert runs == [1]
    assert oo.stats == {"failed": 1, "replayed": 2}


def test_a_known_key_with_other_arguments_is_refused_on_the_short_path_too(store):
    oo = _ledger(store)

    @oo.effect(tool="charge", idempotency_key=lambda order, cents: order)
    def charge(order: str, cents: int) -> str:
        return f"charged {cents}"

    assert charge("o1", 100) == "charged 100"
    with pytest.raises(IdempotencyMismatchError):
        charge("o1", 200)
    assert charge("o1", 100) == "charged 100"
    assert oo.stats == {"executed": 1, "refused": 1, "replayed": 1}


def test_a_known_key_whose_effect_is_not_settled_goes_the_long_way(store):
    oo = _ledger(store)

    @oo.effect(tool="pay", idempotency_key=lambda order: order)
    def pay(order: str) -> None:
        raise TimeoutError("the provider did not answer")

    with pytest.raises(OutcomeUnknownError):
        pay("o1")
    with pytest.raises(OutcomeUnknownError):
        pay("o1")  # a key this process saw, an UNKNOWN effect: never run again
    assert oo.stats == {"unknown": 2}


def test_observers_still_see_every_replay(store):
    events: list[Any] = []
    oo = _ledger(store, observers=[events.append])

    @oo.effect(tool="send", idempotency_key=lambda n: f"k{n}")
    def send(n: int) -> int:
        return n * 2

    assert [send(3), send(3)] == [6, 6]
    assert [(e.tool, e.outcome) for e in events] == [("send", "executed"), ("send", "replayed")]
    assert events[0].effect_id == events[1].effect_id is not None


def test_a_replay_on_sqlite_is_one_read_and_no_write(tmp_path):
    store = SQLiteStore(str(tmp_path / "ledger.db"))
    store.migrate()
    oo = _ledger(store)

    @oo.effect(tool="send", idempotency_key=lambda n: f"k{n}")
    def send(n: int) -> int:
        return n

    send(1)
    seen: list[str] = []
    conn = store._conn()
    conn.set_trace_callback(seen.append)
    try:
        assert send(1) == 1
    finally:
        conn.set_trace_callback(None)
    assert len(seen) == 1 and seen[0].startswith("SELECT id, state, args_fingerprint")
    oo.close()


def test_an_unsettled_known_key_is_read_once_on_its_way_to_the_long_path(tmp_path):
    # The lean read found an UNKNOWN effect: the long way decides on that same read.
    store = SQLiteStore(str(tmp_path / "ledger.db"))
    store.migrate()
    oo = _ledger(store)

    @oo.effect(tool="pay", idempotency_key=lambda order: order)
    def pay(order: str) -> None:
        raise TimeoutError("the provider did not answer")

    with pytest.raises(OutcomeUnknownError):
        pay("o1")
    seen: list[str] = []
    conn = store._conn()
    conn.set_trace_callback(seen.append)
    try:
        with pytest.raises(OutcomeUnknownError):
            pay("o1")
    finally:
        conn.set_trace_callback(None)
    replay_reads = [q for q in seen if q.startswith("SELECT id, state, args_fingerprint")]
    assert len(replay_reads) == 1, seen
    oo.close()


# -- the JSON helpers ------------------------------------------------------------------------

VALUES: list[Any] = [
    {"b": 1, "a": [1.5, "é", None, True, False]},
    {"nested": {"deeper": [{"x": '\u2028\n\t"\\'}]}, "emoji": "\U0001f600"},
    [],
    {},
    "text",
    0,
    -(2**70),
    1e300,
    -0.0,
    None,
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_writes_what_the_json_module_writes(value):
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert dumps(value) == expected


def test_dumps_refuses_what_the_json_module_refuses_every_time():
    circular: list[Any] = []
    circular.append(circular)
    for _ in range(2):  # the second call is not confused by the first one's failure
        with pytest.raises(ValueError, match="Circular reference"):
            dumps({"a": circular})
        with pytest.raises(ValueError, match="not JSON compliant"):
            dumps([math.nan])
        with pytest.raises(TypeError, match="not JSON serializable"):
            dumps({"when": object()})
    assert dumps({"fine": [1]}) == '{"fine":[1]}'


@pytest.mark.parametrize(
    "text",
    ['{"n":1,"status":"sent"}', ' {"a": 1} ', '{"a":1}\n', "[1,2]", '"x"', "1", "1.5", "null"],
)
def test_loads_reads_what_the_json_module_reads(text):
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ['{"a":1}x', "", "{", "[1,]", "nul"])
def test_loads_refuses_what_the_json_module_refuses_with_its_words(text):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        loads(text)
    assert str(got.value) == str(expected.value)
