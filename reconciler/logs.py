"""Structured logs (OPENONCE_LOG_FORMAT=json): one JSON object per line, with the effect
id on every line that concerns an effect — passed as ``extra={"effect_id": ...}`` or, for
lines logged inside a probe by the prober or its HTTP library, taken from the probe's
context (``current_effect_id``)."""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime
from typing import Any

# The effect a log line is about, for lines logged inside a probe (the prober's own, an
# HTTP library's). Set by reconciler.probes around every probe.
current_effect_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "openonce_effect_id", default=None
)

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class EffectIdFilter(logging.Filter):
    """Adds ``effect_id`` from the probe context to lines that did not pass one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "effect_id", None) is None:
            effect_id = current_effect_id.get()
            if effect_id is not None:
                record.effect_id = effect_id
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)
