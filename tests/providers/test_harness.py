"""The fault harness: the fake provider's faults, the safety report's invariants, and
`openonce test FILE` run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, current_effect
from openonce_core._probe import ProbeOutcome
from openonce_core._reconcile import Reconciler
from openonce_core.testing import (
    SAFE,
    ChargeDeclined,
    ChargeFault,
    FakePaymentProber,
    FakePaymentProvider,
    LookupUnavailableError,
    NaiveRetryComparison,
    SafetyCheck,
    SafetyReport,
    fake_payment_capability,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "payment_timeout_after_commit.py"
SCENARIOS = [
    "Normal success",
    "Explicit pre-side-effect failure",
    "Replay safety",
    "Concurrent duplicate safety",
    "Same-key/body conflict",
    "Timeout-before-commit recovery",
    "Timeout-after-commit recovery",
    "Unknown auto-retry protection",
    "Verifier unavailable handling",
    "Unhealthy false-negative handling",
    "Wrong verification identity",
    "Unknown-evidence erasure",
]


def openonce_test(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openonce_core.cli", "test", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_suite(tmp_path: Path, body: str, name: str = "suite.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# -- the bundled example, through the CLI ---------------------------------------------------


def test_example_suite_is_safe_in_text():
    result = openonce_test(str(EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Naive retry: calls=2, charges=2, total=5000 cents" in out
    assert (
        "OpenOnce:    execution=unknown, verification=confirmed, final=committed,"
        " calls=1, charges=1" in out
    )
    lines = out.splitlines()
    rows = {line.rsplit(maxsplit=1)[0].strip(): line for line in lines if line.endswith("PASS")}
    assert list(rows) == SCENARIOS
    # One column: every PASS starts at the same offset.
    assert len({line.rindex("PASS") for line in rows.values()}) == 1
    assert "FAIL" not in out
    assert lines[-2:] == ["Final classification:", SAFE]


def test_example_suite_is_safe_in_json():
    result = openonce_test(str(EXAMPLE), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["passed"] is True
    assert doc["classification"] == SAFE
    assert [c["name"] for c in doc["checks"]] == SCENARIOS
    assert all(c["passed"] is True for c in doc["checks"])
    assert doc["comparison"] == {
        "naive_retry": {"calls": 2, "charges": 2, "total_cents": 5000},
        "openonce": {
            "execution": "unknown",
            "verification": "confirmed",
            "final": "committed",
            "calls": 1,
            "charges": 1,
        },
    }


UNSAFE_SUITE = """
    from openonce_core.testing import (
        ChargeFault, FakePaymentProvider, SafetyCheck, SafetyReport,
    )

    def naive_retry(provider):
        for _ in range(3):
            try:
                return provider.charge("customer_123", 2500, client_reference=None)
            except TimeoutError:
                continue

    def run_safety_suite():
        ok = FakePaymentProvider()
        naive_retry(ok)
        lost = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT])
        naive_retry(lost)
        return SafetyReport("Tool: naive charge", [
            SafetyCheck("Normal success", len(ok.charges) == 1, f"charges={len(ok.charges)}"),
            SafetyCheck(
                "Timeout-after-commit recovery",
                len(lost.charges) == 1,
                f"charges={len(lost.charges)}, total={lost.total_cents} cents",
            ),
        ])
"""


def test_unsafe_suite_fails_with_exit_1(tmp_path):
    suite = write_suite(tmp_path, UNSAFE_SUITE)
    result = openonce_test(suite)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("Normal success") and line.endswith("PASS") for line in lines)
    failed = [line for line in lines if line.endswith("FAIL")]
    assert [line.split("  ")[0] for line in failed] == ["Timeout-after-commit recovery"]
    assert "charges=2, total=5000 cents" in result.stdout  # the detail says what happened
    assert lines[-2:] == ["Final classification:", "UNSAFE: 1 check(s) failed"]

    as_json = openonce_test(suite, "--json")
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["passed"] is False
    assert doc["classification"] == "UNSAFE: 1 check(s) failed"
    assert [c["passed"] for c in doc["checks"]] == [True, False]


# -- bad suite files: exit 2, one line ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("x = 1\n", "defines no run_safety_suite() function"),
        ("run_safety_suite = 3\n", "run_safety_suite is not a function"),
        ("def run_safety_suite(strict):\n    pass\n", "must take no arguments"),
        ("def run_safety_suite():\n    return {'passed': True}\n", "returned dict, not"),
        ("def run_safety_suite():\n    return True\n", "returned bool, not"),
        ("import no_such_module_here\n", "importing it raised ModuleNotFoundError"),
        ("def run_safety_suite(:\n", "importing it raised SyntaxError"),
    ],
)
def test_bad_suite_files_exit_2_with_one_line(tmp_path, body, message):
    suite = write_suite(tmp_path, body)
    result = openonce_test(suite)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"openonce test: {suite}: ")
    assert message in result.stderr


def test_missing_file_exits_2(tmp_path):
    missing = str(tmp_path / "nope.py")
    result = openonce_test(missing)
    assert result.returncode == 2
    assert result.stderr.strip() == f"openonce test: {missing}: no such file"


def test_suite_that_crashes_is_a_failure_not_a_pass(tmp_path):
    suite = write_suite(tmp_path, "def run_safety_suite():\n    raise RuntimeError('boom')\n")
    result = openonce_test(suite)
    assert result.returncode == 1
    assert "SAFE" not in result.stdout
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("run_safety_suite() raised RuntimeError: boom")
    )


def test_suite_can_import_its_neighbours(tmp_path):
    write_suite(
        tmp_path,
        """
        from openonce_core.testing import SafetyCheck
        CHECK = SafetyCheck("Neighbour", True)
        """,
        name="shared_checks.py",
    )
    suite = write_suite(
        tmp_path,
        """
        from openonce_core.testing import SafetyReport
        from shared_checks import CHECK

        def run_safety_suite():
            return SafetyReport("Tool: x", [CHECK])
        """,
    )
    result = openonce_test(suite)
    assert result.returncode == 0, result.stderr


# -- the report's invariants ----------------------------------------------------------------


@pytest.mark.parametrize("passed", ["false", "true", 1, 0, None, [], "PASS"])
def test_safety_check_passed_must_be_an_exact_bool(passed):
    with pytest.raises(TypeError, match="exactly True or False"):
        SafetyCheck("Normal success", passed)


def test_report_rejects_entries_that_are_not_safety_checks():
    class LooksLikeACheck:
        name = "Normal success"
        passed = True
        detail = ""

    with pytest.raises(TypeError, match=r"checks\[1\] is LooksLikeACheck"):
        SafetyReport("t", [SafetyCheck("a", True), LooksLikeACheck()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"checks\[0\] is dict"):
        SafetyReport("t", [{"name": "a", "passed": True}])  # type: ignore[list-item]


def test_report_rechecks_a_check_mutated_past_its_constructor():
    check = SafetyCheck("a", True)
    object.__setattr__(check, "passed", "false")
    with pytest.raises(TypeError, match="not an exact bool"):
        SafetyReport("t", [check])


def test_report_needs_checks_with_distinct_names():
    with pytest.raises(ValueError, match="at least one check"):
        SafetyReport("t", [])
    with pytest.raises(ValueError, match="two checks named 'a'"):
        SafetyReport("t", [SafetyCheck("a", True), SafetyCheck("a", True)])


def test_report_classification_and_text():
    report = SafetyReport(
        "Tool: charge",
        [SafetyCheck("Short", True), SafetyCheck("A longer name", False, "charges=2")],
        NaiveRetryComparison(2, 2, 5000, 1, 1, "unknown", "confirmed", "committed"),
    )
    assert report.passed is False
    assert report.classification == "UNSAFE: 1 check(s) failed"
    assert report.to_text().splitlines() == [
        "Timeout-after-commit comparison",
        "  Naive retry: calls=2, charges=2, total=5000 cents",
        "  OpenOnce:    execution=unknown, verification=confirmed, final=committed,"
        " calls=1, charges=1",
        "",
        "Tool: charge",
        "",
        "Short          PASS",
        "A longer name  FAIL",
        "    charges=2",
        "",
        "Final classification:",
        "UNSAFE: 1 check(s) failed",
    ]
    assert SafetyReport("t", [SafetyCheck("a", True)]).classification == SAFE


def test_comparison_rejects_non_int_counts():
    with pytest.raises(TypeError, match="naive_calls"):
        NaiveRetryComparison("2", 2, 5000, 1, 1, "u", "c", "f")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="calls"):
        NaiveRetryComparison(2, 2, 5000, True, 1, "u", "c", "f")


# -- the fake provider's faults -------------------------------------------------------------


def test_faults_are_consumed_in_order_on_each_side_of_the_commit():
    provider = FakePaymentProvider(
        [
            ChargeFault.FAIL_BEFORE_COMMIT,
            ChargeFault.TIMEOUT_BEFORE_COMMIT,
            ChargeFault.TIMEOUT_AFTER_COMMIT,
            ChargeFault.LOST_REPLY,
        ]
    )
    with pytest.raises(ChargeDeclined):
        provider.charge("c", 100, client_reference="a")
    with pytest.raises(TimeoutError):
        provider.charge("c", 100, client_reference="b")
    assert provider.charges == []  # both failed before the commit
    with pytest.raises(TimeoutError):
        provider.charge("c", 100, client_reference="c")
    with pytest.raises(ConnectionResetError):
        provider.charge("c", 200, client_reference="d")
    assert [(c.client_reference, c.amount_cents) for c in provider.charges] == [
        ("c", 100),
        ("d", 200),
    ]
    provider.charge("c", 300, client_reference="e")  # faults used up: plain success
    assert provider.charge_calls == 5
    assert len(provider.charges) == 3
    assert provider.total_cents == 600


def test_a_repeated_reference_returns_the_same_charge_inside_the_window():
    now = [1000.0]
    provider = FakePaymentProvider(
        [ChargeFault.TIMEOUT_AFTER_COMMIT], idempotency_window_seconds=60, clock=lambda: now[0]
    )
    with pytest.raises(TimeoutError):
        provider.charge("c", 100, client_reference="ref")
    again = provider.charge("c", 100, client_reference="ref")
    assert again == provider.charges[0]
    assert provider.charge_calls == 2
    assert len(provider.charges) == 1
    now[0] += 61  # past the provider's idempotency window, a re-send is a new charge
    later = provider.charge("c", 100, client_reference="ref")
    assert later.id != again.id
    assert len(provider.charges) == 2
    provider.charge("c", 100, client_reference=None)
    provider.charge("c", 100, client_reference=None)  # no reference, no dedup
    assert len(provider.charges) == 4


def test_search_hides_young_charges_for_lag_lookups():
    provider = FakePaymentProvider(index_lag_lookups=2)
    charge = provider.charge("c", 100, client_reference="ref")
    first, second, third = (provider.search("ref") for _ in range(3))
    assert (first.charges, first.index_current) == ((), False)
    assert (second.charges, second.index_current) == ((), False)
    assert (third.charges, third.index_current) == ((charge,), True)
    assert provider.search_calls == 3


def test_search_hides_young_charges_for_lag_seconds():
    now = [1000.0]
    provider = FakePaymentProvider(index_lag_seconds=30, clock=lambda: now[0])
    charge = provider.charge("c", 100, client_reference="ref")
    assert provider.search("ref").charges == ()
    assert provider.search("ref").index_current is False
    now[0] += 30
    assert provider.search("ref").charges == (charge,)


def test_search_outage_and_wrong_identity():
    provider = FakePaymentProvider(lookup_outage=True)
    provider.charge("c", 100, client_reference="ref")
    with pytest.raises(LookupUnavailableError):
        provider.search("ref")
    provider.lookup_outage = False
    provider.wrong_identity = True
    page = provider.search("ref")
    assert [c.client_reference for c in page.charges] == ["ref-other"]
    assert page.index_current is True  # it looks healthy; that is what makes it dangerous


def test_provider_rejects_bad_input():
    with pytest.raises(TypeError):
        FakePaymentProvider(["timeout_after_commit"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        FakePaymentProvider(index_lag_lookups=-1)
    with pytest.raises(ValueError):
        FakePaymentProvider().charge("c", 1.5, client_reference="r")  # type: ignore[arg-type]


# -- the prober, through the real reconciler --------------------------------------------------


def charge_world(provider: FakePaymentProvider) -> tuple[OpenOnce, object, Reconciler]:
    oo = OpenOnce(":memory:", retry_delay=0)

    @oo.effect(tool="charge_customer", idempotency_key=lambda order_id, **_: order_id)
    def charge(order_id: str, amount_cents: int) -> dict:
        ref = current_effect().provider_key
        return provider.charge("customer_1", amount_cents, client_reference=ref).receipt()

    rec = Reconciler(oo, grace_seconds=0, extra_capabilities=[fake_payment_capability()])
    rec.register("charge_customer", FakePaymentProber(provider))
    return oo, charge, rec


@pytest.mark.parametrize(
    ("options", "outcome", "state"),
    [
        ({}, ProbeOutcome.HAPPENED, EffectState.COMMITTED),
        ({"lookup_outage": True}, ProbeOutcome.INCONCLUSIVE, EffectState.HUMAN_REVIEW),
        ({"index_lag_lookups": 1}, ProbeOutcome.INCONCLUSIVE, EffectState.HUMAN_REVIEW),
        ({"wrong_identity": True}, ProbeOutcome.INCONCLUSIVE, EffectState.HUMAN_REVIEW),
    ],
)
def test_prober_on_a_committed_charge(options, outcome, state):
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT], **options)
    oo, charge, rec = charge_world(provider)
    with pytest.raises(OutcomeUnknownError):
        charge(order_id="o1", amount_cents=100)
    report = rec.run_once()
    effect = oo.store.find("charge_customer", "o1")
    assert effect is not None
    assert report.outcomes == {str(outcome): 1}
    assert effect.state == state
    if state == EffectState.COMMITTED:
        assert effect.result == provider.charges[0].receipt()
    else:
        assert effect.result is None
    assert provider.charge_calls == 1
    rec.close()


def test_prober_names_the_reference_on_the_charge_it_found():
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT], wrong_identity=True)
    oo, charge, rec = charge_world(provider)
    with pytest.raises(OutcomeUnknownError):
        charge(order_id="o1", amount_cents=100)
    effect = oo.store.find("charge_customer", "o1")
    assert effect is not None
    result = FakePaymentProber(provider).probe(effect)
    assert result.outcome is ProbeOutcome.HAPPENED
    assert result.provider_reference == effect.provider_key + "-other"
    rec.close()


def test_prober_miss_rearms_only_on_a_current_index_past_its_lag():
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_BEFORE_COMMIT])
    oo, charge, rec = charge_world(provider)
    with pytest.raises(OutcomeUnknownError):
        charge(order_id="o1", amount_cents=100)
    effect = oo.store.find("charge_customer", "o1")
    assert effect is not None
    assert FakePaymentProber(provider).probe(effect).outcome is ProbeOutcome.NOT_HAPPENED
    young = FakePaymentProber(provider, clock=lambda: effect.updated_at + 1)
    provider.index_lag_seconds = 30
    assert young.probe(effect).outcome is ProbeOutcome.INCONCLUSIVE
    provider.index_lag_seconds = 0
    assert rec.run_once().rearmed == [effect.id]
    assert charge(order_id="o1", amount_cents=100)["charge_id"] == "ch_0001"
    assert provider.charge_calls == 2
    assert len(provider.charges) == 1
    rec.close()
