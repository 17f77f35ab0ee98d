"""The built-in provider matrix and ``CapabilityMatrix``: the built-in capabilities plus
a team's own, resolved per tool name."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import CapabilityError
from ._capability import (
    TIER_1_NATIVE_IDEMPOTENCY_KEY,
    TIER_2_NATURAL_BUSINESS_KEY,
    TIER_2_SENDER_CONTROLLED_AUTHORITATIVE,
    TIER_3_NON_AUTHORITATIVE,
    Capability,
)

BUILTIN_CAPABILITIES: tuple[Capability, ...] = (
    Capability(
        name="stripe",
        tool_pattern="stripe.*",
        tier=TIER_1_NATIVE_IDEMPOTENCY_KEY,
        key_strategy="provider_key sent as the Stripe Idempotency-Key; effect metadata stamped",
        probe_basis=(
            "metadata search of PaymentIntents, or of Charges where the tool creates Charges"
            " (Stripe-Version pinned, Stripe-Account for Connect); Refunds are not searchable:"
            " the refunds of the charge or payment_intent named in the args are listed and"
            " matched by metadata (+24h provider-key dedup backstop)"
        ),
        miss_semantics=(
            "inconclusive inside the index lag window, then not-happened; a refund-list miss"
            " (a primary-store read, no index lag) is not-happened past the grace window"
        ),
        can_auto_rearm_on_miss=True,
        default_grace_seconds=120,
        prober="StripeProber",
        handler_requirements=(
            "pass current_effect().provider_key as Stripe Idempotency-Key",
            "stamp effect_metadata(current_effect()) on the created object",
            "a refund tool passes the refunded charge or payment_intent id in its args",
        ),
        risk=(
            "low: Stripe dedups the key for 24h; the search index lags writes; search reads"
            " are limited to about 20/s per account"
        ),
        required_receipt_fields=("stripe_id",),
    ),
    Capability(
        name="github_pr",
        tool_pattern="github.create_pr",
        tier=TIER_2_NATURAL_BUSINESS_KEY,
        key_strategy="natural key owner/repo/head: one open PR per head branch",
        probe_basis=(
            "authoritative primary-store read of pull requests by owner:head (pages"
            " followed, rate-limit headers honoured); the head commit is compared when the"
            " effect records head_sha"
        ),
        miss_semantics="genuinely not-happened",
        can_auto_rearm_on_miss=True,
        default_grace_seconds=0,
        prober="GitHubPullRequestProber",
        handler_requirements=(
            "declare owner, repo and head in idempotency_fields",
            "return the created PR number and its head in the receipt",
            "pass head_sha (the commit pushed) in the args when known, so it is verified",
        ),
        risk="low: the pulls API reads the primary store",
        required_receipt_fields=("number", "head"),
        required_receipt_source_fields={"head": "head"},
        required_args=("owner", "repo", "head"),
        required_idempotency_fields=("owner", "repo", "head"),
    ),
    Capability(
        name="email_provider_api",
        tool_pattern="email.send",
        tier=TIER_2_SENDER_CONTROLLED_AUTHORITATIVE,
        key_strategy="deterministic Message-ID derived from current_effect().provider_key",
        probe_basis=(
            "authoritative sent-store search by Message-ID through the provider API (or an"
            " IMAP sent folder over verified TLS, found by SPECIAL-USE \\Sent)"
        ),
        miss_semantics="not-happened once the sent store has indexed the message",
        can_auto_rearm_on_miss=True,
        default_grace_seconds=120,
        prober="EmailMessageIdProber(authoritative=True)",
        handler_requirements=(
            "set the Message-ID header from current_effect().provider_key",
            "send through a provider API whose sent store records every accepted message",
        ),
        risk="medium: depends on the provider's sent-store indexing delay",
        required_receipt_fields=("message_id",),
    ),
    Capability(
        name="email_smtp",
        tool_pattern="email.send",
        tier=TIER_3_NON_AUTHORITATIVE,
        key_strategy="deterministic Message-ID derived from current_effect().provider_key",
        probe_basis=(
            "sent-folder search by Message-ID over verified TLS, the folder found by"
            " SPECIAL-USE \\Sent (the copy is written by the client)"
        ),
        miss_semantics="inconclusive forever: sent copy can fail after delivery",
        can_auto_rearm_on_miss=False,
        default_grace_seconds=120,
        prober="EmailMessageIdProber(authoritative=False)",
        handler_requirements=(
            "set the Message-ID header from current_effect().provider_key",
            "save a sent copy after delivery (a hit is evidence, a miss is not)",
        ),
        risk="high: SMTP delivery and the sent copy are separate, non-atomic steps",
        required_receipt_fields=("message_id",),
    ),
)


class CapabilityMatrix:
    """The built-in capabilities plus ``extra`` ones, answering per tool name."""

    def __init__(self, extra: Iterable[Capability] = ()) -> None:
        capabilities = [*BUILTIN_CAPABILITIES, *extra]
        seen: set[str] = set()
        for cap in capabilities:
            if cap.name in seen:
                raise CapabilityError(
                    f"capability name {cap.name!r} is defined twice; names must be unique"
                )
            seen.add(cap.name)
        self.capabilities: tuple[Capability, ...] = tuple(capabilities)
        self.custom_count = len(capabilities) - len(BUILTIN_CAPABILITIES)

    def for_tool(self, tool: str) -> list[Capability]:
        return [cap for cap in self.capabilities if cap.matches(tool)]

    def get(self, name: str) -> Capability | None:
        return next((cap for cap in self.capabilities if cap.name == name), None)

    def resolve(self, tool: str, pinned: str | None = None) -> list[Capability]:
        """The capabilities that govern ``tool``: the pinned one, else every match.

        A pin is how an integration says "this email.send is the provider API, not SMTP";
        a pin that names nothing, or a capability for another tool, is a configuration
        error, not a silent fallback to the conservative match.
        """
        if pinned is None:
            return self.for_tool(tool)
        cap = self.get(pinned)
        if cap is None:
            known = ", ".join(c.name for c in self.capabilities)
            raise CapabilityError(f"no provider capability named {pinned!r}; known: {known}")
        if not cap.matches(tool):
            raise CapabilityError(
                f"capability {pinned!r} covers {cap.tool_pattern!r}, not tool {tool!r}"
            )
        return [cap]

    def can_auto_rearm(self, tool: str, pinned: str | None = None) -> bool:
        """True only if something is known and every resolved capability trusts a miss."""
        caps = self.resolve(tool, pinned)
        return bool(caps) and all(cap.can_auto_rearm_on_miss for cap in caps)

    def grace_seconds(self, tool: str, pinned: str | None = None) -> int | None:
        """The longest default grace of the resolved capabilities; None for unknown tools."""
        caps = self.resolve(tool, pinned)
        return max((cap.default_grace_seconds for cap in caps), default=None)
