"""The search box: one line of text, read as the kind of thing a person pastes into it.

* ``eff_3f2a…`` — an effect id, full or a prefix;
* ``stripe.*`` (any ``*``, ``?`` or ``[``) — a tool glob;
* ``charge=ch_1`` (one or more ``name=value``, space separated; ``a.b=1`` reaches into
  an object) — argument values: ``1``, ``true``, ``null`` and ``"quoted"`` are JSON,
  anything else is a string;
* ``id:``, ``key:``, ``scope:``, ``tool:`` or ``arg:`` in front says which, explicitly;
  ``state:unknown`` keeps one state; several such terms, space separated, must all
  match (``state:unknown tool:stripe.*``);
* anything else — an idempotency key or scope (run id) prefix, an effect id prefix
  (with or without ``eff_``: a pasted id often loses it), or an exact tool name,
  whichever matches.

An argument value that looks like a number but is not an integer (``amount=12.5``) is
refused, not searched as text: amounts are integers of minor units, and a silent string
search would find nothing and look like an answer.

Parsing never touches the database; ``SearchError`` says what is wrong with a query.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from openonce_core._states import EffectState

MAX_QUERY = 500
MAX_TERMS = 8

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*$")
_ID = re.compile(r"^eff_[0-9a-f]{1,32}$")
_GLOB_CHARS = set("*?[")
_KINDS = ("id", "key", "scope", "tool", "arg", "state")
# Terms that combine: ``arg:`` takes the rest of the line, so it only comes alone.
_COMBINABLE = ("id", "key", "scope", "tool", "state")
# An effect id's hex without its ``eff_``: at least 8 digits, so a short word is not one.
_BARE_ID = re.compile(r"^[0-9a-f]{8,32}$")
# A number with a fraction (12345.5, -3., .5): an amount written in major units, or a
# typo. 007 and 1.2.3 stay text (a zip code, a version).
_FRACTION = re.compile(r"^-?(?:[0-9]+\.[0-9]*|\.[0-9]+)$")
_STATES = tuple(s.value for s in EffectState)
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


class SearchError(ValueError):
    """The query cannot be read; the message says how to write it."""


@dataclass(frozen=True)
class Search:
    kind: str  # id, key, scope, tool, arg, state, all (every one of ``terms``) or any
    text: str  # the prefix, glob, state or token searched for
    args: dict[str, Any] = field(default_factory=dict)  # for kind "arg": a JSON object
    terms: tuple[Search, ...] = ()  # for kind "all"

    @property
    def bare_id(self) -> str | None:
        """``eff_`` + the text, when an "any" search could be an id pasted without it."""
        return "eff_" + self.text if self.kind == "any" and _BARE_ID.match(self.text) else None

    def describe(self) -> str:
        if self.kind == "all":
            return " and ".join(t.describe() for t in self.terms)
        if self.kind == "state":
            return f"state {self.text}"
        if self.kind == "id":
            return f"effect id starting with {self.text}"
        if self.kind == "key":
            return f"idempotency key starting with {self.text}"
        if self.kind == "scope":
            return f"scope (run id) starting with {self.text}"
        if self.kind == "tool":
            return f"tool matching {self.text}"
        if self.kind == "arg":
            return "arguments containing " + json.dumps(self.args, ensure_ascii=False)
        if self.bare_id:
            return (
                f"id, key or scope starting with {self.text} (or id {self.bare_id}),"
                f" or tool {self.text}"
            )
        return f"id, key or scope starting with {self.text}, or tool {self.text}"


def parse(query: str) -> Search | None:
    """``None`` for an empty query; ``SearchError`` for one that cannot be read."""
    text = query.strip()
    if not text:
        return None
    if len(text) > MAX_QUERY:
        raise SearchError(f"A search is at most {MAX_QUERY} characters.")
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        raise SearchError("A search cannot contain control characters.")
    kind, sep, rest = text.partition(":")
    words = text.split()
    if len(words) > 1 and all(_is_term(w) for w in words):
        return _all_of(words)
    if sep and kind in _KINDS and rest.strip():
        return _explicit(kind, rest.strip())
    if _ID.match(text):
        return Search("id", text)
    if "=" in text and _NAME.match(text.split("=", 1)[0]):
        return Search("arg", text, _arguments(text))
    if _GLOB_CHARS & set(text):
        return Search("tool", text)
    return Search("any", text)


def _explicit(kind: str, text: str) -> Search:
    if kind == "arg":
        return Search("arg", text, _arguments(text))
    if kind == "state":
        return Search("state", _state(text))
    return Search(kind, text)


def _state(text: str) -> str:
    state = text.strip().lower().replace(" ", "_")
    if state not in _STATES:
        raise SearchError(f"{text!r} is not a state; write state: and one of {', '.join(_STATES)}")
    return state


def _is_term(word: str) -> bool:
    kind, sep, rest = word.partition(":")
    return bool(sep and rest) and kind in _COMBINABLE


def _all_of(words: list[str]) -> Search:
    """``state:unknown tool:stripe.*``: every term must match."""
    if len(words) > MAX_TERMS:
        raise SearchError(f"Search at most {MAX_TERMS} terms at once.")
    terms: list[Search] = []
    for word in words:
        kind, _, rest = word.partition(":")
        if any(t.kind == kind for t in terms):
            raise SearchError(f"{kind}: is searched twice")
        terms.append(_explicit(kind, rest))
    return Search("all", " ".join(words), terms=tuple(terms))


def _arguments(text: str) -> dict[str, Any]:
    terms = text.split()
    if len(terms) > MAX_TERMS:
        raise SearchError(f"Search at most {MAX_TERMS} arguments at once.")
    doc: dict[str, Any] = {}
    for term in terms:
        name, sep, raw = term.partition("=")
        if not sep or not _NAME.match(name):
            raise SearchError(f"{term!r}: write an argument search as name=value, e.g. charge=ch_1")
        value = _value(raw)
        *parents, leaf = name.split(".")
        node = doc
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SearchError(f"{name!r} reaches into {part!r}, searched as a value too")
            node = child
        if leaf in node:
            raise SearchError(f"{name!r} is searched twice")
        node[leaf] = value
    return doc


def _value(raw: str) -> Any:
    if raw in ("true", "false", "null") or raw.startswith('"'):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise SearchError(f"{raw!r} is not a JSON string; close the quotes") from None
        if isinstance(value, str) and _UNSTORABLE.search(value):
            # Escapes the box lets through, but no stored argument can hold: Postgres
            # refuses NUL in jsonb and a lone surrogate in any text.
            raise SearchError(
                f"{raw!r}: you cannot search for NUL (\\u0000) or a lone surrogate"
                " (\\ud800 to \\udfff); no stored argument holds one"
            )
        return value
    if re.fullmatch(r"-?(?:0|[1-9][0-9]{0,17})", raw):
        return int(raw)  # integers only: amounts are minor units, floats are refused
    if _FRACTION.match(raw):
        raise SearchError(
            f"{raw!r} is not a whole number: amounts are integers of minor units (12345 for"
            f' 123.45). Write an integer, or "{raw}" in quotes to search for that text.'
        )
    return raw
