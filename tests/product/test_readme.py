"""The README's Python examples run as written, in order, as a new user would paste them."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run_as_written(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {}
    exec(compile("\n".join(blocks), str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert "already used with different arguments" in out
    assert namespace["sent"] == ["a@b.c"]
