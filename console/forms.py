"""Forms: the effects filter (it lives in the URL) and the decisions people make.

Every decision form carries the effect's ``fence`` as the page showed it: the core
refuses a decision made on a stale page (``expected_fence``) instead of applying it to
an effect that has moved on.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django import forms

from ledger.clients import get_openonce
from openonce_core._providers import Capability, check_receipt, receipt_object_problems
from openonce_core._states import EffectState

from . import search
from .context import DOMAIN_PLACEHOLDER, empty_fields
from .selectors import AUDIT_ACTIONS, AuditFilter, Cursor, EffectFilter

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds (at most ten years)."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(text)
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    if not math.isfinite(seconds) or seconds > 10 * 365 * 86400:
        raise ValueError(text)
    return seconds


class DurationField(forms.CharField):
    default_error_messages = {"invalid": "Write a duration such as 90s, 15m, 2h or 1d."}

    def to_python(self, value: Any) -> float | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        try:
            if len(text) > 20:
                raise ValueError(text)
            return parse_duration(text)
        except ValueError:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None


class CursorField(forms.CharField):
    widget = forms.HiddenInput

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, max_length=200, **kwargs)

    def clean(self, value: Any) -> Cursor | None:  # type: ignore[override]
        text = super().clean(value)
        if not text:
            return None
        try:
            return Cursor.decode(text)
        except ValueError:
            raise forms.ValidationError("That page link is malformed; start again.") from None


class EffectFilterForm(forms.Form):
    """The effects list filter. Bound to ``request.GET``: the filter is the URL."""

    q = forms.CharField(
        required=False,
        max_length=search.MAX_QUERY,
        label="Search",
        help_text="An effect id or its start, a key or run id prefix, a tool glob such as"
        " stripe.*, or argument values such as charge=ch_1",
    )
    state = forms.ChoiceField(
        required=False, choices=[("", "any state"), *((s.value, s.value) for s in EffectState)]
    )
    tool = forms.CharField(required=False, max_length=200, help_text="a name or a glob: stripe.*")
    scope = forms.CharField(required=False, max_length=200, label="Scope / run id")
    key = forms.CharField(required=False, max_length=500, label="Idempotency key")
    created_from = forms.DateTimeField(
        required=False,
        label="Created from (UTC)",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    created_to = forms.DateTimeField(
        required=False,
        label="Created before (UTC)",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    stuck = DurationField(
        required=False,
        label="Stuck for longer than",
        help_text="e.g. 15m, 2h, 1d: not finished and unchanged that long",
    )
    after = CursorField()
    before = CursorField()

    def clean_q(self) -> search.Search | None:
        try:
            return search.parse(self.cleaned_data.get("q") or "")
        except search.SearchError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start >= end:
            self.add_error("created_to", "Must be later than “Created from”.")
        if data.get("after") and data.get("before"):
            raise forms.ValidationError("That page link is malformed; start again.")
        return data

    def to_filter(self) -> EffectFilter:
        data = self.cleaned_data
        return EffectFilter(
            search=data["q"],
            state=data["state"],
            tool=data["tool"],
            scope=data["scope"],
            key=data["key"],
            created_from=data["created_from"].timestamp() if data["created_from"] else None,
            created_to=data["created_to"].timestamp() if data["created_to"] else None,
            stuck_for=data["stuck"],
        )

    def params(self) -> list[tuple[str, str]]:
        """The filter's non-empty fields as given (no page cursor), to carry it along."""
        return [
            (name, str(self.data[name]))
            for name in EffectFilterForm.base_fields
            if name not in ("after", "before") and self.data.get(name)
        ]


# -- decisions ----------------------------------------------------------------------------

_REASON_REQUIRED = {"required": "A reason is required: it is the evidence the journal keeps."}


class DecisionForm(forms.Form):
    fence = forms.IntegerField(widget=forms.HiddenInput, min_value=0)
    confirm = forms.BooleanField(
        label="I have checked this effect and confirm the decision",
        error_messages={"required": "Tick the box to confirm the decision."},
    )


class ApproveForm(DecisionForm):
    reason = forms.CharField(required=False, max_length=2000)
    field_order = ["reason", "confirm"]


class ReasonForm(DecisionForm):
    """Deny and cancel: the reason is the journal's evidence."""

    reason = forms.CharField(max_length=2000, error_messages=_REASON_REQUIRED)
    field_order = ["reason", "confirm"]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_receipt(text: str) -> dict[str, Any]:
    """A receipt as typed: a non-empty JSON object of strict JSON (no NaN, no 5,000-digit
    integers); ``ValidationError`` saying what is wrong otherwise."""
    try:
        receipt = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(f"The receipt is not valid JSON: {exc}") from None
    except RecursionError:
        raise forms.ValidationError("The receipt is nested too deeply.") from None
    except ValueError as exc:  # NaN/Infinity, or an integer too long to convert
        raise forms.ValidationError(f"The receipt is not strict JSON: {exc}") from None
    if type(receipt) is not dict or not receipt:
        raise forms.ValidationError("The receipt must be a non-empty JSON object.")
    return receipt


class ResolveHappenedForm(DecisionForm):
    receipt = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "receipt"}),
        max_length=20000,
        help_text="The provider's evidence as a JSON object, started from the template for"
        " this provider. It is checked against the provider's receipt contract and this"
        " effect's identity before anything is committed.",
    )
    reason = forms.CharField(required=False, max_length=2000)
    override_identity = forms.BooleanField(
        required=False,
        label="Override: commit although the receipt names another identity",
        help_text="Also commits a receipt the provider did not confirm. Needs the override"
        " permission and a reason; both are journaled.",
    )
    field_order = ["receipt", "reason", "override_identity", "confirm"]

    def __init__(
        self,
        *args: Any,
        capabilities: list[Capability] | None = None,
        effect: Any = None,
        can_override: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.capabilities = capabilities or []
        self.effect = effect
        self.identity_problems: list[str] = []
        if not can_override:
            del self.fields["override_identity"]

    def clean_receipt(self) -> dict[str, Any]:
        receipt = parse_receipt(self.cleaned_data["receipt"])
        empty = empty_fields(receipt)
        if empty:
            raise forms.ValidationError(
                "Fill in or remove the empty field" + ("s " if len(empty) > 1 else " ")
                + ", ".join(empty) + ": a receipt records what the provider answered."
            )  # fmt: skip
        if DOMAIN_PLACEHOLDER in json.dumps(receipt):
            raise forms.ValidationError(
                f"Replace {DOMAIN_PLACEHOLDER} with the domain the message was sent from."
            )
        if self.effect is not None:
            args = self.effect.args if isinstance(self.effect.args, dict) else {}
            # One capability's wording per problem: email.send matches two capabilities
            # with the same contract, and each problem is shown once.
            problems = []
            for problem in check_receipt(self.capabilities, receipt, args):
                text = problem.split(": ", 1)[-1]
                if text not in problems:
                    problems.append(text)
            if problems:
                raise forms.ValidationError(
                    "The receipt breaks the provider contract: " + "; ".join(problems) + "."
                )
            # The wrong kind of object, or two objects in one receipt: no override helps.
            problems = receipt_object_problems(self.effect.tool, self.capabilities, receipt)
            if problems:
                raise forms.ValidationError("; ".join(problems) + ". Nothing was committed.")
        return receipt

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        override = bool(data.get("override_identity"))
        if override and not (data.get("reason") or "").strip():
            # An override is for a receipt the ledger or the provider cannot tie to this
            # effect; which one is known only when it is checked, so it always needs why.
            self.add_error("reason", "An override needs a reason: the journal keeps it.")
        receipt = data.get("receipt")
        if self.effect is None:
            return data
        oo = get_openonce()
        # Also a receipt that did not parse: the page would show its text again.
        typed = receipt if receipt is not None else self.data.get("receipt")
        for name, value in (("receipt", typed), ("reason", data.get("reason"))):
            if value and oo.holds_secret(self.effect.id, value):
                self.add_error(
                    name,
                    f"The {name} holds the value of one of this effect's secret fields in"
                    " clear; remove it (the ledger keeps secret fields only as digests)."
                    " Nothing was committed.",
                )
                # The form comes back without it: a secret typed once is not shown again.
                self.data = self.data.copy()
                self.data[name] = ""
        if receipt is None or self.errors:
            return data
        # The core's rule, with the ledger's knowledge: another effect may already hold
        # the object this receipt names (committed since the page was drawn, too).
        self.identity_problems = oo.receipt_identity_problems(oo.get(self.effect.id), receipt)
        if self.identity_problems and not override:
            self.add_error(
                "receipt",
                "This receipt names another effect: " + "; ".join(self.identity_problems)
                + ". Nothing was committed."
                + (" Tick the override and give a reason if you are sure."
                   if "override_identity" in self.fields else ""),
            )  # fmt: skip
        return data


class ResolveNotHappenedForm(DecisionForm):
    reason = forms.CharField(
        max_length=2000,
        error_messages=_REASON_REQUIRED,
        help_text="How you know it did not happen: there is no receipt, so this is the evidence.",
    )
    override = forms.BooleanField(
        required=False,
        label="Override: re-arm although the provider says a miss is not evidence",
        help_text="Needs the override permission; the override is written to the journal.",
    )
    field_order = ["reason", "override", "confirm"]

    def __init__(self, *args: Any, can_override: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not can_override:
            del self.fields["override"]


# -- bulk ---------------------------------------------------------------------------------

BULK_ACTIONS = {"approve": "Approve", "deny": "Deny", "cancel": "Cancel"}
BULK_DONE = {"approve": "approved", "deny": "denied", "cancel": "cancelled"}


class BulkPreviewForm(EffectFilterForm):
    action = forms.ChoiceField(choices=list(BULK_ACTIONS.items()))


class BulkApplyForm(forms.Form):
    token = forms.CharField(widget=forms.HiddenInput, max_length=100_000)
    reason = forms.CharField(required=False, max_length=2000)
    confirm = forms.BooleanField(
        label="Apply to exactly the effects listed above",
        error_messages={"required": "Tick the box to confirm the bulk action."},
    )


# -- the audit log ------------------------------------------------------------------------


class SeqField(forms.IntegerField):
    widget = forms.HiddenInput

    def __init__(self) -> None:
        super().__init__(required=False, min_value=1, max_value=2**63 - 1)


class AuditFilterForm(forms.Form):
    """The audit log's filters, bound to ``request.GET``."""

    actor = forms.CharField(required=False, max_length=150, help_text="a username")
    action = forms.ChoiceField(
        required=False,
        choices=[("", "any decision"), *((k, label) for k, (label, _) in AUDIT_ACTIONS.items())],
    )
    tool = forms.CharField(required=False, max_length=200, help_text="a name or a glob")
    since = forms.DateTimeField(
        required=False,
        label="From (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
    )
    until = forms.DateTimeField(
        required=False,
        label="Before (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
    )
    before = SeqField()
    after = SeqField()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("before") and data.get("after"):
            raise forms.ValidationError("That page link is malformed; start again.")
        return data

    def to_filter(self) -> AuditFilter:
        data = self.cleaned_data
        return AuditFilter(
            actor=data["actor"],
            action=data["action"],
            tool=data["tool"],
            since=data["since"].timestamp() if data["since"] else None,
            until=data["until"].timestamp() if data["until"] else None,
        )

    def params(self) -> list[tuple[str, str]]:
        return [
            (name, str(self.data[name]))
            for name in AuditFilterForm.base_fields
            if name not in ("before", "after") and self.data.get(name)
        ]
