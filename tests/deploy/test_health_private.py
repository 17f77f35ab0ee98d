"""``/health/`` for everyone says healthy or unhealthy and nothing more; its reasons (a
prober's failing credentials, sweeps, quarantined messages) need OPENONCE_HEALTH_TOKEN or
a signed-in operator, and a provider's error text has its credentials masked.

The web container's health check (``openonce_site.healthcheck``) still passes on the
public answer."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from console.roles import sync_roles
from reconciler.probes import record_prober_failures

pytestmark = pytest.mark.django_db

KEY = "sk_live_51HcanaryKEY0123456789abcdefXYZ"
TOKEN = "health-token-0123456789abcdef"
LEAK = f"Invalid API Key provided: {KEY} (request req_1; Authorization: Bearer {KEY})"


@pytest.fixture
def failing_prober() -> None:
    record_prober_failures({"stripe": LEAK})


def test_the_public_answer_is_one_word_and_the_status(failing_prober: None) -> None:
    response = Client().get("/health/")
    assert response.status_code == 503
    assert response.json() == {"healthy": False}
    body = response.content.decode()
    assert KEY not in body and "stripe" not in body and "Invalid API Key" not in body
    assert response["Cache-Control"].startswith("max-age=0")


@override_settings(OPENONCE_HEALTH_TOKEN=TOKEN)
def test_the_token_shows_the_reasons_with_the_credentials_masked(failing_prober: None) -> None:
    response = Client().get("/health/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503
    body = response.json()
    assert body["healthy"] is False
    assert any("stripe prober failing" in r for r in body["reasons"])
    assert body["probers"][0]["provider"] == "stripe"
    assert "Invalid API Key provided: [secret]" in body["probers"][0]["reason"]
    assert KEY not in response.content.decode()


@override_settings(OPENONCE_HEALTH_TOKEN=TOKEN)
@pytest.mark.parametrize(
    "given", ["", "Bearer ", f"Bearer {TOKEN}x", f"bearer {TOKEN}", TOKEN, f"Bearer {TOKEN[:-1]}"]
)
def test_a_wrong_token_gets_the_public_answer(failing_prober: None, given: str) -> None:
    response = Client().get("/health/", HTTP_AUTHORIZATION=given)
    assert response.status_code == 503 and response.json() == {"healthy": False}


def test_without_a_configured_token_no_header_opens_the_details(failing_prober: None) -> None:
    # An unset token must not match an empty one.
    for given in ("Bearer ", "Bearer", ""):
        response = Client().get("/health/", HTTP_AUTHORIZATION=given)
        assert response.json() == {"healthy": False}


def test_a_signed_in_operator_sees_the_details(failing_prober: None) -> None:
    sync_roles()
    viewer = User.objects.create_user("viewer", password="x" * 20)
    viewer.groups.add(Group.objects.get(name="viewer"))
    nobody = User.objects.create_user("norole", password="x" * 20)
    client = Client()
    client.force_login(viewer)
    body = client.get("/health/").json()
    assert "[secret]" in body["probers"][0]["reason"] and KEY not in str(body)
    client.force_login(nobody)  # signed in, but no console role
    assert client.get("/health/").json() == {"healthy": False}


def test_health_is_read_only(failing_prober: None) -> None:
    assert Client().post("/health/").status_code == 405


@pytest.mark.parametrize("path", ["/health/", "/livez", "/readyz"])
def test_a_load_balancer_probing_with_head_gets_the_status(failing_prober: None, path) -> None:
    # Load balancers (HAProxy's option httpchk HEAD, some ELB setups) probe with HEAD.
    got = Client().head(path)
    assert got.status_code == Client().get(path).status_code
    assert got.content == b""


def test_the_container_health_check_passes_on_the_public_answer(
    failing_prober: None, live_server, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from openonce_site import healthcheck

    monkeypatch.setenv("OPENONCE_HEALTHCHECK_URL", f"{live_server.url}/health/")
    monkeypatch.setenv("OPENONCE_ALLOWED_HOSTS", "localhost")
    assert healthcheck.main() == 0
    assert "answered 503" in capsys.readouterr().out
