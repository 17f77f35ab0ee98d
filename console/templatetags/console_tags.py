"""Display helpers: agent data shown safely, times, ages, money, secret digests.

``visible`` is the one filter every piece of agent data or typed reason goes through
before it reaches a page: characters that render invisibly or reorder text (bidi
controls, zero-width characters, C0/C1 controls) are shown as a visible ``U+202E``
marker instead, so an approver never reads a reversed IBAN or a hidden word.
"""

from __future__ import annotations

import html
import json
import re
import time
import unicodedata
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from openonce_core._textsafe import code_point, has_hidden, is_hidden, marked

from .. import context as decision_context

register = template.Library()

# How the core stores a secret field (openonce_core._canonical.secret_digest): never the
# value, only this digest. The ledger does not record which fields are secret, so the
# console recognises them by shape.
SECRET_DIGEST = re.compile(r"^(?:sha256|hmac-sha256):[0-9a-f]{64}$")
DIGEST_PREFIX = 8  # hex digits of a digest an operator may see (a viewer sees none)

# Plain words for the evidence tiers: what a probe's answer is worth for that provider.
_TIER_WORDS = {
    "tier_1_native_idempotency_key": "the provider looks our key up: a probe's answer is proof",
    "tier_2_natural_business_key": "found by a business key: a probe's answer is strong evidence",
    "tier_2_sender_controlled_authoritative": (
        "our own sent records are checked: a probe's answer is strong evidence"
    ),
    "tier_3_non_authoritative": "a probe can confirm, but a miss proves nothing",
}
_TIER_SHORT = {
    "tier_1_native_idempotency_key": "answer is proof",
    "tier_2_natural_business_key": "answer is strong evidence",
    "tier_2_sender_controlled_authoritative": "answer is strong evidence",
    "tier_3_non_authoritative": "a miss proves nothing",
}
FENCE_WORDS = "a version number that moves at every change, so a stale page is refused"

_TIER_LABELS = {
    "tier_1_native_idempotency_key": "evidence tier 1",
    "tier_2_natural_business_key": "evidence tier 2",
    "tier_2_sender_controlled_authoritative": "evidence tier 2",
    "tier_3_non_authoritative": "evidence tier 3",
}


def escape(text: str) -> SafeString:
    # The standard library's escape (what Django's does, without its lazy-string wrapper,
    # which costs more than the escaping on a page of a hundred rows).
    return mark_safe(html.escape(text))


def visible_text(value: Any) -> SafeString:
    """``value`` as HTML-escaped text with every hidden character shown as a marker."""
    text = "" if value is None else str(value)
    if not has_hidden(text):
        return escape(text)
    parts = []
    run: list[str] = []
    for char in text:
        if is_hidden(char):
            if run:
                parts.append(escape("".join(run)))
                run = []
            code = code_point(char)
            name = unicodedata.name(char, "control or unassigned character")
            parts.append(
                format_html('<span class="hidden-char" title="{} (hidden)">{}</span>', name, code)
            )
        else:
            run.append(char)
    if run:
        parts.append(escape("".join(run)))
    return mark_safe("".join(parts))  # every part was escaped above


@register.filter
def visible(value: Any) -> SafeString:
    return visible_text(value)


@register.filter
def visible_plain(value: Any) -> str:
    """The same for places that hold text only (a page title): ``[U+202E]``."""
    return marked("" if value is None else str(value))


@register.filter
def duration(seconds: float | None) -> str:
    """``42s``, ``3m 20s``, ``2h 5m``, ``4d 1h``."""
    if seconds is None:
        return "—"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


@register.filter
def age(ts: float | None) -> str:
    """How long ago an epoch timestamp was, as a ``duration``."""
    if ts is None:
        return "—"
    return duration(max(0.0, time.time() - ts))


@register.filter
def epoch(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def when(ts: float | datetime | None) -> SafeString | str:
    """A moment in UTC, labelled so, the same on every page and in every export.

    UTC, not the viewer's zone: the filters read UTC (a pasted or bookmarked filter means
    the same to every operator), the exports, the journal and the server logs are UTC,
    and an operator comparing a time on the page with one in a filter or a log must not
    convert. A plain element, not ``<time datetime>``: a script localizing those would
    show a different time than the filter reads."""
    if ts is None:
        return "—"
    moment = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, UTC)
    moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    # Digits, dashes and colons only: nothing to escape.
    return mark_safe(f'<span class="utc">{text} UTC</span>')


@register.filter
def short_id(effect_id: str) -> str:
    """``eff_3f2a9c1e0b7d…``: enough to tell rows apart (ids are ASCII; no Truncator)."""
    return effect_id if len(effect_id) <= 16 else effect_id[:15] + "…"


@register.filter
def shorten(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@register.filter
def tier_label(tier: str) -> str:
    return _TIER_LABELS.get(tier, tier)


@register.filter
def tier_words(tier: str) -> str:
    """What an evidence tier means, in a sentence: how far a probe's answer counts."""
    return _TIER_WORDS.get(tier, "no known provider: a probe's answer is not evidence")


@register.filter
def tier_short(tier: str) -> str:
    """The tier's meaning in three words, for a badge: ``answer is proof``."""
    return _TIER_SHORT.get(tier, "not evidence")


@register.simple_tag
def fence_words() -> str:
    """What "fence" means, for a page that shows one."""
    return FENCE_WORDS


@register.filter
def tier_class(tier: str) -> str:
    """The badge class of a tier (what ``tier_label|slugify`` gives, without the regex)."""
    return _TIER_LABELS.get(tier, tier).replace(" ", "-").lower()


@register.filter
def is_secret(value: Any) -> bool:
    return isinstance(value, str) and bool(SECRET_DIGEST.match(value))


def secret_text(value: str, show_digest: bool) -> str:
    """A secret field's digest as a person may see it: ``secret`` for viewers, the
    scheme and a short prefix for operators and above; never the whole digest."""
    if not show_digest:
        return "secret"
    scheme, _, digest = value.partition(":")
    return f"secret · {scheme}:{digest[:DIGEST_PREFIX]}…"


def redact(value: Any, show_digest: bool) -> Any:
    """``value`` with every secret digest inside it replaced by ``secret_text``."""
    if is_secret(value):
        return secret_text(value, show_digest)
    if isinstance(value, dict):
        return {k: redact(v, show_digest) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, show_digest) for v in value]
    return value


@register.filter
def secret(value: str, show_digest: bool = False) -> str:
    return secret_text(value, bool(show_digest))


@register.filter
def args_summary(effect: Any, show_digest: bool = False) -> SafeString:
    """``amount=500, charge='ch_1', card=secret`` cut to 80 characters, made visible."""
    width = 80
    try:
        args = effect.args
    except ValueError:
        return visible_text("(unreadable arguments)")
    if not isinstance(args, dict):
        return visible_text(_short(args, bool(show_digest)))
    text = ", ".join(f"{name}={_short(value, bool(show_digest))}" for name, value in args.items())
    return visible_text(text if len(text) <= width else text[: width - 1] + "…")


@register.filter
def pretty_json(value: Any, show_digest: bool = False) -> SafeString | str:
    """Indented JSON, secrets redacted, hidden characters made visible."""
    if value is None:
        return ""
    text = json.dumps(
        redact(value, bool(show_digest)), indent=2, sort_keys=True, ensure_ascii=False
    )
    return visible_text(text)


@register.filter
def compact_json(value: Any) -> str:
    """One-line JSON, for templates a person copies (escaped by the template)."""
    return json.dumps(value, ensure_ascii=False)


@register.filter
def urlencode_pairs(pairs: list[tuple[str, str]]) -> str:
    return urlencode(pairs)


@register.filter
def get_item(mapping: dict[str, Any], key: str) -> Any:
    return mapping.get(key)


@register.filter
def state_label(state: str) -> str:
    return decision_context.STATE_LABELS.get(state, state)


def _short(value: Any, show_digest: bool) -> str:
    if is_secret(value):
        return secret_text(value, show_digest)
    if isinstance(value, str):
        # Quoted as written (not repr): a hidden character is then marked by visible_text.
        return "'" + (value if len(value) <= 30 else value[:29] + "…") + "'"
    if isinstance(value, dict):
        return "{…}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    text = json.dumps(value)
    return text if len(text) <= 30 else text[:29] + "…"
