"""What ``openonce`` prints from the ledger reaches the terminal as text, never as a
command: bidi overrides, zero-width characters and escape sequences (a screen clear, an
OSC 8 link, a C1 CSI) written by an agent or a person show as the console's markers."""

from __future__ import annotations

import pytest

from console.templatetags.console_tags import visible_plain, visible_text
from openonce_core import BusinessError, OpenOnce, require_approval_for
from openonce_core.cli import main

# A right-to-left override, a zero-width space, a screen clear, an OSC 8 link around
# "here", and a C1 CSI that would turn the rest red.
EVIL = "\u202e\u200b\x1b[2J\x1b]8;;https://evil.example\x1b\\here\x1b]8;;\x1b\\\x9b31m"
SHOWN = (
    "[U+202E][U+200B][U+001B][2J[U+001B]]8;;https://evil.example[U+001B]\\here"
    "[U+001B]]8;;[U+001B]\\[U+009B]31m"
)
RAW = ("\x1b", "\x9b", "\u202e", "\u200b")


class Declined(BusinessError):
    """The provider said no, in words an agent's input chose."""


def show(db: str, effect_id: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What ``openonce --db DB show ID`` prints (run in this process: what reaches the
    terminal is what it writes to stdout)."""
    assert main(["--db", db, "show", effect_id]) == 0
    out = capsys.readouterr().out
    assert_nothing_raw(out)
    return out.splitlines()


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "cli.db")


def failed_with_evil_text(db: str) -> str:
    """An effect whose arguments and recorded error hold EVIL."""
    oo = OpenOnce(db, retry_delay=0)

    @oo.effect(tool="stripe.refund", idempotency_key=lambda note: "refund-1")
    def refund(note: str) -> None:
        raise Declined("card declined " + EVIL)

    with pytest.raises(Declined):
        refund(EVIL)
    (effect,) = oo.store.list_effects()
    oo.close()
    return effect.id


def denied_by_evil_name(db: str) -> str:
    """An effect a person with EVIL in their name denied, for EVIL's reason."""
    oo = OpenOnce(db, policy=require_approval_for(["stripe.*"]))

    @oo.effect(tool="stripe.charge", idempotency_key=lambda amount_cents: "charge-1")
    def charge(amount_cents: int) -> dict[str, str]:
        return {"id": "pi_1"}

    with pytest.raises(Exception, match="approval"):
        charge(500)
    (effect,) = oo.store.list_effects()
    oo.deny(effect.id, by="eve" + EVIL, reason="no " + EVIL)
    oo.close()
    return effect.id


def assert_nothing_raw(text: str) -> None:
    assert not [c for c in RAW if c in text], ascii(text)


def test_show_marks_hidden_characters_in_arguments_and_error(db, capsys):
    lines = show(db, failed_with_evil_text(db), capsys)
    (arguments,) = [line for line in lines if line.lstrip().startswith("arguments:")]
    # JSON writes a control character as \u001b itself; the bidi and zero-width ones
    # it keeps are marked.
    assert "[U+202E][U+200B]\\u001b[2J" in arguments
    (error,) = [line for line in lines if line.lstrip().startswith("error:")]
    assert error.endswith(f"Declined: card declined {SHOWN}")


def test_show_marks_hidden_characters_in_the_journal_actor_and_reason(db, capsys):
    (denial,) = [line for line in show(db, denied_by_evil_name(db), capsys) if "-> denied" in line]
    assert denial.endswith(f"operator:eve{SHOWN}: no {SHOWN}")


def test_the_console_shows_the_same_markers_for_the_same_text():
    assert visible_plain(EVIL) == SHOWN
    page = visible_text(EVIL)
    assert_nothing_raw(page)
    codes = ["U+202E", "U+200B", "U+001B", "U+001B", "U+001B", "U+001B", "U+001B", "U+009B"]
    assert [f">{code}</span>" in page for code in codes] == [True] * len(codes)
    assert page.count('class="hidden-char"') == len(codes)
