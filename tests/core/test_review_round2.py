"""Second adversarial review: text the ledger cannot hold, owner names, relative SQLite
paths, a fork from inside a SQLite statement, and what counts as "the same provider object".

* An exception whose message, class name or causes hold a lone surrogate (what
  ``os.fsdecode`` makes of a non-UTF-8 file name) or a NUL (Postgres text cannot hold one)
  made the finish write fail, and the effect stayed STARTED until its lease ran out.
* ``OpenOnce(owner=...)`` took anything, a pid no process can have included.
* A relative SQLite path was reopened (new thread, after a fork) against the current
  directory of the moment: another ledger file.
* A child forked from inside a statement used the ledger with its parent's lock state.
* A probe's receipt agreed with a committed result holding its id under *any* key.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from openonce_core import (
    EffectState,
    LedgerWriteError,
    OpenOnce,
    OutcomeUnknownError,
    ProbeOutcome,
    ProbeResult,
    Reconciler,
    SQLiteStore,
    Store,
)
from openonce_core._failures import describe
from openonce_core._leases import HOST, process_owner
from openonce_core.errors import ConfigurationError, OpenOnceError, ResultUnavailableError
from openonce_core.testing import FakeClock, stop_heartbeat
from tests.support.workers import append_line, read_lines

S = EffectState
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded"  # the lease keeper's thread, as in production
)


def storable_everywhere(value: Any) -> bool:
    """No lone surrogate (no store can encode one) and no NUL (Postgres text cannot)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return "\x00" not in value
    if isinstance(value, dict):
        return all(storable_everywhere(k) and storable_everywhere(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(storable_everywhere(v) for v in value)
    return True


# -- 1. exception text the ledger cannot hold -------------------------------------------------


class Declined(Exception):
    pass


class OddName(Exception):
    pass


OddName.__qualname__ = "OddName\ud800"


def fs_name_error() -> BaseException:
    try:
        open(os.fsdecode(b"/nonexistent/\xff\xfe"))  # noqa: SIM115 - a real FileNotFoundError
    except FileNotFoundError as exc:
        return exc
    raise AssertionError("the file exists")


def with_cause(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


ODD_ERRORS = {
    # name: (make the exception, business_errors, state it must end in)
    "declared_surrogate_message": (lambda: Declined("bad\udcffvalue"), (Declined,), S.FAILED),
    "declared_nul_and_surrogate": (lambda: Declined("a\x00b\ud800c"), (Declined,), S.FAILED),
    "declared_fs_name": (fs_name_error, (FileNotFoundError,), S.FAILED),
    "stderr_surrogate": (lambda: RuntimeError("stderr: \udcff"), (), S.UNKNOWN),
    "surrogate_qualname": (lambda: OddName("x"), (), S.UNKNOWN),
    "surrogate_qualname_declared": (lambda: OddName("x"), (OddName,), S.FAILED),
    "cause_with_nul_and_surrogate": (
        lambda: with_cause(Declined("outer"), ValueError("inner\x00\udcff")),
        (Declined,),
        S.FAILED,
    ),
}


@pytest.mark.parametrize("case", sorted(ODD_ERRORS))
def test_an_exception_the_ledger_cannot_hold_as_is_is_recorded_escaped(store, case):
    make, business, want = ODD_ERRORS[case]
    oo = OpenOnce(store, retry_delay=0, wait_seconds=1, clock=FakeClock())
    runs: list[int] = []

    @oo.effect(tool="odd", idempotency_key=lambda k: k, business_errors=business)
    def odd(k: str) -> None:
        runs.append(1)
        raise make()

    raised: list[BaseException] = []
    for _ in range(2):
        started = time.monotonic()
        with pytest.raises(Exception) as info:
            odd("k")
        assert not isinstance(info.value, LedgerWriteError), info.value
        assert time.monotonic() - started < 1, "waited on an effect left STARTED"
        raised.append(info.value)
    assert runs == [1]
    effect = store.find("odd", "k")
    assert effect is not None and effect.state == want
    if want == S.UNKNOWN:
        assert all(isinstance(e, OutcomeUnknownError) for e in raised)
    assert storable_everywhere(effect.error) and storable_everywhere(effect.execution_evidence)
    journal = oo.journal(effect.id)
    assert all(storable_everywhere(line.reason) for line in journal)
    assert all(storable_everywhere(line.evidence) for line in journal)
    # Escaped, not lost: the text says what the exception said.
    recorded = repr(effect.error)
    assert "\\\\udcff" in recorded or "\\\\ud800" in recorded or "\\\\x00" in recorded, recorded


def test_describe_writes_every_text_storably_and_keeps_args_exact():
    exc = with_cause(Declined("m\x00\udcff", "a\x00"), OddName("c\ud800"))
    doc = describe(exc, "failed", (), why="rule \udcff\x00")
    assert storable_everywhere({k: v for k, v in doc.items() if k != "args"})
    assert doc["message"] == "('m\\\\x00\\\\udcff', 'a\\\\x00')".replace("\\\\", "\\")
    assert doc["why"] == "rule \\udcff\\x00"
    assert doc["causes"][0]["type"].endswith("OddName\\ud800")
    assert doc["args"] is None  # a lone surrogate is not JSON: not kept, not mangled
    plain = describe(Declined("a\x00b"), "failed", ())
    assert plain["args"] == ["a\x00b"]  # JSON writes NUL as \u0000: kept for the replay
    from openonce_core._failures import safe_text

    assert safe_text("plain") == "plain"


def test_an_inner_error_the_ledger_cannot_hold_as_is_still_gives_the_claim_back(store):
    """An OpenOnce error from inside the handler (an inner effect's) suspends the effect;
    its reason quotes the error, NUL and surrogate included."""
    oo = OpenOnce(store, retry_delay=0, clock=FakeClock())
    runs: list[int] = []

    @oo.effect(tool="outer", idempotency_key=lambda k: k)
    def outer(k: str) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise OpenOnceError("inner says \udcff\x00")
        return "ran"

    with pytest.raises(OpenOnceError, match="inner says"):
        outer("k")
    effect = store.find("outer", "k")
    assert effect is not None and effect.state == S.PLANNED
    line = oo.journal(effect.id)[-1]
    assert line.action == "suspend" and "\\udcff\\x00" in line.reason
    assert outer("k") == "ran"


@pytest.mark.parametrize("text", ["raw \udcff", "raw \x00"], ids=["surrogate", "nul"])
@pytest.mark.parametrize("outcome", ["failed", "unknown"])
def test_an_outcome_the_store_refuses_is_recorded_unknown_not_left_started(
    store, monkeypatch, outcome, text
):
    """The backstop: were a description to slip through unescaped, the write the store
    refuses for its data ends UNKNOWN (the attempt ran), not STARTED until the lease ends."""
    import openonce_core._calls as calls

    if "\x00" in text and store.dialect != "postgres":
        pytest.skip("only Postgres text refuses a NUL")

    def raw(exc: BaseException, kind: str, secrets: Any, why: str = "") -> dict[str, Any]:
        return {"type": text, "message": text, "args": None, "class": kind, "why": text}

    monkeypatch.setattr(calls, "describe", raw)
    oo = OpenOnce(store, retry_delay=0, wait_seconds=1, clock=FakeClock())
    business = (Declined,) if outcome == "failed" else ()
    runs: list[int] = []

    @oo.effect(tool="t", idempotency_key=lambda k: k, business_errors=business)
    def handler(k: str) -> None:
        runs.append(1)
        raise Declined("no")

    with pytest.raises(LedgerWriteError) as info:
        handler("k")
    assert "recorded UNKNOWN instead" in str(info.value)
    effect = store.find("t", "k")
    assert effect is not None and effect.state == S.UNKNOWN
    assert "could not be stored" in effect.error["message"]
    with pytest.raises(OutcomeUnknownError):
        handler("k")
    assert runs == [1]


RESULTS = {
    "surrogate_value": ({"x": "a\udcffb"}, False),
    "surrogate_key": ({"a\ud800": 1}, False),
    "nul_value": ({"x": "a\x00b"}, True),
    "nul_key": ({"a\x00": 1}, True),
}


@pytest.mark.parametrize("case", sorted(RESULTS))
def test_a_result_the_ledger_cannot_hold_commits_without_it(store, case):
    value, replays = RESULTS[case]
    oo = OpenOnce(store, retry_delay=0, clock=FakeClock())

    @oo.effect(tool="r", idempotency_key=lambda k: k)
    def returns(k: str) -> Any:
        return value

    assert returns("k") == value
    effect = store.find("r", "k")
    assert effect is not None and effect.state == S.COMMITTED
    if replays:
        assert returns("k") == value
    else:
        with pytest.raises(ResultUnavailableError):
            returns("k")


# -- 2. owner names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "owner",
    [
        f"{HOST}:{10**20}:-",
        f"{HOST}:0:-",
        "elsewhere:-5:-",
        f"{HOST}:{2**22 + 1}:x",
        "worker\x00",
        "worker\udcff",
        "worker\n1",
        "w" * 300,
        b"worker",
    ],
)
def test_an_owner_the_ledger_cannot_hold_or_judge_is_refused(owner):
    with pytest.raises(ConfigurationError):
        OpenOnce(":memory:", owner=owner)


@pytest.mark.parametrize(
    "owner", ["worker-1", "A", "console", "elsewhere:4242:-", f"{HOST}:{2**22}:-", "x:y:z"]
)
def test_owners_of_ones_own_choosing_are_kept(owner):
    assert OpenOnce(":memory:", owner=owner).owner == owner
    assert OpenOnce(":memory:", owner=process_owner()).owner == process_owner()


# -- 3. a relative SQLite path -------------------------------------------------------------------


def test_a_relative_sqlite_path_names_the_file_it_named_when_opened(tmp_path, monkeypatch):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    runs = tmp_path / "runs"
    monkeypatch.chdir(first)
    oo = OpenOnce("ledger.db")
    assert oo.store.path == str(first / "ledger.db")

    @oo.effect(tool="t", idempotency_key=lambda k: k)
    def act(k: str) -> str:
        append_line(runs, k)
        return k

    assert act("K") == "K"
    monkeypatch.chdir(elsewhere)
    OpenOnce("ledger.db").close()  # another ledger where we are now
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(act("K")))  # a new connection
    thread.start()
    thread.join()
    assert out == ["K"]
    pid = os.fork()  # every connection is closed at a fork, and reopened by name after
    if pid == 0:
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert act("K") == "K"
    assert read_lines(runs) == ["K"]
    assert SQLiteStore(str(elsewhere / "ledger.db")).find("t", "K") is None
    oo.close()


# -- 4. a fork from inside a SQLite statement ---------------------------------------------------

FORK_INSIDE_A_CLAIM = r"""
import os, sqlite3, sys, warnings
from pathlib import Path
from openonce_core import OpenOnce

mode, path, runs, report = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
warnings.simplefilter("ignore")
oo = OpenOnce(path)
parent = os.getpid()

@oo.effect(tool="t", idempotency_key=lambda k: k)
def act(k):
    with runs.open("a") as f:
        f.write(k + "\n")
    return k

act("before")  # this thread's connection is open
forked = []

def fork_here():
    forked.append(os.fork())
    if forked[0] != 0:
        return
    sys.settrace(None)
    lines = []
    for what, use in [
        ("read", lambda: oo.store.find("t", "before")),
        ("call", lambda: act("child")),
        ("new client", lambda: OpenOnce(path)),
    ]:
        try:
            use()
            lines.append(f"{what}: used the ledger")
        except Exception as exc:
            lines.append(f"{what}: {type(exc).__name__}: {exc}")
    report.write_text("\n".join(lines) + "\n")
    if mode == "statement":
        # Inside sqlite3_step the connection's mutex is held by a thread this process does
        # not have: nothing can go back into that statement.
        os._exit(0)
    # "between": back into the parent's claim, between its statements; it must not commit.

def on_statement(sql):
    # Called by SQLite inside sqlite3_step, in the claim's transaction.
    if "INSERT INTO openonce_journal" in sql and not forked:
        fork_here()

def tracer(frame, event, arg):
    # Where a signal handler runs: between two Python lines of the claim's transaction
    # (here: its statements done, the COMMIT not yet sent).
    if frame.f_code.co_name == "work" and frame.f_code.co_filename.endswith("sqlite.py"):
        def local(frame, event, arg):
            if event == "return" and not forked and frame.f_locals.get("lines"):
                fork_here()
            return local
        return local
    return None

if mode == "statement":
    oo.store._conn().set_trace_callback(on_statement)
else:
    sys.settrace(tracer)
try:
    result = act("k")
except Exception as exc:
    result = f"{type(exc).__name__}: {exc}"
if os.getpid() != parent:
    with report.open("a") as f:
        f.write(f"resumed claim: {result}\n")
    os._exit(0)
sys.settrace(None)
oo.store._conn().set_trace_callback(None)
assert result == "k", result
assert forked and os.waitstatus_to_exitcode(os.waitpid(forked[0], 0)[1]) == 0
assert act("after") == "after"  # the parent goes on
oo.close()
print("ok")
"""


@pytest.mark.parametrize("mode", ["statement", "between"])
def test_a_child_forked_inside_a_statement_refuses_the_ledger(tmp_path, mode):
    """The forking thread's own connection cannot be closed before the fork (a fork from a
    SQLite callback inside a statement, or from a signal handler between two statements of
    a transaction): the parent goes on with it, and the child, which inherited its lock
    state, refuses every use, even a new client's, and never touches the inherited
    connection (the claim it resumes in does not commit). A subprocess, so a hang fails
    instead of blocking."""
    path, runs, report = tmp_path / "ledger.db", tmp_path / "runs", tmp_path / "child"
    done = subprocess.run(
        [sys.executable, "-c", FORK_INSIDE_A_CLAIM, mode, str(path), str(runs), str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    lines = report.read_text().splitlines()
    uses = ["read", "call", "new client"] + (["resumed claim"] if mode == "between" else [])
    assert [line.split(":")[0] for line in lines] == uses, lines
    assert all("ConfigurationError" in line for line in lines), lines
    assert all("open in the forking thread at fork" in line for line in lines), lines
    assert read_lines(runs) == ["before", "k", "after"]  # the child ran nothing
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        states = conn.execute(
            "SELECT idempotency_key, state FROM openonce_effects ORDER BY idempotency_key"
        ).fetchall()
    assert states == [("after", "committed"), ("before", "committed"), ("k", "committed")]


# -- 5. the same provider object -------------------------------------------------------------


@pytest.mark.parametrize(
    ("committed", "receipt", "same"),
    [
        ({"id": "ch_1", "object": "charge"}, {"stripe_id": "ch_1"}, True),  # returned whole
        ({"stripe_id": "ch_1"}, {"stripe_id": "ch_1"}, True),
        ({"id": "ch_2", "refund_of": "ch_1"}, {"stripe_id": "ch_1"}, False),
        ({"id": "re_9", "charge": "ch_1"}, {"stripe_id": "ch_1"}, False),
        ({"stripe_id": "ch_2", "id": "ch_1"}, {"stripe_id": "ch_1"}, False),
        ({"id": 1, "amount": 1}, {"stripe_id": "1"}, False),
    ],
)
def test_a_committed_result_is_the_probed_object_only_by_its_identity(committed, receipt, same):
    oo = OpenOnce(":memory:")
    rec = Reconciler(oo, grace_seconds=0)
    try:
        assert rec._same_object(committed, receipt, "stripe.charge") is same
    finally:
        rec.close()


def test_a_committed_result_naming_the_probed_object_elsewhere_goes_to_a_person(store):
    """A probe that finds ch_1 loses its race to a late result that committed ch_2 (a
    refund of ch_1): the two are not the same object, so a person checks for a duplicate."""
    clock = FakeClock()
    oo = stop_heartbeat(OpenOnce(store, retry_delay=0, lease_seconds=60, clock=clock))
    entered, release = threading.Event(), threading.Event()
    late = {"id": "ch_2", "refund_of": "ch_1"}
    result: list[Any] = []

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, Any]:
        entered.set()
        assert release.wait(10), "the test never released the handler"
        return late

    thread = threading.Thread(target=lambda: result.append(charge("o1")))
    thread.start()
    assert entered.wait(10)
    clock.advance(61)
    (effect_id,) = oo.expire_leases()

    def prober(effect: Any) -> ProbeResult:
        release.set()  # while the probe runs, the slow attempt's late result commits first
        thread.join(10)
        return ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "ch_1"}, detail="found by metadata",
            provider_reference=effect.provider_key,
        )  # fmt: skip

    rec = Reconciler(oo, grace_seconds=0, owner="rec-1")
    try:
        rec.register("stripe.charge", prober)
        report = rec.run_once()
    finally:
        rec.close()
    assert result == [late]
    assert report.lost_races == 1
    effect = oo.get(effect_id)
    assert effect.state == S.HUMAN_REVIEW
    line = oo.journal(effect_id)[-1]
    assert (line.action, line.from_state) == ("contradict", S.COMMITTED)


# -- 6. closing a store while its own thread is mid-call ---------------------------------------


def test_closing_the_store_mid_call_lets_the_call_finish_and_later_uses_reopen(store):
    """close() closes every connection once its statement is done; the call in flight
    still records its outcome (it was left STARTED on Postgres), and a later use reopens,
    on every store alike."""
    oo = OpenOnce(store, retry_delay=0, clock=FakeClock())
    runs: list[str] = []

    @oo.effect(tool="t", idempotency_key=lambda k: k)
    def act(k: str) -> str:
        runs.append(k)
        if k == "closing":
            store.close()  # as another part of the process might, at shutdown
        return k

    assert act("closing") == "closing"
    effect = store.find("t", "closing")
    assert effect is not None and effect.state == S.COMMITTED
    assert act("after") == "after"
    with store.watch(effect.id) as watch:  # Postgres: the listener starts again
        watch.wait(0)
    store.close()
    assert act("closing") == "closing"  # a replay, reopened once more
    assert runs == ["closing", "after"]


# -- a prober's own words in a journal reason -------------------------------------------------


def test_a_prober_error_holding_nul_and_a_surrogate_is_journaled_escaped(store: Store) -> None:
    from openonce_core.testing import fake_payment_capability

    clock = FakeClock()
    oo = OpenOnce(store, clock=clock)

    @oo.effect(tool="charge_customer", idempotency_key=lambda order: order)
    def charge(order: str) -> dict[str, str]:
        raise TimeoutError("read timed out")  # sent, no answer: UNKNOWN

    with pytest.raises(OutcomeUnknownError):
        charge("o-1")
    [effect] = store.list_effects(None, 10)

    def broken(effect: Any) -> Any:
        raise RuntimeError("bad\x00byte \udcff from the provider's SDK")

    rec = Reconciler(oo, extra_capabilities=[fake_payment_capability("charge_customer")],
                     clock=clock, probe_retries=1)  # fmt: skip
    rec.register("charge_customer", broken)
    rec.run_once()  # raised DataError (Postgres) or UnicodeEncodeError before
    after = oo.get(effect.id)
    assert after.state in (EffectState.UNKNOWN, EffectState.HUMAN_REVIEW)
    reason = oo.journal(effect.id)[-1].reason
    assert "bad\\x00byte \\udcff" in reason
