"""``examples/mcp/agent.py`` runs offline as its own process (the agent, the gateway and
the provider's MCP server: three processes) and tells the story the other examples tell:
a duplicate replayed, an approval that runs once, a lost reply parked UNKNOWN and
resolved. Judged by its lines, the provider's own book, and the ledger it leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openonce_core import EffectState, OpenOnce

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]


def run_example(ledger: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "examples/mcp/agent.py", str(ledger)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def line(lines: list[str], *words: str) -> str:
    found = [text for text in lines if all(w in text for w in words)]
    assert len(found) == 1, f"no single line with {words!r} in:\n" + "\n".join(lines)
    return found[0]


def test_the_mcp_example_replays_waits_for_approval_and_parks_a_lost_reply(tmp_path):
    ledger = tmp_path / "ledger.db"
    lines = run_example(ledger)

    assert "provider charged 1 time" in line(lines, "duplicate replayed")
    pending = line(lines, "payments.refund", "approval required")
    assert "provider refunded 1 time" in line(lines, "approved by eric", "executed once")
    line(lines, "outcome unknown, parked as unknown")
    retry = line(lines, "retry was not sent to the provider")
    assert "charged B-" in retry and "1 time)" in retry
    line(lines, "resolved as happened by eric")
    assert "ch_0002" in line(lines, "replayed eric's receipt")

    book = [
        json.loads(x) for x in ledger.with_suffix(".payments-book.jsonl").read_text().splitlines()
    ]
    assert [entry["kind"] for entry in book] == ["charge", "refund", "charge"]
    with OpenOnce(str(ledger)) as oo:
        effects = oo.store.list_effects()
        assert sorted(e.tool for e in effects) == [
            "payments.charge", "payments.charge", "payments.refund",
        ]  # fmt: skip
        assert {e.state for e in effects} == {EffectState.COMMITTED}
        refund = next(e for e in effects if e.tool == "payments.refund")
        assert refund.id in pending
        assert [(a.decision, a.by) for a in oo.approvals(refund.id)] == [("approve", "eric")]
        lost = next(e for e in effects if str(e.args.get("order")).startswith("B-"))
        moves = [(j.from_state, j.to_state) for j in oo.journal(lost.id)]
        assert ("started", "unknown") in moves
        assert not any(m == ("unknown", "started") for m in moves)  # never re-sent
        # Each effect's provider key reached the provider: its book is keyed by them.
        assert {entry["key"] for entry in book} == {e.provider_key for e in effects}
