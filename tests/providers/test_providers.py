"""Provider knowledge: the capability matrix, its files, contracts and conformance."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._providers import (
    BUILTIN_CAPABILITIES,
    Capability,
    CapabilityError,
    CapabilityMatrix,
    ConformanceError,
    ConformanceScenario,
    assert_conformance,
    capability_from_json,
    check_call_contract,
    check_conformance_evidence,
    check_receipt,
    conformance_plan,
    conformance_template,
    load_capabilities_file,
    load_conformance_file,
    readiness_problems,
    suggest_capability,
)
from openonce_core.errors import OpenOnceError

MATRIX = CapabilityMatrix()
STRIPE = MATRIX.get("stripe")
GITHUB = MATRIX.get("github_pr")
EMAIL_API = MATRIX.get("email_provider_api")
EMAIL_SMTP = MATRIX.get("email_smtp")
assert STRIPE and GITHUB and EMAIL_API and EMAIL_SMTP

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

PR_ARGS = {"owner": "acme", "repo": "api", "head": "fix-login"}


def write_json(path, doc) -> str:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def github_evidence(**changes) -> dict:
    """The README's github_pr evidence, with the current fingerprint."""
    entry = {
        "capability_fingerprint": GITHUB.fingerprint(),
        "source_args": dict(PR_ARGS),
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
    entry.update(changes)
    return {"schema_version": 1, "capabilities": {"github_pr": entry}}


# -- the built-in matrix ------------------------------------------------------------------


def test_builtin_matrix_is_the_readme_table():
    rows = [
        (c.name, c.tool_pattern, c.tier, c.can_auto_rearm_on_miss, c.default_grace_seconds)
        for c in BUILTIN_CAPABILITIES
    ]
    assert rows == [
        ("stripe", "stripe.*", "tier_1_native_idempotency_key", True, 120),
        ("github_pr", "github.create_pr", "tier_2_natural_business_key", True, 0),
        ("email_provider_api", "email.send", "tier_2_sender_controlled_authoritative", True, 120),
        ("email_smtp", "email.send", "tier_3_non_authoritative", False, 120),
    ]
    assert [c.prober for c in BUILTIN_CAPABILITIES] == [
        "StripeProber",
        "GitHubPullRequestProber",
        "EmailMessageIdProber(authoritative=True)",
        "EmailMessageIdProber(authoritative=False)",
    ]
    assert EMAIL_SMTP.miss_semantics == "inconclusive forever: sent copy can fail after delivery"
    assert GITHUB.required_receipt_source_fields == {"head": "head"}
    assert GITHUB.required_args == GITHUB.required_idempotency_fields == ("owner", "repo", "head")


def test_every_builtin_is_reviewed_knowledge():
    assert [p for cap in BUILTIN_CAPABILITIES for p in readiness_problems(cap)] == []


def test_glob_patterns_match_tools():
    assert [c.name for c in MATRIX.for_tool("stripe.refund")] == ["stripe"]
    assert [c.name for c in MATRIX.for_tool("email.send")] == ["email_provider_api", "email_smtp"]
    assert MATRIX.for_tool("stripe") == []
    assert MATRIX.for_tool("github.create_issue") == []


def test_an_ambiguous_tool_cannot_auto_rearm_until_pinned():
    assert MATRIX.can_auto_rearm("stripe.charge") is True
    assert MATRIX.can_auto_rearm("email.send") is False
    assert MATRIX.can_auto_rearm("email.send", "email_provider_api") is True
    assert MATRIX.can_auto_rearm("email.send", "email_smtp") is False
    assert MATRIX.can_auto_rearm("slack.post_message") is False  # unknown: fail closed


def test_grace_is_the_longest_of_the_resolved_capabilities():
    assert MATRIX.grace_seconds("stripe.charge") == 120
    assert MATRIX.grace_seconds("github.create_pr") == 0
    assert MATRIX.grace_seconds("email.send") == 120
    assert MATRIX.grace_seconds("slack.post_message") is None


def test_a_pin_must_name_a_capability_for_that_tool():
    assert MATRIX.resolve("email.send", "email_smtp") == [EMAIL_SMTP]
    with pytest.raises(CapabilityError, match="no provider capability named 'gmail'"):
        MATRIX.resolve("email.send", "gmail")
    with pytest.raises(
        CapabilityError, match=re.escape("'github.create_pr', not tool 'email.send'")
    ):
        MATRIX.resolve("email.send", "github_pr")


def test_capability_error_is_an_openonce_error():
    assert issubclass(CapabilityError, OpenOnceError)
    assert issubclass(ConformanceError, AssertionError)


def test_custom_capabilities_join_the_matrix_and_cannot_shadow_builtins():
    slack = capability_from_json(SLACK)
    matrix = CapabilityMatrix(extra=[slack])
    assert matrix.for_tool("slack.post_message") == [slack]
    assert matrix.grace_seconds("slack.post_message") == 30
    assert matrix.custom_count == 1
    with pytest.raises(CapabilityError, match="'stripe' is defined twice"):
        CapabilityMatrix(extra=[dataclasses.replace(slack, name="stripe")])


# -- fingerprints and JSON ----------------------------------------------------------------


def test_fingerprint_tracks_semantics_not_review_notes():
    fp = STRIPE.fingerprint()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", fp)
    assert dataclasses.replace(STRIPE).fingerprint() == fp
    assert dataclasses.replace(STRIPE, risk="reworded note").fingerprint() == fp
    assert dataclasses.replace(STRIPE, default_grace_seconds=60).fingerprint() != fp
    assert dataclasses.replace(STRIPE, miss_semantics="different").fingerprint() != fp


def test_to_json_round_trips_through_capability_from_json():
    for cap in BUILTIN_CAPABILITIES:
        again = capability_from_json(json.loads(json.dumps(cap.to_json())))
        assert again == cap
        assert again.fingerprint() == cap.fingerprint()


def test_capabilities_are_immutable_even_when_built_from_lists():
    cap = capability_from_json(SLACK)
    assert cap.handler_requirements == tuple(SLACK["handler_requirements"])
    with pytest.raises(TypeError):
        cap.required_receipt_source_fields["ts"] = "x"  # type: ignore[index]
    assert hash(cap) == hash(capability_from_json(SLACK))


def test_guidance_tells_an_operator_what_to_do():
    text = GITHUB.guidance()
    assert "missing prober: register GitHubPullRequestProber" in text
    assert "miss semantics: genuinely not-happened" in text
    assert "  - declare owner, repo and head in idempotency_fields" in text
    assert "required idempotency fields: owner, repo, head" in text
    assert "required receipt fields: number, head" in text
    assert "receipt source contract: receipt head must equal arg head" in text
    smtp = EMAIL_SMTP.guidance()
    assert "inconclusive forever: sent copy can fail after delivery" in smtp
    assert "a miss is not evidence: never re-arm without a person's decision" in smtp


def test_a_tier_3_capability_can_never_rearm():
    with pytest.raises(CapabilityError, match="tier_3_non_authoritative miss is not evidence"):
        dataclasses.replace(EMAIL_SMTP, name="smtp2", can_auto_rearm_on_miss=True)


def test_receipt_source_args_must_be_key_material():
    with pytest.raises(CapabilityError, match="'head' is not in required_idempotency_fields"):
        dataclasses.replace(GITHUB, required_idempotency_fields=("owner", "repo"))


# -- capability files ---------------------------------------------------------------------


def test_the_readme_capability_file_loads(tmp_path):
    path = write_json(tmp_path / "p.json", {"schema_version": 1, "capabilities": [SLACK]})
    [slack] = load_capabilities_file(path)
    assert slack.name == "slack_metadata"
    assert slack.required_receipt_fields == ("ts",)
    assert slack.required_args == ()
    assert readiness_problems(slack) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tier": "tier_9"}, r"capabilities\[0\] \(slack_metadata\)\.tier: unknown tier 'tier_9'"),
        ({"can_auto_rearm_on_miss": "yes"}, r"can_auto_rearm_on_miss: must be true or false"),
        ({"default_grace_seconds": True}, r"default_grace_seconds: must be a non-negative"),
        ({"default_grace_seconds": -1}, r"default_grace_seconds: must be a non-negative"),
        ({"required_receipt_fields": "ts"}, r"required_receipt_fields: must be a list"),
        ({"prober": 3}, r"prober: must be a non-empty string or null"),
        ({"colour": "blue"}, r"\.colour: unknown field"),
        ({"required_receipt_source_fields": {"ts": 1}}, r"required_receipt_source_fields: must"),
        ({"required_receipt_fields": ["ts", "ts"]}, r"required_receipt_fields: duplicate"),
    ],
)
def test_capability_file_errors_name_the_file_and_field(tmp_path, change, message):
    path = write_json(
        tmp_path / "providers.json", {"schema_version": 1, "capabilities": [{**SLACK, **change}]}
    )
    with pytest.raises(CapabilityError, match=message) as info:
        load_capabilities_file(path)
    assert str(info.value).startswith(path + ": capabilities[0]")
    assert "\n" not in str(info.value)


def test_missing_required_field_is_named(tmp_path):
    doc = {k: v for k, v in SLACK.items() if k != "miss_semantics"}
    path = write_json(tmp_path / "p.json", {"schema_version": 1, "capabilities": [doc]})
    with pytest.raises(CapabilityError, match=r"miss_semantics: required field is missing"):
        load_capabilities_file(path)


def test_duplicate_and_builtin_names_are_refused(tmp_path):
    dup = write_json(tmp_path / "d.json", {"schema_version": 1, "capabilities": [SLACK, SLACK]})
    with pytest.raises(CapabilityError, match=r"capabilities\[1\]\.name: .* defined twice"):
        load_capabilities_file(dup)
    shadow = write_json(
        tmp_path / "s.json", {"schema_version": 1, "capabilities": [{**SLACK, "name": "stripe"}]}
    )
    with pytest.raises(CapabilityError, match="'stripe' is a built-in capability"):
        load_capabilities_file(shadow)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 2, "capabilities": []}', "schema_version: must be 1, got 2"),
        ('{"schema_version": true, "capabilities": []}', "schema_version: must be 1"),
        ('{"schema_version": 1, "capabilities": {}}', "capabilities: must be a list"),
        ('{"schema_version": 1, "capabilities": [], "x": 1}', "unknown top-level field 'x'"),
        ("[]", "must be a JSON object"),
        ("{not json", "capability file is not JSON"),
    ],
)
def test_malformed_capability_files(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(CapabilityError, match=re.escape(message)):
        load_capabilities_file(path)


def test_a_missing_file_is_a_capability_error(tmp_path):
    with pytest.raises(CapabilityError, match="cannot read capability file"):
        load_capabilities_file(tmp_path / "absent.json")


# -- receipt and call contracts -----------------------------------------------------------


def test_check_receipt_requires_fields_and_source_equality():
    assert check_receipt([STRIPE], {"stripe_id": "pi_1"}, {}) == []
    assert check_receipt([STRIPE], {"id": "pi_1"}, {}) == [
        "stripe: receipt is missing required field 'stripe_id'"
    ]
    assert check_receipt([GITHUB], {"number": 42, "head": "fix-login"}, PR_ARGS) == []
    assert check_receipt([GITHUB], {"number": 42, "head": "main"}, PR_ARGS) == [
        "github_pr: receipt field 'head' is 'main' but arg 'head' is 'fix-login'"
    ]
    assert check_receipt([GITHUB], {"number": 42, "head": "x"}, {"owner": "acme"}) == [
        "github_pr: receipt field 'head' must equal arg 'head', which the call did not pass"
    ]
    assert check_receipt([STRIPE], ["pi_1"], {}) == ["receipt must be a JSON object, got list"]


def test_check_receipt_checks_every_matching_capability():
    problems = check_receipt([EMAIL_API, EMAIL_SMTP], {}, {})
    assert problems == [
        "email_provider_api: receipt is missing required field 'message_id'",
        "email_smtp: receipt is missing required field 'message_id'",
    ]


def test_call_contract_for_a_natural_key():
    ok = check_call_contract(GITHUB, PR_ARGS | {"title": "t"}, ("owner", "repo", "head"), False)
    assert ok == []
    assert check_call_contract(GITHUB, {"owner": "a", "repo": "b"}, ("owner", "repo"), False) == [
        "github_pr: call is missing required arg 'head'",
        "github_pr: idempotency_fields must include head",
    ]
    assert check_call_contract(GITHUB, PR_ARGS, None, False) == [
        "github_pr: declare idempotency_fields including owner, repo, head"
    ]
    assert check_call_contract(GITHUB, PR_ARGS, None, True) == [
        "github_pr: an explicit idempotency_key is opaque; derive the key with"
        " idempotency_fields including owner, repo, head"
    ]


def test_call_contract_without_natural_key_accepts_any_key():
    assert check_call_contract(STRIPE, {"amount_cents": 5}, None, True) == []


# -- readiness ----------------------------------------------------------------------------


def test_readiness_flags_stubs_and_unfinished_entries():
    stub = capability_from_json(suggest_capability("slack.post_message"))
    problems = readiness_problems(stub)
    assert "slack_post_message: key_strategy is still a TODO stub; review and fill it in" in (
        problems
    )
    assert len(problems) == 5  # key_strategy, probe_basis, miss_semantics, handler reqs, risk
    no_prober = capability_from_json({**SLACK, "prober": None})
    assert readiness_problems(no_prober) == [
        "slack_metadata: auto re-arms on a miss but names no prober; a miss needs a probe"
    ]
    no_receipt = capability_from_json({**SLACK, "required_receipt_fields": []})
    assert readiness_problems(no_receipt) == [
        "slack_metadata: prober SlackMetadataProber has no required_receipt_fields; a HAPPENED"
        " probe could commit without external evidence"
    ]


def test_suggested_stub_is_conservative_and_loadable():
    stub = suggest_capability("slack.post_message")
    assert stub["tier"] == "tier_3_non_authoritative"
    assert stub["can_auto_rearm_on_miss"] is False
    cap = capability_from_json(stub)
    assert cap.matches("slack.post_message") and not cap.matches("slack.post_messageX")
    assert capability_from_json(suggest_capability("weird*tool")).matches("weird*tool")
    assert not capability_from_json(suggest_capability("weird*tool")).matches("weirdXtool")


# -- conformance --------------------------------------------------------------------------


def plan_of(cap: Capability) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(s.value, o.value, fields) for s, o, fields in conformance_plan(cap)]


def test_conformance_plans_per_tier():
    assert plan_of(STRIPE) == [
        ("happened", "happened", ("stripe_id",)),
        ("young_miss", "inconclusive", ()),
        ("mature_miss", "not_happened", ()),
        ("ambiguous", "inconclusive", ()),
    ]
    # No lag window, so no young miss: the README's github evidence has three scenarios.
    assert plan_of(GITHUB) == [
        ("happened", "happened", ("number", "head")),
        ("mature_miss", "not_happened", ()),
        ("ambiguous", "inconclusive", ()),
    ]
    # Tier 3: even a mature miss must stay inconclusive.
    assert plan_of(EMAIL_SMTP)[2] == ("mature_miss", "inconclusive", ())


def stripe_results(**overrides) -> dict[ConformanceScenario, ProbeResult]:
    results = {
        ConformanceScenario.HAPPENED: ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_1"}
        ),
        ConformanceScenario.YOUNG_MISS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
        ConformanceScenario.MATURE_MISS: ProbeResult(ProbeOutcome.NOT_HAPPENED),
        ConformanceScenario.AMBIGUOUS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
    }
    results.update({ConformanceScenario(k): v for k, v in overrides.items()})
    return results


def test_the_readme_stripe_conformance_example_passes():
    assert_conformance(STRIPE, stripe_results())


def test_a_prober_that_rearms_on_a_young_miss_fails_conformance():
    with pytest.raises(ConformanceError) as info:
        assert_conformance(
            STRIPE, stripe_results(young_miss=ProbeResult(ProbeOutcome.NOT_HAPPENED))
        )
    assert str(info.value) == (
        "prober does not conform to capability 'stripe':\n"
        "  - stripe: scenario young_miss expected inconclusive, got not_happened"
    )


def test_conformance_needs_receipts_and_every_scenario():
    results = stripe_results(happened=ProbeResult(ProbeOutcome.HAPPENED, receipt={"id": "pi_1"}))
    del results[ConformanceScenario.AMBIGUOUS]
    with pytest.raises(ConformanceError) as info:
        assert_conformance(STRIPE, results)
    message = str(info.value)
    assert "stripe: scenario happened: receipt is missing required field 'stripe_id'" in message
    assert "stripe: scenario ambiguous has no result" in message
    no_receipt = stripe_results(happened=ProbeResult(ProbeOutcome.HAPPENED))
    with pytest.raises(ConformanceError, match="must return a non-empty receipt"):
        assert_conformance(STRIPE, no_receipt)


def test_github_conformance_checks_the_receipt_head_against_source_args():
    results = {
        ConformanceScenario.HAPPENED: ProbeResult(
            ProbeOutcome.HAPPENED, receipt={"number": 42, "head": "fix-login"}
        ),
        ConformanceScenario.MATURE_MISS: ProbeResult(ProbeOutcome.NOT_HAPPENED),
        ConformanceScenario.AMBIGUOUS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
    }
    assert_conformance(GITHUB, results, source_args=PR_ARGS)
    with pytest.raises(ConformanceError, match="pass source_args"):
        assert_conformance(GITHUB, results)
    with pytest.raises(ConformanceError, match="receipt field 'head' is 'fix-login' but arg"):
        assert_conformance(GITHUB, results, source_args=PR_ARGS | {"head": "other"})
    results[ConformanceScenario.YOUNG_MISS] = ProbeResult(ProbeOutcome.INCONCLUSIVE)
    with pytest.raises(ConformanceError, match="young_miss is not in the conformance plan"):
        assert_conformance(GITHUB, results, source_args=PR_ARGS)


def test_smtp_prober_must_not_claim_a_mature_miss():
    results = stripe_results(
        happened=ProbeResult(ProbeOutcome.HAPPENED, receipt={"message_id": "<a@b>"}),
        mature_miss=ProbeResult(ProbeOutcome.NOT_HAPPENED),
    )
    with pytest.raises(ConformanceError, match="mature_miss expected inconclusive"):
        assert_conformance(EMAIL_SMTP, results)


def test_the_readme_evidence_passes_with_the_current_fingerprint():
    assert check_conformance_evidence(GITHUB, github_evidence()) == []


def test_stale_evidence_fails_until_regenerated():
    stale = github_evidence(capability_fingerprint="sha256:" + "0" * 64)
    [problem] = check_conformance_evidence(GITHUB, stale)
    assert problem.startswith("github_pr: evidence is for fingerprint 'sha256:000")
    assert GITHUB.fingerprint() in problem
    assert "regenerate" in problem


def test_evidence_receipts_must_match_source_args():
    doc = github_evidence()
    doc["capabilities"]["github_pr"]["scenarios"]["happened"]["receipt"]["head"] = "main"
    assert check_conformance_evidence(GITHUB, doc) == [
        "github_pr: scenario happened: receipt field 'head' is 'main' but arg 'head' is 'fix-login'"
    ]
    del doc["capabilities"]["github_pr"]["scenarios"]["happened"]["receipt"]["number"]
    assert "receipt is missing required field 'number'" in "\n".join(
        check_conformance_evidence(GITHUB, doc)
    )


def test_evidence_outcomes_and_scenarios_follow_the_plan():
    doc = github_evidence()
    scenarios = doc["capabilities"]["github_pr"]["scenarios"]
    scenarios["mature_miss"]["outcome"] = "inconclusive"
    del scenarios["ambiguous"]
    scenarios["sideways"] = {"outcome": "happened", "detail": "x"}
    assert check_conformance_evidence(GITHUB, doc) == [
        "github_pr: scenarios.sideways: unknown scenario; the plan has happened, mature_miss,"
        " ambiguous",
        "github_pr: scenario mature_miss expected not_happened, got inconclusive",
        "github_pr: scenario ambiguous has no result",
    ]


def test_missing_evidence_says_how_to_start():
    assert check_conformance_evidence(STRIPE, github_evidence()) == [
        "stripe: no conformance evidence; generate a template with --conformance-file-template"
        " and fill it in"
    ]


def test_a_template_is_a_scaffold_that_never_passes():
    template = conformance_template([GITHUB, STRIPE])
    entry = template["capabilities"]["github_pr"]
    assert entry["capability_fingerprint"] == GITHUB.fingerprint()
    assert entry["source_args"] == {"owner": "TODO", "repo": "TODO", "head": "TODO"}
    assert list(entry["scenarios"]) == ["happened", "mature_miss", "ambiguous"]
    assert entry["scenarios"]["happened"]["outcome"] is None
    assert entry["scenarios"]["happened"]["receipt"] is None
    assert entry["scenarios"]["happened"]["detail"].startswith("TODO")
    assert list(template["capabilities"]["stripe"]["scenarios"]) == [
        "happened",
        "young_miss",
        "mature_miss",
        "ambiguous",
    ]
    problems = check_conformance_evidence(GITHUB, template)
    assert "github_pr: source_args.head is not filled in" in problems
    assert (
        "github_pr: scenarios.happened.outcome: null; record the outcome the prober returned"
        in (problems)
    )
    assert (
        "github_pr: scenarios.ambiguous.detail: describe the fixture (still TODO or missing)"
        in (problems)
    )
    assert not any("has no result" in p for p in problems)  # said once, with the reason


def test_conformance_file_loading(tmp_path):
    good = write_json(tmp_path / "c.json", github_evidence())
    assert check_conformance_evidence(GITHUB, load_conformance_file(good)) == []
    bad = write_json(tmp_path / "b.json", {"schema_version": 1, "capabilities": []})
    with pytest.raises(CapabilityError, match=r"b\.json\.capabilities: must be an object"):
        load_conformance_file(bad)
    wrong = write_json(tmp_path / "w.json", {"schema_version": 1, "capabilities": {"x": 1}})
    with pytest.raises(CapabilityError, match=r"capabilities\.x: must be a JSON object"):
        load_conformance_file(wrong)


def test_evidence_receipts_cannot_hold_todo_values():
    doc = github_evidence()
    doc["capabilities"]["github_pr"]["scenarios"]["happened"]["receipt"]["number"] = "TODO"
    assert check_conformance_evidence(GITHUB, doc) == [
        "github_pr: scenarios.happened.receipt: fill in the receipt the prober returned"
    ]
