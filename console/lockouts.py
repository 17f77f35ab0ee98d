"""The sign-in lockouts page (/lockouts/): an admin who has the console but no shell
looks a name up, sees whether it is locked or slowed and for how long, and clears it —
what ``manage.py clear_lockout`` does, recorded with who, which name, when and why.

Needs ``clear_lockout`` (the admin role) for the page and the POST alike. Clearing is a
POST (CSRF-checked) that redirects back to the lookup. The lockout itself lives in the
cache (console.signin); the record of clearings lives in the database, in the console's
own append-only table (migration 0005), since a lockout is no effect the ledger's
journal could hold a line for.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from ledger.logsafe import one_line

from . import signin
from .access import client_address, permission_required, security_log
from .roles import CLEAR_LOCKOUT

TABLE = "console_lockout_clearings"
RECENT = 20  # clearings the page lists


class LockoutForm(forms.Form):
    """A name (an account's name: at most 150 characters), an address, a reason. Django's
    CharField refuses NUL characters on its own ("Null characters are not allowed")."""

    name = forms.CharField(
        max_length=150,
        label="Name",
        help_text="The name as typed at sign-in; any capitalisation.",
        error_messages={"required": "Type the name whose lockout you want to see."},
    )
    address = forms.CharField(
        required=False,
        max_length=45,
        label="Address (optional)",
        help_text="An address from the security log: shows the lockout there, and clearing"
        " also ends that address's lockout for every name.",
    )
    reason = forms.CharField(
        required=False,
        max_length=2000,
        label="Reason (optional)",
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Kept with the record of this clearing.",
    )

    def clean_address(self) -> str:
        text = self.cleaned_data["address"]
        if not text:
            return ""
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise forms.ValidationError(f"{text!r} is not an IP address.") from None
        # The security log writes an IPv4 client of a server bound to [::] as IPv4.
        if ip.version == 6 and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        return str(ip)


@dataclass(frozen=True)
class Clearing:
    at: float
    actor: str
    username: str
    address: str
    reason: str


@login_required
@permission_required(CLEAR_LOCKOUT)
def lockouts(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _not_allowed(request, "GET")
    form = LockoutForm(request.GET) if "name" in request.GET else LockoutForm()
    if form.is_bound and not form.is_valid():
        return _page(request, form, status=400)
    return _page(request, form)


@login_required
@permission_required(CLEAR_LOCKOUT)
def clear(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _not_allowed(request, "POST")
    form = LockoutForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    name, address, reason = (form.cleaned_data[k] for k in ("name", "address", "reason"))
    signin.clear_lockout(name)
    if address:
        signin.clear_address(address)
    _record(request.user.get_username(), name, address, reason)
    security_log.warning(
        "sign-in lockout cleared: user=%r cleared name=%r%s from %s",
        request.user.get_username(),
        name,
        f" and address {address}" if address else "",
        client_address(request),
    )
    cleared = f"{name} and of address {address}" if address else name
    messages.success(request, f"Cleared the sign-in lockout of {cleared}.")
    query = {"name": name, **({"address": address} if address else {})}
    return redirect(f"{reverse('lockouts')}?{urlencode(query)}")


def recent_clearings(limit: int = RECENT) -> list[Clearing]:
    """The latest clearings, newest first (by the primary key: the order they were made)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT at, actor, username, address, reason FROM {TABLE} ORDER BY id DESC LIMIT %s",
            [limit],
        )
        return [Clearing(*row) for row in cursor.fetchall()]


def _record(username: str, name: str, address: str, reason: str) -> None:
    # Written as "operator:NAME", the way the journal names a person, so the two read alike.
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (at, actor, username, address, reason)"
            " VALUES (%s, %s, %s, %s, %s)",
            [signin.clock(), f"operator:{username}", name, address, reason],
        )


def _page(request: HttpRequest, form: LockoutForm, status: int = 200) -> HttpResponse:
    context: dict[str, Any] = {
        "form": form,
        "clearings": recent_clearings(),
        "per_process": _per_process_counters(),
    }
    if form.is_bound and form.is_valid():
        name, address = form.cleaned_data["name"], form.cleaned_data["address"]
        context["name"] = name
        context["state"] = signin.lockout(name, address)
        context["has_account"] = get_user_model().objects.filter(username__iexact=name).exists()
    return render(request, "console/lockouts.html", context, status=status)


def _per_process_counters() -> bool:
    # With OPENONCE_CACHE_URL=locmem each web process counts on its own, and a clearing
    # reaches only the process that served it: the page must not claim more.
    return str(settings.CACHES["default"]["BACKEND"]).endswith("LocMemCache")


def _not_allowed(request: HttpRequest, allowed: str) -> HttpResponse:
    security_log.warning(
        "method not allowed: user=%r %s %s from %s",
        request.user.get_username(),
        one_line(str(request.method)),
        one_line(request.path),
        client_address(request),
    )
    context = {
        "form": LockoutForm(),
        "clearings": recent_clearings(),
        "refused": "Clearing a lockout is done with the form on this page (a POST)."
        if allowed == "POST"
        else f"This page answers {allowed} only.",
    }
    response = render(request, "console/lockouts.html", context, status=405)
    response["Allow"] = allowed
    return response
