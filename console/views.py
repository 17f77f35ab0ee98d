"""Console views: parse the request, call a selector or the core, render.

One view serves a page and its fragment (``page.html#fragment`` for htmx). Every view
checks its permission; decisions are POST-only, CSRF-checked, pinned to the fence the
page showed, and refused inline when the core says no. An effect id that names no effect
is a 404 for everyone allowed to look, unless the retention archived that effect: its page,
its poll and its journal's exports then answer 410 Gone, saying where it went.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn, cast

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, ValidationError
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget
from django_htmx.middleware import HtmxDetails

from ledger.logsafe import one_line
from ledger.models import Effect, Tombstone
from notifications.selectors import deliveries_for

from . import actions, exports, lockouts, selectors
from . import context as decision
from .access import deny, permission_required, require
from .forms import (
    BULK_ACTIONS,
    BULK_DONE,
    AuditFilterForm,
    BulkApplyForm,
    BulkPreviewForm,
    EffectFilterForm,
)
from .roles import (
    APPROVE,
    CANCEL,
    EXPORT_AUDIT,
    OVERRIDE_IDENTITY,
    OVERRIDE_REARM,
    RESOLVE,
    VIEW,
)
from .search import Search


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


_FENCE = re.compile(r"[0-9]{1,19}")

access_log = logging.getLogger("openonce.request")


def explains_bad_input[V: Callable[..., Any]](view: V) -> V:
    """A request this view cannot read (``BadRequest``: a garbled page link, an unknown
    ``last``, a run without its scope) is a 400 page saying what is wrong, logged as one
    line. Django's own answer names nothing (its 400 page gets no message) and logs a
    traceback for each one."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return view(request, *args, **kwargs)
        except BadRequest as exc:
            access_log.warning(
                "bad request: path=%s reason=%s", one_line(request.path), one_line(str(exc))
            )
            template = "400.html#refusal" if _from_htmx(request) else "400.html"
            response = render(request, template, {"exception": str(exc)}, status=400)
            patch_vary_headers(response, ("HX-Request",))
            response._has_been_logged = True  # type: ignore[attr-defined]  # logged above
            return response

    return cast(V, wrapper)


def _from_htmx(request: HttpRequest) -> bool:
    """An htmx request that swaps the answer into a page (not a history restore)."""
    htmx = getattr(request, "htmx", None)  # django_htmx's middleware sets it
    return bool(htmx) and not htmx.history_restore_request


class _Archived(Exception):
    """The effect asked for is no longer in the ledger: the retention archived it."""

    def __init__(self, tombstone: Tombstone) -> None:
        super().__init__(tombstone.effect_id)
        self.tombstone = tombstone


def answers_gone[V: Callable[..., Any]](view: V) -> V:
    """An effect the retention archived is a 410 page saying when it went, how it ended and
    which archive file holds it, instead of the 404 of an id that never was: the links to
    it (a notification, a ticket, an audit note) outlive it. Only for people who may read
    the ledger: put inside ``permission_required``."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            return view(request, *args, **kwargs)
        except _Archived as gone:
            return _gone(request, gone.tombstone)

    return cast(V, wrapper)


def _gone(request: HttpRequest, tombstone: Tombstone) -> HttpResponse:
    """The archived effect's page; to htmx (the open page's poll) its fragment, with
    ``HX-Refresh``: htmx swaps no 410 (base.html's htmx-config), so the browser loads the
    page again and shows this one whole, instead of asking every 5 s for nothing."""
    context = {
        "tombstone": tombstone,
        "state_label": decision.STATE_LABELS.get(tombstone.state, tombstone.state),
    }
    if _from_htmx(request):
        response = render(request, "console/archived.html#archived", context, status=410)
        response["HX-Refresh"] = "true"
    else:
        response = render(request, "console/archived.html", context, status=410)
    patch_vary_headers(response, ("HX-Request",))
    return response


QUEUE_LABELS = {
    "requires_approval": "Awaiting approval",
    "human_review": "In human review",
    "unknown": "UNKNOWN past grace",
    "approved": "Approved, waiting for the agent",
}


# -- sign-in ------------------------------------------------------------------------------

_login_view = auth_views.LoginView.as_view(
    template_name="registration/login.html", redirect_authenticated_user=True
)


def sign_in(request: HtmxHttpRequest) -> HttpResponse:
    if request.htmx:
        # A poll or a form sent after the session ended was redirected here: load the
        # sign-in page as a whole page instead of inside a fragment.
        return HttpResponseClientRedirect(request.get_full_path())
    return _login_view(request)


# -- the human queue ----------------------------------------------------------------------


@require_GET
@login_required
@permission_required(VIEW)
@explains_bad_input
def queue(request: HtmxHttpRequest) -> HttpResponse:
    kind = request.GET.get("kind", "")
    if kind not in (*selectors.QUEUE_KINDS, *selectors.WAITING_KINDS):
        kind = ""
    # Rows that changed after the page was first loaded are marked new; the poll carries
    # that moment along in its URL.
    since = _float_param(request, "since")
    at = selectors.ledger_now()  # the clock grace and backoff are judged on
    found = selectors.human_queue(kind or None, at=at, since=since)
    kinds = (*selectors.QUEUE_KINDS, *selectors.WAITING_KINDS)
    ctx: dict[str, Any] = {
        "queue": found,
        "kind": kind,
        "kinds": [(k, QUEUE_LABELS[k], found.counts[k]) for k in kinds],
        "labels": QUEUE_LABELS,
        "since": at if since is None else since,
        "may_see_digests": _may_see_digests(request),
        **_queue_extent(found, kind),
    }
    if not _wants_fragment(request):
        ctx["health"] = selectors.health()  # the panel polls on its own
    return _render(request, "console/queue.html", "queue-table", ctx)


def _queue_extent(found: selectors.Queue, kind: str) -> dict[str, Any]:
    """How many rows of how many the queue shows ("100 of 111"), and where the rest are:
    the effects list filtered on each state with rows left out (newest first there)."""
    states = (kind,) if kind else selectors.QUEUE_KINDS
    counts = [found.counts[s] for s in states]
    shown = collections.Counter(str(item.effect.state) for item in found.items)
    total = selectors.Count(sum(c.value for c in counts), any(c.capped for c in counts))
    more = [
        (
            f"all {count} {decision.STATE_LABELS[state]}",
            f"{reverse('effects')}?state={state}",
        )
        for state, count in zip(states, counts, strict=True)
        if count.capped or count.value > shown[state]
    ]
    return {"shown": len(found.items), "total": total, "more": more}


# -- effects ------------------------------------------------------------------------------


@require_GET
@login_required
@permission_required(VIEW)
def effect_list(request: HtmxHttpRequest) -> HttpResponse:
    form = EffectFilterForm(request.GET)
    page = selectors.EffectPage([], None)
    valid = form.is_valid()
    window = _relative_window(request, form)
    status = 400
    if valid and not form.errors:
        data = form.cleaned_data
        f = _created_within(form.to_filter(), window)
        page = selectors.effect_page(f, after=data["after"], before=data["before"])
        status = 200
    params = _absolute_params(form, window, "created_from")
    search = form.cleaned_data.get("q") if status == 200 else None
    ctx = {
        "form": form,
        "page": page,
        # A whole id that finds nothing may name an effect the retention archived.
        "archived": _archived_id(search) if status == 200 and not page.effects else None,
        "search": search,
        "filter_params": params,
        "window": window,
        "windows": RELATIVE_WINDOWS,
        "export_limit": selectors.EFFECTS_EXPORT_LIMIT,
        # A search from the box shows its results first; the filters fold away.
        "filters_open": status != 200
        or any(n != "q" for n, _ in form.params())
        or not form.params(),
        "may_see_digests": _may_see_digests(request),
        "bulk_actions": [
            (name, label)
            for name, label in BULK_ACTIONS.items()
            if request.user.has_perm(actions.ACTIONS[name].perm)
        ],
    }
    return _render(request, "console/effects.html", "effect-results", ctx, status)


@require_GET
@login_required
@permission_required(VIEW)
@answers_gone
def effect_detail(request: HtmxHttpRequest, effect_id: str) -> HttpResponse:
    shown = request.GET.get("fence", "")
    # ASCII digits only, at most a bigint's: "²" is a digit to str.isdigit but no number
    # int() reads, and 5,000 digits are past its limit (both were a 500).
    if _wants_fragment(request) and _FENCE.fullmatch(shown):
        # The open page asks every 5 s whether the effect moved on since it was shown:
        # while its fence is the same, one read of that column by primary key and an empty
        # answer; otherwise the page as it is now, saying so.
        if int(shown) == _fence_or_404(effect_id, archived=True):
            response = HttpResponse(status=204)
        else:
            effect = _get_effect_or_404(effect_id, archived=True)
            said = decision.STATE_LABELS.get(effect.state, effect.state)
            notice = f"This effect changed while the page was open: it is {said} now."
            context = _detail_context(request, effect, notice=notice)
            response = render(request, "console/effect.html#effect", context)
        patch_vary_headers(response, ("HX-Request",))
        return response
    effect = _get_effect_or_404(effect_id, archived=True)
    return render(request, "console/effect.html", _detail_context(request, effect))


@require_POST
@login_required
@permission_required(APPROVE)
@answers_gone
def approve(request: HtmxHttpRequest, effect_id: str) -> HttpResponse:
    return _decide(request, effect_id, "approve")


@require_POST
@login_required
@permission_required(APPROVE)
@answers_gone
def deny_effect(request: HtmxHttpRequest, effect_id: str) -> HttpResponse:
    return _decide(request, effect_id, "deny")


@require_POST
@login_required
@permission_required(RESOLVE)
@answers_gone
def resolve_happened(request: HtmxHttpRequest, effect_id: str) -> HttpResponse:
    if request.POST.get("override_identity") and not request.user.has_perm(OVERRIDE_IDENTITY):
        deny(request, OVERRIDE_IDENTITY)
    return _decide(request, effect_id, "resolve-happened")


@require_POST
@login_required
@permission_required(RESOLVE)
@answers_gone
def resolve_not_happened(request: HtmxHttpRequest, effect_id: str) -> HttpResponse:
    if request.POST.get("override") and not request.user.has_perm(OVERRIDE_REARM):
        deny(request, OVERRIDE_REARM)
    return _decide(request, effect_id, "resolve-not-happened")


@require_POST
@login_required
@permission_required(CANCEL)
@answers_gone
def cancel(request: HtmxHttpRequest, effect_id: str) -> HttpResponse:
    return _decide(request, effect_id, "cancel")


@require_GET
@login_required
@permission_required(VIEW)
@answers_gone
def effect_journal_export(request: HttpRequest, effect_id: str, fmt: str) -> HttpResponse:
    effect = _get_effect_or_404(effect_id, archived=True)
    entries = selectors.journal(effect.id)
    filename = f"{effect.id}-journal.{fmt}"
    if fmt == "csv":
        return exports.csv_response(entries, filename)
    return exports.json_response(
        entries, filename, effect_id=effect.id, tool=effect.tool, state=effect.state
    )


# -- bulk decisions on a filter -----------------------------------------------------------


@require_GET
@login_required
@permission_required(VIEW)
def bulk_preview(request: HtmxHttpRequest) -> HttpResponse:
    """Count what a bulk action on the filter would touch, and seal exactly that set."""
    form = BulkPreviewForm(request.GET)
    if not form.is_valid():
        return render(request, "console/bulk.html", {"form": form}, status=400)
    name = form.cleaned_data["action"]
    action = actions.ACTIONS[name]
    require(request, action.perm)
    found = selectors.bulk_candidates(form.to_filter(), action.states)
    too_many = len(found) > selectors.BULK_LIMIT
    effects = found[: selectors.BULK_LIMIT]
    apply_form = None
    if effects and not too_many:
        token = actions.sign_bulk(name, request.user.pk, effects)
        apply_form = BulkApplyForm(initial={"token": token})
    context = {
        "form": form,
        "action": action,
        "done_verb": BULK_DONE[name],
        "effects": effects,
        "too_many": too_many,
        "limit": selectors.BULK_LIMIT,
        "apply_form": apply_form,
        "filter_params": form.params(),
    }
    return render(request, "console/bulk.html", context)


@require_POST
@login_required
@permission_required(VIEW)
def bulk_apply(request: HtmxHttpRequest) -> HttpResponse:
    """Apply the sealed set effect by effect; an effect that changed since it was counted
    is skipped (its fence moved), not decided on a state nobody looked at."""
    form = BulkApplyForm(request.POST)
    name: str | None = None
    pairs: list[tuple[str, int]] = []
    if form.is_valid():
        try:
            name, pairs = actions.read_bulk(form.cleaned_data["token"], request.user.pk)
        except ValidationError as exc:
            form.add_error(None, exc)
    action = actions.ACTIONS[name] if name else None
    if action is not None:
        require(request, action.perm)
        if action.name != "approve" and not form.cleaned_data.get("reason"):
            form.add_error("reason", "A reason is required: it is the evidence the journal keeps.")
    if action is None or form.errors:
        context = {
            "action": action,
            "done_verb": BULK_DONE.get(name or "", ""),
            "apply_form": form,
            "pending_ids": [i for i, _ in pairs],
        }
        return _render(request, "console/bulk.html", "bulk", context, status=400)
    results = actions.apply_bulk(
        action.name, pairs, request.user.get_username(), form.cleaned_data["reason"]
    )
    totals = {
        o: sum(1 for r in results if r.outcome == o) for o in ("applied", "skipped", "refused")
    }
    context = {"action": action, "results": results, "totals": totals}
    return _render(request, "console/bulk.html", "bulk", context)


# -- provider knowledge, reconciler health, audit -----------------------------------------


@require_GET
@login_required
@permission_required(VIEW)
def capabilities(request: HttpRequest) -> HttpResponse:
    context = {"rows": selectors.capability_matrix(), "health": selectors.health()}
    return render(request, "console/capabilities.html", context)


@require_GET
@login_required
@permission_required(VIEW)
def reconciler_panel(request: HtmxHttpRequest) -> HttpResponse:
    # Two panels poll this page on their own: health (also on the queue and providers
    # pages) and the probers' table (?panel=probers: it asks the broker for its depth).
    if request.GET.get("panel") == "probers":
        context: dict[str, Any] = {
            "probers": selectors.prober_rows(),
            "queue_depth": selectors.dispatch_queue_depth(),
        }
        return _render(request, "console/reconciler.html", "probers-panel", context)
    context = {"health": selectors.health()}
    if not _wants_fragment(request):
        context["probers"] = selectors.prober_rows()
        context["queue_depth"] = selectors.dispatch_queue_depth()
    return _render(request, "console/reconciler.html", "health-panel", context)


@require_GET
@login_required
@permission_required(EXPORT_AUDIT)
def audit(request: HtmxHttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    valid = form.is_valid()
    window = _relative_window(request, form)
    status = 400
    page = selectors.AuditPage([], None, None, selectors.Count(0))
    if valid and not form.errors:
        data = form.cleaned_data
        f = _decided_within(form.to_filter(), window)
        page = selectors.audit_page(f, before=data["before"], after=data["after"])
        status = 200
    ctx = {
        "form": form,
        "page": page,
        "filter_params": form.params(),
        "window": window,
        "windows": RELATIVE_WINDOWS,
        "may_see_digests": _may_see_digests(request),
        # Sign-in lockouts cleared belong to no effect's journal: their own record.
        "clearings": lockouts.recent_clearings(),
    }
    return _render(request, "console/audit.html", "audit-rows", ctx, status)


@require_GET
@login_required
@permission_required(EXPORT_AUDIT)
@explains_bad_input
def audit_export(request: HttpRequest, fmt: str) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    valid = form.is_valid()
    window = _relative_window(request, form)
    if not valid or form.errors:
        raise BadRequest("; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    before = form.cleaned_data["before"]
    f = _decided_within(form.to_filter(), window)
    entries = selectors.audit_log(before, selectors.EXPORT_LIMIT, f)
    next_before = entries[-1].seq if len(entries) == selectors.EXPORT_LIMIT else None
    if fmt == "csv":
        response = exports.csv_response(entries, "openonce-operator-audit.csv")
        if next_before is not None:
            response["X-OpenOnce-Next-Before"] = str(next_before)
        return response
    return exports.json_response(entries, "openonce-operator-audit.json", next_before=next_before)


# -- helpers ------------------------------------------------------------------------------


def _get_effect_or_404(effect_id: str, archived: bool = False) -> Effect:
    """Every effect is visible to whoever may read the ledger; an id that names none is a
    404 (the same answer a hidden one would get, so ids cannot be probed). One no
    database could hold (a NUL byte, a novel's length) names none either. With
    ``archived``, one the retention archived raises ``_Archived`` (see ``answers_gone``)."""
    _check_id(effect_id)
    effect = selectors.effect(effect_id)
    if effect is None:
        _not_found(effect_id, archived)
    return effect


def _fence_or_404(effect_id: str, archived: bool = False) -> int:
    _check_id(effect_id)
    fence = selectors.effect_fence(effect_id)
    if fence is None:
        _not_found(effect_id, archived)
    return fence


def _not_found(effect_id: str, archived: bool) -> NoReturn:
    """Only once the effect is not there is its tombstone asked for: the retention writes
    it before it deletes the effect, and while the effect is there, its page is the
    truth."""
    tombstone = selectors.archived(effect_id) if archived else None
    if tombstone is not None:
        raise _Archived(tombstone)
    raise Http404("no effect with that id")


def _archived_id(search: Search | None) -> Tombstone | None:
    """The tombstone of the effect a search names by its whole id (``id:eff_…``, the id
    alone, or pasted without ``eff_``): one read of openonce_tombstones_effect."""
    if search is None:
        return None
    effect_id = search.bare_id or (search.text if search.kind == "id" else None)
    # Only an id its page's address can hold (no "/": the effect URL's one segment).
    if not effect_id or len(effect_id) > 200 or "\x00" in effect_id or "/" in effect_id:
        return None
    return selectors.archived(effect_id)


def _check_id(effect_id: str) -> None:
    if len(effect_id) > 200 or "\x00" in effect_id:
        raise Http404("no effect with that id")


@dataclass(frozen=True)
class ActionForm:
    """One decision form as the detail page shows it."""

    action: actions.Action
    form: Form
    url: str
    label: str  # the action's name in the effect's state ("Withdraw the approval (deny)")


def _action_form(
    request: HttpRequest, action: actions.Action, effect: Effect, data: Any = None
) -> ActionForm:
    # Several decision forms share the page: each gets its own ids, so every label
    # ticks its own box.
    kwargs: dict[str, Any] = {"initial": {"fence": effect.fence}, "auto_id": f"{action.name}-%s"}
    if action.name == "resolve-not-happened":
        # Offered only where it is needed, to whoever may use it.
        may_override = request.user.has_perm(OVERRIDE_REARM)
        kwargs["can_override"] = may_override and not selectors.miss_may_rearm(effect.tool)
    if action.name == "resolve-happened":
        capabilities = selectors.capabilities_for(effect.tool)
        template = decision.receipt_template(
            capabilities,
            provider_key=effect.provider_key,
            args=effect.args,
            mail_domain=selectors.mail_domain(effect.tool),
        )
        kwargs["initial"]["receipt"] = template.text
        kwargs["capabilities"] = capabilities
        kwargs["effect"] = effect
        kwargs["can_override"] = request.user.has_perm(OVERRIDE_IDENTITY)
    form = action.form_class(data, **kwargs)
    url = reverse(action.name, kwargs={"effect_id": effect.id})
    return ActionForm(action, form, url, action.label_for(effect.state))


def _decide(request: HtmxHttpRequest, effect_id: str, name: str) -> HttpResponse:
    action = actions.ACTIONS[name]
    # An archived effect has no decision to take: its 410 page says where it went (a page
    # left open that long, or a script).
    effect = _get_effect_or_404(effect_id, archived=True)
    item = _action_form(request, action, effect, request.POST)
    if not item.form.is_valid():
        return _refused(request, effect, item, status=400)
    username = request.user.get_username()
    try:
        decided = actions.decide(name, effect.id, username, item.form.cleaned_data)
    except actions.DECISION_ERRORS as exc:
        item.form.add_error(None, str(exc))
        return _refused(request, effect, item, status=409, stale=actions.is_stale(exc))
    notice = f"{action.label}: done, journaled as operator:{username}."
    check = (decided.verification_evidence or {}).get("provider_check")
    if name == "resolve-happened" and isinstance(check, dict) and check.get("said"):
        # What the provider said about the receipt's object, before it was committed.
        notice += f" Asked before committing: {check['said']}."
    if request.htmx:
        # The effect changed as a whole (state, fence, journal): replace all of it.
        fresh = _get_effect_or_404(effect.id)
        context = _detail_context(request, fresh, notice=notice)
        context["focus_notice"] = True  # the form that had the focus is gone
        response = render(request, "console/effect.html#effect", context)
        return reswap(retarget(response, "#effect"), "outerHTML")
    messages.success(request, notice)
    return redirect("effect", effect_id=effect.id)


def _refused(
    request: HtmxHttpRequest, effect: Effect, item: ActionForm, status: int, stale: bool = False
) -> HttpResponse:
    """The form again, with what was typed and why it was refused; nothing changed. Refused
    because the effect moved on (``stale``): with a link to its current page."""
    if request.htmx:
        # The form that had the focus is replaced: the focus goes to why it was refused.
        context = {"item": item, "effect": effect, "stale": stale, "focus_error": True}
        return render(request, "console/effect.html#action", context, status=status)
    context = _detail_context(request, effect, failed=item)
    context["stale"] = stale
    return render(request, "console/effect.html", context, status=status)


def _detail_context(
    request: HttpRequest, effect: Effect, failed: ActionForm | None = None, notice: str = ""
) -> dict[str, Any]:
    journal_lines, journal_total = selectors.journal_tail(effect.id)
    offered = []
    withheld = []
    for action in actions.allowed(effect.state):
        if not request.user.has_perm(action.perm):
            continue
        if failed is not None and failed.action is action:
            offered.append(failed)
        elif action.name == "resolve-not-happened" and not _may_rearm(request, effect):
            # Legal in this state, but the core would refuse it for this person: say why
            # instead of offering a form that can only fail.
            withheld.append(action)
        else:
            offered.append(_action_form(request, action, effect))
    if failed is not None and failed not in offered:
        # Refused because the effect moved on (a stale page): the form stays, with why.
        offered.append(failed)
    approvals = selectors.approvals(effect.id)
    at = time.time()
    valid = {
        a.decided_by
        for a in approvals
        if a.decision == "approve"
        and a.args_fingerprint == effect.args_fingerprint
        and (a.expires_at is None or a.expires_at > at)
    }
    args = effect.args
    first_actor, requested_by = selectors.first_actors([effect.id]).get(effect.id, (None, ""))
    meaning, next_step = decision.STATE_MEANINGS.get(effect.state, ("", ""))
    capabilities = selectors.capabilities_for(effect.tool)
    probed = effect.tool in selectors.registered_probers()
    return {
        "effect": effect,
        # A list, not the dict: a template would read ``args.items`` as an argument
        # named "items" if a tool had one.
        "arguments": list(args.items()) if isinstance(args, dict) else [("(all)", args)],
        "amounts": decision.amounts(args),
        "customer": decision.customer(args),
        "requester": decision.requester(first_actor, effect.scope, requested_by),
        "verdict": decision.probe_verdict(effect.verification_evidence),
        "meaning": meaning,
        "next_step": next_step,
        "journal": decision.timeline(journal_lines),
        "journal_total": journal_total,
        "approvals": approvals,
        "valid_approvals": len(valid),
        "capabilities": capabilities,
        "guidance": [(c, c.guidance(prober_registered=probed)) for c in capabilities],
        "show_template": any(i.action.name == "resolve-happened" for i in offered),
        # A receipt typed here is checked at the provider before it commits (actions.py).
        "provider_verifies": bool(actions.verifiers(effect.tool)),
        "tier": selectors.evidence_tier(effect.tool),
        "receipt_template": decision.receipt_template(
            capabilities,
            provider_key=effect.provider_key,
            args=args,
            mail_domain=selectors.mail_domain(effect.tool),
        ),
        "actions": offered,
        "withheld": withheld,
        "notice": notice,
        "deliveries": deliveries_for(effect.id),
        "may_see_digests": _may_see_digests(request),
    }


def _may_rearm(request: HttpRequest, effect: Effect) -> bool:
    return selectors.miss_may_rearm(effect.tool) or request.user.has_perm(OVERRIDE_REARM)


def _may_see_digests(request: HttpRequest) -> bool:
    """Viewers see "secret" only; people who decide see a short prefix of the digest."""
    user = request.user
    return any(user.has_perm(p) for p in (APPROVE, RESOLVE, CANCEL))


def _render(
    request: HtmxHttpRequest,
    template: str,
    fragment: str,
    context: dict[str, Any],
    status: int = 200,
) -> HttpResponse:
    name = f"{template}#{fragment}" if _wants_fragment(request) else template
    response = render(request, name, context, status=status)
    # Page and fragment share a URL: caches must keep them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


def _wants_fragment(request: HtmxHttpRequest) -> bool:
    # A history restore asks for the whole page even though htmx sends it.
    return bool(request.htmx) and not request.htmx.history_restore_request


def _float_param(request: HttpRequest, name: str) -> float | None:
    """A non-negative epoch time from the query string; 400 for anything else."""
    value = request.GET.get(name, "")
    if not value:
        return None
    try:
        if len(value) > 32 or not value.isascii():
            raise ValueError(value)
        number = float(value)
    except ValueError:
        raise BadRequest(f"{name} must be a time in epoch seconds") from None
    if not math.isfinite(number) or number < 0:
        raise BadRequest(f"{name} must be a time in epoch seconds")
    return number


# -- find & time (issue 21) ---------------------------------------------------------------

# Times are shown in UTC everywhere, as the filters read them (see ``when``).
RELATIVE_WINDOWS: dict[str, str] = {
    "1h": "Last hour",
    "24h": "Last 24 h",
    "today": "Today (UTC)",
    "7d": "Last 7 days",
}
_WINDOW_SECONDS = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}


@dataclass(frozen=True)
class Window:
    """A relative time filter (``?last=1h``) read at one moment, in UTC."""

    key: str
    label: str
    start: float  # epoch seconds

    @property
    def start_text(self) -> str:
        return datetime.fromtimestamp(self.start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _relative_window(request: HttpRequest, form: Form) -> Window | None:
    """``last`` from the query string, or None; an unknown value is an error on ``form``
    (validated already), so the page says so with a 400 and lists nothing."""
    key = request.GET.get("last", "")
    if not key:
        return None
    if key not in RELATIVE_WINDOWS:
        choices = ", ".join(RELATIVE_WINDOWS)
        form.add_error(None, f"“last” must be one of {choices}; nothing was filtered.")
        return None
    now = time.time()
    if key == "today":
        start = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return Window(key, RELATIVE_WINDOWS[key], start.timestamp())
    return Window(key, RELATIVE_WINDOWS[key], now - _WINDOW_SECONDS[key])


def _created_within(f: selectors.EffectFilter, window: Window | None) -> selectors.EffectFilter:
    if window is None:
        return f
    start = max(window.start, f.created_from or 0.0)
    return replace(f, created_from=start)


def _decided_within(f: selectors.AuditFilter, window: Window | None) -> selectors.AuditFilter:
    if window is None:
        return f
    return replace(f, since=max(window.start, f.since or 0.0))


def _absolute_params(form: Form, window: Window | None, field: str) -> list[tuple[str, str]]:
    """The filter's fields with a relative window written as the absolute UTC time it
    meant when the page was shown: a bulk action counts exactly what the page counted."""
    params: list[tuple[str, str]] = form.params()  # type: ignore[attr-defined]
    if window is None:
        return params
    given = form.cleaned_data.get(field) if hasattr(form, "cleaned_data") else None
    start = max(window.start, given.timestamp() if given else 0.0)
    # Down to the second the field reads: at most a second earlier, never later.
    text = datetime.fromtimestamp(math.floor(start), UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return [(n, v) for n, v in params if n != field] + [(field, text)]


@require_GET
@login_required
@permission_required(VIEW)
@explains_bad_input
def run_timeline(request: HtmxHttpRequest) -> HttpResponse:
    """Every effect of one agent run (scope), oldest first, with its journal lines."""
    scope = request.GET.get("scope", "")
    if not scope or len(scope) > 200 or "\x00" in scope:
        raise BadRequest("scope: name the run, e.g. ?scope=run-2026-12-01-a")
    run = selectors.run_timeline(scope)
    steps = [(step.effect, decision.timeline(step.lines)) for step in run.steps]
    context = {
        "run": run,
        "steps": steps,
        "limit": selectors.RUN_LIMIT,
        "may_see_digests": _may_see_digests(request),
    }
    return render(request, "console/run.html", context)


@require_GET
@login_required
@permission_required(VIEW)
@explains_bad_input
def effects_export(request: HttpRequest, fmt: str) -> HttpResponse | StreamingHttpResponse:
    """The effects list's current filter as a download, newest first, at most
    EFFECTS_EXPORT_LIMIT rows; ``X-OpenOnce-Next-After`` (and ``next_after`` in JSON) is
    the ``after`` of the next part when there are more."""
    form = EffectFilterForm(request.GET)
    valid = form.is_valid()
    window = _relative_window(request, form)
    if not valid or form.errors:
        raise BadRequest("; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    if form.cleaned_data["before"] is not None:
        raise BadRequest(
            "before: an export runs from the newest row to older ones; leave before out,"
            " and page on with the X-OpenOnce-Next-After value as after"
        )
    f = _created_within(form.to_filter(), window)
    effects, more = selectors.effect_export(f, after=form.cleaned_data["after"])
    next_after = more.encode() if more else None
    show = _may_see_digests(request)
    if fmt == "csv":
        return exports.effects_csv(effects, "openonce-effects.csv", show, next_after)
    return exports.effects_json(
        effects,
        "openonce-effects.json",
        show,
        next_after,
        filter=dict(_absolute_params(form, window, "created_from")),
        limit=selectors.EFFECTS_EXPORT_LIMIT,
    )


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The 403 page (``handler403``). Django would log each refusal with a full traceback;
    a refusal is no bug, so it is one line here: who, where and why (the security log
    has its own line from ``access.deny``). To htmx (a decision's form, a poll) the
    refusal alone, which it swaps in where the answer was to go (base.html's
    htmx-config): a whole page would not be swapped, and the click would seem to do
    nothing."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None and user.is_authenticated else "(anonymous)"
    access_log.warning(
        "forbidden: user=%r path=%s reason=%s",
        name,
        one_line(request.path),
        one_line(str(exception) or "permission denied"),
    )
    template = "403.html#refusal" if _from_htmx(request) else "403.html"
    response = render(request, template, {"exception": exception}, status=403)
    patch_vary_headers(response, ("HX-Request",))
    # Django's request log skips a response already logged: no second line, no traceback.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response
