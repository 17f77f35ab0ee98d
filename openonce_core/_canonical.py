"""Strict JSON checking and RFC 8785 (JCS) canonical bytes for key material.

Arguments are checked by exact type so nothing is coerced silently: a tuple, a date, an
enum or a ``str`` subclass could serialise to the same JSON as something else and collapse
two different requests into one key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Callable
from typing import Any

from .errors import FloatInKeyMaterialError, InvalidArgumentsError

# I-JSON (RFC 7493): integers beyond 2**53 lose precision in other JSON readers, so two
# different amounts could share a key. Key material refuses them.
MAX_SAFE_INTEGER = 2**53 - 1
# Anywhere else an integer may be large (wei amounts, 64-bit ids), but not absurd: Python
# refuses to print one of more than 4,300 digits, so such a value could not be stored.
MAX_INTEGER = 10**100

_encode_string = json.encoder.encode_basestring  # type: ignore[attr-defined]


MAX_DEPTH = 64  # deeper nesting is refused with a clear error, not a RecursionError


def check_json(value: Any, path: str = "$", *, key_material: bool = False, depth: int = 0) -> bool:
    """Raise InvalidArgumentsError naming ``path`` unless ``value`` is strict JSON.

    Returns whether ``value`` is *plain*: no floats and no object key beyond the Basic
    Multilingual Plane. For a plain value, RFC 8785 text is exactly what the json module
    writes with sorted keys, so :func:`canonical` can let C do it."""
    if depth > MAX_DEPTH:
        raise InvalidArgumentsError(path, f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is str:
        _check_string(value, path)
        return True
    if value is None or kind is bool:
        return True
    if kind is int:
        if key_material and abs(value) > MAX_SAFE_INTEGER:
            raise InvalidArgumentsError(path, "integer beyond 2**53-1 cannot be key material")
        if abs(value) >= MAX_INTEGER:
            raise InvalidArgumentsError(path, "integer of more than 100 digits is not stored")
        return True
    if kind is float:
        if key_material:
            raise FloatInKeyMaterialError(
                path, "floats cannot be key material; pass integer minor units (cents)"
            )
        if not math.isfinite(value):
            raise InvalidArgumentsError(path, f"{value!r} is not JSON")
        return False
    plain = True
    if kind is list:
        for i, item in enumerate(value):
            plain &= check_json(item, f"{path}[{i}]", key_material=key_material, depth=depth + 1)
        return plain
    if kind is dict:
        for k, item in value.items():
            if type(k) is not str:
                raise InvalidArgumentsError(path, f"key {k!r} is not a string")
            _check_string(k, path)
            if not k.isascii() and max(k) > "\uffff":
                plain = False  # JCS orders such keys by UTF-16 code units
            plain &= check_json(item, f"{path}.{k}", key_material=key_material, depth=depth + 1)
        return plain
    raise InvalidArgumentsError(
        path, f"{kind.__name__} is not strict JSON; convert it explicitly at the call site"
    )


def _check_string(s: str, path: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentsError(path, "string holds a lone surrogate") from None


def canonical(value: Any, *, plain: bool = False) -> str:
    """RFC 8785 text of an already checked value (no floats: key material has none).
    ``plain``: :func:`check_json` said so, and the json module writes the same text."""
    if plain:
        return _plain_dumps(value)
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _one_shot(encoder: json.JSONEncoder, *, checked: bool = False) -> Callable[[Any], str]:
    """``encoder.encode``, without the Python layers it adds on every call.

    ``JSONEncoder.encode`` goes through ``iterencode``, which sets up the C encoder anew on
    every call; this calls the C encoder with the encoder's own options directly: set up
    per call with a fresh ``markers`` dict (circular structures are refused alike), or,
    for values :func:`check_json` has ``checked`` (no cycle gets past its depth limit),
    set up once without one. The text is the same (checked on import; without the C
    accelerator, ``encoder.encode`` itself)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has the accelerator
        return encoder.encode
    string = (
        json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
        if encoder.ensure_ascii
        else json.encoder.encode_basestring  # type: ignore[attr-defined]
    )
    options = (
        encoder.default, string, None, encoder.key_separator, encoder.item_separator,
        encoder.sort_keys, encoder.skipkeys, encoder.allow_nan,
    )  # fmt: skip
    once = make(None, *options)

    def encode(value: Any) -> str:
        return "".join(make({}, *options)(value, 0))

    def encode_checked(value: Any) -> str:
        return "".join(once(value, 0))

    chosen = encode_checked if checked else encode
    sample = {"b": [1, "\u00e9\n", None, True, 2.5], "a": {"\U0001f600": -3}}
    try:
        same = chosen(sample) == encoder.encode(sample)
    except Exception:  # pragma: no cover - another interpreter's accelerator
        same = False
    return chosen if same else encoder.encode


# Only for values check_json passed as plain (canonical's contract): no cycle, no float.
_plain_dumps = _one_shot(
    json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False),
    checked=True,
)


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif type(value) is str:
        out.append(_encode_string(value))
    elif type(value) is int:
        out.append(str(value))
    elif type(value) is float:
        # Only reachable for non-key data; repr is the shortest round-trip form.
        out.append(repr(value) if not value.is_integer() else str(int(value)))
    elif type(value) is list:
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        out.append("{")
        # JCS orders member names by their UTF-16 code units, not by code points.
        for i, key in enumerate(sorted(value, key=_utf16_order)):
            if i:
                out.append(",")
            out.append(_encode_string(key))
            out.append(":")
            _write(value[key], out)
        out.append("}")


def _utf16_order(key: str) -> bytes:
    return key.encode("utf-16-be")


def fingerprint(value: Any, *, plain: bool = False) -> str:
    return "sha256:" + hashlib.sha256(canonical(value, plain=plain).encode("utf-8")).hexdigest()


def secret_digest(value: Any, pepper: bytes | None) -> str:
    """What a secret field is stored and keyed as: never the value itself."""
    data = canonical(value).encode("utf-8")
    if pepper:
        return "hmac-sha256:" + hmac.new(pepper, data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(b"openonce-secret\0" + data).hexdigest()


# One encoder for every write: json.dumps with options builds a new one per call.
_dumps = _one_shot(json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False))


def dumps(value: Any) -> str:
    """Compact JSON for storage (not canonical; floats allowed)."""
    return _dumps(value)


_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[attr-defined]


def loads(text: str) -> Any:
    """``json.loads`` of stored JSON, through the decoder's scanner directly: the stored
    text is what :func:`dumps` wrote (no surrounding whitespace), and anything else, valid or
    not, goes to ``json.loads`` itself, which decides and words the error."""
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, TypeError):
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value
