"""What a person needs to decide, in words: what the state means and what happens next,
amounts with their currency, who asked, what the probe said, and a receipt template per
provider capability pre-filled with what the effect already tells.

Pure functions of an effect's fields (and its first journal line): no queries here, so
the queue can build the same context for a hundred rows from two queries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from openonce_core._providers import Capability
from openonce_core._states import EffectState

S = EffectState

STATE_LABELS: dict[str, str] = {
    S.PLANNED: "planned",
    S.REQUIRES_APPROVAL: "awaiting approval",
    S.APPROVED: "approved, not run yet",
    S.DENIED: "denied",
    S.STARTED: "running",
    S.RECEIPT_RECORDED: "receipt being checked",
    S.COMMITTED: "committed",
    S.FAILED: "failed",
    S.UNKNOWN: "outcome unknown",
    S.HUMAN_REVIEW: "in human review",
    S.CANCELLED: "cancelled",
    S.RELEASED: "released",
}

# What the state means, and what happens next (and who makes it happen).
STATE_MEANINGS: dict[str, tuple[str, str]] = {
    S.PLANNED: (
        "Eligible to run; nothing has been sent for this attempt.",
        "It runs when the agent makes the same call again.",
    ),
    S.REQUIRES_APPROVAL: (
        "Waiting for approval. Nothing has been sent to the provider.",
        "Once approved, nothing runs yet: it runs when the agent calls again.",
    ),
    S.APPROVED: (
        "Approved: nothing has run yet.",
        "It runs when the agent makes the same call again. Until then the approval can be"
        " withdrawn (deny) or the effect cancelled.",
    ),
    S.DENIED: (
        "Denied by a person. It never runs.",
        "Every call with these arguments gets the denial.",
    ),
    S.STARTED: (
        "Running: the handler may be talking to the provider right now.",
        "It records a receipt or a failure; if its lease runs out first it becomes"
        " UNKNOWN, never a retry.",
    ),
    S.RECEIPT_RECORDED: (
        "The handler returned; its receipt is being checked against the provider contract.",
        "It commits, or goes to human review if the receipt breaks the contract.",
    ),
    S.COMMITTED: (
        "Done: the provider's receipt is recorded.",
        "Duplicates replay this receipt instead of running again.",
    ),
    S.FAILED: (
        "The provider said no (a business error).",
        "Duplicates replay the same failure; nothing is retried.",
    ),
    S.UNKNOWN: (
        "The call may have happened: its outcome was never recorded.",
        "The reconciler probes the provider after the grace window. Nothing is retried"
        " blindly; a person can resolve it with a receipt or a reason.",
    ),
    S.HUMAN_REVIEW: (
        "The reconciler could not decide what happened.",
        "A person resolves it: with the provider's receipt if it happened, with a reason"
        " if it did not (that re-arms it for the agent's next call).",
    ),
    S.CANCELLED: (
        "Cancelled by a person before it ran.",
        "Every call with these arguments gets the cancellation.",
    ),
    S.RELEASED: (
        "An unstarted claim given up.",
        "Its idempotency key can be claimed anew by the next call.",
    ),
}

# Currencies whose minor unit is not a hundredth (ISO 4217 exponents, as Stripe uses).
_ZERO_DECIMAL = ("BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF")
_ZERO_DECIMAL += ("UGX", "VND", "VUV", "XAF", "XOF", "XPF")
_THREE_DECIMAL = ("BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND")
_EXPONENT = {**dict.fromkeys(_ZERO_DECIMAL, 0), **dict.fromkeys(_THREE_DECIMAL, 3)}
_AMOUNT_NAMES = ("amount", "amount_cents", "amount_minor", "total", "total_cents", "price")
_CURRENCY_NAMES = ("currency", "currency_code")
# Who or what the effect acts on: the customer, and the object or address it touches.
_CUSTOMER_NAMES = (
    "customer",
    "customer_id",
    "customer_email",
    "account",
    "to",
    "recipient",
    "email",
    "charge",
    "charge_id",
    "payment_intent",
    "order",
    "order_id",
)


@dataclass(frozen=True)
class Fact:
    label: str
    value: str
    copy: bool = False  # an id worth a copy button


def amounts(args: Any) -> list[Fact]:
    """Integer amounts in minor units, with the call's currency: ``25.00 USD``. Without a
    currency argument the page says so instead of guessing one."""
    if not isinstance(args, dict):
        return []
    currency = next(
        (args[n] for n in _CURRENCY_NAMES if isinstance(args.get(n), str) and args[n]), None
    )
    found = []
    for name, value in args.items():
        if type(value) is not int or not (name in _AMOUNT_NAMES or name.endswith("_cents")):
            continue
        if currency is not None and len(currency) == 3 and currency.isalpha():
            code = currency.upper()
            exponent = _EXPONENT.get(code, 2)
            units, minor = divmod(abs(value), 10**exponent) if exponent else (abs(value), 0)
            sign = "-" if value < 0 else ""
            text = f"{sign}{units:,}" + (f".{minor:0{exponent}d}" if exponent else "")
            found.append(Fact("Amount", f"{text} {code}"))
        else:
            found.append(Fact("Amount", f"{value:,} minor units (no currency argument)"))
    return found


def customer(args: Any) -> list[Fact]:
    if not isinstance(args, dict):
        return []
    return [
        Fact(name.replace("_", " ").capitalize(), str(args[name]), copy=True)
        for name in _CUSTOMER_NAMES
        if isinstance(args.get(name), str | int) and not isinstance(args.get(name), bool)
    ]


@dataclass(frozen=True)
class Requester:
    agent: str  # the OpenOnce owner that made the claim: "host:pid" unless named
    host: str
    pid: str
    run: str  # the scope (run id), or "" for an explicit key without one
    # Who the agent asked for (``oo.requested_by``: a user, an MCP client and session).
    requested_by: str = ""

    def __str__(self) -> str:
        where = f"{self.host} pid {self.pid}" if self.pid else self.agent
        if self.requested_by:
            where = f"{self.requested_by} via {where}"
        return f"{where}, run {self.run}" if self.run else where


def requester(
    first_actor: str | None, scope: str | None, requested_by: str = ""
) -> Requester | None:
    """From the journal's first line: ``agent:<host:pid:token>`` (the core's owner name),
    ``agent:<host:pid>`` (older ledgers) or ``agent:<a name the agent chose>``, and who the
    agent asked for, if its evidence says (``requested_by``)."""
    if not first_actor or not first_actor.startswith("agent:"):
        return None
    owner = first_actor.removeprefix("agent:")
    parts = owner.rsplit(":", 2)
    if len(parts) == 3 and not parts[1].isdigit():
        parts = owner.rsplit(":", 1)
    host, pid = (parts[0], parts[1]) if len(parts) > 1 else (owner, "")
    if not (host and pid.isdigit()):
        return Requester(owner, owner, "", scope or "", requested_by)
    # The token after the pid only tells processes with one pid apart: no reader needs it.
    return Requester(f"{host}:{pid}", host, pid, scope or "", requested_by)


@dataclass(frozen=True)
class Verdict:
    outcome: str  # happened / not_happened / inconclusive
    words: str
    at: float | None
    claimed_receipt: Any = None


_OUTCOME_WORDS = {
    "happened": "the probe found it at the provider",
    "not_happened": "the probe found no trace of it",
    "inconclusive": "the probe could not tell",
}


def probe_verdict(verification_evidence: Any) -> Verdict | None:
    """The latest probe observation, in words, with its time (epoch) and what it saw."""
    if not isinstance(verification_evidence, dict):
        return None
    observations = verification_evidence.get("observations")
    if not isinstance(observations, list) or not observations:
        return None
    last = observations[-1]
    if not isinstance(last, dict):
        return None
    outcome = str(last.get("outcome", "inconclusive"))
    words = _OUTCOME_WORDS.get(outcome, outcome)
    detail = last.get("detail")
    if detail:
        words = f"{words}: {detail}"
    at = last.get("at") if isinstance(last.get("at"), int | float) else None
    observed = last.get("observed")
    claimed = observed.get("receipt") if isinstance(observed, dict) else None
    return Verdict(outcome, words, at, claimed or last.get("receipt"))


# -- receipts -----------------------------------------------------------------------------


DOMAIN_PLACEHOLDER = "your-sending-domain"  # refused in a receipt: the person must fill it


@dataclass(frozen=True)
class ReceiptTemplate:
    capability: str
    text: str  # the JSON a person starts from
    explain: str


def receipt_template(
    capabilities: list[Capability],
    *,
    provider_key: str,
    args: Any,
    mail_domain: str | None = None,
) -> ReceiptTemplate:
    """One receipt for the capabilities governing the effect, pre-filled with what the
    effect already knows (its Message-ID, provider key, the PR's head); the fields only
    the provider can tell are left empty for the person to fill, and are refused empty."""
    args = args if isinstance(args, dict) else {}
    doc: dict[str, Any] = {}
    notes = []
    names = [c.name for c in capabilities]
    for cap in capabilities:
        for field in cap.required_receipt_fields:
            doc.setdefault(field, "")
        for receipt_field, arg in cap.required_receipt_source_fields.items():
            if arg in args:
                doc[receipt_field] = args[arg]
    if "message_id" in doc:
        domain = mail_domain or DOMAIN_PLACEHOLDER
        doc["message_id"] = f"<{provider_key}@{domain}>"
        notes.append(
            "The Message-ID is this effect's own (set from its provider key)"
            + ("" if mail_domain else "; put your sending domain after the @")
            + "; look it up in the sent store."
        )
    if "stripe_id" in doc:
        notes.append(
            "Find the Stripe object whose metadata openonce_provider_key is this effect's"
            " provider key and fill in its id (pi_…, ch_…, re_…)."
        )
    if {"number", "head"} <= set(doc):
        for name in ("owner", "repo"):
            if name in args:
                doc[name] = args[name]
        doc["number"] = None
        notes.append("Fill in the number of the pull request opened from this head.")
    if not capabilities:
        notes.append(
            "No provider capability is known for this tool, so no receipt contract applies:"
            " record what the provider answered, as a JSON object."
        )
        doc = {"provider_reference": ""}
    return ReceiptTemplate(
        ", ".join(names) or "none", json.dumps(doc, indent=2, ensure_ascii=False), " ".join(notes)
    )


def empty_fields(receipt: dict[str, Any]) -> list[str]:
    """Fields left as the template had them (an empty string or null): a receipt records
    what the provider answered, and an empty id answers nothing."""
    return sorted(k for k, v in receipt.items() if v is None or v == "")


# -- the journal as a timeline -------------------------------------------------------------


@dataclass(frozen=True)
class TimelineLine:
    seq: int
    at: float
    actor: str
    from_state: str | None
    to_state: str
    reason: str
    evidence: Any
    overrides: list[str]  # what a person overrode on this line, in words


def timeline(entries: list[Any]) -> list[TimelineLine]:
    """Journal lines as the detail page shows them, each line's evidence parsed once and
    its overrides (a re-arm against the provider matrix, a receipt's identity) named."""
    lines = []
    for entry in entries:
        evidence = entry.evidence
        overrides: list[str] = []
        if isinstance(evidence, dict):
            if evidence.get("override"):
                overrides.append(str(evidence["override"]))
            found = evidence.get("identity_override")
            if isinstance(found, list):
                overrides.extend(str(p) for p in found)
        lines.append(
            TimelineLine(
                entry.seq,
                entry.at,
                entry.actor,
                entry.from_state,
                entry.to_state,
                entry.reason,
                evidence,
                overrides,
            )
        )
    return lines
