"""An effect the retention archived, followed by an old link: ``/effects/<id>/`` (and its
poll, and its journal's exports) answers 410 Gone with where it went, when, how it ended
and how to bring it back, instead of the 404 of an id that never was.

The effects are archived by really running the retention (``run_retention``) on the test
database's ledger, SQLite or Postgres (OPENONCE_DATABASE), as the daily task does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import DESKTOP, PHONE
from django.urls import reverse
from playwright.sync_api import expect
from test_console_ux_browser import serious_violations
from test_console_views import PASSWORD, client_for, html, make_users

from console.roles import sync_roles
from ledger import clients as site_ledger
from openonce_core import BusinessError, OpenOnce, open_store
from openonce_core._retention import RetentionPolicy, import_archive, run_retention
from openonce_core.errors import EffectArchivedError
from openonce_core.testing import FakeClock
from tests.support.browser import sign_in_with
from tests.support.retention import DAY, Refunds, empty_ledger, old_and_new_refunds

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HTTP_HX_REQUEST": "true"}
MISSING = "eff_" + "0" * 32


@pytest.fixture
def ledger(transactional_db: None) -> Iterator[str]:
    """The test database's ledger, emptied (tombstones too), and the console's roles."""
    site_ledger.reset()
    target = site_ledger.ledger_target()
    empty_ledger(target)
    sync_roles()
    yield target
    site_ledger.reset()


@pytest.fixture
def refunds(ledger: str) -> Iterator[Refunds]:
    """o-1 and o-2 committed 100 days ago, o-new just now."""
    made = old_and_new_refunds(ledger, migrate=False)
    yield made
    made.oo.close()


@pytest.fixture
def users(ledger: str) -> dict[str, Any]:
    return make_users()


def archive(ledger: str, folder: Path) -> Path:
    """The retention, as the daily task runs it at 90 days; the one archive file it wrote."""
    store = open_store(ledger)
    try:
        report = run_retention(store, RetentionPolicy(older_than=90 * DAY), str(folder))
    finally:
        store.close()
    assert report.effects == 2 and report.tombstones == 2
    (path,) = report.archives
    return Path(path)


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_an_archived_effect_says_where_it_went(refunds: Refunds, users, tmp_path) -> None:
    ids = refunds.ids()
    folder = tmp_path / "secret-customer-folder"
    path = archive(site_ledger.ledger_target(), folder)
    with pytest.raises(EffectArchivedError) as refused:
        refunds.refund("o-1")  # what the page says a duplicate gets
    assert refused.value.archive == str(path)
    client = client_for(users["viewer"])

    response = client.get(reverse("effect", args=[ids["o-1"]]))

    assert response.status_code == 410
    page = html(response)
    assert "This effect was archived by the retention on" in page
    assert utc(refused.value.archived_at) in page
    assert "stripe.refund" in page and "committed" in page
    assert path.name in page and path.name.startswith("openonce-archive-")
    assert str(folder) not in page and "secret-customer-folder" not in page  # no server path
    assert "EffectArchivedError" in page
    assert f"openonce --db DSN retention import {path.name}" in page
    assert "o-1" in page  # its idempotency key
    # The console's page: its landmarks and one h1, then a heading per part.
    assert page.count("<h1") == 1 and "<main" in page and 'role="search"' in page
    assert "<h2" in page and "To restore it" in page
    # The effect not archived is its page as before; an id that never was, the 404.
    assert client.get(reverse("effect", args=[ids["o-new"]])).status_code == 200
    missing = client.get(reverse("effect", args=[MISSING]))
    assert missing.status_code == 404
    assert "no effect has that id" in html(missing) and "archived" not in html(missing)


def test_a_failed_effect_shows_its_final_state(ledger: str, users, tmp_path) -> None:
    clock = FakeClock(start=time.time() - 100 * DAY)
    oo = OpenOnce(ledger, retry_delay=0, clock=clock, migrate=False)

    @oo.effect(tool="mail.send", idempotency_key=lambda to: to)
    def send(to: str) -> str:
        raise BusinessError("mailbox does not exist")

    with pytest.raises(BusinessError):
        send("nobody@example.com")
    failed = oo.store.find("mail.send", "nobody@example.com").id
    clock.set(time.time())
    oo.close()
    made = old_and_new_refunds(ledger, migrate=False)  # two more old ones, one young
    made.oo.close()
    store = open_store(ledger)
    try:
        report = run_retention(store, RetentionPolicy(older_than=90 * DAY), str(tmp_path))
    finally:
        store.close()
    assert report.effects == 3

    response = client_for(users["viewer"]).get(reverse("effect", args=[failed]))

    assert response.status_code == 410
    page = html(response)
    assert "mail.send" in page and "It ended failed" in page


def test_the_open_pages_poll_reloads_it_and_exports_say_gone(
    refunds: Refunds, users, tmp_path
) -> None:
    ids = refunds.ids()
    fence = refunds.oo.get(ids["o-1"]).fence
    client = client_for(users["viewer"])
    url = reverse("effect", args=[ids["o-1"]])
    assert client.get(url, {"fence": fence}, **HX).status_code == 204  # still there
    path = archive(site_ledger.ledger_target(), tmp_path)

    poll = client.get(url, {"fence": fence}, **HX)

    # htmx swaps no 410 (base.html's htmx-config): HX-Refresh has the browser load the
    # page again, which is then the archived page, whole; the body is a fragment only.
    assert poll.status_code == 410
    assert poll["HX-Refresh"] == "true"
    assert "HX-Request" in poll["Vary"]
    fragment = html(poll)
    assert "<html" not in fragment and "<main" not in fragment
    assert 'id="effect"' in fragment and "data-effect-poll" not in fragment
    assert "archived by the retention" in fragment and path.name in fragment
    # A history restore asks for the whole page.
    whole = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert whole.status_code == 410 and "<main" in html(whole) and "HX-Refresh" not in whole
    for name in ("effect-journal-csv", "effect-journal-json"):
        export = client.get(reverse(name, args=[ids["o-1"]]))
        assert export.status_code == 410, name
        assert "archived by the retention" in html(export) and path.name in html(export)
        assert client.get(reverse(name, args=[MISSING])).status_code == 404
    assert client.get(reverse("effect", args=[MISSING]), {"fence": 1}, **HX).status_code == 404


def test_only_people_who_may_read_the_ledger_learn_it_was_archived(
    refunds: Refunds, users, tmp_path
) -> None:
    ids = refunds.ids()
    archive(site_ledger.ledger_target(), tmp_path)
    url = reverse("effect", args=[ids["o-1"]])

    nobody = client_for(None).get(url)
    norole = client_for(users["norole"]).get(url)
    norole_poll = client_for(users["norole"]).get(url, {"fence": 2}, **HX)

    assert nobody.status_code == 302 and nobody["Location"].startswith(reverse("login"))
    assert norole.status_code == 403 and "archived" not in html(norole)
    assert norole_poll.status_code == 403 and "archived" not in html(norole_poll)
    for role in ("viewer", "approver", "admin"):
        assert client_for(users[role]).get(url).status_code == 410, role


def test_an_imported_archive_brings_the_page_back(refunds: Refunds, users, tmp_path) -> None:
    ids = refunds.ids()
    path = archive(site_ledger.ledger_target(), tmp_path)
    client = client_for(users["viewer"])
    url = reverse("effect", args=[ids["o-1"]])
    assert client.get(url).status_code == 410

    import_archive(refunds.oo.store, path)  # what the page tells the operator to run

    response = client.get(url)
    assert response.status_code == 200 and "archived by the retention" not in html(response)
    assert refunds.refund("o-1") == "re_o-1"  # replayed, not run again
    assert refunds.calls == ["o-1", "o-2", "o-new"]


def test_a_search_for_an_archived_id_says_where_it_went(refunds: Refunds, users, tmp_path):
    ids = refunds.ids()
    archive(site_ledger.ledger_target(), tmp_path)
    client = client_for(users["viewer"])
    archived = ids["o-1"]

    for query in (f"id:{archived}", archived, archived.removeprefix("eff_")):
        response = client.get(reverse("effects"), {"q": query})
        assert response.status_code == 200, query
        page = re.sub(r"<[^>]+>", "", html(response))  # the text a person reads
        assert f"effect {archived} was archived by the retention on" in page, query
        assert reverse("effect", args=[archived]) in response.content.decode()
        assert "No effect matches this filter" not in page

    # A prefix, an id that never was, or a search that finds effects: as before.
    for query in (f"id:{archived[:10]}", MISSING):
        page = html(client.get(reverse("effects"), {"q": query}))
        assert "No effect matches this filter" in page and "archived" not in page, query
    page = html(client.get(reverse("effects"), {"q": ids["o-new"]}))
    assert "archived" not in page and "No effect matches" not in page


ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "390"])
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_the_archived_page_passes_axe_and_is_photographed(
    open_page, refunds: Refunds, users, tmp_path, axe_source: str, viewport, dark: bool
) -> None:
    archived = refunds.ids()["o-1"]
    archive(site_ledger.ledger_target(), tmp_path)
    page = open_page(viewport, dark=dark)
    sign_in_with(page, "viewer", PASSWORD)

    answer = page.goto(reverse("effect", args=[archived]))

    assert answer is not None and answer.status == 410
    expect(page.get_by_role("heading", level=1)).to_contain_text("stripe.refund")
    expect(page.get_by_role("heading", name="To restore it")).to_be_visible()
    assert serious_violations(page, axe_source) == []
    overflow = page.evaluate(
        "document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls {overflow} px sideways at {viewport['width']} px"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"console-archived-{viewport['width']}-{'dark' if dark else 'light'}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
