"""Malformed input answers 4xx with a clear message, never 500: a search for a NUL or a
lone surrogate (which Postgres cannot hold in jsonb or text), and a form posted in a
charset other than UTF-8 (Django reads forms only in UTF-8; UTF-16 was a 500)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse
from test_console_views import CSRF, Agent, client_for, fresh_ledger, html, make_users

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


def test_the_suite_runs_this_on_postgres() -> None:
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


@pytest.mark.parametrize(
    "q",
    [
        r'arg:x="\u0000"',
        r'x="a\u0000b"',
        r'arg:x="\ud800"',
        r'arg:note="\udfff-tail"',
        r'arg:a.b="\u0000"',
    ],
)
def test_a_search_for_a_nul_or_a_lone_surrogate_is_refused_clearly(
    agent: Agent, users, q: str
) -> None:
    agent.call("stripe.refund", charge="ch_1", amount=700)
    response = client_for(users["viewer"]).get(reverse("effects"), {"q": q})
    assert response.status_code == 400
    assert "cannot search for" in html(response)


def test_other_escapes_still_search(agent: Agent, users) -> None:
    effect = agent.call("stripe.refund", charge="ch_é", amount=700)
    response = client_for(users["viewer"]).get(reverse("effects"), {"q": r'charge="ch_\u00e9"'})
    assert response.status_code == 200 and effect in html(response)


UTF16 = "application/x-www-form-urlencoded; charset=utf-16"


@pytest.mark.parametrize(
    "content_type",
    [UTF16, "application/x-www-form-urlencoded; charset=utf-32", "text/plain; charset=utf-16le",
     "application/x-www-form-urlencoded; charset=rot13",
     "application/x-www-form-urlencoded; charset=no-such-charset",
     "application/x-www-form-urlencoded; charset=iso-8859-1",
     "application/x-www-form-urlencoded; charset=utf8",
     'application/x-www-form-urlencoded; charset=" utf-8"',
     "application/x-www-form-urlencoded; charset=utf-8; charset=utf-16"],
)  # fmt: skip
def test_a_sign_in_posted_in_an_unreadable_charset_is_a_400(agent: Agent, content_type) -> None:
    body = "username=a&password=b".encode("utf-16") if "utf-16" in content_type else b"a=b"
    # generic(): the test client's post() would itself fail to encode in these charsets.
    # CSRF checked as for a browser: the check reads the form, and that was the 500.
    response = client_for(None).generic(
        "POST", reverse("login"), body, content_type=content_type, HTTP_X_CSRFTOKEN=CSRF
    )
    assert response.status_code == 400
    assert "send UTF-8" in response.content.decode()


def test_a_console_post_in_utf16_is_a_400_and_decides_nothing(agent: Agent, users) -> None:
    effect = agent.pending()
    client = client_for(users["operator"])
    fence = agent.fence(effect)
    body = f"fence={fence}&confirm=on&reason=duplicate".encode("utf-16")
    response = client.generic(
        "POST", reverse("cancel", args=[effect]), body, content_type=UTF16, HTTP_X_CSRFTOKEN=CSRF
    )
    assert response.status_code == 400
    assert agent.state(effect) == "requires_approval"
    # The same decision in UTF-8 goes through: the refusal was the charset's.
    done = client.post(
        reverse("cancel", args=[effect]),
        f"fence={fence}&confirm=on&reason=duplicate".encode(),
        content_type="application/x-www-form-urlencoded; charset=utf-8",
        HTTP_X_CSRFTOKEN=CSRF,
    )
    assert done.status_code == 302 and agent.state(effect) == "cancelled"


def test_a_get_naming_utf16_is_a_400_too(agent: Agent, users) -> None:
    # Django reads the query string in the request's charset as well.
    response = client_for(users["viewer"]).get(
        reverse("effects"), {"q": "stripe.*"}, headers={"content-type": UTF16}
    )
    assert response.status_code == 400


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", '"utf-8"'])
def test_readable_charsets_sign_in_as_before(agent: Agent, users, charset: str) -> None:
    response = client_for(None).generic(
        "POST",
        reverse("login"),
        b"username=viewer&password=correct+horse+battery+staple",
        content_type=f"application/x-www-form-urlencoded; charset={charset}",
        HTTP_X_CSRFTOKEN=CSRF,
    )
    assert response.status_code == 302, response.content.decode()[-1500:]
