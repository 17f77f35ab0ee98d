"""The alert rules under real promtool (Debian's ``prometheus`` package): they load, and
their unit tests in deploy/prometheus/tests/ pass - replicas are not added up, "never
swept" is told apart from "on time", and a failed scrape pages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "openonce-alerts.yml"
TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is absent: apt-get install prometheus"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def test_the_rules_load() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_the_rules_unit_tests_pass() -> None:
    assert TESTS, "deploy/prometheus/tests/ holds the rules' unit tests"
    tested = promtool("test", "rules", *map(str, TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
