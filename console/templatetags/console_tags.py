"""Small display helpers: ages, timestamps, argument summaries, secret digests."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django import template

register = template.Library()

# How the core stores a secret field (openonce_core.canonical.secret_digest): never the
# value, only this digest. The ledger does not record which fields are secret, so the
# console recognises them by shape.
SECRET_DIGEST = re.compile(r"^(?:sha256|hmac-sha256):[0-9a-f]{64}$")

_TIER_LABELS = {
    "tier_1_native_idempotency_key": "tier 1",
    "tier_2_natural_business_key": "tier 2",
    "tier_2_sender_controlled_authoritative": "tier 2",
    "tier_3_non_authoritative": "tier 3",
}


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
def tier_label(tier: str) -> str:
    return _TIER_LABELS.get(tier, tier)


@register.filter
def is_secret(value: Any) -> bool:
    return isinstance(value, str) and bool(SECRET_DIGEST.match(value))


@register.filter
def args_summary(effect: Any, width: int = 80) -> str:
    """``amount=500, charge='ch_1', card=sha256:3f2a…`` cut to ``width`` characters."""
    try:
        args = effect.args
    except ValueError:
        return "(unreadable arguments)"
    if not isinstance(args, dict):
        return _short(args)
    text = ", ".join(f"{name}={_short(value)}" for name, value in args.items())
    return text if len(text) <= width else text[: width - 1] + "…"


@register.filter
def pretty_json(value: Any) -> str:
    if value is None:
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def urlencode_pairs(pairs: list[tuple[str, str]]) -> str:
    return urlencode(pairs)


@register.filter
def get_item(mapping: dict[str, Any], key: str) -> Any:
    return mapping.get(key)


def _short(value: Any) -> str:
    if is_secret(value):
        return value[: value.index(":") + 9] + "…"
    if isinstance(value, str):
        return repr(value if len(value) <= 30 else value[:29] + "…")
    if isinstance(value, dict):
        return "{…}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    return json.dumps(value)
