"""The gateway as a user runs it: ``openonce mcp-proxy`` in its own process, the SDK's
client over stdio and over streamable HTTP, the upstream a real MCPServer process that
writes every call it receives to a file. Answers are awaited, never slept for; the HTTP
servers are polled until they answer, with a deadline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from openonce_core import EffectState, OpenOnce
from tests.mcp.mcp_support import UPSTREAM, config, free_port, received, tally, until
from tests.support.daemon import wait_until

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
OPENONCE = [sys.executable, "-m", "openonce_core.cli"]


async def answers(call: Any) -> bool:
    """Whether a call through the gateway got an answer, not an error."""
    return not (await call).is_error


def stdio_upstream(counts: Path, **env: str) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(UPSTREAM)],
        "env": {"OO_MCP_COUNTS": str(counts), **env},
        "timeout_seconds": 20,
    }


def write_config(tmp_path: Path, upstream: dict[str, Any], **overrides: Any) -> Path:
    path = tmp_path / "openonce-mcp.json"
    path.write_text(json.dumps(config(upstream={"payments": upstream}, **overrides)))
    return path


def gateway_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@asynccontextmanager
async def stdio_gateway(db: str, config_path: Path, name: str = "agent") -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "openonce_core.cli", "--db", db, "mcp-proxy", "--config", str(config_path)],
        env=gateway_env(),
        cwd=str(REPO),
    )
    info = types.Implementation(name=name, version="1")
    async with Client(params, client_info=info, read_timeout_seconds=60) as client:
        yield client


@contextmanager
def process(args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(args, env=env, cwd=REPO, stderr=subprocess.DEVNULL)
    try:
        yield child
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def answers_http(url: str) -> bool:
    import httpx

    try:
        httpx.get(url, timeout=1)  # any answer at all: the server is up
    except httpx.HTTPError:
        return False
    return True


def openonce(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPENONCE, "--db", db, *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_over_stdio_a_duplicate_replays_and_pass_through_reaches_upstream(tmp_path):
    counts = tmp_path / "calls.jsonl"
    cfg = write_config(tmp_path, stdio_upstream(counts))
    db = str(tmp_path / "ledger.db")

    async def main() -> None:
        async with stdio_gateway(db, cfg) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            assert {"pay", "refund", "lookup", "decline", "hang", "crash"} <= listed
            first = await client.call_tool("pay", {"order": "o-1", "amount_cents": 500})
            second = await client.call_tool("pay", {"order": "o-1", "amount_cents": 500})
            assert second.structured_content == first.structured_content
            assert not first.is_error
            for _ in range(2):
                await client.call_tool("lookup", {"order": "o-1"})

    anyio.run(main)
    assert tally(counts) == {"pay": 1, "lookup": 2}


def test_over_stdio_approval_with_the_openonce_command_then_runs_once(tmp_path):
    counts = tmp_path / "calls.jsonl"
    cfg = write_config(tmp_path, stdio_upstream(counts))
    db = str(tmp_path / "ledger.db")

    async def main() -> None:
        async with stdio_gateway(db, cfg) as client:
            asked = await client.call_tool("refund", {"charge": "ch_1"})
            signal = asked.structured_content or {}
            assert asked.is_error and signal["status"] == "approval_required"
            approved = await anyio.to_thread.run_sync(
                lambda: openonce(db, "approve", signal["effect_id"], "--by", "eric")
            )
            assert approved.returncode == 0, approved.stderr
            ran = await client.call_tool("refund", {"charge": "ch_1"})
            again = await client.call_tool("refund", {"charge": "ch_1"})
            assert not ran.is_error and again.structured_content == ran.structured_content

    anyio.run(main)
    assert tally(counts) == {"refund": 1}


def test_upstream_crashing_mid_call_is_unknown_never_sent_again_and_reconnected(tmp_path):
    counts = tmp_path / "calls.jsonl"
    cfg = write_config(tmp_path, stdio_upstream(counts))
    db = str(tmp_path / "ledger.db")

    async def main() -> None:
        async with stdio_gateway(db, cfg) as client:
            lost = await client.call_tool("crash", {"order": "o-9"})
            signal = lost.structured_content or {}
            assert lost.is_error and signal["status"] == "outcome_unknown"
            assert "Do not retry" in lost.content[0].text  # type: ignore[union-attr]
            with OpenOnce(db) as oo:
                assert oo.get(signal["effect_id"]).state == EffectState.UNKNOWN
            # The gateway starts the upstream again; until then nothing reaches it.
            await until(lambda: answers(client.call_tool("lookup", {"order": "o-9"})), 30)
            again = await client.call_tool("crash", {"order": "o-9"})
            assert (again.structured_content or {})["status"] == "outcome_unknown"
            other = await client.call_tool("pay", {"order": "o-10", "amount_cents": 1})
            assert not other.is_error

    anyio.run(main)
    assert tally(counts)["crash"] == 1  # the UNKNOWN call was never sent again
    assert tally(counts)["pay"] == 1


def test_over_streamable_http_both_ways_dedup_and_unknown(tmp_path):
    counts = tmp_path / "calls.jsonl"
    up_port, gw_port = free_port(), free_port()
    env = {**gateway_env(), "OO_MCP_COUNTS": str(counts)}
    upstream_url = f"http://127.0.0.1:{up_port}/mcp"
    cfg = write_config(tmp_path, {"url": upstream_url, "timeout_seconds": 20})
    db = str(tmp_path / "ledger.db")
    with process([sys.executable, str(UPSTREAM), "--http", str(up_port)], env):
        wait_until(lambda: answers_http(upstream_url), 20, "the upstream's HTTP server")
        gateway = [*OPENONCE, "--db", db, "mcp-proxy", "--config", str(cfg),
                   "--listen", f"127.0.0.1:{gw_port}"]  # fmt: skip
        with process(gateway, gateway_env()):
            url = f"http://127.0.0.1:{gw_port}/mcp"
            wait_until(lambda: answers_http(url), 20, "the gateway's HTTP server")

            async def main() -> None:
                async with Client(url) as client:
                    first = await client.call_tool("pay", {"order": "o-1", "amount_cents": 5})
                    second = await client.call_tool("pay", {"order": "o-1", "amount_cents": 5})
                    assert not first.is_error
                    assert second.structured_content == first.structured_content
                    assert (second.meta or {})["openonce/outcome"] == "replayed"
                    for _ in range(2):
                        hung = await client.call_tool("hang", {"order": "o-2"})
                        assert (hung.structured_content or {})["status"] == "outcome_unknown"
                    await client.call_tool("lookup", {"order": "o-1"})
                    await client.call_tool("lookup", {"order": "o-1"})

            anyio.run(main)
    assert tally(counts) == {"pay": 1, "hang": 1, "lookup": 2}


def test_bad_config_exits_naming_the_field_and_starts_nothing(tmp_path):
    counts = tmp_path / "calls.jsonl"
    cfg = write_config(tmp_path, stdio_upstream(counts), tools={"charge_card": {}})
    done = openonce(str(tmp_path / "ledger.db"), "mcp-proxy", "--config", str(cfg))
    assert done.returncode == 1
    assert "tools.charge_card: no upstream lists a tool named 'charge_card'" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"upstream": {"command": "x"}, "tools": {"pay": {"tool": 3}}}))
    done = openonce(str(tmp_path / "ledger.db"), "mcp-proxy", "--config", str(bad))
    assert done.returncode == 1
    assert "tools.pay.tool: must be a non-empty string" in done.stderr
    assert received(counts) == []


def test_two_gateways_on_one_postgres_ledger_race_the_same_call_upstream_once(tmp_path, pg_dsn):
    counts = tmp_path / "calls.jsonl"
    gate = tmp_path / "pay-may-answer"  # the second gateway's call arrives while it is held
    cfg = write_config(tmp_path, stdio_upstream(counts, OO_MCP_PAY_GATE=str(gate)))
    migrated = openonce(pg_dsn, "migrate")
    assert migrated.returncode == 0, migrated.stderr

    async def main() -> None:
        async with (
            stdio_gateway(pg_dsn, cfg, "agent-a") as a,
            stdio_gateway(pg_dsn, cfg, "agent-b") as b,
        ):
            answers: list[types.CallToolResult] = []

            async def call(client: Client) -> None:
                call = {"order": "o-race", "amount_cents": 700}
                answers.append(await client.call_tool("pay", call))

            async with anyio.create_task_group() as group:
                group.start_soon(call, a)
                group.start_soon(call, b)
                await until(lambda: tally(counts)["pay"], 30)  # one of them is at the provider
                gate.touch()
            assert [x.is_error for x in answers] == [False, False]
            assert answers[0].structured_content == answers[1].structured_content
            outcomes = sorted((x.meta or {})["openonce/outcome"] for x in answers)
            assert outcomes == ["executed", "replayed"]

    anyio.run(main)
    assert tally(counts) == {"pay": 1}


def test_an_http_upstream_that_goes_away_does_not_take_the_gateway_with_it(tmp_path):
    counts = tmp_path / "calls.jsonl"
    up_port = free_port()
    env = {**gateway_env(), "OO_MCP_COUNTS": str(counts)}
    upstream_url = f"http://127.0.0.1:{up_port}/mcp"
    cfg = write_config(tmp_path, {"url": upstream_url, "timeout_seconds": 20})
    db = str(tmp_path / "ledger.db")
    upstream = [sys.executable, str(UPSTREAM), "--http", str(up_port)]

    async def across_restart() -> None:
        up = subprocess.Popen(upstream, env=env, cwd=REPO, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: answers_http(upstream_url), 20, "the upstream's HTTP server")
            async with stdio_gateway(db, cfg) as client:
                first = await client.call_tool("pay", {"order": "o-1", "amount_cents": 5})
                assert not first.is_error
                up.kill()
                up.wait()
                down = await client.call_tool("lookup", {"order": "o-1"})
                assert down.is_error  # an error answer: the gateway itself is still up
                up = subprocess.Popen(upstream, env=env, cwd=REPO, stderr=subprocess.DEVNULL)
                await until(lambda: answers(client.call_tool("lookup", {"order": "o-1"})), 60)
                again = await client.call_tool("pay", {"order": "o-1", "amount_cents": 5})
                assert again.structured_content == first.structured_content  # replayed
                fresh = await client.call_tool("pay", {"order": "o-2", "amount_cents": 5})
                assert not fresh.is_error
        finally:
            up.kill()
            up.wait()

    anyio.run(across_restart)
    assert tally(counts)["pay"] == 2  # o-1 once, o-2 once
