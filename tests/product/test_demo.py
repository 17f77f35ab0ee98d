"""`make demo` as a new user runs it, minus the long-running server: set up, agent run,
one reconcile sweep. The console itself is exercised by the browser tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from openonce_core import EffectState, OpenOnce

ROOT = Path(__file__).resolve().parents[2]


def test_demo_leaves_what_an_operator_meets(tmp_path):
    env = {**os.environ, "OPENONCE_DEMO_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--no-serve"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "2 calls, 1 email sent: the duplicate was replayed" in out
    assert "retried by the agent: refused, not charged twice" in out
    assert "due 2: expired 0, committed 1, re-armed 0, to human review 1" in out

    oo = OpenOnce(str(tmp_path / "demo.db"), migrate=False)
    try:
        by_tool: dict[str, list[str]] = {}
        for effect in oo.store.list_effects(limit=50):
            by_tool.setdefault(effect.tool, []).append(str(effect.state))
        assert sorted(by_tool["stripe.charge"]) == ["committed", "committed"]
        assert by_tool["stripe.refund"] == [EffectState.REQUIRES_APPROVAL]
        assert sorted(by_tool["email.send"]) == ["committed", "human_review"]
        lost = next(
            e for e in oo.store.list_effects(limit=50)
            if e.tool == "stripe.charge" and e.execution_status == "unknown"
        )  # fmt: skip
        assert lost.result["stripe_id"] == "pi_demo2"
        assert oo.journal(lost.id)[-1].actor == "reconciler:daemon"
    finally:
        oo.close()
