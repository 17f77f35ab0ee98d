"""`openonce providers`, run as a user runs it: a subprocess, its output and exit status."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openonce_core._providers import CapabilityMatrix
from openonce_core.cli._providers import add_providers_parser, cmd_providers

GITHUB = CapabilityMatrix().get("github_pr")
assert GITHUB is not None

SLACK = {
    "name": "slack_metadata",
    "tool_pattern": "slack.post_message",
    "tier": "tier_2_sender_controlled_authoritative",
    "key_strategy": "message metadata event_payload.openonce_effect_id",
    "probe_basis": "conversations.history search by metadata",
    "miss_semantics": "not-happened after Slack history propagation",
    "can_auto_rearm_on_miss": True,
    "default_grace_seconds": 30,
    "prober": "SlackMetadataProber",
    "handler_requirements": [
        "stamp openonce effect_id into Slack message metadata",
        "grant the prober history scope for the target channel",
    ],
    "risk": "medium: depends on Slack retention and history permissions",
    "required_receipt_fields": ["ts"],
}

MATRIX_TABLE = """\
provider capability matrix
name                tool               tier                                     auto_rearm  grace_s prober
stripe              stripe.*           tier_1_native_idempotency_key            yes         120     StripeProber
github_pr           github.create_pr   tier_2_natural_business_key              yes         0       GitHubPullRequestProber
email_provider_api  email.send         tier_2_sender_controlled_authoritative   yes         120     EmailMessageIdProber(authoritative=True)
email_smtp          email.send         tier_3_non_authoritative                 no          120     EmailMessageIdProber(authoritative=False)
"""  # noqa: E501

STRIPE_REQUIREMENTS = """\
  requirements:
    handler:
      - pass current_effect().provider_key as Stripe Idempotency-Key
      - stamp effect_metadata(current_effect()) on the created object
      - a refund tool passes the refunded charge or payment_intent id in its args
    receipt fields: stripe_id
"""

STRIPE_PLAN = """\
  conformance:
    - happened: expect happened + receipt
      receipt fields: stripe_id
    - young_miss: expect inconclusive
    - mature_miss: expect not_happened
    - ambiguous: expect inconclusive
"""

GOOD_SOURCE = """\
import openonce
from openonce.integrations.langgraph import effect_tool

oo = openonce.OpenOnce("openonce.db")
PR_TOOL = "github.create_pr"


@oo.effect(tool=PR_TOOL, idempotency_fields=["owner", "repo", "head"])
def create_pr(owner: str, repo: str, head: str, title: str, body: str) -> dict:
    pr = github.pulls.create(owner, repo, head=head, title=title, body=body)
    receipt = {"number": pr.number, "head": head}
    return receipt


@effect_tool(oo, tool="stripe.refund", idempotency_fields=["charge"])
def refund(charge: str) -> dict:
    refund = stripe.Refund.create(charge=charge, idempotency_key=key())
    return dict(stripe_id=refund.id)
"""

BAD_SOURCE = """\
import openonce

oo = openonce.OpenOnce("openonce.db")
PREFIX = "slack"


@oo.effect(tool=PREFIX + ".post")
def post(channel, text):
    return slack.post(channel, text)


@oo.effect(tool="github.create_pr", idempotency_key=lambda **a: "k")
def open_pr(owner, repo, title):
    return {"number": 1, "head": "main"}


@oo.effect(tool="email.send")
def send(to, subject):
    return {"message_id": make_id()}


@oo.effect(tool="slack.post_message")
def post_message(channel, text):
    return {"ts": "1.2"}
"""


def providers(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openonce_core.cli", "providers", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def write_json(path: Path, doc: object) -> str:
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return str(path)


def github_evidence() -> dict:
    return {
        "schema_version": 1,
        "capabilities": {
            "github_pr": {
                "capability_fingerprint": GITHUB.fingerprint(),
                "source_args": {"owner": "acme", "repo": "api", "head": "fix-login"},
                "scenarios": {
                    "happened": {
                        "outcome": "happened",
                        "receipt": {"number": 42, "head": "fix-login"},
                        "detail": "fixture returned exactly one PR for acme:fix-login",
                    },
                    "mature_miss": {
                        "outcome": "not_happened",
                        "detail": "fixture returned no PRs for acme:fix-login",
                    },
                    "ambiguous": {
                        "outcome": "inconclusive",
                        "detail": "fixture returned duplicate PRs for acme:fix-login",
                    },
                },
            }
        },
    }


def stripe_evidence() -> dict:
    stripe = CapabilityMatrix().get("stripe")
    assert stripe is not None
    outcomes = {
        "happened": "happened",
        "young_miss": "inconclusive",
        "mature_miss": "not_happened",
        "ambiguous": "inconclusive",
    }
    scenarios = {
        name: {"outcome": outcome, "detail": f"fixture for {name}"}
        for name, outcome in outcomes.items()
    }
    scenarios["happened"]["receipt"] = {"stripe_id": "re_1"}
    return {
        "capability_fingerprint": stripe.fingerprint(),
        "source_args": {},
        "scenarios": scenarios,
    }


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


# -- the matrix and one tool --------------------------------------------------------------


def test_the_matrix_is_the_readme_table():
    result = providers()
    assert result.returncode == 0, result.stderr
    assert result.stdout == MATRIX_TABLE


def test_matrix_json_carries_fingerprints_and_plans():
    doc = json.loads(providers("--json").stdout)
    assert doc["schema_version"] == 1
    names = [c["name"] for c in doc["capabilities"]]
    assert names == ["stripe", "github_pr", "email_provider_api", "email_smtp"]
    github = doc["capabilities"][1]
    assert github["fingerprint"] == GITHUB.fingerprint()
    assert [s["scenario"] for s in github["conformance_plan"]] == [
        "happened",
        "mature_miss",
        "ambiguous",
    ]


def test_requirements_for_a_tool():
    result = providers("stripe.charge", "--requirements")
    assert result.returncode == 0
    assert result.stdout == "stripe.charge -> stripe (tier_1_native_idempotency_key)\n" + (
        STRIPE_REQUIREMENTS
    )


def test_conformance_plan_for_a_tool():
    result = providers("stripe.charge", "--conformance-plan")
    assert result.returncode == 0
    assert STRIPE_PLAN in result.stdout


def test_github_requirements_show_the_receipt_source():
    out = providers("github.create_pr", "--requirements").stdout
    assert "    idempotency fields: owner, repo, head\n" in out
    assert "    receipt fields: number, head\n" in out
    assert "    receipt source: head = arg head\n" in out


def test_a_tool_lists_only_its_capabilities():
    out = providers("email.send").stdout
    assert out.splitlines()[0] == "provider capability matrix for email.send"
    assert [line.split()[0] for line in out.splitlines()[2:]] == [
        "email_provider_api",
        "email_smtp",
    ]


def test_an_unknown_tool_says_it_goes_to_a_human():
    result = providers("slack.post")
    assert result.returncode == 0
    assert "no provider capability matches 'slack.post'" in result.stdout
    assert "human review" in result.stdout


def test_tool_json_is_the_readme_excerpt():
    result = providers("email.send", "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert doc["tool"] == "email.send"
    assert doc["can_auto_rearm_on_miss"] is False
    smtp = doc["capabilities"][1]
    assert smtp["name"] == "email_smtp"
    assert smtp["can_auto_rearm_on_miss"] is False
    assert smtp["miss_semantics"] == "inconclusive forever: sent copy can fail after delivery"
    assert "policy" not in doc


# -- policy gates -------------------------------------------------------------------------


def test_known_and_auto_rearm_pass_for_stripe():
    result = providers("stripe.charge", "--require-known", "--require-auto-rearm")
    assert (result.returncode, result.stdout) == (0, "policy: passed\n")


def test_email_send_is_blocked_from_auto_rearm():
    result = providers("email.send", "--require-auto-rearm", "--json")
    assert result.returncode == 1
    policy = json.loads(result.stdout)["policy"]
    assert policy["passed"] is False
    assert policy["required"] == ["auto_rearm_on_miss"]
    assert policy["checks"]["auto_rearm_on_miss"]["passed"] is False
    assert policy["checks"]["auto_rearm_on_miss"]["reason"] == (
        "'email.send' is not safe to auto-rearm on a miss; blocking capabilities: email_smtp"
    )


def test_pinning_the_provider_api_capability_passes():
    result = providers("email.send", "--capability", "email_provider_api", "--require-auto-rearm")
    assert (result.returncode, result.stdout) == (0, "policy: passed\n")


def test_failed_gate_lists_the_reason():
    result = providers("slack.post", "--require-known")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "policy: failed",
        "  known: no provider capability matches 'slack.post'; add one with --capability-file"
        " (--suggest-capabilities writes a stub)",
    ]


def test_a_bad_pin_is_one_line_and_refused():
    result = providers("email.send", "--capability", "github_pr", "--require-auto-rearm")
    assert result.returncode == 1
    assert one_line_error(result) == (
        "openonce: capability 'github_pr' covers 'github.create_pr', not tool 'email.send'"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--require-known"], "--require-known needs a TOOL or --scan DIR"),
        (["stripe.charge", "--require-handler-contract"], "reads handler source: add --scan DIR"),
        (["github.create_pr", "--require-conformance"], "needs --conformance-file FILE"),
        (["--scan", "nowhere"], "--scan nowhere: no such file or directory"),
        (
            ["x", "--suggest-capabilities", "--require-known"],
            "--suggest-capabilities prints a file; run the gates separately",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message):
    result = providers(*args)
    assert result.returncode == 2
    assert message in one_line_error(result)


# -- capability files ---------------------------------------------------------------------


def test_validate_only_with_the_readme_file(tmp_path):
    write_json(tmp_path / "openonce-providers.json", {"schema_version": 1, "capabilities": [SLACK]})
    result = providers(
        "--capability-file", "openonce-providers.json", "--validate-only", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "provider capability matrix valid: 5 capability(ies), 1 custom from"
        " openonce-providers.json\n"
    )
    reviewed = providers(
        "--capability-file",
        "openonce-providers.json",
        "--validate-only",
        "--require-reviewed",
        cwd=tmp_path,
    )
    assert (reviewed.returncode, reviewed.stdout) == (0, "readiness: passed\n")


def test_a_custom_tool_passes_the_gates(tmp_path):
    path = write_json(tmp_path / "p.json", {"schema_version": 1, "capabilities": [SLACK]})
    result = providers(
        "slack.post_message",
        "--capability-file",
        path,
        "--require-known",
        "--require-auto-rearm",
    )
    assert (result.returncode, result.stdout) == (0, "policy: passed\n")


def test_an_invalid_capability_file_is_one_line_naming_the_field(tmp_path):
    path = write_json(
        tmp_path / "p.json",
        {"schema_version": 1, "capabilities": [{**SLACK, "tier": "tier_9"}]},
    )
    result = providers("--capability-file", path, "--validate-only")
    assert result.returncode == 1
    line = one_line_error(result)
    assert line.startswith(f"openonce: {path}: capabilities[0] (slack_metadata).tier:")
    assert "unknown tier 'tier_9'" in line


def test_suggested_stubs_load_but_fail_review(tmp_path):
    result = providers("slack.post", "--suggest-capabilities", "--json")
    assert result.returncode == 0
    stub_file = tmp_path / "stubs.json"
    stub_file.write_text(result.stdout)
    doc = json.loads(result.stdout)
    assert doc["capabilities"][0]["tier"] == "tier_3_non_authoritative"
    assert doc["capabilities"][0]["can_auto_rearm_on_miss"] is False
    valid = providers("--capability-file", str(stub_file), "--validate-only")
    assert valid.returncode == 0
    assert "1 custom" in valid.stdout
    reviewed = providers(
        "--capability-file", str(stub_file), "--validate-only", "--require-reviewed"
    )
    assert reviewed.returncode == 1
    assert reviewed.stdout.splitlines()[0] == "readiness: failed"
    assert "  reviewed: slack_post: risk is still a TODO stub; review and fill it in" in (
        reviewed.stdout.splitlines()
    )


def test_a_known_tool_needs_no_suggestion():
    result = providers("stripe.charge", "--suggest-capabilities", "--json")
    assert json.loads(result.stdout) == {"schema_version": 1, "capabilities": []}


# -- conformance --------------------------------------------------------------------------


def test_the_readme_conformance_evidence_passes(tmp_path):
    path = write_json(tmp_path / "openonce-conformance.json", github_evidence())
    result = providers("github.create_pr", "--conformance-file", path, "--require-conformance")
    assert (result.returncode, result.stdout) == (0, "conformance: passed\n")


def test_the_fingerprint_to_record_is_in_the_tool_json():
    doc = json.loads(providers("github.create_pr", "--json").stdout)
    assert doc["capabilities"][0]["fingerprint"] == GITHUB.fingerprint()


def test_stale_evidence_fails(tmp_path):
    doc = github_evidence()
    doc["capabilities"]["github_pr"]["capability_fingerprint"] = "sha256:old"
    path = write_json(tmp_path / "c.json", doc)
    result = providers("github.create_pr", "--conformance-file", path, "--require-conformance")
    assert result.returncode == 1
    assert result.stdout.splitlines()[0] == "conformance: failed"
    assert "evidence is for fingerprint 'sha256:old'" in result.stdout


def test_a_template_is_not_evidence(tmp_path):
    template = providers("github.create_pr", "--conformance-file-template")
    assert template.returncode == 0
    doc = json.loads(template.stdout)
    entry = doc["capabilities"]["github_pr"]
    assert entry["capability_fingerprint"] == GITHUB.fingerprint()
    assert entry["source_args"] == {"owner": "TODO", "repo": "TODO", "head": "TODO"}
    assert entry["scenarios"]["happened"] == {
        "outcome": None,
        "receipt": None,
        "detail": "TODO: describe the fixture for happened (expect happened with receipt fields"
        " number, head)",
    }
    path = tmp_path / "openonce-conformance.json"
    path.write_text(template.stdout)
    result = providers(
        "github.create_pr", "--conformance-file", str(path), "--require-conformance", "--json"
    )
    assert result.returncode == 1
    check = json.loads(result.stdout)["policy"]["checks"]["conformance"]
    assert check["passed"] is False
    assert "github_pr: source_args.head is not filled in" in check["problems"]


def test_a_malformed_conformance_file_is_one_line(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"schema_version": 1, "capabilities": []}')
    result = providers("github.create_pr", "--conformance-file", str(path), "--require-conformance")
    assert result.returncode == 1
    assert one_line_error(result) == (
        f"openonce: {path}.capabilities: must be an object keyed by capability name"
    )


# -- scanning a project -------------------------------------------------------------------


@pytest.fixture
def good_project(tmp_path: Path) -> Path:
    (tmp_path / "src" / "app").mkdir(parents=True)
    (tmp_path / "src" / "app" / "tools.py").write_text(GOOD_SOURCE)
    doc = github_evidence()
    doc["capabilities"]["stripe"] = stripe_evidence()
    write_json(tmp_path / "openonce-conformance.json", doc)
    return tmp_path


def test_the_readme_scan_gate_passes_for_a_good_project(good_project):
    result = providers(
        "--scan",
        "src",
        "--require-known",
        "--require-auto-rearm",
        "--require-handler-contract",
        "--require-receipt-contract",
        "--conformance-file",
        "openonce-conformance.json",
        "--require-conformance",
        cwd=good_project,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "scan: passed\n"


def test_scan_without_gates_lists_tools(good_project):
    result = providers("--scan", "src", cwd=good_project)
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "scan src: 2 effect tool(s) in 1 file(s)",
        "  app/tools.py:9   create_pr  github.create_pr  github_pr",
        "  app/tools.py:16  refund     stripe.refund     stripe",
    ]


def test_scan_json_reports_handlers(good_project):
    doc = json.loads(providers("--scan", "src", "--json", cwd=good_project).stdout)
    create_pr = doc["scan"]["tools"][0]
    assert create_pr["tool"] == "github.create_pr"
    assert create_pr["tool_source"] == "constant PR_TOOL"
    assert create_pr["parameters"] == ["owner", "repo", "head", "title", "body"]
    assert create_pr["idempotency_fields"] == ["owner", "repo", "head"]
    assert create_pr["returns"] == [
        {"line": 12, "kind": "local_dict", "fields": {"number": None, "head": "head"}, "reason": ""}
    ]
    assert create_pr["capabilities"] == ["github_pr"]


def test_scan_template_covers_exactly_the_capabilities_in_use(good_project):
    result = providers("--scan", "src", "--conformance-file-template", cwd=good_project)
    assert result.returncode == 0
    assert list(json.loads(result.stdout)["capabilities"]) == ["github_pr", "stripe"]


def test_the_scan_gate_fails_a_bad_project(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "agent.py").write_text(BAD_SOURCE)
    result = providers(
        "--scan",
        "src",
        "--require-known",
        "--require-auto-rearm",
        "--require-handler-contract",
        "--require-receipt-contract",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "scan: failed"
    expected = [
        "  auditable: agent.py:8 post: unauditable tool expression \"PREFIX + '.post'\";"
        " use a string literal or a module-level constant",
        "  known: no provider capability matches 'slack.post_message'; add one with"
        " --capability-file (--suggest-capabilities writes a stub)",
        "  auto_rearm_on_miss: 'email.send' is not safe to auto-rearm on a miss; blocking"
        " capabilities: email_smtp",
        "  handler_contract: agent.py:13 open_pr: github_pr: handler signature lacks required"
        " arg 'head'",
        "  handler_contract: agent.py:13 open_pr: github_pr: idempotency_key= is opaque; use"
        " idempotency_fields including owner, repo, head",
        "  receipt_contract: agent.py:13 open_pr: github_pr: line 14: receipt 'head' must be the"
        " handler arg 'head' itself (write 'head': head)",
    ]
    for line in expected:
        assert line in lines
    json_result = providers("--scan", "src", "--require-known", "--json", cwd=tmp_path)
    policy = json.loads(json_result.stdout)["policy"]
    assert policy["required"] == ["auditable", "known"]
    assert policy["checks"]["auditable"]["passed"] is False
    assert policy["checks"]["known"]["problems"] == [
        "no provider capability matches 'slack.post_message'; add one with --capability-file"
        " (--suggest-capabilities writes a stub)"
    ]


def test_scan_suggests_stubs_for_unknown_tools(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "agent.py").write_text(BAD_SOURCE)
    result = providers("--scan", "src", "--suggest-capabilities", "--json", cwd=tmp_path)
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert [c["tool_pattern"] for c in doc["capabilities"]] == ["slack.post_message"]


def test_a_scan_that_finds_nothing_fails_its_gates(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "empty.py").write_text("x = 1\n")
    result = providers("--scan", "src", "--require-known", cwd=tmp_path)
    assert result.returncode == 1
    assert "  auditable: found no effect tools under src; check the --scan path" in (
        result.stdout.splitlines()
    )


def test_pinning_with_scan_applies_to_the_tools_it_matches(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "mail.py").write_text(
        textwrap.dedent(
            """
            @oo.effect(tool="email.send")
            def send(to):
                return {"message_id": make_id(to)}
            """
        )
    )
    blocked = providers("--scan", "src", "--require-auto-rearm", cwd=tmp_path)
    assert blocked.returncode == 1
    pinned = providers(
        "--scan", "src", "--capability", "email_provider_api", "--require-auto-rearm", cwd=tmp_path
    )
    assert (pinned.returncode, pinned.stdout) == (0, "scan: passed\n")


# -- the subcommand hook ------------------------------------------------------------------


def test_add_providers_parser_wires_a_subcommand(capsys):
    root = argparse.ArgumentParser(prog="openonce")
    sub = root.add_subparsers(dest="command", required=True)
    add_providers_parser(sub)
    args = root.parse_args(["providers", "stripe.charge", "--require-known"])
    assert args.func is cmd_providers
    assert args.func(args) == 0
    assert capsys.readouterr().out == "policy: passed\n"
