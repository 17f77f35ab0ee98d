"""Journal lines as CSV and JSON downloads (an effect's journal, the operator audit log)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.http import HttpResponse

from ledger.models import JournalEntry

COLUMNS = ("seq", "at", "effect_id", "actor", "from_state", "to_state", "reason", "evidence")

# A spreadsheet runs a cell starting with one of these as a formula; a reason typed into
# the console must not become one (CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def journal_row(entry: JournalEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "at": datetime.fromtimestamp(entry.at, UTC).isoformat(),
        "effect_id": entry.effect_id,
        "actor": entry.actor,
        "from_state": entry.from_state,
        "to_state": entry.to_state,
        "reason": entry.reason,
        "evidence": entry.evidence,
    }


def csv_response(entries: Iterable[JournalEntry], filename: str) -> HttpResponse:
    response = _attachment("text/csv; charset=utf-8", filename)
    writer = csv.writer(response)
    writer.writerow(COLUMNS)
    for entry in entries:
        row = journal_row(entry)
        row["evidence"] = json.dumps(row["evidence"], sort_keys=True) if row["evidence"] else ""
        writer.writerow([_cell(row[c]) for c in COLUMNS])
    return response


def json_response(entries: Iterable[JournalEntry], filename: str, **extra: Any) -> HttpResponse:
    response = _attachment("application/json", filename)
    document = {**extra, "journal": [journal_row(e) for e in entries]}
    response.write(json.dumps(document, indent=2, ensure_ascii=False))
    return response


def _attachment(content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text
