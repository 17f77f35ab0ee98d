"""The console's third pass, finding and time (issue 21, items 7 and 8): every time in UTC,
labelled, the same in the list, on the effect's page and in the filter that finds it;
relative time filters; a run's timeline; ``state:`` terms in the search box; the effects
list as CSV and JSON; one row per prober on the reconciler page; the pager's position;
an id pasted without ``eff_``; a non-integer amount refused; a 403 logged as one line.
View tests with Django's client, browser tests in Chromium under the deployment's CSP.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import DESKTOP, PHONE
from django.urls import reverse
from playwright.sync_api import Page, expect
from test_console_ux_browser import serious_violations
from test_console_views import (
    PASSWORD,
    Agent,
    client_for,
    fresh_ledger,
    html,
    make_users,
)

from console import selectors
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core.errors import ProbeTransientError
from openonce_core.testing import FakeClock
from openonce_site import urls as site_urls
from reconciler import probes
from reconciler.models import ProberStatus
from tests.support.browser import sign_in_with

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"

# The site's URLs with the console's 403 handler, whether or not the site's URLconf names
# it yet (openonce_site/urls.py: handler403 = "console.views.permission_denied").
urlpatterns = site_urls.urlpatterns
handler403 = getattr(site_urls, "handler403", "console.views.permission_denied")

# 2027-01-15 08:00:00 UTC: a moment whose local rendering differs in every zone but UTC.
KNOWN = 1_800_000_000.0
KNOWN_TEXT = "2027-01-15 08:00:00 UTC"


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


def rows_of(page: str) -> list[str]:
    """The effect ids the list shows, in order."""
    return re.findall(r'data-row-link href="/effects/(eff_[0-9a-f]+)/"', page)


# -- time -----------------------------------------------------------------------------------


def test_a_time_reads_the_same_in_the_list_on_the_effect_and_in_the_filter(
    agent: Agent, users
) -> None:
    then = Agent(clock=FakeClock(KNOWN)).pending(charge="ch_known", amount=100)
    client = client_for(users["viewer"])

    listed = html(client.get(reverse("effects"), {"tool": "stripe.refund"}))
    detail = html(client.get(reverse("effect", args=[then])))
    shown = f'<span class="utc">{KNOWN_TEXT}</span>'
    assert shown in listed and shown in detail
    # No element a script would rewrite into the viewer's zone.
    assert "<time datetime" not in listed and "<time datetime" not in detail

    # The filter reads the same digits as UTC: from that second on finds it, before it not.
    found = html(client.get(reverse("effects"), {"created_from": "2027-01-15T08:00:00"}))
    assert rows_of(found) == [then]
    before = html(client.get(reverse("effects"), {"created_to": "2027-01-15T08:00:00"}))
    assert then not in rows_of(before)
    assert "Created from (UTC)" in listed and "Times are UTC" in listed


def test_relative_filters_on_the_effects_list(agent: Agent, users) -> None:
    old = Agent(clock=FakeClock(time.time() - 2 * 3600)).pending(charge="ch_old", amount=1)
    week_old = Agent(clock=FakeClock(time.time() - 8 * 86400)).pending(charge="ch_w", amount=3)
    fresh = agent.pending(charge="ch_new", amount=2)
    client = client_for(users["admin"])

    assert rows_of(html(client.get(reverse("effects"), {"last": "1h"}))) == [fresh]
    assert rows_of(html(client.get(reverse("effects"), {"last": "24h"}))) == [fresh, old]
    assert rows_of(html(client.get(reverse("effects"), {"last": "7d"}))) == [fresh, old]
    today = rows_of(html(client.get(reverse("effects"), {"last": "today"})))
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert fresh in today and week_old not in today
    assert (old in today) == (agent.oo.get(old).created_at >= midnight.timestamp())

    page = html(client.get(reverse("effects"), {"last": "1h", "tool": "stripe.*"}))
    assert 'aria-current="true">Last hour<' in page
    assert "created since " in page and " UTC" in page
    # A bulk action counts what the page counted: the window as an absolute UTC time.
    bounds = re.findall(r'name="created_from" value="([^"]+)"', page)
    assert len(bounds) == 1
    assert datetime.fromisoformat(bounds[0] + "+00:00") > datetime.now(UTC) - timedelta(minutes=61)

    response = client.get(reverse("effects"), {"last": "a while"})
    assert response.status_code == 400
    assert "“last” must be one of 1h, 24h, today, 7d" in html(response)
    assert rows_of(html(response)) == []


def test_relative_filters_on_the_audit_log_and_its_export(agent: Agent, users) -> None:
    earlier = Agent(clock=FakeClock(time.time() - 3 * 3600))
    first = earlier.pending(charge="ch_a", amount=1)
    earlier.oo.approve(first, by="approver", reason="then")
    second = agent.pending(charge="ch_b", amount=2)
    agent.oo.deny(second, by="approver", reason="now")
    client = client_for(users["admin"])

    page = html(client.get(reverse("audit"), {"last": "1h"}))
    assert second in page and first not in page
    assert 'aria-current="true">Last hour<' in page
    page = html(client.get(reverse("audit"), {"last": "24h"}))
    assert second in page and first in page

    rows = list(csv.reader(io.StringIO(html(client.get(reverse("audit-csv"), {"last": "1h"})))))
    assert [r[2] for r in rows[1:]] == [second]
    assert client.get(reverse("audit"), {"last": "forever"}).status_code == 400
    assert client.get(reverse("audit-csv"), {"last": "forever"}).status_code == 400


# -- a run's timeline -------------------------------------------------------------------------


def test_a_run_timeline_lists_every_effect_of_the_run_in_order_with_its_moves(
    agent: Agent, users
) -> None:
    with agent.oo.scope("run-2026-12-03-a"):
        refund = agent.pending(charge="ch_run", amount=900)
        charge = agent.unknown("stripe.charge", order="o-run", amount=900)
    other = agent.pending(charge="ch_other", amount=1)
    agent.oo.approve(refund, by="approver", reason="looks right")
    client = client_for(users["viewer"])

    page = html(client.get(reverse("run"), {"scope": "run-2026-12-03-a"}))
    assert rows_of(page) == [refund, charge]  # oldest first
    assert other not in page
    steps = page.split('<li class="card" data-row>')[1:]
    # Each effect with its moves, as the journal has them.
    assert "requires_approval" in steps[0] and "operator:approver" in steps[0]
    assert "looks right" in steps[0]
    assert "started" in steps[1] and "unknown" in steps[1]
    assert "Effects</dt>\n    <dd>2" in page

    # Reachable from the list: the scope links to it.
    listed = html(client.get(reverse("effects")))
    assert 'href="/run/?scope=run-2026-12-03-a"' in listed
    assert client.get(reverse("run")).status_code == 400
    empty = html(client.get(reverse("run"), {"scope": "no-such-run"}))
    assert "No effect has this scope" in empty


# -- the search box ---------------------------------------------------------------------------


def test_state_tool_and_scope_terms_in_the_search_box(agent: Agent, users) -> None:
    with agent.oo.scope("run-s"):
        unknown = agent.unknown("stripe.charge", order="o-s", amount=5)
    other_unknown = agent.unknown("ledger.sync", order="o-t")
    pending = agent.pending(charge="ch_s", amount=5)
    client = client_for(users["viewer"])

    def search(q: str) -> list[str]:
        response = client.get(reverse("effects"), {"q": q})
        assert response.status_code == 200, html(response)
        return rows_of(html(response))

    assert set(search("state:unknown")) == {unknown, other_unknown}
    assert search("state:UNKNOWN tool:stripe.*") == [unknown]
    assert search("scope:run-s state:unknown") == [unknown]
    assert search("state:requires_approval") == [pending]
    response = client.get(reverse("effects"), {"q": "state:lost"})
    assert response.status_code == 400
    assert "&#x27;lost&#x27; is not a state" in html(response)


def test_an_id_pasted_without_eff_finds_the_effect(agent: Agent, users) -> None:
    wanted = agent.pending(charge="ch_bare", amount=1)
    other = agent.pending(charge="ch_else", amount=2)
    client = client_for(users["viewer"])
    bare = wanted.removeprefix("eff_")
    for q in (bare, bare[:12]):
        page = html(client.get(reverse("effects"), {"q": q}))
        assert rows_of(page) == [wanted], q
        assert other not in page


def test_a_non_integer_amount_is_refused_with_a_clear_error(agent: Agent, users) -> None:
    made = agent.pending(charge="ch_amount", amount=12345)
    before = (agent.state(made), agent.fence(made))
    client = client_for(users["admin"])

    response = client.get(reverse("effects"), {"q": "amount=12345.5"})
    assert response.status_code == 400
    page = html(response)
    assert "&#x27;12345.5&#x27; is not a whole number" in page
    assert rows_of(page) == []  # not searched as the string "12345.5"
    bulk = client.get(reverse("bulk"), {"q": "amount=12345.5", "action": "cancel"})
    assert bulk.status_code == 400
    assert (agent.state(made), agent.fence(made)) == before  # nothing changed
    # The integer and the quoted text still search as before.
    assert rows_of(html(client.get(reverse("effects"), {"q": "amount=12345"}))) == [made]
    quoted = client.get(reverse("effects"), {"q": 'amount="12345.5"'})
    assert quoted.status_code == 200 and rows_of(html(quoted)) == []


# -- the pager's position -----------------------------------------------------------------------


def test_the_pager_says_where_the_page_is(agent: Agent, users) -> None:
    for n in range(70):
        agent.call("demo.page", n=n)
    client = client_for(users["viewer"])

    first = html(client.get(reverse("effects"), {"tool": "demo.page"}))
    assert '<span class="position">1\N{EN DASH}50 of 70</span>' in first
    older = re.search(r'rel="next" href="([^"]+)"', first)
    assert older
    second = html(client.get(older.group(1).replace("&amp;", "&")))
    assert '<span class="position">51\N{EN DASH}70 of 70</span>' in second
    assert len(rows_of(second)) == 20
    newer = re.search(r'rel="prev" href="([^"]+)"', second)
    assert newer
    back = html(client.get(newer.group(1).replace("&amp;", "&")))
    assert '<span class="position">1\N{EN DASH}50 of 70</span>' in back


# -- the effects list as a download ------------------------------------------------------------


def test_the_effects_list_exports_its_filter_as_csv_and_json(
    agent: Agent, users, monkeypatch
) -> None:
    with agent.oo.scope('=HYPERLINK("http://evil")'):
        first = agent.pending(charge="=1+2", amount=100)
    second = agent.pending(charge="ch_csv", amount=200)
    agent.call("email.send", {"message_id": "<x@y>"}, to="ann@example.com")  # not in it
    client = client_for(users["viewer"])

    response = client.get(reverse("effects-csv"), {"tool": "stripe.refund"})
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="openonce-effects.csv"'
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0][:4] == ["id", "tool", "state", "scope"]
    assert [r[0] for r in rows[1:]] == [second, first]  # newest first, as the list
    assert {r[2] for r in rows[1:]} == {"requires_approval"}
    assert rows[2][3] == '\'=HYPERLINK("http://evil")'  # no formula reaches a spreadsheet
    assert json.loads(rows[2][-1]) == {"charge": "=1+2", "amount": 100}
    assert "X-OpenOnce-Next-After" not in response

    response = client.get(reverse("effects-json"), {"q": "state:requires_approval"})
    document = json.loads(b"".join(response.streaming_content))
    assert [e["id"] for e in document["effects"]] == [second, first]
    assert document["effects"][0]["args"] == {"charge": "ch_csv", "amount": 200}
    assert document["effects"][0]["created_at"].endswith("+00:00")
    assert document["filter"] == {"q": "state:requires_approval"}
    assert document["next_after"] is None

    # Large exports stop at the limit and say where the next part starts.
    monkeypatch.setattr(selectors, "EFFECTS_EXPORT_LIMIT", 1)
    response = client.get(reverse("effects-csv"), {"tool": "stripe.refund"})
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [r[0] for r in rows[1:]] == [second]
    after = response["X-OpenOnce-Next-After"]
    rest = client.get(reverse("effects-csv"), {"tool": "stripe.refund", "after": after})
    rows = list(csv.reader(io.StringIO(b"".join(rest.streaming_content).decode())))
    assert [r[0] for r in rows[1:]] == [first]

    page = html(client.get(reverse("effects"), {"tool": "stripe.refund"}))
    assert 'href="/effects.csv?tool=stripe.refund"' in page
    assert client.get(reverse("effects-json"), {"q": "amount=1.5"}).status_code == 400


# -- the reconciler's probers ------------------------------------------------------------------


class ScriptedProber:
    """Answers each probe with the next of ``answers`` (a result, or an error to raise)."""

    def __init__(self, answers: list[Any], provider: str = "stripe") -> None:
        self.answers = answers
        self.provider = provider

    def probe(self, effect: Any) -> ProbeResult:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def record_probes(agent: Agent, settings: Any) -> None:
    """Five probes of a Stripe charge as the workers record them (one of each verdict, a
    429 and one held by the shared limiter), and a GitHub prober refused on its key."""
    waiting = agent.unknown("stripe.charge", order="o-p", amount=5)
    effect = agent.oo.get(waiting)
    scripted = ScriptedProber(
        [
            ProbeResult(ProbeOutcome.HAPPENED, provider_reference=effect.provider_key),
            ProbeResult(ProbeOutcome.NOT_HAPPENED, provider_reference=effect.provider_key),
            ProbeResult(ProbeOutcome.INCONCLUSIVE),
            ProbeTransientError("stripe", "429 Too Many Requests", status=429),
            ProbeTransientError("stripe", "not asked: the shared limit", sent=False),
        ]
    )
    wrapped = probes.InstrumentedProber("stripe.charge", scripted)
    for _ in range(5):
        with contextlib.suppress(ProbeTransientError):
            wrapped.probe(effect)
    assert probes.flush() == 5
    ProberStatus.objects.create(
        provider="github",
        failing=True,
        reason="401 Bad credentials",
        since=datetime(2027, 1, 15, 8, 0, tzinfo=UTC),
    )
    settings.OPENONCE_PROBERS = {
        "stripe.charge": scripted,
        "github.pr": ScriptedProber([], "github"),
    }


def test_the_reconciler_page_has_one_row_per_prober(agent: Agent, users, settings) -> None:
    record_probes(agent, settings)
    client = client_for(users["viewer"])

    page = html(client.get(reverse("reconciler")))
    stripe = page.split('id="prober-stripecharge"')[1].split("</tr>")[0]
    assert "<li>1 happened</li><li>1 not happened</li><li>1 inconclusive</li>" in stripe
    assert "2 transient" in stripe
    assert '<td data-label="Rate-limit waits" class="num">2</td>' in stripe  # 429 + limited
    assert 'href="/effects/?state=unknown&amp;tool=stripe.charge">1</a>' in stripe
    assert "not failing" in stripe and "· answered" in stripe
    assert "answer is proof" in stripe  # the evidence tier in plain words
    github = page.split('id="prober-githubpr"')[1].split("</tr>")[0]
    assert KNOWN_TEXT in github and "401 Bad credentials" in github
    assert "none yet" in github
    assert "Batches waiting" in page
    # The table polls on its own; the health panel (on the queue too) does not carry it.
    fragment = html(client.get(reverse("reconciler"), {"panel": "probers"}, HTTP_HX_REQUEST="true"))
    assert fragment.lstrip().startswith('<section id="probers-panel"')
    assert "<li>1 happened</li><li>1 not happened</li>" in fragment
    health = html(client.get(reverse("reconciler"), HTTP_HX_REQUEST="true"))
    assert 'id="health-panel"' in health and "probers-panel" not in health
    assert "prober-stripecharge" not in html(client.get(reverse("queue")))


# -- 403 ---------------------------------------------------------------------------------------


@pytest.mark.urls(__name__)
def test_a_403_is_logged_as_one_line_without_a_traceback(agent: Agent, users, caplog) -> None:
    client = client_for(users["viewer"])
    with caplog.at_level(logging.INFO):
        response = client.get(reverse("audit"), {"actor": "x"})
    assert response.status_code == 403
    assert "Not allowed" in html(response)
    request_lines = [r for r in caplog.records if r.name in ("django.request", "openonce.request")]
    assert len(request_lines) == 1
    line = request_lines[0]
    assert line.getMessage() == (
        "forbidden: user='viewer' path=/audit/ reason=you need the console.export_audit permission"
    )
    assert line.exc_info is None
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text


# -- in the browser ----------------------------------------------------------------------------


def sign_in(page: Page, username: str) -> None:
    sign_in_with(page, username, PASSWORD)


def test_in_tokyo_the_list_and_the_effect_show_the_same_utc_time(
    open_page, agent: Agent, users
) -> None:
    then = Agent(clock=FakeClock(KNOWN)).pending(charge="ch_tokyo", amount=100)
    page = open_page(timezone="Asia/Tokyo")
    sign_in(page, "viewer")
    page.goto(reverse("effects") + "?created_from=2027-01-15T08:00:00")
    # Both read as the page shows them once there (the effect's page may be mid-load
    # when its address changes): the same UTC text in the list and on the effect.
    expect(page.locator("#effect-results td[data-label=Created]").first).to_have_text(KNOWN_TEXT)
    page.locator("#effect-results a[data-row-link]").first.click()
    expect(page).to_have_url(re.compile(then))
    expect(page.locator("#context-title ~ dl .utc").first).to_have_text(KNOWN_TEXT)


def test_relative_filters_and_the_run_timeline_by_keyboard(open_page, agent: Agent, users) -> None:
    Agent(clock=FakeClock(time.time() - 2 * 3600)).pending(charge="ch_old", amount=1)
    with agent.oo.scope("run-keys"):
        first = agent.pending(charge="ch_k1", amount=1)
        agent.unknown("stripe.charge", order="o-k2", amount=2)
    page = open_page()
    sign_in(page, "viewer")
    agent.call("demo.step", n=1)  # not a stripe call: the filter leaves it out
    page.goto(reverse("effects"))
    page.get_by_label("Tool").fill("stripe.*")
    page.get_by_label("Tool").press("Enter")  # the filter swaps the results in place
    expect(page).to_have_url(re.compile(r"tool=stripe"))
    expect(page.locator("#effect-results tr[data-row]")).to_have_count(3)
    # The range keeps the filter the results show, not the one the page was loaded with.
    page.get_by_role("link", name="Last hour").click()
    expect(page).to_have_url(re.compile(r"tool=stripe.*last=1h|last=1h.*tool=stripe"))
    expect(page.locator("#effect-results tr[data-row]")).to_have_count(2)
    expect(page.get_by_role("link", name="Last hour")).to_have_attribute("aria-current", "true")

    page.get_by_role("link", name="run-keys").first.click()
    expect(page.locator("h1")).to_contain_text("run-keys")
    page.wait_for_load_state("load")  # console.js (deferred) listens for the keys by then
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(first))


def _effects_for_screens(agent: Agent) -> str:
    with agent.oo.scope("run-2026-12-03-screens"):
        agent.pending(charge="ch_screen", amount=2500)
        agent.unknown("stripe.charge", order="o-screen", amount=700)
        agent.call("email.send", {"message_id": "<m@shop.example>"}, to="ann@example.com")
    for n in range(3):
        agent.call("demo.step", n=n)
    return "run-2026-12-03-screens"


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1280", "390"])
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_find_pages_pass_axe_and_are_photographed(
    open_page, agent: Agent, users, axe_source: str, viewport: dict[str, int], dark: bool, settings
) -> None:
    run = _effects_for_screens(agent)
    record_probes(agent, settings)
    page = open_page(viewport, dark=dark)
    sign_in(page, "admin")
    width = viewport["width"]
    scheme = "dark" if dark else "light"
    for name, url in (
        ("effects", reverse("effects") + "?last=24h"),
        ("run", reverse("run") + "?scope=" + run),
        ("reconciler", reverse("reconciler")),
        ("audit", reverse("audit") + "?last=7d"),
    ):
        page.goto(url)
        assert serious_violations(page, axe_source) == [], url
        overflow = page.evaluate(
            "document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth"
        )
        assert overflow <= 0, f"{url} scrolls {overflow} px sideways at {width} px"
        if name == "reconciler" and width >= 1280:
            # The prober table reads whole on a desktop: no column behind a scroll bar.
            hidden = page.evaluate(
                "(() => { const w = document.querySelector('#probers-panel .table-wrap');"
                " return w ? w.scrollWidth - w.clientWidth : -1; })()"
            )
            assert hidden == 0, f"the prober table hides {hidden} px at {width} px"
        if name != "audit":
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / f"console-{name}-{width}-{scheme}.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
