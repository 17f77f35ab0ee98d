"""What counts as a hidden character, for text shown to a person.

Agent data and typed reasons are shown by the console (``console_tags.visible``) and
printed by the ``openonce`` command. Some characters render as nothing, reorder what
follows or command the terminal: a person could read another text than the ledger holds
(a reversed IBAN, a hidden word, a screen cleared, a link to somewhere else). Both show
each such character as a visible marker, ``U+202E``, from this one definition, so the
console and the terminal never disagree about what is hidden.

Hidden: controls (Cc: C0 with ESC, which starts ANSI and OSC 8 sequences, DEL, and C1
with CSI U+009B and OSC U+009D), format characters (Cf: bidi embeddings, overrides and
isolates U+202A-202E and U+2066-2069, zero-width U+200B-200F, U+2060-2064, U+FEFF, the
soft hyphen), line and paragraph separators, surrogates, private use and unassigned
points. Newline and tab are layout, kept as they are.
"""

from __future__ import annotations

import re
import unicodedata

LAYOUT = frozenset("\n\t")
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})

# Printable ASCII, newlines and tabs: nothing to mark (the common case, checked fast).
_PLAIN = re.compile(r"[ -~\n\t]*")


def is_hidden(char: str) -> bool:
    """Whether one character renders invisibly, reorders text or controls a terminal."""
    return char not in LAYOUT and unicodedata.category(char) in HIDDEN_CATEGORIES


def has_hidden(text: str) -> bool:
    return not _PLAIN.fullmatch(text) and any(is_hidden(c) for c in text)


def code_point(char: str) -> str:
    """The marker's text: ``U+202E``."""
    return f"U+{ord(char):04X}"


def marked(text: str) -> str:
    """``text`` with every hidden character written as ``[U+202E]``, for plain text (a
    terminal, a page title)."""
    if not has_hidden(text):
        return text
    return "".join(f"[{code_point(c)}]" if is_hidden(c) else c for c in text)
