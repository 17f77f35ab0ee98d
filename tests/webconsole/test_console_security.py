"""The console's security baseline: who may open and do what (every URL x every role),
CSRF on every unsafe request, no state change on GET, 404 for unknown effects, logged
sign-in failures and denials, no secret in a page, and a clean ``check --deploy``."""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse
from test_console_views import (
    CARD,
    CSRF,
    PASSWORD,
    UNKNOWN,
    Agent,
    client_for,
    fresh_ledger,
    html,
    make_users,
    post,
)

from console.roles import PERMISSIONS, ROLES

ROOT = Path(__file__).resolve().parents[2]
ROLE_NAMES = ["anonymous", "norole", "viewer", "operator", "approver", "admin"]
MISSING = "eff_00000000000000000000000000000000"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> dict[str, User]:
    return make_users()


# What each role holds, as the roles module grants it (the matrix below is written out
# by hand so that a change to the grants shows up here as a failing expectation).
HOLDS = {
    "anonymous": set(),
    "norole": set(),
    "viewer": {"view"},
    "operator": {"view", "resolve", "cancel"},
    "approver": {"view", "approve"},
    "admin": {"view", "resolve", "cancel", "approve", "audit", "lockout"},
}


def _urls(effect_id: str) -> list[tuple[str, str, str, dict[str, Any], int]]:
    """(method, name, url, data, status when allowed) for every console URL.

    Unsafe URLs are called on an effect that does not exist (allowed -> 404) or with an
    empty form (allowed -> 400), so the matrix changes nothing."""
    e = [effect_id]
    m = [MISSING]
    return [
        ("GET", "view", reverse("queue"), {}, 200),
        ("GET", "view", reverse("effects"), {}, 200),
        ("GET", "view", reverse("effect", args=e), {}, 200),
        ("GET", "view", reverse("effect", args=m), {}, 404),
        ("GET", "view", reverse("effect-journal-csv", args=e), {}, 200),
        ("GET", "view", reverse("effect-journal-json", args=e), {}, 200),
        ("GET", "view", reverse("effect-journal-csv", args=m), {}, 404),
        ("GET", "view", reverse("capabilities"), {}, 200),
        ("GET", "view", reverse("reconciler"), {}, 200),
        ("GET", "approve", reverse("bulk") + "?action=approve", {}, 200),
        ("GET", "approve", reverse("bulk") + "?action=deny", {}, 200),
        ("GET", "cancel", reverse("bulk") + "?action=cancel", {}, 200),
        ("POST", "view", reverse("bulk-apply"), {}, 400),
        ("POST", "approve", reverse("approve", args=m), {}, 404),
        ("POST", "approve", reverse("deny", args=m), {}, 404),
        ("POST", "resolve", reverse("resolve-happened", args=m), {}, 404),
        ("POST", "resolve", reverse("resolve-not-happened", args=m), {}, 404),
        ("POST", "cancel", reverse("cancel", args=m), {}, 404),
        ("POST", "approve", reverse("approve", args=e), {}, 400),
        ("POST", "cancel", reverse("cancel", args=e), {}, 400),
        ("GET", "audit", reverse("audit"), {}, 200),
        ("GET", "audit", reverse("audit-csv"), {}, 200),
        ("GET", "audit", reverse("audit-json"), {}, 200),
        ("GET", "lockout", reverse("lockouts"), {}, 200),
        ("POST", "lockout", reverse("lockout-clear"), {}, 400),
    ]


POST_ONLY = ["approve", "deny", "resolve-happened", "resolve-not-happened", "cancel"]


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_authorization_matrix(role: str, agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(None if role == "anonymous" else users[role])
    for method, needs, url, data, allowed in _urls(effect_id):
        response = client.get(url, data) if method == "GET" else post(client, url, data)
        if role == "anonymous":
            expected = 302
        elif needs in HOLDS[role]:
            expected = allowed
        else:
            expected = 403
        assert response.status_code == expected, (role, method, url)
        if expected == 302:
            assert response["Location"].startswith("/login/?next=")
    assert agent.state(effect_id) == "requires_approval"  # the matrix changed nothing


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_public_and_sign_in_urls(role: str, users, agent: Agent) -> None:
    client = client_for(None if role == "anonymous" else users[role])
    assert client.get(reverse("health")).status_code in (200, 503)  # for load balancers
    login = client.get(reverse("login"))
    assert login.status_code == (200 if role == "anonymous" else 302)
    assert client.get(reverse("logout")).status_code == 405
    assert post(client, reverse("logout")).status_code == 302


def test_roles_are_groups_with_their_permissions(agent: Agent) -> None:
    for role, codenames in ROLES.items():
        group = Group.objects.get(name=role)
        assert set(group.permissions.values_list("codename", flat=True)) == set(codenames)
    admin = set(Group.objects.get(name="admin").permissions.values_list("codename", flat=True))
    console = set(
        Permission.objects.filter(content_type__app_label="console").values_list(
            "codename", flat=True
        )
    )
    assert admin == console == set(PERMISSIONS)


def test_every_unsafe_request_needs_the_csrf_token(agent: Agent, users) -> None:
    effect_id = agent.pending()
    fence = agent.fence(effect_id)
    client = client_for(users["admin"])
    unsafe = [reverse(name, args=[effect_id]) for name in POST_ONLY]
    unsafe += [reverse("bulk-apply"), reverse("logout")]
    for url in unsafe:
        response = client.post(url, {"fence": fence, "confirm": "on", "reason": "x"})
        assert response.status_code == 403, url
        response = client.post(
            url, {"fence": fence, "confirm": "on", "reason": "x"}, HTTP_X_CSRFTOKEN="w" * 32
        )
        assert response.status_code == 403, url
    anonymous = Client(enforce_csrf_checks=True)
    response = anonymous.post(reverse("login"), {"username": "admin", "password": PASSWORD})
    assert response.status_code == 403
    assert agent.state(effect_id) == "requires_approval"
    assert "/login/" not in html(client.get(reverse("queue")))  # still signed in


def test_htmx_sends_the_token_from_the_page(agent: Agent, users) -> None:
    """The token the page puts on <body hx-headers> is the one htmx sends, and it works."""
    effect_id = agent.pending()
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["approver"])
    page = html(client.get(reverse("effect", args=[effect_id])))
    token = re.search(r"""<body hx-headers='\{"X-CSRFToken": "([^"]+)"\}'>""", page)[1]
    response = client.post(
        reverse("approve", args=[effect_id]),
        {"fence": agent.fence(effect_id), "confirm": "on"},
        HTTP_X_CSRFTOKEN=token,
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    assert agent.state(effect_id) == "approved"


def test_decisions_are_post_only(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["admin"])
    for name in POST_ONLY:
        url = reverse(name, args=[effect_id])
        assert (
            client.get(url, {"fence": agent.fence(effect_id), "confirm": "on"}).status_code == 405
        )
        assert client.put(url, HTTP_X_CSRFTOKEN=CSRF).status_code == 405
    assert client.get(reverse("bulk-apply")).status_code == 405
    assert agent.state(effect_id) == "requires_approval"


def test_unknown_effect_ids_are_404_everywhere(users, agent: Agent) -> None:
    client = client_for(users["admin"])
    for name in ("effect", "effect-journal-csv", "effect-journal-json"):
        assert client.get(reverse(name, args=[MISSING])).status_code == 404
    for name in POST_ONLY:
        response = post(
            client, reverse(name, args=[MISSING]), {"fence": 1, "confirm": "on", "reason": "r"}
        )
        assert response.status_code == 404


def test_sign_in_failures_are_logged_without_the_password(users, caplog) -> None:
    client = client_for(None)
    caplog.set_level(logging.WARNING, logger="openonce.security")
    response = post(client, reverse("login"), {"username": "viewer", "password": "hunter2-nope"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in html(response)
    assert "sign-in failed: username='viewer'" in caplog.text
    assert "hunter2-nope" not in caplog.text

    response = post(
        client,
        reverse("login") + "?next=/effects/",
        {"username": "viewer", "password": PASSWORD, "next": "/effects/"},
    )
    assert response.status_code == 302 and response["Location"] == "/effects/"


def test_sign_in_refuses_to_redirect_off_site(users) -> None:
    client = client_for(None)
    response = post(
        client,
        reverse("login"),
        {"username": "viewer", "password": PASSWORD, "next": "https://evil.example/"},
    )
    assert response.status_code == 302 and response["Location"] == "/"


def test_permission_denials_are_logged(agent: Agent, users, caplog) -> None:
    effect_id = agent.pending()
    caplog.set_level(logging.WARNING, logger="openonce.security")
    response = post(client_for(users["viewer"]), reverse("approve", args=[effect_id]), {})
    assert response.status_code == 403
    record = next(r for r in caplog.records if r.name == "openonce.security")
    assert record.getMessage().startswith(
        "permission denied: user='viewer' lacks console.approve_effect"
        f" for POST /effects/{effect_id}/approve/"
    )


def test_an_expired_session_turns_an_htmx_poll_into_a_full_page_sign_in(agent: Agent) -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.get(reverse("queue"), HTTP_HX_REQUEST="true")
    assert response.status_code == 302  # the browser follows this, keeping HX-Request
    login = client.get(response["Location"], HTTP_HX_REQUEST="true")
    assert login["HX-Redirect"] == response["Location"]


def test_no_secret_reaches_a_page(agent: Agent, users) -> None:
    effect_id = agent.call(
        "stripe.charge", UNKNOWN, secret_fields=("card",), order="o-s", amount=1, card=CARD
    )
    client = client_for(users["admin"])
    pages = [
        client.get(reverse("effect", args=[effect_id])),
        client.get(reverse("effects")),
        client.get(reverse("queue")),
        client.get(reverse("effect-journal-json", args=[effect_id])),
        client.get(reverse("audit-json")),
    ]
    from django.conf import settings

    for response in pages:
        assert response.status_code == 200
        body = html(response)
        assert CARD not in body and CARD[-8:] not in body
        assert settings.SECRET_KEY not in body


def test_ledger_pages_are_not_cached(agent: Agent, users) -> None:
    response = client_for(users["viewer"]).get(reverse("queue"))
    assert "no-store" in response["Cache-Control"] and "private" in response["Cache-Control"]


def test_check_deploy_with_production_settings_is_clean() -> None:
    env = {
        **os.environ,
        "OPENONCE_SECRET_KEY": secrets.token_urlsafe(64),
        "OPENONCE_DATABASE": os.environ.get("OPENONCE_DATABASE", "openonce.db"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "check",
            "--deploy",
            "--fail-level",
            "WARNING",
            "--settings=openonce_site.settings.production",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout
