"""A reviewer's attacks on three changes of issue 19, each written as the test that would
catch the break: an archived effect's page (console.views.answers_gone), the terminal
totals on /metrics (reconciler/metrics.py) and the daily retention's deletion of old
notification digests (notifications/retention.py).

Run on SQLite and on Postgres (OPENONCE_DATABASE); the Postgres-only attacks (the
planner's estimates) skip on SQLite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from test_console_archived import HX, MISSING, archive, ledger, refunds, users
from test_console_views import PASSWORD, client_for, html, post

from ledger import clients as site_ledger
from openonce_core import open_store
from openonce_core._retention import import_archive
from openonce_core._states import TERMINAL, EffectState
from tests.core.test_due_indexed import copies, park
from tests.daemon.test_reconciler_envelope import parse_metrics
from tests.support.browser import sign_in_with
from tests.support.retention import DAY, Refunds

pytestmark = pytest.mark.django_db(transaction=True)
S = EffectState
ROOT = Path(__file__).resolve().parents[2]
_FIXTURES = (ledger, refunds, users)  # imported for pytest, not called


def put_tombstone(target: str, effect_id: str, **fields: Any) -> None:
    """A tombstone written straight into the ledger, as a retention batch leaves it (one
    that crashed before deleting its effect, or one of a damaged ledger)."""
    row = {
        "tool": "stripe.refund",
        "idempotency_key": "k-" + effect_id[-8:],
        "effect_id": effect_id,
        "state": "committed",
        "args_fingerprint": "fp",
        "created_at": time.time() - 100 * DAY,
        "archived_at": time.time() - DAY,
        "archive": "/var/lib/openonce/archive/openonce-archive-1.jsonl.gz",
        **fields,
    }
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    store: Any = open_store(target)
    try:
        store.retention_write(
            lambda cur: cur.run(
                f"INSERT INTO openonce_tombstones ({names}) VALUES ({marks})", list(row.values())
            )
        )
    finally:
        store.close()


def text_of(response: Any) -> str:
    import re

    return re.sub(r"<[^>]+>", "", html(response))


# -- 1. an archived effect's page ---------------------------------------------------------


def test_archived_imported_and_archived_again_shows_one_page_of_the_newest(
    refunds: Refunds, users, tmp_path
) -> None:
    ids = refunds.ids()
    first = archive(site_ledger.ledger_target(), tmp_path / "first")
    import_archive(refunds.oo.store, first)
    second = archive(site_ledger.ledger_target(), tmp_path / "second")
    assert first.name != second.name or first.parent != second.parent
    stones = site_ledger.ledger_target()
    store: Any = open_store(stones)
    try:
        rows = store._all(
            "SELECT archive FROM openonce_tombstones WHERE effect_id = ?", (ids["o-1"],)
        )
    finally:
        store.close()
    assert [r[0] for r in rows] == [str(second)]  # the import lifted the first tombstone

    response = client_for(users["viewer"]).get(reverse("effect", args=[ids["o-1"]]))

    assert response.status_code == 410
    assert second.name in html(response)


def test_two_tombstones_of_one_effect_show_the_newest(ledger: str, users) -> None:
    """A damaged ledger (the model says the table does not enforce one per effect)."""
    put_tombstone(ledger, MISSING, idempotency_key="old", archived_at=1e9, archive="a/old.gz")
    put_tombstone(ledger, MISSING, idempotency_key="new", archived_at=2e9, archive="a/new.gz")

    response = client_for(users["viewer"]).get(reverse("effect", args=[MISSING]))

    assert response.status_code == 410
    assert "new.gz" in html(response) and "old.gz" not in html(response)


def test_a_tombstone_beside_a_live_effect_leaves_its_page_alone(refunds: Refunds, users) -> None:
    """A retention batch that wrote its tombstones and crashed before deleting: the effect
    is still in the ledger, and its page, poll, exports and search are the live ones."""
    live = refunds.ids()["o-new"]
    put_tombstone(site_ledger.ledger_target(), live)
    client = client_for(users["viewer"])
    url = reverse("effect", args=[live])
    fence = refunds.oo.get(live).fence

    page = client.get(url)
    assert page.status_code == 200 and "archived by the retention" not in html(page)
    assert client.get(url, {"fence": fence}, **HX).status_code == 204
    for name in ("effect-journal-csv", "effect-journal-json"):
        assert client.get(reverse(name, args=[live])).status_code == 200, name
    found = client.get(reverse("effects"), {"q": live})
    assert found.status_code == 200 and "archived" not in text_of(found)
    assert live in html(found)


def test_a_released_or_failed_tombstone_says_how_it_ended(ledger: str, users) -> None:
    put_tombstone(ledger, MISSING, state="released")

    response = client_for(users["viewer"]).get(reverse("effect", args=[MISSING]))

    assert response.status_code == 410
    assert "It ended released" in text_of(response) or "It ended Released" in text_of(response)


def test_a_future_archive_time_and_no_cache_of_the_gone_page(ledger: str, users) -> None:
    """The host that ran the retention may run an hour ahead; and no browser or proxy may
    keep the 410 (heuristically cacheable) once the archive is imported again."""
    put_tombstone(ledger, MISSING, archived_at=time.time() + 3600, created_at=time.time() + 7200)

    response = client_for(users["viewer"]).get(reverse("effect", args=[MISSING]))

    assert response.status_code == 410
    assert "no-store" in response["Cache-Control"]
    assert "archived by the retention on" in text_of(response)


HOSTILE = '<script>alert("x")</script>'


def test_html_in_the_tombstone_is_shown_as_text(ledger: str, users) -> None:
    put_tombstone(
        ledger,
        MISSING,
        tool=HOSTILE,
        idempotency_key='"><img src=x onerror=alert(1)>',
        archive='C:\\Archives\\<b onmouseover="alert(1)">x</b>.jsonl.gz',
    )
    client = client_for(users["viewer"])

    for response in (
        client.get(reverse("effect", args=[MISSING])),
        client.get(reverse("effect", args=[MISSING]), {"fence": 1}, **HX),
        client.get(reverse("effect-journal-json", args=[MISSING])),
    ):
        body = html(response)
        assert response.status_code == 410
        assert "<script>alert" not in body and "<img src=x" not in body
        assert "<b onmouseover" not in body and "C:" not in body and "Archives" not in body
        assert "&lt;script&gt;" in body
    search = client.get(reverse("effects"), {"q": MISSING})
    assert search.status_code == 200 and "<script>alert" not in html(search)


@pytest.mark.parametrize(
    ("archive_path", "shown"),
    [
        ("D:\\openonce\\archives\\openonce-archive-7.jsonl.gz", "openonce-archive-7.jsonl.gz"),
        ("openonce-archive-8.jsonl.gz", "openonce-archive-8.jsonl.gz"),
        ("", "not recorded"),
    ],
    ids=["windows", "no-folder", "empty"],
)
def test_the_archive_file_name_without_its_folder(ledger: str, users, archive_path, shown):
    put_tombstone(ledger, MISSING, archive=archive_path)

    response = client_for(users["viewer"]).get(reverse("effect", args=[MISSING]))

    assert response.status_code == 410
    page = text_of(response)
    assert shown in page
    assert "openonce\\archives" not in page and "D:" not in page
    if not archive_path:
        assert "retention import FILE" in page


ODD_IDS = [
    quote("eff_a/b", safe=""),  # an encoded slash: a path segment of its own
    quote("eff_é☃", safe=""),
    "eff_" + "a" * 250,
    "eff_a%00b",
    quote("eff_\ud800", safe="", errors="surrogatepass"),
]


@pytest.mark.parametrize("odd", ODD_IDS, ids=["slash", "unicode", "long", "nul", "surrogate"])
def test_odd_ids_are_404_never_an_error(ledger: str, users, odd: str) -> None:
    client = client_for(users["viewer"])
    for suffix, extra in (("", {}), ("?fence=1", HX), ("journal.csv", {}), ("journal.json", {})):
        response = client.get(f"/effects/{odd}/{suffix}", **extra)
        assert response.status_code in (400, 404), (suffix, response.status_code)


@pytest.mark.parametrize(
    "query", ["id:eff_a/b", "eff_é☃", "id:eff_" + "a" * 250, "id:" + "a" * 196, "id:a\x00b"]
)
def test_odd_ids_in_the_search_box_are_answered(ledger: str, users, query: str) -> None:
    put_tombstone(ledger, "eff_" + "a" * 196)  # an id of exactly 200 characters, archived
    response = client_for(users["viewer"]).get(reverse("effects"), {"q": query})
    assert response.status_code in (200, 400)


def test_an_archived_id_in_the_search_box_links_to_its_page_even_with_odd_characters(
    ledger: str, users
) -> None:
    """An archive imported from elsewhere, or an older ledger, may name an effect whose id
    the console's URL pattern (<str:effect_id>: no slash) cannot hold: the search must not
    be a server error."""
    put_tombstone(ledger, "eff_a/b")
    response = client_for(users["viewer"]).get(reverse("effects"), {"q": "id:eff_a/b"})
    assert response.status_code == 200


def test_who_may_learn_that_an_effect_was_archived(refunds: Refunds, users, tmp_path) -> None:
    archived = refunds.ids()["o-1"]
    archive(site_ledger.ledger_target(), tmp_path)
    urls = [
        reverse("effect", args=[archived]),
        reverse("effect-journal-csv", args=[archived]),
        reverse("effect-journal-json", args=[archived]),
    ]
    for url in urls:
        anonymous = client_for(None).get(url)
        assert anonymous.status_code == 302, url
        assert anonymous["Location"].startswith(reverse("login"))
        norole = client_for(users["norole"]).get(url)
        assert norole.status_code == 403 and "archived" not in html(norole), url
        assert client_for(users["viewer"]).get(url).status_code == 410, url
    search = client_for(users["norole"]).get(reverse("effects"), {"q": archived})
    assert search.status_code == 403 and "archived" not in html(search)
    anonymous = client_for(None).get(reverse("effects"), {"q": archived})
    assert anonymous.status_code == 302


@pytest.mark.parametrize(
    "name", ["approve", "deny", "resolve-happened", "resolve-not-happened", "cancel"]
)
def test_a_decision_on_an_archived_effect_says_it_was_archived(
    refunds: Refunds, users, tmp_path, name: str
) -> None:
    """A page left open on the effect posts a decision after the retention archived it:
    the answer must say where it went (410, and HX-Refresh for htmx so the page reloads
    as the archived page), not the 404 of an id that never was, which htmx does not swap
    (the click would do nothing the person can see)."""
    archived = refunds.ids()["o-1"]
    archive(site_ledger.ledger_target(), tmp_path)
    client = client_for(users["admin"])
    url = reverse(name, args=[archived])

    form = {"fence": 3, "confirm": "on", "reason": "late click"}
    plain = post(client, url, form)
    poll = post(client, url, form, **HX)

    assert plain.status_code == 410, plain.status_code
    assert "archived by the retention" in html(plain)
    assert poll.status_code == 410 and poll.get("HX-Refresh") == "true"


def test_the_reloaded_page_of_an_archived_effect_polls_no_more(
    refunds: Refunds, users, tmp_path
) -> None:
    archived = refunds.ids()["o-1"]
    fence = refunds.oo.get(archived).fence
    archive(site_ledger.ledger_target(), tmp_path)
    client = client_for(users["viewer"])
    url = reverse("effect", args=[archived])

    poll = client.get(url, {"fence": fence}, **HX)
    reloaded = client.get(url)  # what HX-Refresh makes the browser load

    assert poll.status_code == 410 and poll["HX-Refresh"] == "true"
    assert reloaded.status_code == 410 and "HX-Refresh" not in reloaded
    page = html(reloaded)
    assert "data-effect-poll" not in page and "every " not in page.split("<main", 1)[1]


def test_an_open_page_becomes_the_archived_page_in_the_browser(
    open_page, refunds: Refunds, users, tmp_path
) -> None:
    """The real htmx: its 5 s poll gets 410 with HX-Refresh, the browser loads the page
    again, and the archived page it shows no longer polls (no reload loop)."""
    from playwright.sync_api import expect

    archived = refunds.ids()["o-1"]
    page = open_page()
    sign_in_with(page, "viewer", PASSWORD)
    page.goto(reverse("effect", args=[archived]))
    expect(page.locator("[data-effect-poll]")).to_have_count(1)

    # The reload's load event, not the heading: the heading is visible while the
    # reloaded document is still loading, before its load event has fired.
    with page.expect_event("load", timeout=20_000):
        archive(site_ledger.ledger_target(), tmp_path)

    assert page.url.endswith(reverse("effect", args=[archived]))
    expect(page.get_by_role("heading", name="To restore it")).to_be_visible()
    expect(page.locator("[data-effect-poll]")).to_have_count(0)
    expect(page.locator("[hx-trigger]")).to_have_count(0)


# -- 2. /metrics terminal totals ----------------------------------------------------------


@pytest.fixture
def metrics_ledger(ledger: str, settings) -> Iterator[Any]:
    """The site's ledger client on the emptied test database's ledger."""
    from ledger.clients import get_openonce

    settings.OPENONCE_PROBERS = "tests.support.probers:PROBERS"
    settings.OPENONCE_GRACE_SECONDS = None
    yield get_openonce()


def effects_metric(client: Any) -> tuple[dict[Any, float], str]:
    page = client.get("/metrics")
    assert page.status_code == 200
    text = page.content.decode()
    return parse_metrics(text), text


def committed(m: dict[Any, float]) -> float:
    return m[("openonce_effects", (("state", "committed"),))]


def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the planner's estimates are Postgres's")


def test_without_the_planners_figures_terminal_totals_are_counted(
    metrics_ledger, client, monkeypatch
) -> None:
    """SQLite and the in-memory store have no estimates; on Postgres, a table never
    analyzed (reltuples -1) has none either: counted exactly, whatever EXACT_LIMIT."""
    from reconciler import metrics

    oo = metrics_ledger
    at = oo.clock.now()
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 6)
    monkeypatch.setattr(metrics, "EXACT_LIMIT", 0)
    if connection.vendor == "postgresql":
        with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
            (tuples,) = conn.execute(
                "SELECT reltuples FROM pg_class WHERE oid = 'openonce_effects'::regclass"
            ).fetchone()
        if tuples >= 0:
            pytest.skip("autovacuum analyzed the table first")

    m, page = effects_metric(client)

    assert committed(m) == 7
    assert "counted, at most every 60s" in page


def test_a_table_vacuumed_but_not_analyzed_is_counted_not_estimated_as_empty(
    metrics_ledger, client, monkeypatch
) -> None:
    """VACUUM (and a pg_upgrade, which keeps pg_class but not the statistics) sets
    reltuples while pg_stats has no row for the state column: the estimate then reads
    every terminal state as 0 — a million committed effects shown as none."""
    postgres_only()
    from reconciler import metrics

    oo = metrics_ledger
    at = oo.clock.now()
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 149)
    with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
        conn.execute("VACUUM openonce_effects")  # reltuples
        # ... and no statistics, as after pg_upgrade: an earlier test's ANALYZE of this
        # table (a TRUNCATE keeps them) would otherwise still be there.
        conn.execute("DELETE FROM pg_statistic WHERE starelid = 'openonce_effects'::regclass")
        stats = conn.execute(
            "SELECT count(*) FROM pg_stats WHERE tablename = 'openonce_effects'"
            " AND attname = 'state' AND schemaname = current_schema()"
        ).fetchone()
    assert stats == (0,)
    monkeypatch.setattr(metrics, "EXACT_LIMIT", 100)

    m, page = effects_metric(client)

    assert committed(m) == 150, page.splitlines()[:3]


def test_a_column_of_one_state_is_estimated_whole(metrics_ledger, client, monkeypatch) -> None:
    postgres_only()
    from reconciler import metrics

    oo = metrics_ledger
    at = oo.clock.now()
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 199)
    with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
        conn.execute("ANALYZE openonce_effects")
    monkeypatch.setattr(metrics, "EXACT_LIMIT", 100)

    m, page = effects_metric(client)

    assert "estimated by Postgres's planner" in page
    assert committed(m) == 200
    assert m[("openonce_effects", (("state", "failed"),))] == 0


@pytest.fixture
def schema_dsn(request: pytest.FixtureRequest, transactional_db: None) -> str:
    """tests/conftest.py's ``pg_dsn`` (a schema of its own), on Postgres runs only."""
    postgres_only()
    return str(request.getfixturevalue("pg_dsn"))


def test_estimates_read_the_ledgers_own_schema(schema_dsn: str) -> None:
    """A ledger in a schema of its own (search_path), beside another ledger whose
    statistics say something else: the estimates are this one's."""
    from openonce_core import OpenOnce

    oo = OpenOnce(schema_dsn, retry_delay=0, migrate=True)
    try:
        at = oo.clock.now()
        copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 119)
        copies(oo, park(oo, "ledger.sync", at - 3600, state=S.CANCELLED), 29)
        oo.store._with_cursor(lambda cur: cur.execute("ANALYZE openonce_effects"))
        with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
            conn.execute("ANALYZE openonce_effects")  # the site's ledger: other figures

        rows, counts = oo.store.estimated_counts(TERMINAL)
    finally:
        oo.close()

    assert rows == 150
    assert counts["committed"] == 120 and counts["cancelled"] == 30 and counts["failed"] == 0


def test_a_ledger_clock_stepping_back_takes_the_totals_again(
    metrics_ledger, client, monkeypatch
) -> None:
    oo = metrics_ledger
    at = oo.clock.now()
    park(oo, "ledger.sync", at - 3600, state=S.COMMITTED)
    assert committed(effects_metric(client)[0]) == 1
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 2)
    now = oo.clock.now
    monkeypatch.setattr(oo.clock, "now", lambda: now() - 30)  # NTP stepped it back

    assert committed(effects_metric(client)[0]) == 4


def test_a_shorter_ttl_applies_to_totals_taken_under_a_longer_one(
    metrics_ledger, client, settings, monkeypatch
) -> None:
    oo = metrics_ledger
    at = oo.clock.now()
    settings.OPENONCE_METRICS_TERMINAL_SECONDS = 3600.0
    park(oo, "ledger.sync", at - 3600, state=S.COMMITTED)
    assert committed(effects_metric(client)[0]) == 1
    copies(oo, park(oo, "ledger.sync", at - 3600, state=S.COMMITTED), 2)
    settings.OPENONCE_METRICS_TERMINAL_SECONDS = 10.0
    now = oo.clock.now
    monkeypatch.setattr(oo.clock, "now", lambda: now() + 11)

    m, page = effects_metric(client)

    assert committed(m) == 4 and "at most every 10s" in page
    settings.OPENONCE_METRICS_TERMINAL_SECONDS = 0.0
    m, _ = effects_metric(client)
    assert not [k for k in m if k[0] == "openonce_effects" and k[1][0][1] in TERMINAL]


@pytest.mark.parametrize("value", ["-1", "abc", "inf", "nan", "-0.5"])
def test_a_bad_terminal_seconds_is_refused_at_start_up(value: str) -> None:
    env = {**os.environ, "OPENONCE_METRICS_TERMINAL_SECONDS": value}
    env["DJANGO_SETTINGS_MODULE"] = "openonce_site.settings.test"
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0
    last = started.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last and "OPENONCE_METRICS_TERMINAL_SECONDS" in last


# -- 3. old notification digests ----------------------------------------------------------


def digest(window: int, created_at: float, status: str = "sent", **more: Any) -> Any:
    from notifications.models import Digest

    fields: dict[str, Any] = {
        "channel": "ops", "kind": "webhook", "destination": "https://hooks.example.com/…",
        "status": status, "window": window, "interval": 300.0, "count": 1, "attempts": 1,
        "next_attempt_at": created_at, "created_at": created_at, "sent_at": created_at + 1,
    }  # fmt: skip
    return Digest.objects.create(**{**fields, **more})


def test_a_digest_being_sent_or_named_is_kept(ledger: str) -> None:
    from notifications.models import Delivery, Digest
    from notifications.retention import forget_old_digests

    old = time.time() - 100 * DAY
    claimed = digest(1, old, status="pending", claimed_until=time.time() + 60)
    retrying = digest(2, old, status="pending", claimed_until=None)
    named = digest(3, old)
    Delivery.objects.create(
        effect_id=MISSING, journal_seq=1, event="requires_approval", tool="stripe.refund",
        channel="ops", kind="webhook", destination="https://hooks.example.com/…",
        status="sent", attempts=1, next_attempt_at=0.0, created_at=old, sent_at=old,
        digest=named,
    )  # fmt: skip
    gone = digest(4, old)

    assert forget_old_digests(time.time() - 90 * DAY) == 1

    left = set(Digest.objects.values_list("pk", flat=True))
    assert left == {claimed.pk, retrying.pk, named.pk} and gone.pk not in left


def test_digests_on_the_cutoff_and_from_a_clock_ahead(ledger: str) -> None:
    from notifications.models import Digest
    from notifications.retention import forget_old_digests

    cutoff = time.time() - 90 * DAY
    on = digest(1, cutoff)
    before = digest(2, cutoff - 0.001)
    ahead = digest(3, time.time() + DAY)  # a notifier whose clock runs a day ahead

    assert forget_old_digests(cutoff) == 1

    assert set(Digest.objects.values_list("pk", flat=True)) == {on.pk, ahead.pk}
    assert not Digest.objects.filter(pk=before.pk).exists()


def test_thousands_of_old_digests_go_in_chunks_that_end(ledger: str) -> None:
    from notifications.models import Digest
    from notifications.retention import CHUNK, forget_old_digests

    old = time.time() - 100 * DAY
    n = 2 * CHUNK + 37
    Digest.objects.bulk_create(
        [
            Digest(
                channel="ops",
                kind="webhook",
                destination="d",
                status="sent",
                window=i,
                interval=300.0,
                count=1,
                attempts=1,
                next_attempt_at=old,
                created_at=old,
            )
            for i in range(n)
        ],
        batch_size=200,
    )
    young = digest(n + 1, time.time())

    with CaptureQueriesContext(connection) as ran:
        assert forget_old_digests(time.time() - 90 * DAY) == n

    assert list(Digest.objects.values_list("pk", flat=True)) == [young.pk]
    chunks = -(-n // CHUNK)
    # A fixed number of statements per chunk, whatever it holds (today 9 on SQLite: the
    # ids, the rows whole, BEGIN, the deliveries' SET NULL, a DELETE per 100), never one
    # per digest; one empty select ends the loop.
    assert len(ran.captured_queries) <= 10 * chunks + 1, len(ran.captured_queries)


def test_with_the_retention_off_old_digests_stay(ledger: str, settings) -> None:
    """OPENONCE_RETENTION_DAYS=0 keeps everything: the deliveries a digest lists stay too,
    so deleting their digests would leave their pages without the attempts."""
    from notifications.models import Digest
    from reconciler.retention import retention

    settings.OPENONCE_RETENTION_DAYS = 0
    settings.OPENONCE_RETENTION_ARCHIVE_DIR = Path("/nonexistent-archive-dir")
    kept = digest(1, time.time() - 1000 * DAY)

    retention.apply()

    assert list(Digest.objects.values_list("pk", flat=True)) == [kept.pk]


def test_a_digest_deleted_while_the_notifier_settles_it(ledger: str, monkeypatch) -> None:
    """A digest claimed before the cutoff and still pending (the notifier was stopped, its
    deliveries archived since) is settled by the notifier while the retention runs: the
    retention may delete it the moment it is given up or sent, before the notifier reads
    it back to copy its outcome to its deliveries. The notifier's tick must not fail."""
    from notifications import dispatch
    from notifications.models import Digest
    from notifications.retention import forget_old_digests

    old = time.time() - 100 * DAY
    digest(1, old, status="pending", attempts=0, sent_at=None)
    real = dispatch._attempt

    def attempt_then_retention(*args: Any) -> str:
        status = real(*args)
        forget_old_digests(time.time() - 90 * DAY)  # the daily task, on another worker
        return status

    monkeypatch.setattr(dispatch, "_attempt", attempt_then_retention)

    assert dispatch._send_digests({}, time.time(), 10) == (0, 1)  # its channel is gone
    assert not Digest.objects.exists()


# -- 5. an export address with before= ----------------------------------------------------


def test_an_export_with_before_is_refused_not_silently_started_from_the_newest(
    refunds: Refunds, users, monkeypatch
) -> None:
    """The list's page links carry before=; an export pages only forward (after=). A
    hand-made export address with before= used to be answered from the newest row, as if
    before were not there: a download that was not what was asked for."""
    from console import selectors

    client = client_for(users["viewer"])
    monkeypatch.setattr(selectors, "EFFECTS_EXPORT_LIMIT", 1)
    first = client.get(reverse("effects-csv"))
    cursor = first["X-OpenOnce-Next-After"]
    for name in ("effects-csv", "effects-json"):
        refused = client.get(reverse(name), {"before": cursor})
        assert refused.status_code == 400
        assert "leave before out" in text_of(refused)
        assert "after" in text_of(refused)
    rest = client.get(reverse("effects-csv"), {"after": cursor})
    assert rest.status_code == 200
