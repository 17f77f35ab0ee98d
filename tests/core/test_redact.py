"""redact_text: credentials and card numbers found by their shape in free text (a prober's
exception message, a journal reason) become ``[secret]`` before the text leaves the
process; everything else is left as it was."""

from __future__ import annotations

import pytest

from openonce_core._redact import redact_text

SECRET = "[secret]"


@pytest.mark.parametrize(
    "credential",
    [
        "sk_live_51HqLyjWDarjtT1zdp7dcXYZabc",
        "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
        "rk_live_51HqLyjWDarjtT1zdp7dcAAAA",
        "rk_test_51HqLyjWDarjtT1zdp7dcBBBB",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "gho_16C7e42F292c6912E7710c838347Ae178B4a",
        "ghs_16C7e42F292c6912E7710c838347Ae178B4a",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFG",
    ],
)
def test_provider_keys_are_replaced(credential: str) -> None:
    text = f"stripe said no (key {credential}): 401"
    out = redact_text(text)
    assert credential not in out
    assert out == f"stripe said no (key {SECRET}): 401"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc.DEF-123_xyz=", f"Authorization: {SECRET}"),
        ("sent with bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", f"sent with bearer {SECRET}"),
        ("header Basic dXNlcjpwYXNzd29yZA== refused", f"header Basic {SECRET} refused"),
        ("authorization=token 0123456789abcdef0123", f"authorization={SECRET}"),
    ],
)
def test_authorization_values_are_replaced(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "GET https://alice:hunter2@api.example.com/v1 failed",
            f"GET https://{SECRET}@api.example.com/v1 failed",
        ),
        ("imaps://bob:p%40ss:w0rd@mail.example.com:993", f"imaps://{SECRET}@mail.example.com:993"),
        ("postgresql://root:pw@db/ledger", f"postgresql://{SECRET}@db/ledger"),
        # Only a user name is no credential: left as it is.
        ("ssh://git@github.com/x.git", "ssh://git@github.com/x.git"),
    ],
)
def test_credentials_in_urls_are_replaced(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "card",
    [
        "4242424242424242",
        "4242 4242 4242 4242",
        "4242-4242-4242-4242",
        "378282246310005",  # Amex, 15 digits
        "3782 822463 10005",
        "4222222222222",  # 13 digits
        "6011111111111117",
        "4000 0566 5566 5556",
    ],
)
def test_card_numbers_that_pass_luhn_are_replaced(card: str) -> None:
    assert redact_text(f"card {card} declined") == f"card {SECRET} declined"


def test_a_card_followed_by_other_numbers_is_still_found() -> None:
    assert redact_text("card 4242 4242 4242 4242 12 30") == f"card {SECRET} 12 30"
    assert redact_text("pan=4242424242424242;cvc=123") == f"pan={SECRET};cvc=123"


@pytest.mark.parametrize(
    "text",
    [
        "4242424242424241",  # fails Luhn
        "order 123456789012",  # 12 digits: too short to be a card
        "12345678901234567890123",  # 23 digits in one run
        "at 1717171717.123 after 3 tries",
        "pi_3MtwBwLkdIwHu7ix28a3tqPa and ch_1234567890123456",  # ids keep their digits
        "the basic plan failed",
        "Basic Authentication failed",
        "Bearer",
        "sk_live_",  # a prefix alone is no key
        "HTTP 503 from https://api.example.com/v1/search?q=x",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_several_secrets_in_one_text_and_the_text_around_them_kept() -> None:
    text = (
        "retry 3: key=sk_test_4eC39HqLyjWDarjtT1zdp7dc\nurl https://u:p@h/x"
        " card 5555555555554444 \u202e"
    )
    assert redact_text(text) == (
        f"retry 3: key={SECRET}\nurl https://{SECRET}@h/x card {SECRET} \u202e"
    )


def test_long_hostile_input_is_handled_quickly() -> None:
    import time

    started = time.perf_counter()
    redact_text("1 " * 50_000 + "a:" * 50_000 + "https://" + ":" * 50_000)
    assert time.perf_counter() - started < 2.0
