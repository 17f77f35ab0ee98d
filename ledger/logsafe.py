"""Log records that cannot be forged from request data."""

from __future__ import annotations

import logging


def one_line(text: str) -> str:
    """``text`` with every control, format (bidi overrides, zero-width) and line or
    paragraph separator character escaped as ``\\xNN`` / ``\\uNNNN``: what a person
    or a log parser reads is one line, in the order it was written."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


class OneLineFilter(logging.Filter):
    """Escapes the formatted message of every record it sees. The traceback of an
    exception (added by the formatter after the message) keeps its own lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = one_line(message)
        if escaped != message:
            record.msg, record.args = escaped, None
        return True
