"""Downloads: journal lines (an effect's journal, the operator audit log) and the effects
list, as CSV and JSON.

Every CSV cell a spreadsheet would run as a formula is prefixed with ``'`` (CSV
injection): agent data and typed reasons reach these files. The effects list is
streamed row by row from the database (``StreamingHttpResponse``), never held whole.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse

from ledger.models import Effect, JournalEntry

from .templatetags.console_tags import redact

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
    _name(response, filename)
    return response


def _name(response: HttpResponse | StreamingHttpResponse, filename: str) -> None:
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"


# -- the effects list ---------------------------------------------------------------------

EFFECT_COLUMNS = (
    "id",
    "tool",
    "state",
    "scope",
    "idempotency_key",
    "created_at",
    "updated_at",
    "attempt",
    "max_attempts",
    "fence",
    "args",
)


def effect_row(effect: Effect, show_digest: bool) -> dict[str, Any]:
    """One effect as the list shows it; secret digests as the person may see them."""
    try:
        args: Any = redact(effect.args, show_digest)
    except ValueError:
        args = "(unreadable arguments)"
    return {
        "id": effect.id,
        "tool": effect.tool,
        "state": effect.state,
        "scope": effect.scope,
        "idempotency_key": effect.idempotency_key,
        "created_at": _utc(effect.created_at),
        "updated_at": _utc(effect.updated_at),
        "attempt": effect.attempt,
        "max_attempts": effect.max_attempts,
        "fence": effect.fence,
        "args": args,
    }


class _Line:
    """A file object for csv.writer that hands back what it was given."""

    def write(self, text: str) -> str:
        return text


def effects_csv(
    effects: Iterator[Effect], filename: str, show_digest: bool, next_after: str | None
) -> StreamingHttpResponse:
    writer = csv.writer(_Line())

    def rows() -> Iterator[str]:
        yield writer.writerow(EFFECT_COLUMNS)
        for effect in effects:
            row = effect_row(effect, show_digest)
            row["args"] = json.dumps(row["args"], sort_keys=True, ensure_ascii=False)
            yield writer.writerow([_cell(row[c]) for c in EFFECT_COLUMNS])

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    _name(response, filename)
    if next_after is not None:
        response["X-OpenOnce-Next-After"] = next_after
    return response


def effects_json(
    effects: Iterator[Effect],
    filename: str,
    show_digest: bool,
    next_after: str | None,
    **extra: Any,
) -> StreamingHttpResponse:
    def parts() -> Iterator[str]:
        head = json.dumps({**extra, "next_after": next_after}, ensure_ascii=False)
        yield head[:-1] + ', "effects": ['
        for n, effect in enumerate(effects):
            row = json.dumps(effect_row(effect, show_digest), ensure_ascii=False)
            yield ("," if n else "") + "\n" + row
        yield "\n]}\n"

    response = StreamingHttpResponse(parts(), content_type="application/json")
    _name(response, filename)
    if next_after is not None:
        response["X-OpenOnce-Next-After"] = next_after
    return response


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text
