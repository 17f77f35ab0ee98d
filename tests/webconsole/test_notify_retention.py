"""The notifier's part of the retention: the deliveries of archived effects are written
into the archive (``archive_deliveries``) and then deleted (``forget_deliveries``), read
through delivery_effect, never the whole table; everything else stays as it was."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications.models import Delivery
from notifications.retention import CHUNK, archive_deliveries, forget_deliveries

pytestmark = pytest.mark.django_db(transaction=True)


def delivery(effect_id: str, seq: int, **more: Any) -> Delivery:
    fields: dict[str, Any] = {
        "effect_id": effect_id, "journal_seq": seq, "event": "requires_approval",
        "tool": "stripe.refund", "channel": "hook", "kind": "webhook",
        "destination": "https://hooks.example.com/…", "status": Delivery.SENT,
        "attempts": 1, "next_attempt_at": 100.0 + seq, "created_at": 100.0 + seq,
        "sent_at": 101.0 + seq, "last_status": 200,
    }  # fmt: skip
    return Delivery.objects.create(**{**fields, **more})


def test_the_archive_holds_each_effects_deliveries_as_plain_json() -> None:
    first = delivery("eff_a", 1)
    failed = delivery(
        "eff_a", 2, channel="mail", kind="email", destination="oncall@example.com",
        status=Delivery.FAILED, attempts=8, last_status=None, last_error="451 try later",
        sent_at=None,
    )  # fmt: skip
    delivery("eff_kept", 3)

    archived = archive_deliveries(["eff_a", "eff_none"])

    assert list(archived) == ["eff_a", "eff_none"]  # each id asked for, [] if it had none
    assert archived["eff_none"] == []
    assert [row["id"] for row in archived["eff_a"]] == [first.id, failed.id]  # oldest first
    assert json.loads(json.dumps(archived)) == archived  # JSON-safe as it is
    row = archived["eff_a"][1]
    assert row["destination"] == "oncall@example.com" and row["status"] == "failed"
    assert row["last_error"] == "451 try later" and row["sent_at"] is None
    assert Delivery.objects.count() == 3  # archiving deletes nothing


def test_a_credential_kept_in_an_old_destination_stays_out_of_the_archive() -> None:
    """Rows from before destinations were masked kept ``user:password@`` and the path."""
    delivery("eff_old", 1, destination="https://ops:hunter2@hooks.example.com/T0/B0/secret")
    [row] = archive_deliveries(["eff_old"])["eff_old"]
    assert row["destination"] == "https://hooks.example.com/…"


def test_forgetting_deletes_those_effects_deliveries_and_no_other() -> None:
    for seq in range(3):
        delivery("eff_a", seq)
    delivery("eff_b", 10)
    kept = delivery("eff_kept", 20)

    assert forget_deliveries(["eff_a", "eff_b", "eff_a"]) == 4
    assert list(Delivery.objects.values_list("id", flat=True)) == [kept.id]
    assert forget_deliveries(["eff_a"]) == 0  # twice is harmless


def test_a_batch_larger_than_a_statement_is_taken_in_chunks() -> None:
    ids = [f"eff_{i}" for i in range(CHUNK * 2 + 1)]
    Delivery.objects.bulk_create(
        Delivery(
            effect_id=i, journal_seq=n, event="human_review", tool="t", channel="c",
            kind="slack", destination="https://hooks.slack.com/…", next_attempt_at=0.0,
            created_at=0.0,
        )
        for n, i in enumerate(ids)
    )  # fmt: skip
    archived = archive_deliveries(ids)
    assert sum(len(rows) for rows in archived.values()) == len(ids)
    assert forget_deliveries(ids) == len(ids)
    assert not Delivery.objects.exists()


def test_nothing_is_read_or_deleted_for_an_empty_batch() -> None:
    delivery("eff_a", 1)
    with CaptureQueriesContext(connection) as queries:
        assert archive_deliveries([]) == {}
        assert forget_deliveries([]) == 0
    assert [q for q in queries.captured_queries if "notifications_delivery" in q["sql"]] == []
    assert Delivery.objects.count() == 1


@pytest.mark.parametrize("bad", ["eff_a", None, [1, 2], ["eff_a", None]])
def test_a_batch_that_is_not_a_list_of_ids_changes_nothing(bad: Any) -> None:
    """A lone id string would otherwise be read as one id per character."""
    delivery("e", 1)  # "e" is a character of "eff_a"
    with pytest.raises(TypeError, match="a list of effect ids"):
        forget_deliveries(bad)
    with pytest.raises(TypeError, match="a list of effect ids"):
        archive_deliveries(bad)
    assert Delivery.objects.count() == 1


def test_both_read_the_batch_through_delivery_effect() -> None:
    delivery("eff_a", 1)
    with CaptureQueriesContext(connection) as queries:
        archive_deliveries(["eff_a"])
        forget_deliveries(["eff_a"])
    statements = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith(("SELECT", "DELETE"))
    ]
    assert len(statements) == 2
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            for sql in statements:
                cursor.execute("EXPLAIN " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                assert "delivery_effect" in plan and "Seq Scan" not in plan, plan
        finally:
            cursor.execute("RESET enable_seqscan")
