"""Credentials and card numbers found by their shape in free text, replaced by ``[secret]``.

A call's declared secrets are scrubbed by value (``failures.scrub``); this is the other
half, for text whose secrets nobody declared: a prober's exception message that quotes a
request (``Authorization: Bearer …``, ``https://user:pass@host``), a provider's error that
echoes a key, a reason that carries a card number. It is applied to a prober's words
before the reconciler journals them (``reconcile._words``), to provider errors kept for
health (``reconciler.probes``) and shown in the console, and to every notification body.
A reason a person types is journaled as written (it is refused if it holds a declared
secret, ``decisions``).

Shapes recognised:

* Stripe secret and restricted keys (``sk_live_``, ``sk_test_``, ``rk_live_``,
  ``rk_test_``) and webhook signing secrets (``whsec_``);
* GitHub tokens (``ghp_``, ``gho_``, ``ghs_``, ``ghu_``, ``ghr_``, ``github_pat_``);
* an ``Authorization`` value, a ``Bearer`` token, a ``Basic`` credential;
* the ``user:password@`` of a URL (a user name alone is kept);
* 13 to 19 digits that pass the Luhn check, written together or grouped with single
  spaces, no-break spaces, dots or dashes (``4242 4242 4242 4242``, ``4242.4242…``).

Shapes are a net, not a proof: a key in a format not listed passes through. Only the
standard library is used, so any part of OpenOnce may import it.
"""

from __future__ import annotations

import re

SECRET = "[secret]"

# Each pattern is linear in the text: no nested repetition that could backtrack.
_KEYS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"[sr]k_(?:live|test)_[A-Za-z0-9]{8,}"
    r"|whsec_[A-Za-z0-9+/=]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r")"
)
# "Authorization: <scheme> <value>" (or "authorization=...", or quoted as in a dict's
# repr or JSON: "'Authorization': 'token ...'"): the whole value goes.
_AUTHORIZATION = re.compile(
    r"(?i)(\bauthorization['\"]?\s*[:=]\s*['\"]?)"
    r"(?:(?:bearer|basic|token|digest|bot)\s+)?[^\s,;'\"]+"
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/-]{8,}=*")
# "Basic" as HTTP writes it; a following capitalised word ("Basic Authentication") is
# English, not base64.
_BASIC = re.compile(r"(\bBasic\s+)(?![A-Z]?[a-z]+\b)[A-Za-z0-9+/]{8,}={0,2}")
# scheme://user:password@ — the password may hold ":" and "@" (the last "@" before the
# path ends the user information).
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@:]*:[^\s/?#]*@")
# Runs of digit groups (3 or more digits each: every card layout uses such groups) joined
# by single spaces, no-break spaces, dots or dashes; not part of a word, an id (ch_123…)
# or a decimal (0.123…).
_SEPARATOR = "[ .\u00a0-]"
_DIGIT_RUN = re.compile(rf"(?<![\w.])\d{{3,}}(?:{_SEPARATOR}\d{{3,}})*(?!\w)")
_CARD_DIGITS = range(13, 20)


def redact_text(text: str) -> str:
    """``text`` with every recognised credential and card number replaced by ``[secret]``."""
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + SECRET, text)
    text = _BEARER.sub(lambda m: m.group(1) + SECRET, text)
    text = _BASIC.sub(lambda m: m.group(1) + SECRET, text)
    text = _KEYS.sub(SECRET, text)
    text = _URL_CREDENTIALS.sub(lambda m: m.group(1) + SECRET + "@", text)
    return _DIGIT_RUN.sub(_cards_in_run, text)


def _cards_in_run(match: re.Match[str]) -> str:
    """Replace card numbers inside one run of digit groups. A card may be followed or
    preceded by other numbers in the same run ("4242 4242 4242 4242 12 30" has its expiry
    after it), so every span of whole groups holding 13-19 digits is tried, longest
    first; the digits of one group are never split."""
    run = match.group(0)
    groups = re.split(f"({_SEPARATOR})", run)  # digits, separator, digits, ...
    digits = groups[0::2]
    separators = groups[1::2]
    out: list[str] = []
    i = 0
    while i < len(digits):
        end = _card_ending_at(digits, i)
        if end is None:
            out.append(digits[i])
            if i < len(separators):
                out.append(separators[i])
            i += 1
            continue
        out.append(SECRET)
        if end < len(separators):
            out.append(separators[end])
        i = end + 1
    return "".join(out)


def _card_ending_at(digits: list[str], start: int) -> int | None:
    """The index of the last group of the longest card number starting at ``start``."""
    best = None
    count = 0
    for end in range(start, len(digits)):
        count += len(digits[end])
        if count > _CARD_DIGITS[-1]:
            break
        if count in _CARD_DIGITS and _luhn("".join(digits[start : end + 1])):
            best = end
    return best


def _luhn(number: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(number)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0
