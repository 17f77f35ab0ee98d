"""The spec's public names, importable from ``openonce_core`` exactly as it spells them,
and a complete error tree."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import openonce_core
from openonce_core import (
    ConformanceScenario,
    OpenOnceError,
    ProbeOutcome,
    ProbeResult,
    assert_conformance,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_spec_examples_import_what_they_name(tmp_path):
    oo = openonce_core.OpenOnce(":memory:")
    rec = openonce_core.Reconciler(oo.store)  # the spec's spelling: a Reconciler over a store
    assert isinstance(rec, openonce_core.Reconciler) and rec.store is oo.store
    providers = tmp_path / "openonce-providers.json"
    providers.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "capabilities": [
                    {
                        "name": "slack_metadata",
                        "tool_pattern": "slack.post_message",
                        "tier": "tier_2_sender_controlled_authoritative",
                        "key_strategy": "message metadata event_payload.openonce_effect_id",
                        "probe_basis": "conversations.history search by metadata",
                        "miss_semantics": "not-happened after Slack history propagation",
                        "can_auto_rearm_on_miss": True,
                        "default_grace_seconds": 30,
                        "prober": "SlackMetadataProber",
                        "handler_requirements": ["stamp the effect id into message metadata"],
                        "risk": "medium",
                        "required_receipt_fields": ["ts"],
                    }
                ],
            }
        )
    )
    [extra] = openonce_core.load_capabilities_file(providers)
    assert extra.name == "slack_metadata"
    stripe = openonce_core.CapabilityMatrix().resolve("stripe.charge")[0]
    assert_conformance(
        stripe,
        {
            ConformanceScenario.HAPPENED: ProbeResult(
                ProbeOutcome.HAPPENED, receipt={"stripe_id": "pi_1"}
            ),
            ConformanceScenario.YOUNG_MISS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
            ConformanceScenario.MATURE_MISS: ProbeResult(ProbeOutcome.NOT_HAPPENED),
            ConformanceScenario.AMBIGUOUS: ProbeResult(ProbeOutcome.INCONCLUSIVE),
        },
    )
    for name in ("StripeProber", "GitHubPullRequestProber", "EmailMessageIdProber"):
        assert callable(getattr(openonce_core, name))
    assert openonce_core.effect_metadata.__module__ == "openonce_core.probers.stripe"


def test_every_public_name_exists_and_the_package_is_typed():
    for name in openonce_core.__all__:
        assert getattr(openonce_core, name) is not None, name
    assert (ROOT / "openonce_core" / "py.typed").exists()
    importlib.import_module("openonce_core.testing").FakeClock()


def test_the_error_tree_is_complete():
    errors = importlib.import_module("openonce_core.errors")
    for name in ("CapabilityError", "WiringError", "ConfigurationError", "ReceiptIdentityError",
                 "HandlerNotStartedError", "SchemaVersionError"):  # fmt: skip
        cls = getattr(openonce_core, name)
        assert issubclass(cls, OpenOnceError), name
        assert cls.__module__ == "openonce_core.errors"
        assert name in errors.__doc__, f"{name} is missing from the tree in errors.py"
    # Signals raised by handlers and probers are not OpenOnce's own errors.
    for name in ("BusinessError", "RetryableEffectError", "UnknownOutcomeError", "ProbeError"):
        assert not issubclass(getattr(openonce_core, name), OpenOnceError)
        assert name in errors.__doc__
    assert issubclass(openonce_core.ConformanceError, AssertionError)
    # The modules that used to define them still expose the same classes.
    assert importlib.import_module("openonce_core._providers").CapabilityError is (
        openonce_core.CapabilityError
    )
    assert importlib.import_module("openonce_core._wiring").WiringError is openonce_core.WiringError
