"""``openonce mcp-proxy`` refuses what it cannot start, before it connects to anything:
in-process (``openonce_core.cli.main``), exit status 1 and one line on stderr."""

from __future__ import annotations

import json

import pytest

from openonce_core.cli import main


def proxy(tmp_path, capsys, *args: str) -> tuple[int, str]:
    status = main(["--db", str(tmp_path / "ledger.db"), "mcp-proxy", *args])
    return status, capsys.readouterr().err


def test_a_missing_config_file_is_named(tmp_path, capsys):
    status, err = proxy(tmp_path, capsys, "--config", str(tmp_path / "nope.json"))
    assert status == 1
    assert f"cannot read {tmp_path / 'nope.json'}" in err


def test_a_config_that_is_not_json_says_where(tmp_path, capsys):
    path = tmp_path / "openonce-mcp.json"
    path.write_text('{"upstream": {"command": "x"},\n "tools": {,}}')
    status, err = proxy(tmp_path, capsys, "--config", str(path))
    assert status == 1
    assert "is not JSON (line 2" in err


@pytest.mark.parametrize("listen", ["8765", "localhost:", "127.0.0.1:99999", "h:port"])
def test_a_bad_listen_address_is_refused(tmp_path, capsys, listen):
    path = tmp_path / "openonce-mcp.json"
    path.write_text(json.dumps({"upstream": {"command": "never-started"}}))
    status, err = proxy(tmp_path, capsys, "--config", str(path), "--listen", listen)
    assert status == 1
    assert "give HOST:PORT" in err
    assert not (tmp_path / "ledger.db").exists()  # refused before the ledger was opened
