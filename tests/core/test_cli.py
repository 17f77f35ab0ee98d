"""The `openonce` command, run as a user runs it: a subprocess against a real ledger."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from openonce_core import EffectState, OpenOnce, require_approval_for
from openonce_core._schema import SCHEMA_VERSION


def openonce(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openonce_core.cli", "--db", db, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "cli.db")
    return request.getfixturevalue("pg_dsn")


def test_migrate_installs_schema_once(db):
    first = openonce(db, "migrate")
    assert first.returncode == 0, first.stderr
    assert f"migrated from version 0 to {SCHEMA_VERSION}" in first.stdout
    again = openonce(db, "migrate")
    assert again.returncode == 0
    assert f"already at version {SCHEMA_VERSION}" in again.stdout


def test_commands_before_migrate_say_what_to_do(db):
    result = openonce(db, "review")
    assert result.returncode == 1
    assert "openonce --db DSN migrate" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_unknown_effect_id_is_one_line_and_nonzero(db):
    openonce(db, "migrate")
    result = openonce(db, "show", "eff_missing")
    assert result.returncode == 1
    assert result.stderr.strip() == "openonce: no effect with id 'eff_missing'"


def test_review_approve_and_show_journal(db):
    openonce(db, "migrate")
    oo = OpenOnce(db, policy=require_approval_for(["stripe.*"]), migrate=False)
    calls = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge, amount_cents: charge)
    def refund(charge: str, amount_cents: int) -> dict:
        calls.append(charge)
        return {"refund_id": "re_1"}

    with pytest.raises(Exception) as pending:
        refund("ch_1", 500)
    effect_id = pending.value.effect_id

    review = openonce(db, "review")
    assert review.returncode == 0
    assert "requires_approval" in review.stdout and "stripe.refund" in review.stdout
    assert "1 effect(s) need a human" in review.stdout

    approve = openonce(db, "approve", effect_id, "--by", "eric", "--reason", "customer asked")
    assert approve.returncode == 0, approve.stderr
    assert refund("ch_1", 500) == {"refund_id": "re_1"}
    assert refund("ch_1", 500) == {"refund_id": "re_1"}
    assert calls == ["ch_1"]

    shown = json.loads(openonce(db, "show", effect_id, "--json").stdout)
    assert shown["state"] == "committed"
    moves = [(j["from"], j["to"], j["actor"]) for j in shown["journal"]]
    assert moves[1] == ("requires_approval", "approved", "operator:eric")
    assert moves[-1][1] == "committed"
    text = openonce(db, "show", effect_id).stdout
    assert "requires_approval -> approved  operator:eric: customer asked" in text
    oo.close()


def test_resolve_commands_and_bad_receipt(db):
    openonce(db, "migrate")
    oo = OpenOnce(db, migrate=False)

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
    def charge(order: str) -> dict:
        raise TimeoutError("read timed out")

    with pytest.raises(Exception) as unknown:
        charge("o-1")
    effect_id = unknown.value.effect_id

    bad = openonce(db, "resolve-happened", effect_id, "--receipt-json", "{not json", "--by", "e")
    assert bad.returncode == 1 and "not JSON" in bad.stderr
    empty = openonce(db, "resolve-happened", effect_id, "--receipt-json", "{}", "--by", "e")
    assert empty.returncode == 1 and "non-empty JSON object" in empty.stderr
    assert oo.get(effect_id).state == EffectState.UNKNOWN

    no_reason = openonce(db, "resolve-not-happened", effect_id, "--by", "eric")
    assert no_reason.returncode == 2  # argparse: --reason is required

    ok = openonce(
        db, "resolve-happened", effect_id, "--receipt-json", '{"stripe_id": "pi_1"}',
        "--by", "eric", "--reason", "matched in Stripe dashboard",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "committed with manual receipt" in ok.stdout
    assert charge("o-1") == {"stripe_id": "pi_1"}

    again = openonce(db, "resolve-not-happened", effect_id, "--by", "eric", "--reason", "x")
    assert again.returncode == 1
    assert "cannot resolve as not happened" in again.stderr
    oo.close()
