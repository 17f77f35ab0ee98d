"""The nemesis soak (bench/soak.py): a short run passes and reports every fault it injected,
and its checker fails when the provider's record and the ledger disagree — a checker that
cannot fail is worthless."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Appended, not prepended: bench/ must never shadow the project's packages.
sys.path.append(str(BENCH))

from soak import Config, parse_faults, schedule  # noqa: E402
from soak_check import check, check_resources  # noqa: E402

# -- the checker against planted violations ---------------------------------------------------


def _journal(*moves: tuple[str, str | None, str]) -> list[dict[str, Any]]:
    return [{"action": a, "from_state": f, "to_state": t} for a, f, t in moves]


COMMITTED_JOURNAL = _journal(("claim", None, "started"), ("finish", "started", "committed"))


def _world() -> tuple[
    list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]
]:
    """Two orders paid once each, seen by the agents, committed in the ledger: clean."""
    provider = [
        {"kind": "exec", "order": "order-1", "id": "pi_1", "effect_id": "eff_1"},
        {"kind": "replay", "order": "order-1", "id": "pi_1", "effect_id": "eff_1"},
        {"kind": "exec", "order": "order-2", "id": "pi_2", "effect_id": "eff_2"},
        {"kind": "declined", "order": "order-17", "effect_id": "eff_17"},
    ]
    agents = [
        {"k": "order-1", "o": "ok", "r": {"stripe_id": "pi_1"}, "ran": True},
        {"k": "order-1", "o": "ok", "r": {"stripe_id": "pi_1"}, "ran": False},
        {"k": "order-2", "o": "unknown"},
        {"k": "order-17", "o": "failed"},
    ]
    effects = [
        {"id": "eff_1", "order": "order-1", "state": "committed", "result": {"stripe_id": "pi_1"}},
        {"id": "eff_2", "order": "order-2", "state": "committed", "result": {"stripe_id": "pi_2"}},
        {"id": "eff_17", "order": "order-17", "state": "failed", "result": None},
    ]
    journals = {
        "eff_1": COMMITTED_JOURNAL,
        "eff_2": _journal(
            ("claim", None, "started"),
            ("finish", "started", "unknown"),
            ("probe_happened", "unknown", "receipt_recorded"),
            ("check_receipt", "receipt_recorded", "committed"),
        ),
        "eff_17": _journal(("claim", None, "started"), ("finish", "started", "failed")),
    }
    return provider, agents, effects, journals


def test_the_checker_passes_a_clean_world() -> None:
    verdict = check(*_world())
    assert verdict.ok, verdict.violations
    assert verdict.checked["executed_once"] == 2
    assert verdict.checked["journal_legal"] == 3


def test_the_checker_catches_a_key_executed_twice() -> None:
    provider, agents, effects, journals = _world()
    provider.append({"kind": "exec", "order": "order-2", "id": "pi_9", "effect_id": "eff_2"})
    verdict = check(provider, agents, effects, journals)
    assert [v.invariant for v in verdict.violations] == ["executed_once"]
    assert "executed 2 times" in verdict.violations[0].detail
    assert verdict.violations[0].effect_id == "eff_2"


def test_the_checker_catches_a_lost_outcome() -> None:
    provider, agents, effects, journals = _world()
    # The agent saw pi_1 succeed, but the ledger lost it (re-armed, nobody called again)...
    effects[0] = {**effects[0], "state": "planned", "result": None}
    journals["eff_1"] = _journal(
        ("claim", None, "started"), ("finish", "started", "unknown"),
        ("probe_not_happened", "unknown", "planned"),
    )  # fmt: skip
    verdict = check(provider, agents, effects, journals)
    kinds = sorted({v.invariant for v in verdict.violations})
    assert kinds == ["outcomes_kept", "settled"]
    assert any("an agent saw success with pi_1" in v.detail for v in verdict.violations)


def test_the_checker_catches_a_commit_the_provider_never_made() -> None:
    provider, agents, effects, journals = _world()
    effects[1] = {**effects[1], "result": {"stripe_id": "pi_other"}}
    verdict = check(provider, agents, effects, journals)
    assert {v.invariant for v in verdict.violations} == {"outcomes_kept"}
    assert any("never executed" in v.detail for v in verdict.violations)


def test_the_checker_catches_an_execution_the_ledger_calls_failed() -> None:
    provider, agents, effects, journals = _world()
    provider.append({"kind": "exec", "order": "order-17", "id": "pi_17", "effect_id": "eff_17"})
    verdict = check(provider, agents, effects, journals)
    assert [v.invariant for v in verdict.violations] == ["outcomes_kept"]


def test_the_checker_catches_an_illegal_journal_and_one_that_disagrees() -> None:
    provider, agents, effects, journals = _world()
    journals["eff_1"] = _journal(("claim", None, "started"), ("finish", "started", "unknown"),
                                 ("finish", "unknown", "committed"))  # fmt: skip
    journals["eff_17"] = _journal(("claim", None, "started"), ("finish", "started", "unknown"))
    verdict = check(provider, agents, effects, journals)
    details = [v.detail for v in verdict.violations if v.invariant == "journal_legal"]
    assert len(details) == 2, verdict.violations
    assert any("not a legal move" in d for d in details)
    assert any("replays to unknown, the effect is failed" in d for d in details)


def test_the_checker_catches_a_live_owner_read_as_dead() -> None:
    provider, agents, effects, journals = _world()
    owner = "agent:vm:123:4026531836.99"
    gone = "owner of attempt 1 is gone: process 123 on vm no longer exists"
    journals["eff_2"] = [
        {"action": "claim", "from_state": None, "to_state": "started", "actor": owner},
        {"action": "expire", "from_state": "started", "to_state": "unknown",
         "actor": "openonce", "reason": gone},
        {"action": "note", "from_state": "unknown", "to_state": "unknown", "actor": owner,
         "reason": "attempt 1 finished (unknown) after losing its lease"},
        {"action": "probe_happened", "from_state": "unknown", "to_state": "receipt_recorded",
         "actor": "reconciler:daemon"},
        {"action": "check_receipt", "from_state": "receipt_recorded", "to_state": "committed",
         "actor": "reconciler:daemon"},
    ]  # fmt: skip
    verdict = check(provider, agents, effects, journals)
    assert [v.invariant for v in verdict.violations] == ["owners_judged"], verdict.violations
    # A dead owner that stays silent is fine.
    del journals["eff_2"][2]
    assert check(provider, agents, effects, journals).ok


def test_the_checker_catches_a_live_lease_expired_early() -> None:
    provider, agents, effects, journals = _world()
    owner = "vm:123:4026531836.99"
    expired = f"lease of attempt 1 held by {owner} expired"
    journals["eff_1"] = [
        {"action": "claim", "from_state": None, "to_state": "started", "actor": f"agent:{owner}"},
        {"action": "expire", "from_state": "started", "to_state": "unknown", "actor": "openonce",
         "reason": expired, "evidence": {"attempt": 1, "owner": owner}},
        {"action": "late_result", "from_state": "unknown", "to_state": "committed",
         "actor": f"agent:{owner}", "reason": "late result of attempt 1 after its lease expired"},
    ]  # fmt: skip
    # The owner's call of order-1, attempt 1: 1.2 s on the real clock, under the 3 s a judge
    # must watch a lease un-renewed before it may expire it.
    agents[0] = {**agents[0], "pid": 123, "t": 100.0, "end": 101.2, "a": [1]}
    verdict = check(provider, agents, effects, journals)
    assert [v.invariant for v in verdict.violations] == ["live_leases_kept"], verdict.violations
    assert "took 1.20 s" in verdict.violations[0].detail
    assert verdict.violations[0].effect_id == "eff_1"
    # A call long enough to have been watched that long is only counted, not judged...
    agents[0] = {**agents[0], "end": 104.0}
    verdict = check(provider, agents, effects, journals)
    assert verdict.ok, verdict.violations
    assert verdict.figures["lease expires whose owner wrote its result afterwards"] == 1
    # ... and so is an expire its owner never wrote after (killed, or the lease lingered
    # after its call gave up), and one that said the owner is gone (owners_judged's).
    agents[0] = {**agents[0], "end": 101.2}
    late = journals["eff_1"].pop()
    journals["eff_1"] += _journal(("probe_happened", "unknown", "receipt_recorded"),
                                  ("check_receipt", "receipt_recorded", "committed"))  # fmt: skip
    assert check(provider, agents, effects, journals).ok
    gone = "owner of attempt 1 is gone: process 123 on vm no longer exists"
    journals["eff_1"] = [journals["eff_1"][0], {**journals["eff_1"][1], "reason": gone}, late]
    assert [v.invariant for v in check(provider, agents, effects, journals).violations] == [
        "owners_judged"
    ]


def test_the_checker_catches_an_effect_left_in_flight() -> None:
    provider, agents, effects, journals = _world()
    effects.append({"id": "eff_3", "order": "order-3", "state": "unknown", "result": None})
    journals["eff_3"] = _journal(("claim", None, "started"), ("finish", "started", "unknown"))
    verdict = check(provider, agents, effects, journals)
    assert [v.invariant for v in verdict.violations] == ["settled"]


def test_the_resource_check_catches_growth_and_too_many_connections() -> None:
    verdict = check(*_world())
    start = {"worker": {"pid": 1, "fds": 10, "threads": 3, "rss_mb": 50.0},
             "gone": {"pid": 2, "fds": 10, "threads": 3, "rss_mb": 50.0}}  # fmt: skip
    end = {"worker": {"pid": 1, "fds": 90, "threads": 30, "rss_mb": 500.0},
           "gone": {"pid": 3, "fds": 900, "threads": 3, "rss_mb": 50.0}}  # fmt: skip
    check_resources(verdict, start, end, connections=(10, 80), connection_bound=40)
    assert sorted(v.detail.split()[0] for v in verdict.violations) == [
        "80", "RSS", "open", "threads",
    ]  # fmt: skip


def test_the_schedule_comes_from_the_seed_alone() -> None:
    cfg = Config(duration=60, seed=5, store="postgres", faults=parse_faults("all"))
    assert [str(e) for e in schedule(cfg)] == [str(e) for e in schedule(cfg)]
    assert [str(e) for e in schedule(cfg)] != [
        str(e) for e in schedule(Config(duration=60, seed=6, store="postgres"))
    ]
    sqlite = schedule(Config(duration=60, seed=5, store="sqlite", faults=parse_faults("all")))
    assert not {e.kind for e in sqlite} & {"pg_terminate", "proxy_delay", "redis_restart"}


def test_faults_are_picked_by_kind_group_and_exclusion() -> None:
    assert parse_faults("kill,provider_slow") == (
        "kill_agent", "kill_in_flight", "kill_reconciler", "provider_slow",
    )  # fmt: skip
    assert "stop_agent" not in parse_faults("all,-stop")
    assert "stop_agent" in parse_faults("all,-stop_agent_long,-provider_stall")
    assert "reconciler_clock_step" in parse_faults("clock")
    assert "person" in parse_faults("all,-stop")
    assert parse_faults("none") == ()
    with pytest.raises(SystemExit):
        parse_faults("kill,nonsense")


# -- a short run ----------------------------------------------------------------------------

SHORT_FAULTS = "stop,provider,person,clock,fork,kill_reconciler"
# Seed 2 puts into 25 s the patterns that were sharpened to find bugs of the library before
# b12c7f0's fixes (bench/README.md, "Nemesis soak"): a fork family on a ledger of its own
# whose parent closes its client while the children record effects, the reconciler's clock
# an hour ahead and back, a request held past the grace, and (as root) a reconciler loop
# running as another uid, judged by owners_judged.
SHORT_SEED = 2


def test_the_short_run_exercises_the_patterns_that_found_known_bugs() -> None:
    plan = schedule(Config(duration=25, seed=SHORT_SEED, store="sqlite",
                           faults=parse_faults(SHORT_FAULTS)))  # fmt: skip
    kinds = {e.kind for e in plan}
    assert {"fork_prefork", "fork_orphan", "reconciler_clock_step", "provider_stall"} <= kinds
    assert any(e.params.get("own_ledger") for e in plan if e.kind.startswith("fork_"))
    assert any(e.params.get("offset") == 3600 for e in plan if e.kind == "reconciler_clock_step")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_short_soak_on_sqlite_passes_and_names_every_fault_it_injected(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--store", "sqlite", "--seed", str(SHORT_SEED),
         "--duration", "25", "--drain", "25", "--faults", SHORT_FAULTS, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]
    assert f"RESULT: PASS (seed {SHORT_SEED})" in out
    planned = set(re.findall(r"^  t=\s*[\d.]+s  (\w+)", out, re.MULTILINE))
    injected_block = out.split("faults injected:", 1)[1].split("calls:", 1)[0]
    injected = set(re.findall(r"^  (\w+)\s+\d+$", injected_block, re.MULTILINE))
    assert planned, out
    assert planned == injected, (planned, injected)
    for name in ("executed_once", "outcomes_kept", "settled", "journal_legal", "owners_judged",
                 "live_leases_kept", "resources"):  # fmt: skip
        assert re.search(rf"^  {name}\s+OK", out, re.MULTILINE), out
