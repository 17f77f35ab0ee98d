"""Key material: strict JSON checking and RFC 8785 (JCS) canonical text.

Two calls share a key exactly when their key material has the same canonical text, so
these tests pin the text itself (RFC 8785 examples) and every value that must be refused
rather than coerced.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import hashlib
import json
import uuid
from typing import Any

import pytest

from openonce_core import FloatInKeyMaterialError, InvalidArgumentsError, OpenOnceError
from openonce_core._canonical import (
    MAX_SAFE_INTEGER,
    canonical,
    check_json,
    fingerprint,
    secret_digest,
)

# -- RFC 8785 canonical text ---------------------------------------------------------------


def test_members_are_sorted_by_utf16_code_units():
    # RFC 8785 section 3.2.3: the emoji (a surrogate pair, U+D83D U+DE00) sorts before
    # U+FB33 in UTF-16 order, although its code point (U+1F600) is larger.
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    text = canonical(value)
    assert text == (
        '{"\\r":"Carriage Return",'
        '"1":"One",'
        '"\u0080":"Control",'
        '"\u00f6":"Latin Small Letter O With Diaeresis",'
        '"\u20ac":"Euro Sign",'
        '"\U0001f600":"Emoji: Grinning Face",'
        '"\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    )
    # Sorting by code point would get the last two the other way round.
    assert text.index("\U0001f600") < text.index("\ufb33")
    assert sorted(value) != sorted(value, key=lambda k: k.encode("utf-16-be"))


def test_string_escaping_follows_rfc_8785():
    # RFC 8785 section 3.2.2.2 example: only '"', '\\' and controls are escaped;
    # \b \t \n \f \r use their short forms, other controls \u00xx in lower case;
    # '/' and everything from U+007F up are written as they are.
    source = r'"\u20ac$\u000F\u000aA' + "'" + r'\u0042\u0022\u005c\\\"\/"'
    value = json.loads(source)
    assert canonical(value) == '"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"'
    assert canonical("\b\t\n\f\r") == '"\\b\\t\\n\\f\\r"'
    assert canonical("\x00\x1f\x7f\u2028") == '"\\u0000\\u001f\x7f\u2028"'


def test_literals_integers_and_structure_have_no_whitespace():
    value = {"literals": [None, True, False], "numbers": [0, -1, 333333333, MAX_SAFE_INTEGER]}
    assert canonical(value) == (
        '{"literals":[null,true,false],"numbers":[0,-1,333333333,9007199254740991]}'
    )
    assert canonical([]) == "[]"
    assert canonical({}) == "{}"
    assert canonical("") == '""'


def test_nested_objects_are_sorted_at_every_level():
    value = {"b": [{"z": 1, "a": {"y": None, "x": [2, 1]}}], "a": "first"}
    assert canonical(value) == '{"a":"first","b":[{"a":{"x":[2,1],"y":null},"z":1}]}'


def test_canonical_text_ignores_insertion_order_and_round_trips():
    one = {"to": "a@b.c", "subject": "hi", "meta": {"tags": ["x", "y"], "n": 1}}
    two = {"meta": {"n": 1, "tags": ["x", "y"]}, "subject": "hi", "to": "a@b.c"}
    assert canonical(one) == canonical(two)
    assert json.loads(canonical(one)) == one
    # Matches a sorted, compact, non-ASCII-escaping dump for plain ASCII keys.
    assert canonical(one) == json.dumps(
        one, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def test_list_order_and_types_are_significant():
    assert canonical([1, 2]) != canonical([2, 1])
    assert fingerprint({"a": True}) != fingerprint({"a": 1})
    assert fingerprint({"a": False}) != fingerprint({"a": 0})
    assert fingerprint({"a": "1"}) != fingerprint({"a": 1})
    assert fingerprint({"a": None}) != fingerprint({})


def test_fingerprint_is_sha256_of_the_canonical_utf8_text():
    value = {"to": "zoë@b.c", "amount_cents": 500}
    expected = hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()
    assert fingerprint(value) == "sha256:" + expected
    assert fingerprint({"amount_cents": 500, "to": "zoë@b.c"}) == fingerprint(value)


# -- strict JSON: what is refused, and where ------------------------------------------------


class Color(enum.Enum):
    RED = "red"


class Priority(enum.IntEnum):
    HIGH = 1


class Currency(enum.StrEnum):
    EUR = "EUR"


class Name(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


REFUSED = [
    pytest.param((1, 2), "$", id="tuple"),
    pytest.param({1, 2}, "$", id="set"),
    pytest.param(frozenset({1}), "$", id="frozenset"),
    pytest.param(b"raw", "$", id="bytes"),
    pytest.param(bytearray(b"raw"), "$", id="bytearray"),
    pytest.param(datetime.date(2026, 7, 2), "$", id="date"),
    pytest.param(datetime.datetime(2026, 7, 2, 12, 0), "$", id="datetime"),
    pytest.param(decimal.Decimal("1.10"), "$", id="decimal"),
    pytest.param(uuid.UUID(int=1), "$", id="uuid"),
    pytest.param(Color.RED, "$", id="enum"),
    pytest.param(Priority.HIGH, "$", id="intenum"),
    pytest.param(Currency.EUR, "$", id="strenum"),
    pytest.param(Name("alice"), "$", id="str-subclass"),
    pytest.param(Count(3), "$", id="int-subclass"),
    pytest.param(Ratio(0.5), "$", id="float-subclass"),
    pytest.param(collections.OrderedDict(a=1), "$", id="dict-subclass"),
    pytest.param(collections.UserList([1]), "$", id="list-like"),
    pytest.param(float("nan"), "$", id="nan"),
    pytest.param(float("inf"), "$", id="inf"),
    pytest.param(float("-inf"), "$", id="-inf"),
    pytest.param(object(), "$", id="object"),
    pytest.param("\ud800", "$", id="lone-surrogate"),
    pytest.param({1: "one"}, "$", id="int-key"),
    pytest.param({None: "none"}, "$", id="none-key"),
    pytest.param({Name("k"): 1}, "$", id="str-subclass-key"),
    pytest.param({"\udc00": 1}, "$", id="lone-surrogate-key"),
    pytest.param({"items": [1, (2, 3)]}, "$.items[1]", id="nested-tuple"),
    pytest.param({"a": [{"b": [0, {"c": b"x"}]}]}, "$.a[0].b[1].c", id="deep"),
    pytest.param({"meta": {2: "x"}}, "$.meta", id="nested-int-key"),
    pytest.param([{"ratio": float("nan")}], "$[0].ratio", id="nan-in-list"),
]


@pytest.mark.parametrize(("value", "path"), REFUSED)
def test_non_strict_json_is_refused_naming_the_path(value: Any, path: str):
    with pytest.raises(InvalidArgumentsError) as info:
        check_json(value)
    assert info.value.path == path
    assert str(info.value).startswith(f"argument {path}: ")
    with pytest.raises(InvalidArgumentsError) as keyed:
        check_json(value, key_material=True)
    assert keyed.value.path == path


def test_a_custom_root_path_prefixes_every_report():
    with pytest.raises(InvalidArgumentsError) as info:
        check_json({"ids": ["pi_1", ("pi_2",)]}, "$receipt")
    assert info.value.path == "$receipt.ids[1]"


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -(2**60),
        "",
        "zoë \u2028 \U0001f600",
        [],
        {},
        {"a": [1, "b", None, {"c": [True]}], "": "empty key"},
        1.5,
        -0.0,
        {"ratio": 0.1, "items": [1e300, -2.5e-8]},
    ],
)
def test_strict_json_is_accepted(value: Any):
    check_json(value)  # raises on failure


def test_error_classes_are_value_errors_and_openonce_errors():
    assert issubclass(InvalidArgumentsError, ValueError)
    assert issubclass(InvalidArgumentsError, OpenOnceError)
    assert issubclass(FloatInKeyMaterialError, InvalidArgumentsError)


# -- key material: stricter still -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path"),
    [
        pytest.param(12.5, "$", id="float"),
        pytest.param(1.0, "$", id="integral-float"),
        pytest.param(-0.0, "$", id="negative-zero"),
        pytest.param(float("nan"), "$", id="nan"),
        pytest.param({"amount": 0.1}, "$.amount", id="field"),
        pytest.param({"lines": [{"qty": 1}, {"qty": 2.0}]}, "$.lines[1].qty", id="nested"),
    ],
)
def test_floats_are_refused_as_key_material(value: Any, path: str):
    with pytest.raises(FloatInKeyMaterialError) as info:
        check_json(value, key_material=True)
    assert info.value.path == path
    assert "minor units" in str(info.value)


def test_floats_are_fine_outside_key_material():
    check_json({"amount": 0.1, "lines": [{"qty": 2.0}]})


@pytest.mark.parametrize("value", [MAX_SAFE_INTEGER + 1, -(MAX_SAFE_INTEGER + 1), 10**30])
def test_integers_beyond_2_53_are_refused_as_key_material(value: int):
    check_json({"amount": value})  # fine as plain data
    with pytest.raises(InvalidArgumentsError) as info:
        check_json({"amount": value}, key_material=True)
    assert not isinstance(info.value, FloatInKeyMaterialError)
    assert info.value.path == "$.amount"


def test_integers_up_to_2_53_are_key_material():
    check_json([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0], key_material=True)
    assert MAX_SAFE_INTEGER == 2**53 - 1


# -- secret digests -------------------------------------------------------------------------


def test_secret_digest_is_stable_and_never_the_value():
    card = "4242424242424242"
    digest = secret_digest(card, None)
    assert digest == secret_digest(card, None)
    assert digest.startswith("sha256:")
    assert card not in digest
    assert digest != secret_digest("4000056655665556", None)
    # Domain separated: not simply the fingerprint of the value.
    assert digest != fingerprint(card)


def test_secret_digest_with_a_pepper_is_an_hmac():
    card = "4242424242424242"
    peppered = secret_digest(card, b"pepper-1")
    assert peppered.startswith("hmac-sha256:")
    assert card not in peppered
    assert peppered == secret_digest(card, b"pepper-1")
    assert peppered != secret_digest(card, b"pepper-2")
    assert peppered.split(":", 1)[1] != secret_digest(card, None).split(":", 1)[1]


def test_secret_digest_of_structured_values_follows_canonical_text():
    assert secret_digest({"b": 1, "a": 2}, None) == secret_digest({"a": 2, "b": 1}, None)
    assert secret_digest([1, 2], None) != secret_digest([2, 1], None)


def test_the_fast_path_writes_exactly_the_rfc_8785_text():
    """For plain values (no floats, no key beyond the BMP) canonical() lets the json module
    write the text; it must be byte for byte what the RFC 8785 writer produces, or keys
    of existing ledgers would change."""
    import random

    from openonce_core._canonical import canonical, check_json

    rng = random.Random(8785)
    alphabet = ["a", "Z", "0", " ", '"', "\\", "/", "\x00", "\x1f", "\x7f", "é", "€", "\u2028",
                "\ufeff", "日", "\u202e", "\U0001f600"]  # fmt: skip

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))

    def value(depth: int = 0) -> object:
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return text()
        if kind == 1:
            return rng.choice([0, -1, 2**53 - 1, -(2**40), 10**30])
        if kind == 2:
            return rng.choice([True, False, None])
        if kind == 3:
            return ""
        if kind == 4:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {text(): value(depth + 1) for _ in range(rng.randrange(4))}

    checked = 0
    for _ in range(3000):
        v = value()
        plain = check_json(v)
        if plain:
            checked += 1
        assert canonical(v, plain=plain) == canonical(v)
    assert checked > 1000
    assert not check_json({"\U0001f600": 1})  # ordered by UTF-16 units: the slow path
    assert not check_json([1.5])
