"""The two long lists, rendered in Python: the queue's rows and the journal's timeline.

A hundred queue rows or two hundred journal lines cost Django's template engine some
30 ms on this project's 2-core machines, most of the page's budget; the same markup
built here costs a few. Every dynamic value goes through ``visible_text`` (agent data,
reasons: escaped, hidden characters marked) or ``html.escape``; the markup is the one
the templates around it style and the tests read.
"""

from __future__ import annotations

import html
from typing import Any

from django import template
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from .console_tags import (
    args_summary,
    duration,
    epoch,
    pretty_json,
    short_id,
    shorten,
    tier_class,
    tier_label,
    tier_short,
    tier_words,
    visible_text,
    when,
)

register = template.Library()

_NOT_PROBED = {"requires_approval", "approved"}


def _e(value: Any) -> str:
    return html.escape(str(value))


@register.simple_tag
def queue_rows(items: list[Any], labels: dict[str, str], show_digest: bool) -> SafeString:
    if not items:
        return mark_safe('<tr><td colspan="7" class="empty">Nothing waits for a person.</td></tr>')
    # Every effect page has the same path but for its id.
    path = reverse("effect", args=["EFFECT"])
    rows = []
    for item in items:
        effect = item.effect
        url = path.replace("EFFECT", _e(effect.id))
        new = ' class="new"' if item.new else ""
        badge = ' <span class="badge new-badge">new</span>' if item.new else ""
        facts = "".join(
            '<span class="fact">'
            + ("" if fact.label == "Amount" else _e(fact.label) + " ")
            + f"<strong>{visible_text(fact.value)}</strong></span> "
            for fact in item.facts
        )
        if item.verdict is not None:
            said = visible_text(shorten(item.verdict.words, 90))
        else:
            said = "—" if effect.state in _NOT_PROBED else "not probed yet"
        who = visible_text(str(item.requester)) if item.requester else "—"
        rows.append(
            f'<tr id="row-{_e(effect.id)}" data-row{new}>'
            f'<td data-label="Effect"><a data-row-link href="{url}"><code>'
            f"{_e(short_id(effect.id))}</code></a>{badge}</td>"
            f'<td data-label="Waiting for"><span class="state state-{_e(effect.state)}">'
            f"{_e(labels.get(effect.state, effect.state))}</span></td>"
            f'<td data-label="Tool">{visible_text(effect.tool)} <span class="badge'
            f' {_e(tier_class(item.tier))}" title="{_e(tier_words(item.tier))}">'
            f'{_e(tier_label(item.tier))}</span> <span class="tier-words">'
            f"{_e(tier_short(item.tier))}</span></td>"
            f'<td data-label="What">{facts}<span class="args">'
            f"{args_summary(effect, show_digest)}</span></td>"
            f'<td data-label="Requested by">{who}</td>'
            f'<td data-label="Probe said">{said}</td>'
            f'<td data-label="Waiting" class="num"><span title="since'
            f' {_e(epoch(effect.updated_at))}">{_e(duration(item.age))}</span></td></tr>'
        )
    return mark_safe("\n".join(rows))  # every value above is escaped


@register.simple_tag
def timeline(lines: list[Any], show_digest: bool) -> SafeString:
    out = []
    for line in lines:
        actor = visible_text(line.actor)
        overridden = bool(line.overrides)
        parts = [
            '<li class="overridden">' if overridden else "<li>",
            f'<div class="when">#{int(line.seq)} · {when(line.at)}</div>',
            f"<div><strong>{actor}</strong>: {_e(line.from_state or '(new)')} →"
            f' <span class="state state-{_e(line.to_state)}">{_e(line.to_state)}</span>',
        ]
        if overridden:
            parts.append(f' <span class="badge override">override by {actor}</span>')
        parts.append("</div>")
        if line.reason:
            parts.append(f'<p class="reason">{visible_text(line.reason)}</p>')
        for what in line.overrides:
            parts.append(f'<p class="small override-detail">Overrode: {visible_text(what)}</p>')
        if line.evidence:
            parts.append(
                "<details><summary>evidence</summary>"
                f"<pre>{pretty_json(line.evidence, show_digest)}</pre></details>"
            )
        parts.append("</li>")
        out.append("".join(parts))
    return mark_safe("\n".join(out))  # every value above is escaped
