"""Find anything: the search box (effect id full or prefix, idempotency key and scope
prefixes, tool globs, argument values), the list's pager both ways with counts, the
audit log's filters; each query served by an index (checked with EXPLAIN on Postgres),
and the SQLite fallback in a real SQLite deployment (a subprocess on its own ledger).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from test_console_views import UNKNOWN, Agent, client_for, decide, fresh_ledger, html, make_users

from console import search, selectors
from ledger.models import JournalEntry

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


def found(client: Any, q: str, **more: str) -> str:
    response = client.get(reverse("effects"), {"q": q, **more})
    assert response.status_code == 200, html(response)
    return html(response)


def test_one_box_finds_by_id_prefix_key_scope_tool_glob_and_argument(agent: Agent, users) -> None:
    with agent.oo.scope("run-2026-12-01-a"):
        refund = agent.call("stripe.refund", charge="ch_search", amount=700)
    charge = agent.call("stripe.charge", UNKNOWN, order="ord-77", amount=2500)
    email = agent.call("email.send", {"message_id": "<m@x>"}, to="ann@example.com")
    client = client_for(users["viewer"])

    page = found(client, refund[:12])  # a pasted, shortened effect id
    assert refund in page and charge not in page and email not in page
    page = found(client, refund)  # the full id
    assert refund in page and "<strong>1</strong> effect matches" in page
    page = found(client, "stripe.*")
    assert refund in page and charge in page and email not in page
    page = found(client, "email.sen?")
    assert email in page and refund not in page
    page = found(client, "order=ord-77")
    assert charge in page and refund not in page
    page = found(client, "amount=2500")  # an integer, as JSON
    assert charge in page and refund not in page
    page = found(client, 'amount="2500"')  # the string "2500" is another value
    assert charge not in page
    page = found(client, "run-2026-12")  # a scope prefix
    assert refund in page and charge not in page
    key = agent.oo.get(email).idempotency_key
    page = found(client, key[:8])  # an idempotency key prefix
    assert email in page and refund not in page
    page = found(client, "key:" + key[:8])
    assert email in page
    page = found(client, "stripe.charge")  # an exact tool name
    assert charge in page and refund not in page
    # A prefix search takes % and _ literally.
    assert "No effect matches" in found(client, "k-%")
    # Search combines with the other filters.
    page = found(client, "stripe.*", state="unknown")
    assert charge in page and refund not in page


def test_a_query_that_cannot_be_read_is_a_form_error(agent: Agent, users) -> None:
    response = client_for(users["viewer"]).get(reverse("effects"), {"q": 'order="42'})
    assert response.status_code == 400
    assert "close the quotes" in html(response)


def test_the_pager_goes_both_ways_and_counts_up_to_a_bound(
    agent: Agent, users, monkeypatch
) -> None:
    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    made = [agent.call("demo.step", n=n) for n in range(5)]
    newest_first = made[::-1]
    client = client_for(users["viewer"])

    page = html(client.get(reverse("effects"), {"tool": "demo.step"}))
    assert "<strong>5</strong> effects match; showing 2." in page
    assert 'aria-disabled="true">← Newer' in page  # the first page has no previous
    pages = [newest_first[:2]]
    for _ in range(2):
        url = re.search(r'<a rel="next" href="([^"]+)"', page)[1].replace("&amp;", "&")
        page = html(client.get(url))
        pages.append([e for e in newest_first if e in page])
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]
    assert 'aria-disabled="true">Older →' in page  # the last page has no next
    # Back again, page by page, to the first.
    back = []
    for _ in range(2):
        url = re.search(r'<a rel="prev" href="([^"]+)"', page)[1].replace("&amp;", "&")
        assert "before=" in url and "tool=demo.step" in url
        page = html(client.get(url))
        back.append([e for e in newest_first if e in page])
    assert back == [newest_first[2:4], newest_first[0:2]]
    assert 'rel="prev"' not in page

    monkeypatch.setattr(selectors, "LIST_COUNT_CAP", 3)
    page = html(client.get(reverse("effects"), {"tool": "demo.step"}))
    assert "<strong>3+</strong> effects match" in page


def test_the_audit_log_filters_by_actor_action_tool_and_time(agent: Agent, users) -> None:
    refund = agent.pending(charge="ch_a", amount=1)
    wire = agent.pending("wire.transfer", account="acc-1", amount=5)
    unknown = agent.unknown("ledger.sync", order="o-a")
    admin = client_for(users["admin"])
    approver = client_for(users["approver"])
    assert decide(approver, "approve", refund, agent.fence(refund)).status_code == 302
    assert decide(admin, "deny", wire, agent.fence(wire), reason="no").status_code == 302
    rearm = {"reason": "not in the ledger", "override": "on"}
    assert (
        decide(admin, "resolve-not-happened", unknown, agent.fence(unknown), **rearm).status_code
        == 302
    )

    def audit(**query: str) -> str:
        response = admin.get(reverse("audit"), query)
        assert response.status_code == 200
        return html(response)

    page = audit(actor="approver")
    assert refund in page and wire not in page
    page = audit(action="deny")
    assert wire in page and refund not in page
    page = audit(tool="stripe.*")
    assert refund in page and wire not in page and unknown not in page
    page = audit(action="resolve-not-happened")
    assert unknown in page and "override</span>" in page  # the override is visible
    assert "<strong>3</strong> decisions match" in audit()
    assert "No operator decision matches." in audit(since="2999-01-01T00:00")
    assert refund in audit(until="2999-01-01T00:00")
    # Exports follow the filter.
    document = json.loads(admin.get(reverse("audit-json"), {"actor": "admin"}).content)
    assert {j["effect_id"] for j in document["journal"]} == {wire, unknown}


def explain(rows: Any) -> str:
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        # An empty table is read sequentially whatever the indexes: ask whether an index
        # can serve the condition at all.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


EXPLAINS = [
    ("id", "eff_3f2a", "openonce_effects_id_prefix"),
    ("key", "refund-", "openonce_effects_key"),
    ("scope", "run-2026", "openonce_effects_scope"),
    ("arg", "charge=ch_1", "openonce_effects_args"),
]


@pytest.mark.parametrize(("kind", "text", "index"), EXPLAINS)
def test_each_search_kind_is_served_by_its_index(agent: Agent, kind: str, text: str, index: str):
    parsed = search.parse(f"{kind}:{text}")
    rows = selectors._filtered(selectors.EffectFilter(search=parsed), 0.0)
    plan = explain(rows.values("id"))
    assert index in plan, plan


def test_journal_reads_are_served_by_the_journal_key(agent: Agent) -> None:
    """The journal has one index for agents' lines, its key (effect_id, seq): an effect's
    lines, its newest lines, and the first line of each effect on a page all use it."""
    refund = agent.call("stripe.refund", charge="ch_key", amount=100)
    lines = JournalEntry.objects.filter(effect_id=refund)
    assert "openonce_journal_pkey" in explain(lines.order_by("seq"))
    assert "openonce_journal_pkey" in explain(lines.order_by("-seq")[:50])
    firsts = JournalEntry.objects.filter(effect_id__in=[refund], seq__in=[1, 2])
    assert "openonce_journal_pkey" in explain(firsts.values_list("effect_id", "actor"))
    assert selectors.first_actors([refund]) == {refund: (lines.order_by("seq")[0].actor, "")}


def test_a_tool_glob_is_the_tools_it_matches(agent: Agent) -> None:
    for tool in ("stripe.refund", "stripe.charge", "email.send", "stripe"):
        agent.call(tool, x=1)
    assert selectors.distinct_tools() == ["email.send", "stripe", "stripe.charge", "stripe.refund"]
    assert selectors.matching_tools("stripe.*") == ["stripe.charge", "stripe.refund"]
    assert selectors.matching_tools("stripe.refund") == ["stripe.refund"]
    assert selectors.matching_tools("nothing.*") == []


SQLITE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    from openonce_core import OpenOnce
    from ledger.clients import get_openonce
    from console import search, selectors

    import inspect

    oo = OpenOnce(get_openonce().store)
    ids = {}
    for name, tool, args in [
        ("refund", "stripe.refund", {"charge": "ch_1", "amount": 700}),
        ("charge", "stripe.charge", {"order": "ord-77", "amount": 2500, "live": True}),
        ("other", "stripe.charge", {"order": "ord-78", "amount": "2500"}),
        ("email", "email.send", {"to": "ann@example.com", "meta": {"lang": "de"}}),
    ]:
        def handler(**kwargs):
            return {"ok": True}
        handler.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in args]
        )
        oo.effect(handler, tool=tool, idempotency_key=lambda name=name, **a: name)(**args)
        ids[name] = oo.store.find(tool, name).id

    def find(q):
        page = selectors.effect_page(selectors.EffectFilter(search=search.parse(q)))
        return sorted(n for n, i in ids.items() if i in {e.id for e in page.effects})

    print(json.dumps({
        "id": find(ids["refund"][:10]),
        "glob": find("stripe.*"),
        "int": find("amount=2500"),
        "str": find('amount="2500"'),
        "bool": find("live=true"),
        "nested": find("meta.lang=de"),
        "key": find("key:ema"),
        "count": str(selectors.effect_page(selectors.EffectFilter()).total),
    }))
    """
)


def test_search_works_on_a_sqlite_ledger_too(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "openonce_site.settings.test",
        "OPENONCE_DATABASE": str(tmp_path / "ledger.db"),
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", SQLITE_SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "id": ["refund"],
        "glob": ["charge", "other", "refund"],
        "int": ["charge"],
        "str": ["other"],
        "bool": ["charge"],
        "nested": ["email"],
        "key": ["email"],
        "count": "4",
    }
