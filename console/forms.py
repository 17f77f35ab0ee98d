"""Forms: the effects filter (it lives in the URL) and the decisions people make.

Every decision form carries the effect's ``fence`` as the page showed it: the core
refuses a decision made on a stale page (``expected_fence``) instead of applying it to
an effect that has moved on.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms

from openonce_core.states import EffectState

from .selectors import Cursor, EffectFilter

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d`` -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(text)
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


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


class EffectFilterForm(forms.Form):
    """The effects list filter. Bound to ``request.GET``: the filter is the URL."""

    state = forms.ChoiceField(
        required=False, choices=[("", "any state"), *((s.value, s.value) for s in EffectState)]
    )
    tool = forms.CharField(required=False, max_length=200)
    scope = forms.CharField(required=False, max_length=200, label="Scope / run id")
    key = forms.CharField(required=False, max_length=500, label="Idempotency key")
    created_from = forms.DateTimeField(
        required=False,
        label="Created from (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    created_to = forms.DateTimeField(
        required=False,
        label="Created before (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    stuck = DurationField(
        required=False,
        label="Stuck for longer than",
        help_text="e.g. 15m, 2h, 1d: not finished and unchanged that long",
    )
    after = forms.CharField(required=False, widget=forms.HiddenInput, max_length=200)

    def clean_after(self) -> Cursor | None:
        text = self.cleaned_data.get("after") or ""
        if not text:
            return None
        try:
            return Cursor.decode(text)
        except ValueError:
            raise forms.ValidationError("That page link is malformed; start again.") from None

    def to_filter(self) -> EffectFilter:
        data = self.cleaned_data
        return EffectFilter(
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
            if name != "after" and self.data.get(name)
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


class ResolveHappenedForm(DecisionForm):
    receipt = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        max_length=20000,
        help_text='The provider\'s evidence as a JSON object, e.g. {"stripe_id": "ch_123"}.'
        " It is checked against the provider's receipt contract before anything is committed.",
    )
    reason = forms.CharField(required=False, max_length=2000)
    field_order = ["receipt", "reason", "confirm"]

    def clean_receipt(self) -> dict[str, Any]:
        try:
            receipt = json.loads(self.cleaned_data["receipt"])
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"The receipt is not valid JSON: {exc}") from None
        except RecursionError:
            raise forms.ValidationError("The receipt is nested too deeply.") from None
        if type(receipt) is not dict or not receipt:
            raise forms.ValidationError("The receipt must be a non-empty JSON object.")
        return receipt


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
