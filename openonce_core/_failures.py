"""How an exception is written into the ledger, and how a recorded failure is raised again.

A provider error that echoes a card number must not put it in the ledger: every secret
value of the call is scrubbed from the message, from the exception's arguments and from
the chain of causes *before* anything is cut to length or stored. A secret written in
digits (a card, a phone number) is found by its digits too, however the text groups them.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping
from typing import Any

from ._canonical import MAX_DEPTH, check_json
from ._records import Effect
from .errors import EffectFailed, InvalidArgumentsError

MAX_MESSAGE = 2000
SECRET = "[secret]"
CYCLE = "<cycle>"  # what a container that holds itself is recorded as
TOO_DEEP = "<too deep>"  # ... and one nested deeper than MAX_DEPTH
# How people group digits: spaces (any, the no-break one too), dashes, dots, slashes,
# brackets and the plus of a phone number.
_SEPARATOR = r"[\s\-\u2010-\u2015./()+]"
_ONLY_DIGITS_AND_SEPARATORS = re.compile(rf"(?:[0-9]|{_SEPARATOR})+")
# Fewer digits than this are searched for exactly only: "1-2-3-4" would be everywhere.
MIN_DIGITS = 6


def describe(
    exc: BaseException, kind: str, secrets: tuple[str, ...], why: str = ""
) -> dict[str, Any]:
    """The JSON record of a handler's exception: its class, message, arguments (when they
    are JSON, so the same exception can be raised on replay), class and causes.

    Every text in it is storable on every store: a lone surrogate (what ``os.fsdecode``
    makes of a non-UTF-8 file name) or a NUL (which Postgres text cannot hold) in a
    message, a reason or a class's name is written escaped (:func:`safe_text`). The
    arguments are kept exactly, or not at all: they are JSON (NUL is written ``\\u0000``)
    and refused by the JSON check when they hold a lone surrogate."""
    args: Any = scrub(_plain(list(exc.args)), secrets)
    try:
        check_json(args)
    except InvalidArgumentsError:
        args = None
    doc: dict[str, Any] = {
        "type": type_name(exc),
        "message": _cut(safe_text(scrub(_text(exc), secrets))),
        "args": args,
        "class": safe_text(kind),
    }
    if why:
        doc["why"] = _cut(safe_text(scrub(why, secrets)))
    causes = [
        {
            "type": type_name(c),
            "message": _cut(safe_text(scrub(_text(c), secrets)), 500),
        }
        for c in chain(exc)[1:]
    ]
    if causes:
        doc["causes"] = causes
    return doc


def safe_text(text: Any) -> str:
    """``text`` as every store can hold it: a NUL written ``\\x00``, a lone surrogate
    ``\\udcff`` (backslashreplace). Text that needs neither is returned as it is."""
    out: str = text if type(text) is str else _str(text)
    if "\x00" in out:
        out = out.replace("\x00", "\\x00")
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        out = out.encode("utf-8", "backslashreplace").decode("utf-8")
    return out


def type_name(exc: BaseException) -> str:
    """``module.QualifiedName`` of the exception's class, storable (:func:`safe_text`)."""
    cls = type(exc)
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "?")
    return safe_text(f"{_str(module)}.{_str(qualname)}")


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` for a reason or a journal line: never raises, and
    storable."""
    return safe_text(f"{_str(type(exc).__name__)}: {_text(exc)}")


def message_text(exc: BaseException) -> str:
    """The message of ``exc`` for a reason or a journal line: never raises, and storable."""
    return safe_text(_text(exc))


def _str(value: Any) -> str:
    try:
        return value if type(value) is str else str(value)
    except Exception:
        return "?"


def undescribed(exc: BaseException, why: str) -> dict[str, Any]:
    """The record of an exception :func:`describe` could not read: its class and why, not
    its message (which may hold a secret that could not be scrubbed)."""
    why = safe_text(why)
    return {
        "type": type_name(exc),
        "message": why,
        "args": None,
        "class": "unknown",
        "why": why,
    }


def chain(exc: BaseException, limit: int = 16) -> list[BaseException]:
    """``exc`` and what it was raised from or during, outermost first, without cycles."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < limit and all(current is not s for s in seen):
        seen.append(current)
        cause = current.__cause__
        if cause is None and not current.__suppress_context__:
            cause = current.__context__
        current = cause
    return seen


def scrub(value: Any, secrets: tuple[str, ...], _inside: tuple[int, ...] = ()) -> Any:
    """``value`` with every secret replaced by ``[secret]``, in strings at any depth. A
    container that holds itself becomes ``<cycle>``, one nested deeper than ``MAX_DEPTH``
    ``<too deep>``: nothing below it is kept, so no secret either."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, SECRET)
            digits = _digit_run(secret)
            if digits is not None:
                value = digits.sub(SECRET, value)
        return value
    if isinstance(value, int) and not isinstance(value, bool) and _is_secret_number(value, secrets):
        return SECRET
    if isinstance(value, list | tuple | dict):
        if id(value) in _inside:
            return CYCLE
        if len(_inside) >= MAX_DEPTH:
            return TOO_DEEP
        inside = (*_inside, id(value))
        if isinstance(value, dict):
            return {scrub(k, secrets, inside): scrub(v, secrets, inside) for k, v in value.items()}
        return [scrub(v, secrets, inside) for v in value]
    return value


def _is_secret_number(value: int, secrets: tuple[str, ...]) -> bool:
    text = str(value)
    if text in secrets:
        return True
    return any((run := _digit_run(s)) is not None and run.search(text) for s in secrets)


@functools.lru_cache(maxsize=256)
def _digit_run(secret: str) -> re.Pattern[str] | None:
    """For a secret made of digits and separators, a pattern for its digits grouped any
    way (up to three separators between two digits): 4242424242424242, 4242 4242 4242
    4242 and 4242-4242-4242-4242 are one card. None for any other secret."""
    if not _ONLY_DIGITS_AND_SEPARATORS.fullmatch(secret):
        return None
    digits = [c for c in secret if c in "0123456789"]
    if len(digits) < MIN_DIGITS:
        return None
    # Linear: a separator is never a digit, so no two ways to match the same text.
    return re.compile(f"{_SEPARATOR}{{0,3}}".join(digits))


def _plain(value: Any, _inside: tuple[int, ...] = ()) -> Any:
    """Arguments as plain JSON types where that loses nothing a replay needs: provider
    errors carry mappings (an OrderedDict body, a header mapping) and tuples. Anything else
    is left as it is, and the check that follows then refuses it; a container that holds
    itself, or nests past ``MAX_DEPTH``, is cut as :func:`scrub` cuts it."""
    if not isinstance(value, Mapping | list | tuple):
        return value
    if id(value) in _inside:
        return CYCLE
    if len(_inside) >= MAX_DEPTH:
        return TOO_DEEP
    inside = (*_inside, id(value))
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, inside) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, inside) for v in value]
    return value


def contains_secret(value: Any, secrets: tuple[str, ...]) -> bool:
    return bool(secrets) and scrub(value, secrets) != value


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} whose str() raised>"


def _cut(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storable(value: Any) -> tuple[Any, bool]:
    try:
        check_json(value)
    except InvalidArgumentsError:
        return None, False
    return value, True


def rebuild(effect_id: str, error: dict[str, Any] | None) -> BaseException:
    """The recorded failure, as the same exception class when it is loaded here."""
    error = error or {}
    type_name = str(error.get("type", "Exception"))
    module_name, _, qualname = type_name.rpartition(".")
    exc: BaseException | None = None
    obj: Any = sys.modules.get(module_name)  # never import modules named by ledger data
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, Exception) and error.get("args") is not None:
        try:
            exc = obj(*error["args"])
        except Exception:
            exc = None
    if exc is None:
        exc = EffectFailed(effect_id, type_name, str(error.get("message", "")))
    exc.openonce_replayed = True  # type: ignore[attr-defined]
    exc.openonce_effect_id = effect_id  # type: ignore[attr-defined]
    return exc


def last_error(effect: Effect) -> str:
    error = (effect.execution_evidence or {}).get("error") or {}
    return str(error.get("message", ""))
