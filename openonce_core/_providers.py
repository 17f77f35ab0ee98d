"""Provider knowledge: what a probe miss means for each provider, and how to prove it.

A prober answers "did this effect happen at the provider?". Whether its answer can be
trusted depends on the provider, not on the prober's code: a Stripe metadata search lags
behind writes, a GitHub PR read is authoritative, a bare SMTP "sent" copy can be lost
after delivery. This module is the one named place for that knowledge:

* ``Capability`` — one provider behaviour: its honesty tier, what a miss means, whether a
  miss may re-arm the effect, the grace window, and the handler and receipt contracts;
* ``CapabilityMatrix`` — the built-in capabilities plus a team's own, resolved per tool;
* receipt and call contracts (``check_receipt``, ``check_call_contract``) the runtime
  and the reconciler enforce;
* conformance: the scenarios every prober of a capability must pass
  (``conformance_plan``, ``assert_conformance``) and the JSON evidence CI checks
  (``check_conformance_evidence``), bound to the capability's ``fingerprint()`` so that
  evidence goes stale when the capability's semantics change.

The three honesty tiers:

* tier 1 — the provider dedups by our key (Stripe): a miss is inconclusive inside the
  index lag window, then not-happened;
* tier 2 — a natural business key read from the primary store (GitHub PR by head), or a
  sender-controlled key searched in an authoritative sent store: a miss is not-happened;
* tier 3 — non-authoritative evidence (bare SMTP): a miss is never evidence.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from ._canonical import fingerprint as _fingerprint
from ._probe import ProbeOutcome, ProbeResult
from .errors import CapabilityError, ConformanceError

SCHEMA_VERSION = 1

TIER_1_NATIVE_IDEMPOTENCY_KEY = "tier_1_native_idempotency_key"
TIER_2_NATURAL_BUSINESS_KEY = "tier_2_natural_business_key"
TIER_2_SENDER_CONTROLLED_AUTHORITATIVE = "tier_2_sender_controlled_authoritative"
TIER_3_NON_AUTHORITATIVE = "tier_3_non_authoritative"
TIERS = (
    TIER_1_NATIVE_IDEMPOTENCY_KEY,
    TIER_2_NATURAL_BUSINESS_KEY,
    TIER_2_SENDER_CONTROLLED_AUTHORITATIVE,
    TIER_3_NON_AUTHORITATIVE,
)

# Text a reviewer still has to replace. Any field holding it fails --require-reviewed
# and any evidence holding it fails --require-conformance.
TODO = "TODO"

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class _InvalidCapability(CapabilityError):
    """A semantic contradiction in one field; ``capability_from_json`` re-labels it."""

    def __init__(self, name: str, problem: str) -> None:
        self.problem = problem
        super().__init__(f"capability {name!r}: {problem}")


# -- the capability -----------------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    """One provider behaviour and the contracts that make its probe results trustworthy."""

    name: str
    tool_pattern: str
    tier: str
    key_strategy: str
    probe_basis: str
    miss_semantics: str
    can_auto_rearm_on_miss: bool
    default_grace_seconds: int
    prober: str | None = None
    handler_requirements: tuple[str, ...] = ()
    risk: str = ""
    required_receipt_fields: tuple[str, ...] = ()
    required_receipt_source_fields: Mapping[str, str] = field(default_factory=dict)
    required_args: tuple[str, ...] = ()
    required_idempotency_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Accept lists from callers, but keep the instance immutable: a capability is
        # shared by every reconciler tick and must not change under one of them.
        for name in _TUPLE_FIELDS:
            object.__setattr__(self, name, tuple(getattr(self, name)))
        sources = MappingProxyType(dict(self.required_receipt_source_fields))
        object.__setattr__(self, "required_receipt_source_fields", sources)
        problems = _semantic_problems(self)
        if problems:
            raise _InvalidCapability(self.name, problems[0])

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def matches(self, tool: str) -> bool:
        """True when ``tool`` matches the capability's glob (``stripe.*``)."""
        return fnmatch.fnmatchcase(tool, self.tool_pattern)

    def to_json(self) -> dict[str, Any]:
        """The capability in the capability-file schema (``capability_from_json`` reads it)."""
        return {
            "name": self.name,
            "tool_pattern": self.tool_pattern,
            "tier": self.tier,
            "key_strategy": self.key_strategy,
            "probe_basis": self.probe_basis,
            "miss_semantics": self.miss_semantics,
            "can_auto_rearm_on_miss": self.can_auto_rearm_on_miss,
            "default_grace_seconds": self.default_grace_seconds,
            "prober": self.prober,
            "handler_requirements": list(self.handler_requirements),
            "risk": self.risk,
            "required_receipt_fields": list(self.required_receipt_fields),
            "required_receipt_source_fields": dict(self.required_receipt_source_fields),
            "required_args": list(self.required_args),
            "required_idempotency_fields": list(self.required_idempotency_fields),
        }

    def fingerprint(self) -> str:
        """``sha256:`` of the canonical JSON of everything that decides probe semantics.

        Conformance evidence records it; when a field that changes what a prober must do
        or what its result means changes, old evidence stops counting. ``risk`` is a
        reviewer's note, not semantics, so rewording it does not invalidate evidence.
        """
        semantic = self.to_json()
        del semantic["risk"]
        return _fingerprint(semantic)

    def guidance(self, *, prober_registered: bool = False) -> str:
        """What an operator needs to resolve an UNKNOWN effect of this capability by hand
        (and, when no prober was registered, which one would have done it)."""
        lines = [f"provider capability {self.name} ({self.tier})"]
        if not prober_registered and self.prober:
            lines.append(
                f"missing prober: register {self.prober} for this tool"
                f" (Reconciler.register(tool, prober, capability={self.name!r}))"
            )
        elif not prober_registered:
            lines.append("missing prober: none is known for this capability; check by hand")
        lines.append(f"probe basis: {self.probe_basis}")
        lines.append(f"miss semantics: {self.miss_semantics}")
        if self.can_auto_rearm_on_miss:
            lines.append(
                f"a miss may re-arm the effect after a {self.default_grace_seconds}s grace window"
            )
        else:
            lines.append("a miss is not evidence: never re-arm without a person's decision")
        if self.handler_requirements:
            lines.append("handler requirements:")
            lines.extend(f"  - {item}" for item in self.handler_requirements)
        if self.required_idempotency_fields:
            lines.append(
                "required idempotency fields: " + ", ".join(self.required_idempotency_fields)
            )
        if self.required_receipt_fields:
            lines.append("required receipt fields: " + ", ".join(self.required_receipt_fields))
        for receipt_field, arg in self.required_receipt_source_fields.items():
            lines.append(f"receipt source contract: receipt {receipt_field} must equal arg {arg}")
        return "\n".join(lines)


_TUPLE_FIELDS = (
    "handler_requirements",
    "required_receipt_fields",
    "required_args",
    "required_idempotency_fields",
)


def _semantic_problems(cap: Capability) -> list[str]:
    """Contradictions no capability may hold, whatever file or code it came from."""
    problems: list[str] = []
    if not _NAME.match(cap.name):
        problems.append("name: use letters, digits, '_', '.' or '-'")
    if not cap.tool_pattern:
        problems.append("tool_pattern: must not be empty")
    if cap.tier not in TIERS:
        problems.append(f"tier: unknown tier {cap.tier!r}; expected one of {', '.join(TIERS)}")
    if type(cap.default_grace_seconds) is not int or cap.default_grace_seconds < 0:
        problems.append("default_grace_seconds: must be a non-negative integer")
    if cap.tier == TIER_3_NON_AUTHORITATIVE and cap.can_auto_rearm_on_miss:
        # The whole point of tier 3: its miss is not evidence, so it can never re-arm.
        problems.append(
            "can_auto_rearm_on_miss: a tier_3_non_authoritative miss is not evidence;"
            " it cannot re-arm"
        )
    for name in _TUPLE_FIELDS:
        values: tuple[str, ...] = getattr(cap, name)
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            problems.append(f"{name}: duplicate entries {', '.join(duplicates)}")
    for receipt_field, arg in cap.required_receipt_source_fields.items():
        where = f"required_receipt_source_fields.{receipt_field}"
        if receipt_field not in cap.required_receipt_fields:
            problems.append(f"{where}: {receipt_field!r} is not in required_receipt_fields")
        if arg not in cap.required_idempotency_fields:
            # A receipt tied to an arg that is not key material could be replayed for a
            # call with a different value of that arg.
            problems.append(f"{where}: source arg {arg!r} is not in required_idempotency_fields")
    return problems


# -- the built-in matrix ------------------------------------------------------------------

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


# -- capability files ---------------------------------------------------------------------

# field -> (kind, required). Kinds: str, bool, int, str_or_null, strings, string_map.
_FIELDS: dict[str, tuple[str, bool]] = {
    "name": ("str", True),
    "tool_pattern": ("str", True),
    "tier": ("str", True),
    "key_strategy": ("str", True),
    "probe_basis": ("str", True),
    "miss_semantics": ("str", True),
    "can_auto_rearm_on_miss": ("bool", True),
    "default_grace_seconds": ("int", True),
    "risk": ("str", True),
    "prober": ("str_or_null", False),
    "handler_requirements": ("strings", False),
    "required_receipt_fields": ("strings", False),
    "required_receipt_source_fields": ("string_map", False),
    "required_args": ("strings", False),
    "required_idempotency_fields": ("strings", False),
}


def _type_problem(kind: str, value: Any) -> str | None:
    """Why ``value`` is not of ``kind``, or None. Exact types: JSON true is not 1."""
    if kind == "str":
        return None if type(value) is str and value.strip() else "must be a non-empty string"
    if kind == "bool":
        return None if type(value) is bool else "must be true or false"
    if kind == "int":
        ok = type(value) is int and value >= 0
        return None if ok else "must be a non-negative integer"
    if kind == "str_or_null":
        ok = value is None or _type_problem("str", value) is None
        return None if ok else "must be a non-empty string or null"
    if kind == "strings":
        ok = type(value) is list and all(type(v) is str and v.strip() for v in value)
        return None if ok else "must be a list of non-empty strings"
    ok = type(value) is dict and all(type(v) is str and v.strip() for v in value.values())
    return None if ok else "must be an object mapping receipt field to handler arg name"


def capability_from_json(doc: Any, where: str = "capability") -> Capability:
    """Build a capability from its JSON object, checking every field's type.

    ``where`` prefixes every error (``openonce-providers.json: capabilities[0]``).
    """
    if type(doc) is not dict:
        raise CapabilityError(f"{where}: must be a JSON object")
    label = f"{where} ({doc['name']})" if type(doc.get("name")) is str else where
    for key in doc:
        if key not in _FIELDS:
            raise CapabilityError(f"{label}.{key}: unknown field; expected {', '.join(_FIELDS)}")
    for key, (kind, required) in _FIELDS.items():
        if key not in doc:
            if required:
                raise CapabilityError(f"{label}.{key}: required field is missing")
            continue
        problem = _type_problem(kind, doc[key])
        if problem:
            raise CapabilityError(f"{label}.{key}: {problem}")
    try:
        return Capability(**doc)
    except _InvalidCapability as exc:
        raise CapabilityError(f"{label}.{exc.problem}") from None


def _read_json(path: str | os.PathLike[str], what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise CapabilityError(f"{os.fspath(path)}: cannot read {what}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CapabilityError(
            f"{os.fspath(path)}: {what} is not JSON: {exc.msg} at line {exc.lineno}"
            f" column {exc.colno}"
        ) from None


def _check_document(doc: Any, where: str, keys: tuple[str, ...]) -> None:
    if type(doc) is not dict:
        raise CapabilityError(f"{where}: must be a JSON object")
    for key in doc:
        if key not in keys:
            raise CapabilityError(f"{where}: unknown top-level field {key!r}")
    if doc.get("schema_version") != SCHEMA_VERSION or type(doc["schema_version"]) is not int:
        raise CapabilityError(
            f"{where}.schema_version: must be {SCHEMA_VERSION}, got {doc.get('schema_version')!r}"
        )


def load_capabilities_file(path: str | os.PathLike[str]) -> list[Capability]:
    """Read a team's capability file: ``{"schema_version": 1, "capabilities": [...]}``.

    Names must be unique and must not shadow a built-in: a file that quietly redefined
    ``stripe`` would change what every Stripe miss means without anyone reviewing it.
    """
    where = os.fspath(path)
    doc = _read_json(path, "capability file")
    _check_document(doc, where, ("schema_version", "capabilities"))
    entries = doc.get("capabilities")
    if type(entries) is not list:
        raise CapabilityError(f"{where}.capabilities: must be a list of capability objects")
    builtin_names = {cap.name for cap in BUILTIN_CAPABILITIES}
    capabilities: list[Capability] = []
    for i, entry in enumerate(entries):
        cap = capability_from_json(entry, f"{where}: capabilities[{i}]")
        if cap.name in builtin_names:
            raise CapabilityError(
                f"{where}: capabilities[{i}].name: {cap.name!r} is a built-in capability;"
                " choose another name"
            )
        if any(other.name == cap.name for other in capabilities):
            raise CapabilityError(
                f"{where}: capabilities[{i}].name: {cap.name!r} is defined twice in this file"
            )
        capabilities.append(cap)
    return capabilities


# -- contracts ----------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``True`` is not ``1``, ``42`` is not ``"42"``."""
    return type(a) is type(b) and a == b


def check_receipt(
    capabilities: Iterable[Capability], receipt: Any, args: Mapping[str, Any]
) -> list[str]:
    """Why ``receipt`` does not satisfy every capability's receipt contract (empty: it does).

    A source field ties the receipt to the call: a PR receipt whose head is not the head
    this call asked for is evidence about some other effect.
    """
    if type(receipt) is not dict:
        return [f"receipt must be a JSON object, got {type(receipt).__name__}"]
    return [
        f"{cap.name}: {problem}"
        for cap in capabilities
        for problem in _receipt_problems(cap, receipt, args)
    ]


def _receipt_problems(
    cap: Capability, receipt: Mapping[str, Any], args: Mapping[str, Any]
) -> list[str]:
    problems = [
        f"receipt is missing required field {name!r}"
        for name in cap.required_receipt_fields
        if name not in receipt
    ]
    for receipt_field, arg in cap.required_receipt_source_fields.items():
        if receipt_field not in receipt:
            continue  # already reported as missing
        if arg not in args:
            problems.append(
                f"receipt field {receipt_field!r} must equal arg {arg!r},"
                " which the call did not pass"
            )
        elif not _same(receipt[receipt_field], args[arg]):
            problems.append(
                f"receipt field {receipt_field!r} is {receipt[receipt_field]!r}"
                f" but arg {arg!r} is {args[arg]!r}"
            )
    return problems


# The stamps OpenOnce's own handler contracts put on provider objects (Stripe metadata,
# see probers.stripe.effect_metadata) and the generic names a receipt may echo them by.
_PROVIDER_KEY_FIELDS = ("provider_key", "openonce_provider_key")
_EFFECT_ID_FIELDS = ("effect_id", "openonce_effect_id")
_PR_URL = re.compile(r"/([^/]+)/([^/]+)/pulls?/\d+")


def receipt_identity_problems(
    capabilities: Iterable[Capability],
    receipt: Mapping[str, Any],
    *,
    effect_id: str,
    provider_key: str,
    args: Any,
) -> list[str]:
    """Why ``receipt`` names some other effect than this one (empty: nothing contradicts).

    The rule a probe result is held to, applied to a receipt a person types: a field that
    identifies the provider object must agree with what this effect sent. A field the
    receipt leaves out is not a contradiction (the contract check asks for it).

    * an OpenOnce stamp, top level or in ``metadata`` (Stripe): ``provider_key`` /
      ``openonce_provider_key`` must be this effect's provider key, ``effect_id`` /
      ``openonce_effect_id`` its id;
    * ``message_id`` where a capability asks for one: the handler contract sets it to
      ``<{provider_key}@{domain}>``, so its local part must be this provider key;
    * a natural key (a PR's ``owner``, ``repo``, ``head``; ``html_url``): where a
      capability requires those arguments, the receipt's must equal the call's.
    """
    problems: list[str] = []
    caps = list(capabilities)
    stamps: list[tuple[str, Mapping[str, Any]]] = [("", receipt)]
    metadata = receipt.get("metadata")
    if isinstance(metadata, Mapping):
        stamps.append(("metadata.", metadata))
    for prefix, doc in stamps:
        for name in _PROVIDER_KEY_FIELDS:
            if name in doc and doc[name] != provider_key:
                problems.append(
                    f"{prefix}{name} is {doc[name]!r} but this effect's provider key is"
                    f" {provider_key!r}"
                )
        for name in _EFFECT_ID_FIELDS:
            if name in doc and doc[name] != effect_id:
                problems.append(f"{prefix}{name} is {doc[name]!r}, not this effect ({effect_id})")
    if "message_id" in receipt and any("message_id" in c.required_receipt_fields for c in caps):
        value = receipt["message_id"]
        local = value.strip()[1:].partition("@")[0] if isinstance(value, str) else None
        if not isinstance(value, str) or not value.strip().startswith("<") or local != provider_key:
            problems.append(
                f"message_id is {value!r} but this effect's Message-ID is"
                f" <{provider_key}@...> (set from its provider key)"
            )
    natural = {arg for c in caps for arg in c.required_args}
    if isinstance(args, Mapping):
        for name in sorted(natural & {"owner", "repo", "head"}):
            if name in receipt and name in args and not _same(receipt[name], args[name]):
                problems.append(f"{name} is {receipt[name]!r} but this call's is {args[name]!r}")
        url = receipt.get("html_url")
        if {"owner", "repo"} <= natural and isinstance(url, str):
            match = _PR_URL.search(url.partition("://")[2])
            wanted = (args.get("owner"), args.get("repo"))
            if match and (match.group(1), match.group(2)) != wanted:
                problems.append(
                    f"html_url names {match.group(1)}/{match.group(2)} but this call is"
                    f" {wanted[0]}/{wanted[1]}"
                )
    return problems


# One Stripe object id (``pi_3Nx…``, ``re_1…``, ``cs_test_a1…``): a prefix naming its
# kind, then its id. Not a client secret (``pi_…_secret_…``): that is no id.
_STRIPE_ID = re.compile(r"[a-z]+_(?:test_|live_)?[A-Za-z0-9]+")
# Refunds: ``re_``, and ``pyr_`` for some payment methods.
_REFUND_PREFIXES = ("re_", "pyr_")
# One Message-ID (RFC 5322 msg-id): angle brackets around left@right, nothing else.
_MESSAGE_ID = re.compile(r"<[^<>\s,@]+@[^<>\s,@]+>")


def is_refund_tool(tool: str) -> bool:
    """Whether ``tool`` creates Stripe refunds: the rule the Stripe prober reads by."""
    return "refund" in tool.rpartition(".")[2].lower()


def receipt_object_problems(
    tool: str, capabilities: Iterable[Capability], receipt: Mapping[str, Any]
) -> list[str]:
    """Why ``receipt`` does not name exactly one provider object of the kind ``tool``
    creates (empty: it does). No override makes such a receipt right: a PaymentIntent is
    not a refund, and one receipt naming two messages is evidence for neither.

    * ``stripe_id``: one Stripe object id; a refund tool's is a refund (``re_``), any
      other Stripe tool's is not;
    * ``message_id``: exactly one ``<left@right>``;
    * ``number`` (a pull request): one positive integer.
    """
    fields = {f for c in capabilities for f in c.required_receipt_fields}
    problems: list[str] = []
    if "stripe_id" in fields and "stripe_id" in receipt:
        value = receipt["stripe_id"]
        if not isinstance(value, str) or not _STRIPE_ID.fullmatch(value):
            problems.append(
                f"stripe_id is {value!r}: a receipt names one Stripe object id, such as"
                " pi_…, ch_… or re_…"
            )
        elif is_refund_tool(tool) and not value.startswith(_REFUND_PREFIXES):
            problems.append(
                f"stripe_id {value!r} is not a refund: {tool} creates refunds, whose ids"
                " start with re_ (or pyr_)"
            )
        elif not is_refund_tool(tool) and value.startswith(_REFUND_PREFIXES):
            problems.append(f"stripe_id {value!r} is a refund, but {tool} does not create refunds")
    if "message_id" in fields and "message_id" in receipt:
        value = receipt["message_id"]
        if isinstance(value, str) and value.count("<") + value.count(">") > 2:
            problems.append(
                f"message_id {value!r} lists more than one message: a receipt names one Message-ID"
            )
        elif isinstance(value, str) and value.strip() and not _MESSAGE_ID.fullmatch(value.strip()):
            problems.append(f"message_id {value!r} is not one Message-ID of the form <left@right>")
    number = receipt.get("number")
    if "number" in fields and "number" in receipt and (type(number) is not int or number < 1):
        problems.append(f"number is {number!r}: a pull request's number is a positive integer")
    return problems


@dataclass(frozen=True)
class ReceiptIdentity:
    """The provider object a receipt names, as the ledger can look it up among the
    committed receipts of other effects: ``field`` of the receipt equals ``value``, on
    effects whose tool matches ``tool_pattern`` and whose arguments hold ``scope``."""

    label: str  # in words: "Stripe object pi_1", "pull request acme/api#7"
    field: str
    value: str | int
    tool_pattern: str
    scope: tuple[tuple[str, Any], ...] = ()


def receipt_identities(
    capabilities: Iterable[Capability], receipt: Mapping[str, Any], args: Any
) -> list[ReceiptIdentity]:
    """The provider identities ``receipt`` claims, per capability: a Stripe object id, a
    Message-ID, a pull request (its number within the call's owner/repo). A provider
    object is the receipt of at most one effect."""
    found: list[ReceiptIdentity] = []
    args = args if isinstance(args, Mapping) else {}
    for cap in capabilities:
        fields = cap.required_receipt_fields
        stripe_id = receipt.get("stripe_id")
        if "stripe_id" in fields and isinstance(stripe_id, str) and stripe_id:
            found.append(
                ReceiptIdentity(f"Stripe object {stripe_id}", "stripe_id", stripe_id,
                                cap.tool_pattern)
            )  # fmt: skip
        message_id = receipt.get("message_id")
        if "message_id" in fields and isinstance(message_id, str) and message_id.strip():
            value = message_id.strip()
            found.append(
                ReceiptIdentity(f"Message-ID {value}", "message_id", value, cap.tool_pattern)
            )
        number = receipt.get("number")
        owner, repo = args.get("owner"), args.get("repo")
        if (
            "number" in fields
            and type(number) is int
            and {"owner", "repo"} <= set(cap.required_args)
            and isinstance(owner, str)
            and isinstance(repo, str)
        ):
            found.append(
                ReceiptIdentity(
                    f"pull request {owner}/{repo}#{number}", "number", number, cap.tool_pattern,
                    (("owner", owner), ("repo", repo)),
                )
            )  # fmt: skip
    unique: dict[tuple[Any, ...], ReceiptIdentity] = {}
    for identity in found:  # email.send matches two capabilities naming the same one
        unique.setdefault((identity.field, identity.value, identity.tool_pattern), identity)
    return list(unique.values())


def tool_prefix(pattern: str) -> str:
    """The literal start of a tool glob (``stripe.*`` -> ``stripe.``): a store narrows its
    search to tools starting with it, then the glob itself is matched."""
    return re.split(r"[*?\[]", pattern, maxsplit=1)[0]


def check_call_contract(
    capability: Capability,
    args: Mapping[str, Any],
    idempotency_fields: Iterable[str] | None,
    explicit_key: bool,
) -> list[str]:
    """Why a call may not run under ``capability`` (empty: it may).

    Natural-key contracts need their key fields in the derived key material, so a replay
    can only ever answer the same owner/repo/head. An explicit ``idempotency_key`` is
    opaque: OpenOnce cannot see whether it contains those fields, so it is refused.
    """
    problems = [
        f"{capability.name}: call is missing required arg {arg!r}"
        for arg in capability.required_args
        if arg not in args
    ]
    required = capability.required_idempotency_fields
    if not required:
        return problems
    wanted = ", ".join(required)
    if explicit_key:
        problems.append(
            f"{capability.name}: an explicit idempotency_key is opaque; derive the key with"
            f" idempotency_fields including {wanted}"
        )
        return problems
    declared = tuple(idempotency_fields) if idempotency_fields is not None else None
    if declared is None:
        problems.append(f"{capability.name}: declare idempotency_fields including {wanted}")
        return problems
    missing = [name for name in required if name not in declared]
    if missing:
        problems.append(f"{capability.name}: idempotency_fields must include {', '.join(missing)}")
    return problems


def _todo_fields(cap: Capability) -> list[str]:
    """The fields whose text (or any list item or mapping value) still says TODO."""
    found = []
    for key, value in cap.to_json().items():
        if isinstance(value, dict):
            value = list(value.values())
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(text, str) and TODO in text for text in texts):
            found.append(key)
    return found


def readiness_problems(capability: Capability) -> list[str]:
    """Why ``capability`` is not finished provider knowledge (for ``--require-reviewed``)."""
    cap = capability
    problems = [
        f"{cap.name}: {key} is still a TODO stub; review and fill it in"
        for key in _todo_fields(cap)
    ]
    if cap.can_auto_rearm_on_miss and not cap.prober:
        problems.append(
            f"{cap.name}: auto re-arms on a miss but names no prober; a miss needs a probe"
        )
    if cap.prober and not cap.required_receipt_fields:
        problems.append(
            f"{cap.name}: prober {cap.prober} has no required_receipt_fields; a HAPPENED probe"
            " could commit without external evidence"
        )
    return problems


# -- conformance --------------------------------------------------------------------------


class ConformanceScenario(StrEnum):
    """The standard situations every prober of a capability is tested in."""

    HAPPENED = "happened"  # the effect exists at the provider
    YOUNG_MISS = "young_miss"  # not found, still inside the grace (index lag) window
    MATURE_MISS = "mature_miss"  # not found, past the grace window
    AMBIGUOUS = "ambiguous"  # duplicates, unrelated objects, errors: nothing decisive


PlanStep = tuple[ConformanceScenario, ProbeOutcome, tuple[str, ...]]


def conformance_plan(capability: Capability) -> list[PlanStep]:
    """Scenario, expected outcome and required receipt fields, per scenario that applies.

    A young miss only exists where there is a lag window (grace > 0). A mature miss is
    NOT_HAPPENED only where a miss may re-arm; elsewhere (tier 3) a prober that claims
    NOT_HAPPENED would turn a lost sent copy into a duplicate send.
    """
    cap = capability
    plan: list[PlanStep] = [
        (ConformanceScenario.HAPPENED, ProbeOutcome.HAPPENED, cap.required_receipt_fields)
    ]
    if cap.default_grace_seconds > 0:
        plan.append((ConformanceScenario.YOUNG_MISS, ProbeOutcome.INCONCLUSIVE, ()))
    mature = ProbeOutcome.NOT_HAPPENED if cap.can_auto_rearm_on_miss else ProbeOutcome.INCONCLUSIVE
    plan.append((ConformanceScenario.MATURE_MISS, mature, ()))
    plan.append((ConformanceScenario.AMBIGUOUS, ProbeOutcome.INCONCLUSIVE, ()))
    return plan


def conformance_problems(
    capability: Capability,
    results: Mapping[ConformanceScenario, ProbeResult],
    source_args: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why ``results`` do not conform to the capability's plan (empty: they do)."""
    return _compare_with_plan(capability, results, source_args, reported=set())


def _compare_with_plan(
    cap: Capability,
    results: Mapping[ConformanceScenario, ProbeResult],
    source_args: Mapping[str, Any] | None,
    reported: set[str],
) -> list[str]:
    """Problems per planned scenario; ``reported`` ones already have a better message."""
    plan = conformance_plan(cap)
    planned = {scenario for scenario, _, _ in plan}
    problems = [
        f"{cap.name}: scenario {ConformanceScenario(s).value} is not in the conformance plan"
        for s in results
        if s not in planned
    ]
    for scenario, expected, _ in plan:
        result = results.get(scenario)
        if result is None and scenario.value in reported:
            continue
        if result is None:
            problems.append(f"{cap.name}: scenario {scenario.value} has no result")
            continue
        if result.outcome != expected:
            problems.append(
                f"{cap.name}: scenario {scenario.value} expected {expected.value},"
                f" got {ProbeOutcome(result.outcome).value}"
            )
            continue
        if expected is ProbeOutcome.HAPPENED:
            problems.extend(_happened_receipt_problems(cap, result.receipt, source_args))
    return problems


def _happened_receipt_problems(
    cap: Capability, receipt: Any, source_args: Mapping[str, Any] | None
) -> list[str]:
    prefix = f"{cap.name}: scenario happened"
    # Runtime reconciliation refuses a HAPPENED probe without a receipt, so must this.
    if type(receipt) is not dict or not receipt:
        return [f"{prefix} must return a non-empty receipt object"]
    if cap.required_receipt_source_fields and source_args is None:
        return [
            f"{prefix}: pass source_args so receipt fields"
            f" {', '.join(cap.required_receipt_source_fields)} can be checked against them"
        ]
    return [f"{prefix}: {p}" for p in _receipt_problems(cap, receipt, source_args or {})]


def assert_conformance(
    capability: Capability,
    results: Mapping[ConformanceScenario, ProbeResult],
    *,
    source_args: Mapping[str, Any] | None = None,
) -> None:
    """Raise ``ConformanceError`` listing every way ``results`` miss the plan.

    ``source_args`` are the fixture call's arguments; capabilities with receipt source
    fields (github_pr's head) need them to check the receipt belongs to that call.
    """
    problems = conformance_problems(capability, results, source_args)
    if problems:
        raise ConformanceError(
            f"prober does not conform to capability {capability.name!r}:\n  - "
            + "\n  - ".join(problems)
        )


def load_conformance_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read conformance evidence: ``{"schema_version": 1, "capabilities": {name: {...}}}``.

    Only the envelope is checked here; ``check_conformance_evidence`` judges each entry
    against the current capability, so one stale entry does not hide the others.
    """
    where = os.fspath(path)
    doc = _read_json(path, "conformance file")
    _check_document(doc, where, ("schema_version", "capabilities"))
    entries = doc.get("capabilities")
    if type(entries) is not dict:
        raise CapabilityError(f"{where}.capabilities: must be an object keyed by capability name")
    for name, entry in entries.items():
        if type(entry) is not dict:
            raise CapabilityError(f"{where}.capabilities.{name}: must be a JSON object")
    result: dict[str, Any] = doc
    return result


_EVIDENCE_KEYS = ("capability_fingerprint", "source_args", "scenarios")
_SCENARIO_KEYS = ("outcome", "receipt", "detail")


def _is_filled(value: Any) -> bool:
    """False for null and for text still holding TODO: a template is not evidence."""
    if value is None:
        return False
    return not (isinstance(value, str) and (TODO in value or not value.strip()))


def source_arg_names(capability: Capability) -> tuple[str, ...]:
    """The fixture call's arguments evidence must record: the full provider key."""
    names = [
        *capability.required_args,
        *capability.required_idempotency_fields,
        *capability.required_receipt_source_fields.values(),
    ]
    return tuple(dict.fromkeys(names))


def check_conformance_evidence(
    capability: Capability, evidence_doc: Mapping[str, Any]
) -> list[str]:
    """Why the evidence document does not prove ``capability``'s conformance (empty: it does).

    The evidence must be for the current fingerprint, cover every planned scenario with
    the planned outcome, carry a fixture detail, and its HAPPENED receipt must hold the
    required fields with source fields equal to ``source_args``.
    """
    cap = capability
    entry = (evidence_doc.get("capabilities") or {}).get(cap.name)
    if entry is None:
        return [
            f"{cap.name}: no conformance evidence; generate a template with"
            " --conformance-file-template and fill it in"
        ]
    if type(entry) is not dict:
        return [f"{cap.name}: evidence must be a JSON object"]
    problems = [f"{cap.name}: unknown field {key!r}" for key in entry if key not in _EVIDENCE_KEYS]
    found = entry.get("capability_fingerprint")
    if found != cap.fingerprint():
        problems.append(
            f"{cap.name}: evidence is for fingerprint {found!r}, the capability is now"
            f" {cap.fingerprint()}; re-run the scenarios and regenerate the evidence"
        )
    source_args = entry.get("source_args")
    if type(source_args) is not dict:
        problems.append(f"{cap.name}: source_args must be an object of the fixture call's args")
        source_args = {}
    for name in source_arg_names(cap):
        if not _is_filled(source_args.get(name)):
            problems.append(f"{cap.name}: source_args.{name} is not filled in")
    scenarios = entry.get("scenarios")
    if type(scenarios) is not dict:
        return [*problems, f"{cap.name}: scenarios must be an object keyed by scenario name"]
    results, entry_problems = _results_from_evidence(cap, scenarios)
    problems.extend(entry_problems)
    # Scenarios present but not filled in were reported above with the reason why.
    problems.extend(_compare_with_plan(cap, results, source_args, reported=set(scenarios)))
    return problems


def _results_from_evidence(
    cap: Capability, scenarios: Mapping[str, Any]
) -> tuple[dict[ConformanceScenario, ProbeResult], list[str]]:
    """Turn filled-in scenario entries into probe results; report the ones that are not."""
    results: dict[ConformanceScenario, ProbeResult] = {}
    problems: list[str] = []
    valid = {s.value for s in ConformanceScenario}
    planned = ", ".join(s.value for s, _, _ in conformance_plan(cap))
    outcomes = {o.value for o in ProbeOutcome}
    for name, item in scenarios.items():
        where = f"{cap.name}: scenarios.{name}"
        if name not in valid:
            problems.append(f"{where}: unknown scenario; the plan has {planned}")
            continue
        if type(item) is not dict:
            problems.append(f"{where}: must be an object with outcome, receipt and detail")
            continue
        problems.extend(f"{where}: unknown field {k!r}" for k in item if k not in _SCENARIO_KEYS)
        outcome, detail = item.get("outcome"), item.get("detail")
        if not _is_filled(detail) or type(detail) is not str:
            problems.append(f"{where}.detail: describe the fixture (still TODO or missing)")
        if outcome is None:
            problems.append(f"{where}.outcome: null; record the outcome the prober returned")
            continue
        if outcome not in outcomes:
            problems.append(
                f"{where}.outcome: {outcome!r} is not an observed outcome;"
                f" record {', '.join(sorted(outcomes))}"
            )
            continue
        receipt = item.get("receipt")
        if type(receipt) is dict and not all(_is_filled(v) for v in receipt.values()):
            problems.append(f"{where}.receipt: fill in the receipt the prober returned")
        results[ConformanceScenario(name)] = ProbeResult(
            ProbeOutcome(outcome), receipt=receipt, detail=str(detail or "")
        )
    return results, problems


def conformance_template(capabilities: Iterable[Capability]) -> dict[str, Any]:
    """A fill-in evidence document for ``capabilities``: a scaffold that fails until done.

    Fingerprints and scenario names are copied from the current contract so nobody types
    them by hand; outcomes and receipts are null and details say TODO, so an unfilled
    template can never pass ``--require-conformance``.
    """
    entries: dict[str, Any] = {}
    for cap in capabilities:
        scenarios: dict[str, Any] = {}
        for scenario, expected, receipt_fields in conformance_plan(cap):
            item: dict[str, Any] = {"outcome": None}
            if scenario is ConformanceScenario.HAPPENED:
                item["receipt"] = None
            hint = f"expect {expected.value}"
            if receipt_fields:
                hint += " with receipt fields " + ", ".join(receipt_fields)
            item["detail"] = f"{TODO}: describe the fixture for {scenario.value} ({hint})"
            scenarios[scenario.value] = item
        entries[cap.name] = {
            "capability_fingerprint": cap.fingerprint(),
            "source_args": {name: TODO for name in source_arg_names(cap)},
            "scenarios": scenarios,
        }
    return {"schema_version": SCHEMA_VERSION, "capabilities": entries}


# -- stubs for unknown tools --------------------------------------------------------------


def suggest_capability(tool: str) -> dict[str, Any]:
    """A conservative capability stub for an unknown tool, in the capability-file schema.

    It loads, but it is review work, not knowledge: tier 3, a miss never re-arms, and
    every judgement a person must make says TODO so ``--require-reviewed`` fails on it.
    """
    name = re.sub(r"[^A-Za-z0-9_]+", "_", tool).strip("_") or "custom_tool"
    return {
        "name": name,
        "tool_pattern": re.sub(r"([*?\[])", r"[\1]", tool),
        "tier": TIER_3_NON_AUTHORITATIVE,
        "key_strategy": f"{TODO}: how a call's key reaches the provider",
        "probe_basis": f"{TODO}: which read proves the effect happened",
        "miss_semantics": f"{TODO}: until reviewed, a miss is not evidence",
        "can_auto_rearm_on_miss": False,
        "default_grace_seconds": 0,
        "prober": None,
        "handler_requirements": [f"{TODO}: what the handler must pass or stamp"],
        "risk": f"{TODO}: what a wrong answer costs",
        "required_receipt_fields": [],
    }
