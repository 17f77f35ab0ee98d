"""bench/volume.py (``make bench-volume``) end to end on a tiny ledger: it fills both
databases, measures each figure on both, runs the retention beside the hot path, and
prints every row of its table, the bytes per effect and the row writes. Its figures at
this size mean nothing; what is checked is that every row is there, with a value on both
ledgers, and that it leaves no database behind."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

from tests.conftest import PG_DSN

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "volume.py"
ROWS = [
    "new effects/s (OpenOnce decorator)",
    "notifier tick p95",
    "/metrics scrape p95",
    "due() over 300 UNKNOWN in backoff p95",
    "console queue page p95",
    "console effects list p95",
    "console list state=committed p95",
]
RETENTION_ROWS = [
    "new effects/s while retention runs",
    "new effects/s after the retention",
    "retention: effects archived/s",
]
# Both ledgers' values ("12.3 ms" or "456/s"), the ratio, the budget and a verdict.
VALUE = r"[\d,.]+(?: ms|/s)"
VERDICT = rf"\s+{VALUE}\s+{VALUE}\s+[\d.]+x\s+<=1\.2x\s+(PASS|OVER)$"


def test_prints_every_row_on_a_tiny_ledger():
    database = "oo_volume_smoke_" + uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENONCE_", "DJANGO_"))}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--effects", "3000", "--quick", "--backoff", "300",
         "--archive", "2000", "--pg-dsn", PG_DSN, "--database", database],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for row in ROWS:
        assert re.search(re.escape(row) + VERDICT, out, re.M), f"{row!r} missing:\n{out}"
    if importlib.util.find_spec("openonce_core._retention") is None:
        assert "retention: not available" in out
    else:
        for row in RETENTION_ROWS[:2]:
            assert re.search(re.escape(row) + VERDICT, out, re.M), out
        assert re.search(
            re.escape(RETENTION_ROWS[2]) + r"\s+-\s+[\d,]+/s\s+-\s+>=116/s\s+(PASS|OVER)$",
            out,
            re.M,
        ), out
        assert re.search(r"retention: 2,000 effects and [\d,]+ journal lines archived", out), out
    for table in ("openonce_effects", "openonce_journal", "openonce_approvals"):
        assert re.search(rf"^  {table}\s+heap\s", out, re.M), out
    assert "openonce_effects_state_updated" in out and "openonce_journal_seq" in out
    assert re.search(r"at 10M effects a day: [\d.,]+ GB a day", out), out
    assert re.search(
        r"openonce_effects\s+n_tup_ins\s+[\d,]+\s+n_tup_upd\s+[\d,]+\s+n_tup_hot_upd", out
    )
    with psycopg.connect(PG_DSN) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (database + "%",)
        ).fetchall()
    assert left == []
