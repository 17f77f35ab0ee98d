"""``openonce reconcile`` and the contract-checked resolve commands, run as an operator
runs them: the real entry point in a subprocess against a SQLite file and Postgres.

The test process makes UNKNOWN effects (a handler records at a fake provider, a JSON file,
then times out); the probers module, written to tmp_path and importable through
PYTHONPATH, reads that file from the subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openonce_core import EffectState, OpenOnce, OutcomeUnknownError, current_effect

S = EffectState
MODULE = "oo_reconcile_probers"

PROBERS_SOURCE = textwrap.dedent(
    '''
    """Probers for the CLI tests: they read what the fake provider recorded."""

    import json
    from pathlib import Path

    from openonce_core._probe import ProbeOutcome, ProbeResult

    PROVIDER = Path(__file__).with_name("provider.json")


    class FileProber:
        def probe(self, effect):
            recorded = json.loads(PROVIDER.read_text()) if PROVIDER.exists() else {}
            receipt = recorded.get(effect.provider_key)
            if receipt is not None:
                return ProbeResult(
                    ProbeOutcome.HAPPENED,
                    receipt=receipt,
                    detail="found in provider.json",
                    provider_reference=effect.provider_key,
                )
            return ProbeResult(
                ProbeOutcome.NOT_HAPPENED,
                detail="not in provider.json",
                provider_reference=effect.provider_key,
            )


    PROBERS = {
        "stripe.charge": FileProber(),
        "email.send": FileProber(),
        "acme.ship": FileProber(),
    }


    def make_probers():
        return dict(PROBERS)
    '''
)


class Ledger:
    """The test process's side: tools whose handlers record at the fake provider and then
    time out, and the OpenOnce the assertions read through."""

    def __init__(self, db: str, provider: Path) -> None:
        self.db = db
        self.provider = provider
        self.oo = OpenOnce(db, retry_delay=0, migrate=False)
        self.calls: list[tuple[str, int]] = []
        self.script: list[str] = []

        @self.oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
        def charge(order: str) -> dict[str, Any]:
            return self._body("stripe.charge", {"stripe_id": f"pi_{order}"})

        @self.oo.effect(tool="email.send", idempotency_key=lambda to: to)
        def send(to: str) -> dict[str, Any]:
            return self._body("email.send", {"message_id": f"<{to}>"})

        @self.oo.effect(tool="acme.ship", idempotency_key=lambda parcel: parcel)
        def ship(parcel: str) -> dict[str, Any]:
            return self._body("acme.ship", {"tracking": f"trk_{parcel}"})

        self.tools = {"stripe.charge": charge, "email.send": send, "acme.ship": ship}

    def _body(self, tool: str, receipt: dict[str, Any]) -> dict[str, Any]:
        ctx = current_effect()
        self.calls.append((tool, ctx.attempt))
        mode = self.script.pop(0) if self.script else "after"
        if mode != "before":
            recorded = json.loads(self.provider.read_text()) if self.provider.exists() else {}
            recorded[ctx.provider_key] = receipt
            self.provider.write_text(json.dumps(recorded))
        if mode == "ok":
            return receipt
        raise TimeoutError("read timed out")

    def unknown(self, tool: str, arg: str, *, mode: str = "after") -> str:
        self.script.append(mode)
        with pytest.raises(OutcomeUnknownError) as info:
            self.tools[tool](arg)
        assert self.oo.get(info.value.effect_id).state == S.UNKNOWN
        return info.value.effect_id

    def state(self, effect_id: str) -> str:
        return str(self.oo.get(effect_id).state)


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    target = (
        str(tmp_path / "cli.db") if request.param == "sqlite" else request.getfixturevalue("pg_dsn")
    )
    migrated = subprocess.run(
        [sys.executable, "-m", "openonce_core.cli", "--db", target, "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert migrated.returncode == 0, migrated.stderr
    return target


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    (tmp_path / f"{MODULE}.py").write_text(PROBERS_SOURCE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture
def ledger(db, tmp_path) -> Iterator[Ledger]:
    world = Ledger(db, tmp_path / "provider.json")
    yield world
    world.oo.close()


def openonce(db: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openonce_core.cli", "--db", db, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def reconcile_json(db: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    result = openonce(db, env, "reconcile", "--probers", f"{MODULE}:PROBERS", "--json", *args)
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.strip().splitlines()
    report: dict[str, Any] = json.loads(line)
    return report


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("openonce: ")
    assert "Traceback" not in result.stderr
    return lines[0]


# -- reconcile ----------------------------------------------------------------------------


def test_reconcile_commits_an_unknown_effect_and_prints_the_report(ledger, env):
    effect_id = ledger.unknown("stripe.charge", "o1")
    result = openonce(
        ledger.db, env, "reconcile", "--probers", f"{MODULE}:PROBERS", "--grace-seconds", "0"
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.strip().splitlines()
    for part in ("expired 0,", "committed 1,", "re-armed 0,", "to human review 0,"):
        assert part in line, line
    assert "still unknown 0" in line and line.endswith("lost races 0"), line
    effect = ledger.oo.get(effect_id)
    assert effect.state == S.COMMITTED
    assert effect.result == {"stripe_id": "pi_o1"}
    assert effect.verification_status == "confirmed"
    journal_line, verdict = ledger.oo.journal(effect_id)[-2:]
    assert (journal_line.actor, journal_line.reason) == ("reconciler:cli", "found in provider.json")
    assert (verdict.action, verdict.to_state) == ("check_receipt", S.COMMITTED)

    assert ledger.tools["stripe.charge"]("o1") == {"stripe_id": "pi_o1"}
    assert ledger.calls == [("stripe.charge", 1)]


def test_reconcile_waits_out_the_capability_grace_by_default(ledger, env):
    effect_id = ledger.unknown("stripe.charge", "o1")
    report = reconcile_json(ledger.db, env)
    assert report["waiting"] == 1 and report["committed"] == []
    assert ledger.state(effect_id) == S.UNKNOWN


def test_reconcile_json_report_is_parseable(ledger, env):
    committed = ledger.unknown("stripe.charge", "o1")
    rearmed = ledger.unknown("stripe.charge", "o2", mode="before")
    escalated = ledger.unknown("acme.ship", "p1", mode="before")  # unknown tool: no re-arm
    report = reconcile_json(ledger.db, env, "--grace-seconds", "0")
    assert report["committed"] == [committed]
    assert report["rearmed"] == [rearmed]
    assert report["escalated"] == [escalated]
    assert report["expired"] == [] and report["lost_races"] == 0 and report["waiting"] == 0
    assert report["outcomes"] == {"happened": 1, "not_happened": 2}
    assert [ledger.state(i) for i in (committed, rearmed, escalated)] == [
        S.COMMITTED,
        S.PLANNED,
        S.HUMAN_REVIEW,
    ]


def test_a_callable_probers_reference_is_called_to_build_the_table(ledger, env):
    effect_id = ledger.unknown("stripe.charge", "o1")
    result = openonce(
        ledger.db, env, "reconcile", "--probers", f"{MODULE}:make_probers",
        "--grace-seconds", "0", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["committed"] == [effect_id]


def test_a_pinned_email_capability_decides_whether_a_miss_rearms(ledger, env):
    unpinned = ledger.unknown("email.send", "a@example.com", mode="before")
    report = reconcile_json(ledger.db, env, "--grace-seconds", "0")
    assert report["escalated"] == [unpinned] and report["rearmed"] == []
    assert ledger.state(unpinned) == S.HUMAN_REVIEW
    assert "a miss is not evidence" in ledger.oo.journal(unpinned)[-1].reason

    pinned = ledger.unknown("email.send", "b@example.com", mode="before")
    report = reconcile_json(
        ledger.db, env, "--grace-seconds", "0",
        "--provider-capability", "email.send=email_provider_api",
    )  # fmt: skip
    assert report["rearmed"] == [pinned] and report["escalated"] == []
    assert ledger.state(pinned) == S.PLANNED


def test_a_pin_that_fits_no_capability_is_refused(ledger, env):
    effect_id = ledger.unknown("email.send", "a@example.com", mode="before")
    result = openonce(
        ledger.db, env, "reconcile", "--probers", f"{MODULE}:PROBERS", "--grace-seconds", "0",
        "--provider-capability", "email.send=stripe",
    )  # fmt: skip
    assert "'stripe'" in one_error_line(result)
    assert ledger.state(effect_id) == S.UNKNOWN


def test_require_provider_capability_sends_an_unknown_tool_to_a_person(ledger, env):
    strict = ledger.unknown("acme.ship", "p1")  # recorded: the prober says HAPPENED
    report = reconcile_json(ledger.db, env, "--grace-seconds", "0", "--require-provider-capability")
    assert report["escalated"] == [strict] and report["committed"] == []
    assert ledger.state(strict) == S.HUMAN_REVIEW
    assert "no reviewed provider capability for acme.ship" in ledger.oo.journal(strict)[-1].reason

    loose = ledger.unknown("acme.ship", "p2")
    assert reconcile_json(ledger.db, env, "--grace-seconds", "0")["committed"] == [loose]


def test_require_conformance_needs_a_conformance_file(ledger, env):
    effect_id = ledger.unknown("stripe.charge", "o1")
    result = openonce(
        ledger.db, env, "reconcile", "--probers", f"{MODULE}:PROBERS",
        "--grace-seconds", "0", "--require-conformance",
    )  # fmt: skip
    assert one_error_line(result) == "openonce: --require-conformance needs --conformance-file"
    assert result.stdout == ""
    assert ledger.state(effect_id) == S.UNKNOWN


def test_require_conformance_with_evidence_missing_goes_to_a_person(ledger, env, tmp_path):
    effect_id = ledger.unknown("stripe.charge", "o1")
    evidence = tmp_path / "conformance.json"
    evidence.write_text(json.dumps({"schema_version": 1, "capabilities": {}}))
    report = reconcile_json(
        ledger.db, env, "--grace-seconds", "0",
        "--conformance-file", str(evidence), "--require-conformance",
    )  # fmt: skip
    assert report["escalated"] == [effect_id]
    reason = ledger.oo.journal(effect_id)[-1].reason
    assert "conformance evidence missing" in reason and "stripe: no conformance evidence" in reason


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_colon_here", "'no_colon_here' is not of the form package.module:NAME"),
        ("oo_no_such_module_xyz:PROBERS", "cannot import 'oo_no_such_module_xyz'"),
        (f"{MODULE}:NOPE", f"'{MODULE}' has no 'NOPE'"),
    ],
    ids=["no-colon", "missing-module", "missing-name"],
)
def test_a_bad_probers_reference_is_one_clear_line(ledger, env, reference, message):
    effect_id = ledger.unknown("stripe.charge", "o1")
    result = openonce(ledger.db, env, "reconcile", "--probers", reference, "--grace-seconds", "0")
    assert message in one_error_line(result)
    assert result.stdout == ""
    assert ledger.state(effect_id) == S.UNKNOWN


def test_watch_resolves_an_effect_created_while_it_runs_and_stops_on_sigterm(ledger, env):
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "openonce_core.cli", "--db", ledger.db, "reconcile",
            "--probers", f"{MODULE}:PROBERS", "--grace-seconds", "0",
            "--watch", "--interval", "0.2",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()  # printed once the signal handlers are in place
        assert "reconciling every 0.2s" in banner, banner
        effect_id = ledger.unknown("stripe.charge", "o1")
        deadline = time.monotonic() + 15
        while ledger.state(effect_id) != S.COMMITTED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ledger.state(effect_id) == S.COMMITTED
        assert proc.poll() is None  # still watching
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "committed 1," in stdout
    assert "Traceback" not in stderr
    assert ledger.oo.get(effect_id).result == {"stripe_id": "pi_o1"}
    assert ledger.calls == [("stripe.charge", 1)]


# -- a person's decision, checked against the provider matrix -----------------------------


def test_resolve_happened_require_receipt_contract_refuses_a_bad_receipt(ledger, env):
    effect_id = ledger.unknown("stripe.charge", "o1")
    journal = ledger.oo.journal(effect_id)
    refused = openonce(
        ledger.db, env, "resolve-happened", effect_id, "--receipt-json", '{"id": "pi_o1"}',
        "--by", "eric", "--require-receipt-contract",
    )  # fmt: skip
    line = one_error_line(refused)
    assert "receipt breaks the provider contract" in line and "stripe_id" in line
    assert ledger.state(effect_id) == S.UNKNOWN
    assert ledger.oo.journal(effect_id) == journal

    accepted = openonce(
        ledger.db, env, "resolve-happened", effect_id, "--receipt-json", '{"stripe_id": "pi_o1"}',
        "--by", "eric", "--require-receipt-contract",
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert ledger.state(effect_id) == S.COMMITTED


def test_resolve_not_happened_require_auto_rearm_refuses_email(ledger, env):
    email_id = ledger.unknown("email.send", "a@example.com", mode="before")
    refused = openonce(
        ledger.db, env, "resolve-not-happened", email_id, "--by", "eric",
        "--reason", "not in the sent folder", "--require-auto-rearm",
    )  # fmt: skip
    assert "not safe to re-arm" in one_error_line(refused)
    assert ledger.state(email_id) == S.UNKNOWN

    charge_id = ledger.unknown("stripe.charge", "o1", mode="before")
    accepted = openonce(
        ledger.db, env, "resolve-not-happened", charge_id, "--by", "eric",
        "--reason", "not in the dashboard", "--require-auto-rearm",
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert "re-armed" in accepted.stdout
    assert ledger.state(charge_id) == S.PLANNED


def test_a_capability_file_teaches_the_daemon_a_tool(ledger, env, tmp_path):
    capabilities = tmp_path / "openonce-providers.json"
    capabilities.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "capabilities": [
                    {
                        "name": "acme_shipping",
                        "tool_pattern": "acme.ship",
                        "tier": "tier_2_natural_business_key",
                        "key_strategy": "parcel id",
                        "probe_basis": "authoritative shipment lookup by parcel",
                        "miss_semantics": "genuinely not-happened",
                        "can_auto_rearm_on_miss": True,
                        "default_grace_seconds": 0,
                        "prober": "FileProber",
                        "risk": "low",
                        "required_receipt_fields": ["tracking"],
                    }
                ],
            }
        )
    )
    unknown_tool = ledger.unknown("acme.ship", "p1", mode="before")
    report = reconcile_json(ledger.db, env, "--grace-seconds", "0")
    assert report["escalated"] == [unknown_tool]

    known_tool = ledger.unknown("acme.ship", "p2", mode="before")
    report = reconcile_json(
        ledger.db, env, "--capability-file", str(capabilities), "--require-provider-capability"
    )  # the file's grace (0 s) applies: no --grace-seconds needed
    assert report["rearmed"] == [known_tool] and report["escalated"] == []
    assert ledger.state(known_tool) == S.PLANNED
