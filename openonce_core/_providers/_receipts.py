"""Receipt checks: whether a receipt satisfies a capability's receipt contract and names
the call's own provider object."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._capability import Capability


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
