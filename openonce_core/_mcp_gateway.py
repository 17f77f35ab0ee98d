"""The MCP gateway: an MCP server that fronts upstream MCP servers and runs the tools the
configuration lists through the ledger, exactly as ``@oo.effect`` runs a handler.

* The tool list passes through unchanged (names, descriptions, input and output schemas):
  the gateway answers ``tools/list`` with what the upstreams listed at start.
* A listed tool is declared with ``OpenOnce.declare`` (the same ``EffectOptions``); its
  handler forwards the call upstream with the effect's provider key in the request's
  ``_meta`` (``openonce/provider_key``) and, if the configuration names one, as an
  argument. A duplicate replays the recorded result without reaching upstream.
* What an upstream answer means: a result is COMMITTED; a tool error result
  (``isError``) is FAILED and replays (``business_errors`` says which ones; the others
  are UNKNOWN); a JSON-RPC refusal of the request itself (unknown tool, invalid params)
  ran nothing: the claim is given back and the call answers "refused", as it does for a
  tool error about a tool the upstream no longer lists (dropped since the gateway
  started); a timeout, a lost upstream, anything else after the request left is UNKNOWN.
  An upstream known to be lost is not sent to: the claim is given back too. An answer
  the ledger cannot store is COMMITTED without it; a duplicate is told it happened.
* A call OpenOnce stops (approval, unknown outcome, denial, ...) answers with a tool
  error whose text and ``structuredContent`` say what happened and what to do, naming the
  effect and its console page. Bad calls (arguments that do not fit the tool's input
  schema, a missing idempotency field, a float in key material, a NUL) are refused
  before anything is written or sent.
* Who asked (the MCP client's name and session, ``mcp:<client>#<session>``) goes into the
  claim's own journal line (``oo.requested_by``), the console's requester; another session
  asking for an effect that waits for approval is journaled as a note for the approver.
* Tools not listed pass through, unrecorded.
* Each upstream's connection lives in a task of its own: one that breaks is opened again
  (a stdio server started again) without taking the gateway down.

Scope (what a derived key is unique within): a call's ``_meta["openonce/scope"]``, else
the configuration's fixed ``scope``, else, with ``{"per": "session"}``, the client's
session (``_meta["openonce/session"]``, the streamable HTTP session id, or on stdio the
gateway process, which serves one client). A session scope does not dedupe across an
agent's restart; a fixed scope dedupes across restarts but also across agents sharing it.
A ``_meta`` scope or session the gateway cannot use (not a string, empty, too long) is
refused, never ignored: the fallback would be wider than what the client asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import jsonschema  # type: ignore[import-untyped]  # no stubs; mcp depends on it
import mcp_types as types
from anyio.abc import TaskStatus
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED, INVALID_PARAMS, METHOD_NOT_FOUND

from ._bridge import HandlerNotStarted
from ._canonical import canonical, check_json
from ._context import current_effect
from ._mcp_config import GatewayConfig, ToolEffect, Upstream, template_fields
from ._observe import EffectEvent
from ._options import EffectOptions
from ._policy import require_approval_for
from ._runtime import OpenOnce
from .errors import (
    ApprovalPending,
    BusinessError,
    ConfigurationError,
    EffectFailed,
    MayHaveRunError,
    NothingRanError,
    OpenOnceError,
    ResultUnavailableError,
    UnknownOutcomeError,
)
from .integrations._signals import STOPS, signal_for

log = logging.getLogger("openonce.mcp")

GATEWAY_NAME = "openonce-mcp-gateway"

# Keys of a request's ``_meta`` the gateway reads, and of the ``_meta`` it sends upstream
# and answers with.
META_SCOPE = "openonce/scope"
META_SESSION = "openonce/session"
META_PROVIDER_KEY = "openonce/provider_key"
META_EFFECT_ID = "openonce/effect_id"
META_OUTCOME = "openonce/outcome"
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"

# The longest ``_meta`` scope or session the gateway takes: the scope is indexed with the
# key, and Postgres refuses an index row over ~2.7 kB (SQLite would take it: the stores
# would disagree on the same call).
MAX_SCOPE_CHARS = 256

REFUSED = "refused"  # the ``status`` of a bad call's answer: nothing ran
HAPPENED = "happened"  # settled from a receipt that is not the tool's own answer

RECONNECT_PAUSE = 0.5  # seconds before the first try to reconnect a lost upstream
MAX_RECONNECT_PAUSE = 30.0


class _UpstreamToolError(BusinessError):
    """The upstream tool answered with an error result: FAILED, replayed. ``result`` is
    that answer as JSON, given back to every duplicate."""

    def __init__(self, result: dict[str, Any]) -> None:
        # The answer is the exception's one argument: what the ledger records and a
        # replay constructs it from again.
        self.result = result
        super().__init__(result)

    def __str__(self) -> str:
        return _result_text(self.result) or "the upstream tool answered with an error"


class _UpstreamOutcomeUnknown(UnknownOutcomeError):
    """The request left for the upstream and no answer that settles it came back."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asked: the MCP client's name and its session, journaled on every effect it
    runs (the console's requester)."""

    client: str
    session: str | None

    @property
    def actor(self) -> str:
        return f"mcp:{self.client}" + (f"#{self.session}" if self.session else "")


_events: contextvars.ContextVar[list[EffectEvent] | None] = contextvars.ContextVar(
    "mcp_events", default=None
)


class UpstreamServer:
    """One upstream MCP server, held open by a task of its own (:meth:`run`): a connection
    that breaks (the process died, the HTTP server went away) takes down that task's
    client, not the gateway, and is opened again, with a growing pause between tries."""

    def __init__(self, spec: Upstream, target: Any = None) -> None:
        self.spec = spec
        self._target = target  # an in-process server or a Transport, for tests
        self.client: Client | None = None
        self.lost = False  # no usable connection: nothing is sent until it is back
        self._stopping = False
        self._stopped = anyio.Event()
        self._wake = anyio.Event()  # set to close the connection (stop, or it broke)

    async def run(self, *, task_status: TaskStatus[list[types.Tool]]) -> None:
        """Connect, hand the tool list to whoever started this task, then hold the
        connection until :meth:`stop`; reconnect when it breaks. A first connection that
        fails raises: the gateway does not start without its upstreams."""
        started = False
        pause = RECONNECT_PAUSE
        while not self._stopping:
            self._wake = anyio.Event()
            try:
                async with self._new_client() as client:
                    tools = await _list_tools(client)
                    self.client, self.lost = client, False
                    if not started:
                        task_status.started(tools)
                        started = True
                    else:
                        log.warning("upstream %r: connected again", self.spec.name)
                    pause = RECONNECT_PAUSE
                    await self._wake.wait()
            except Exception as exc:
                if not started:
                    raise
                log.warning("upstream %r: connection lost (%s)", self.spec.name, _inner(exc))
            finally:
                self.client, self.lost = None, True
            if not self._stopping:
                with anyio.move_on_after(pause):
                    await self._stopped.wait()
                pause = min(pause * 2, MAX_RECONNECT_PAUSE)

    def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        self._wake.set()

    def broke(self) -> None:
        """The connection closed under a call: send nothing more on it; reconnect."""
        self.lost = True
        self._wake.set()

    async def lists(self, name: str) -> bool:
        """Whether the upstream lists the tool ``name`` now; True when it cannot say (the
        answer then counts as it is)."""
        client = self.client
        if client is None or self.lost:
            return True
        try:
            with anyio.fail_after(self.spec.timeout_seconds):
                return any(tool.name == name for tool in await _list_tools(client))
        except Exception:
            return True

    def _new_client(self) -> Client:
        return Client(
            self._target if self._target is not None else self._transport(),
            client_info=types.Implementation(name=GATEWAY_NAME, version=_version()),
            cache=None,  # the gateway lists once; a cache would only hide a change
        )

    def _transport(self) -> Any:
        spec = self.spec
        if spec.url is not None:
            http = httpx2.AsyncClient(
                headers=dict(spec.headers or {}), timeout=spec.timeout_seconds
            )
            return streamable_http_client(spec.url, http_client=http)
        assert spec.command is not None
        # The upstream gets a safe environment plus what the configuration sets, never the
        # gateway's own (it holds the ledger's DSN and perhaps the secret pepper).
        return StdioServerParameters(
            command=spec.command,
            args=list(spec.args),
            env={**get_default_environment(), **(spec.env or {})},
            cwd=spec.cwd,
        )

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any], timeout: float
    ) -> types.CallToolResult:
        if self.client is None or self.lost:
            raise ConnectionError(f"the upstream {self.spec.name!r} is not connected")
        try:
            return await self.client.call_tool(
                name,
                arguments,
                read_timeout_seconds=timeout,
                meta=meta,  # type: ignore[arg-type]
            )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.broke()
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self.broke()
            raise


class Gateway:
    """The upstreams, the ledger client and the configuration: what ``tools/list`` and
    ``tools/call`` answer from. Made by :func:`open_gateway`."""

    def __init__(self, config: GatewayConfig, oo: OpenOnce) -> None:
        self.config = config
        self.oo = oo
        self.tools: list[types.Tool] = []  # as the upstreams listed them
        self.routes: dict[str, UpstreamServer] = {}
        self.session = "stdio-" + uuid.uuid4().hex[:12]  # this process's session on stdio
        self._declared: dict[tuple[str, tuple[str, ...]], Callable[..., Any]] = {}
        self._validators: dict[str, Any] = {}
        oo.observe(_record_event)

    def add_upstream(self, upstream: UpstreamServer, tools: list[types.Tool]) -> None:
        for tool in tools:
            other = self.routes.get(tool.name)
            if other is not None:
                raise OpenOnceError(
                    f"upstreams {other.spec.name!r} and {upstream.spec.name!r} both list a tool"
                    f" named {tool.name!r}; an MCP client could not tell them apart"
                )
            self.routes[tool.name] = upstream
            self.tools.append(tool)

    def check_declarations(self) -> None:
        """Declare every listed tool once, with all its arguments, so an option the core
        refuses (secret fields without a pepper, a bad max_attempts) stops the gateway at
        start instead of failing its first call."""
        for effect in self.config.tools.values():
            tool = next(t for t in self.tools if t.name == effect.name)
            properties = tool.input_schema.get("properties") or {}
            names = tuple(n for n in properties if n.isidentifier())
            try:
                self._declare(effect, names)
            except (OpenOnceError, ValueError) as exc:
                raise ConfigurationError(f"tools.{effect.name}: {exc}") from None

    # -- answering tools/call --------------------------------------------------------------

    async def call(
        self, name: str, arguments: dict[str, Any], meta: Mapping[str, Any], caller: Caller
    ) -> types.CallToolResult:
        upstream = self.routes.get(name)
        if upstream is None:
            return _error(f"unknown tool {name!r}", {"status": REFUSED, "tool": name})
        effect = self.config.tools.get(name)
        if effect is None:  # passes through, unrecorded
            if upstream.lost:
                why = f"the upstream {upstream.spec.name!r} is not connected; nothing was sent"
                return _error(why, {"status": "not_connected", "tool": name})
            return await upstream.call(name, arguments, {}, upstream.spec.timeout_seconds)
        return await self._recorded(effect, arguments, meta, caller)

    async def _recorded(
        self,
        effect: ToolEffect,
        arguments: dict[str, Any],
        meta: Mapping[str, Any],
        caller: Caller,
    ) -> types.CallToolResult:
        problem = self._bad_meta(meta) or self._bad_call(effect, arguments)
        if problem:
            return _refused(effect.tool, problem)
        scope = self._scope(meta, caller)
        if scope is None and effect.idempotency_key is None:
            if self.config.scope_per_session:
                why = (
                    "this call has no session to scope its key to (a stateless HTTP client):"
                    f' pass _meta["{META_SESSION}"] or _meta["{META_SCOPE}"] with the call'
                )
            else:
                why = (
                    "no scope for this call's key: set \"scope\" in the gateway's"
                    f' configuration, or pass _meta["{META_SCOPE}"] with the call'
                )
            return _refused(effect.tool, why)
        handler = self._declare(effect, tuple(arguments))
        events: list[EffectEvent] = []
        events_token = _events.set(events)
        try:
            # Who asked goes into the claim's own journal line (the console's requester),
            # in the claim's commit: no third commit on the call's path.
            with (
                self.oo.scope(scope) if scope else contextlib.nullcontext(),
                self.oo.requested_by(caller.actor) if caller else contextlib.nullcontext(),
            ):
                result = await handler(**arguments)
        except STOPS as exc:
            if isinstance(exc, ApprovalPending) and exc.effect_id:
                # The person who approves sees who asked; the handler has not run yet.
                note = functools.partial(self._note_requester, exc.effect_id, caller, once=True)
                await _quietly(asyncio.get_running_loop().run_in_executor(None, note))
            return self._stopped(exc, effect)
        except _UpstreamToolError as exc:
            return _with_meta(exc.result, _effect_meta(events))  # the upstream's own
        except NothingRanError as exc:
            return _refused(effect.tool, str(exc))
        except ResultUnavailableError as exc:
            # COMMITTED, but its answer could not be stored (an integer of 200 digits, a
            # structure nested too deep): not "outcome unknown", which would send the
            # model to wait for a person who has nothing to settle.
            return _unreplayable(exc, effect.tool)
        except MayHaveRunError as exc:
            return self._stopped_unknown(exc, effect)
        except EffectFailed as exc:  # a recorded failure this process cannot rebuild
            return _error(
                str(exc), {"status": "failed", "tool": effect.tool, **_effect_meta(events)}
            )
        except (OpenOnceError, ValueError) as exc:  # set-up errors, raised before any run
            return _refused(effect.tool, str(exc))
        finally:
            _events.reset(events_token)
        return _with_meta(result, _effect_meta(events), self._output_schema(effect.name))

    def _bad_meta(self, meta: Mapping[str, Any]) -> str:
        """A scope or session the call names but the gateway cannot use. Never ignored:
        the fallback (the configuration's scope, the process's session) is wider than
        what the client asked for, and its call would replay another task's answer."""
        keys = (META_SCOPE, META_SESSION) if self.config.meta_scope else (META_SESSION,)
        for key in keys:
            if key not in meta:
                continue
            value = meta[key]
            if not isinstance(value, str) or not value or len(value) > MAX_SCOPE_CHARS:
                got = f"{len(value)} characters" if isinstance(value, str) else _kind(value)
                return (
                    f'_meta["{key}"] must be a non-empty string of at most {MAX_SCOPE_CHARS}'
                    f" characters, not {got}; nothing ran"
                )
        return ""

    def _bad_call(self, effect: ToolEffect, arguments: dict[str, Any]) -> str:
        for option, names in (
            ("idempotency_fields", effect.idempotency_fields or ()),
            ("idempotency_key", template_fields(effect.idempotency_key or "")),
        ):
            for name in names:
                if name not in arguments:
                    return (
                        f"argument {name!r} is missing: it is part of this call's"
                        f" idempotency key ({option}); nothing ran"
                    )
        for name in arguments:
            if not name.isidentifier() or name.startswith("__"):
                return f"argument name {name!r} cannot be recorded; nothing ran"
        if effect.provider_key_argument in arguments:
            return (
                f"argument {effect.provider_key_argument!r} is set by OpenOnce (the provider"
                " key); leave it out; nothing ran"
            )
        # Checked here, not left to the upstream: its refusal would be recorded as the
        # effect's failure, and the corrected call (the same key) would replay it.
        problem = next(iter(self._validator(effect.name).iter_errors(arguments)), None)
        if problem is not None:
            where = "".join(f"[{p!r}]" for p in problem.absolute_path) or "arguments"
            return f"{where} do not fit the tool's input schema: {problem.message}; nothing ran"
        return ""

    def _output_schema(self, name: str) -> Mapping[str, Any] | None:
        return next(t.output_schema for t in self.tools if t.name == name)

    def _validator(self, name: str) -> Any:
        found = self._validators.get(name)
        if found is None:
            schema = next(t.input_schema for t in self.tools if t.name == name)
            found = jsonschema.validators.validator_for(schema)(schema)
            self._validators[name] = found
        return found

    def _scope(self, meta: Mapping[str, Any], caller: Caller) -> str | None:
        given = meta.get(META_SCOPE) if self.config.meta_scope else None
        if isinstance(given, str) and given:
            return given
        if self.config.scope is not None:
            return self.config.scope
        if self.config.scope_per_session and caller.session:
            return f"mcp-session:{caller.session}"
        return None

    def _declare(self, effect: ToolEffect, names: tuple[str, ...]) -> Callable[..., Any]:
        """The effect for calls with these argument names: the handler's signature is the
        call's arguments, so ``bind`` keeps them exactly as sent (an optional argument left
        out is not recorded as a default)."""
        found = self._declared.get((effect.name, names))
        if found is not None:
            return found
        gateway = self

        async def forward(**arguments: Any) -> Any:
            return await gateway._forward(effect, arguments)

        forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [_parameter(n) for n in names]
        )
        forward.__name__ = forward.__qualname__ = effect.name
        template = effect.idempotency_key
        options = EffectOptions(
            tool=effect.tool,
            idempotency_fields=effect.idempotency_fields,
            idempotency_key=functools.partial(_template_key, template) if template else None,
            max_attempts=effect.max_attempts,
            secret_fields=[f for f in effect.secret_fields if f in names],
            lease_seconds=effect.lease_seconds,
            wait_seconds=effect.wait_seconds,
        )
        declared = self.oo.declare(forward, options)
        if len(self._declared) >= 1024:  # argument-name sets are few; bound them anyway
            self._declared.clear()
        self._declared[(effect.name, names)] = declared
        return declared

    async def _forward(self, effect: ToolEffect, arguments: dict[str, Any]) -> Any:
        """The effect's handler: send the call upstream once, and say what came back."""
        ctx = current_effect()
        upstream = self.routes[effect.name]
        if upstream.client is None or upstream.lost:
            # Nothing is sent: the claim is given back (the effect returns to planned) and
            # the same call runs once the gateway is connected again.
            raise HandlerNotStarted(
                f"the upstream {upstream.spec.name!r} is not connected; nothing was sent."
                " Restart the gateway, then make the same call again"
            )
        sent = dict(arguments)
        if effect.provider_key_argument:
            sent[effect.provider_key_argument] = ctx.provider_key
        meta = {META_PROVIDER_KEY: ctx.provider_key, META_EFFECT_ID: ctx.effect_id}
        timeout = effect.timeout_seconds or upstream.spec.timeout_seconds
        try:
            result = await upstream.call(effect.name, sent, meta, timeout)
        except MCPError as exc:
            if exc.code in (INVALID_PARAMS, METHOD_NOT_FOUND):
                # The upstream refused the request itself; its tool did not run. The claim
                # is given back, so the corrected call is not answered with this refusal.
                raise HandlerNotStarted(
                    f"the upstream refused the request: {exc.message}"
                ) from None
            raise _UpstreamOutcomeUnknown(
                f"no answer from the upstream {upstream.spec.name!r} ({exc.message})"
            ) from None
        except Exception as exc:
            raise _UpstreamOutcomeUnknown(
                f"the upstream {upstream.spec.name!r} was lost: {type(exc).__name__}: {exc}"
            ) from None
        payload = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        payload.pop("_meta", None)
        if result.is_error and not await upstream.lists(effect.name):
            # The upstream dropped (or renamed) the tool since the gateway started, and
            # answers its calls with an error result ("Unknown tool: pay", as the SDK's
            # MCPServer does) instead of refusing the request: a tool it does not have did
            # not run. Recorded as FAILED it would replay forever, even once it is back.
            raise HandlerNotStarted(
                f"the upstream {upstream.spec.name!r} no longer lists the tool"
                f" {effect.name!r} (it answered: {_result_text(payload)[:200]})"
            )
        if result.is_error:
            if _is_business(effect, _result_text(payload)):
                raise _UpstreamToolError(payload)
            raise _UpstreamOutcomeUnknown(
                "the upstream tool answered with an error not listed in business_errors: "
                + _result_text(payload)
            )
        return payload

    def _note_requester(self, effect_id: str, caller: Caller, *, once: bool = False) -> None:
        """Journal who asked (the console's requester). ``once``: not if this caller is
        journaled on the effect already (a call repeated while it waits for approval)."""
        if once and any(
            caller.actor in (line.actor, (line.evidence or {}).get("requested_by"))
            for line in self.oo.journal(effect_id)
        ):
            return
        session = f", session {caller.session}" if caller.session else ""
        self.oo.ledger.note(
            effect_id,
            actor=caller.actor,
            reason=f"requested by MCP client {caller.client!r}{session}",
        )

    def _stopped(self, exc: OpenOnceError, effect: ToolEffect) -> types.CallToolResult:
        signal = signal_for(exc, effect.tool)
        effect_id = signal.get("effect_id")
        if effect_id and self.config.console_url:
            signal["console"] = f"{self.config.console_url}/effects/{effect_id}/"
        lines = [_HEADLINES.get(signal["status"], signal["status"]), signal["instruction"]]
        if effect_id:
            lines.append(f"Effect: {effect_id}")
        if signal.get("console"):
            lines.append(f"Console: {signal['console']}")
        if signal["status"] == "approval_required":
            lines.append(f"Approve: openonce approve {effect_id} --by <name>")
        return _error("\n".join(lines), signal)

    def _stopped_unknown(self, exc: MayHaveRunError, effect: ToolEffect) -> types.CallToolResult:
        signal = signal_for(exc, effect.tool)  # anything else that may have run: do not retry
        signal["detail"] = str(exc)
        return _error(f"{_HEADLINES['outcome_unknown']}\n{signal['instruction']}", signal)


_HEADLINES = {
    "approval_required": "Approval required: this call has not run.",
    "approval_denied": "Denied: this call did not run and will not run.",
    "cancelled": "Cancelled: this call did not run and will not run.",
    "outcome_unknown": "Outcome unknown: this call may or may not have happened. Do not retry.",
    "in_progress": "In progress: this call is running elsewhere. Do not start it again.",
}


def _template_key(template: str, **arguments: Any) -> str:
    """An ``idempotency_key`` template filled in: a string argument as it is, any other as
    canonical JSON (RFC 8785, keys sorted). The same object sent with its keys in another
    order (a model writing the call again) makes the same key, and a key reads alike in
    every client's language: ``true``, ``null``, not Python's ``True``, ``None``."""
    values = {}
    for name in template_fields(template):
        value = arguments[name]
        if isinstance(value, str):
            values[name] = value
        else:
            plain = check_json(value, name, key_material=True)
            values[name] = canonical(value, plain=plain)
    return template.format_map(values)


def _parameter(name: str) -> inspect.Parameter:
    """A handler parameter named as the call's argument, a Python keyword too: MCP
    arguments are JSON keys, and ``from``, ``class`` or ``in`` are common ones (a mail's
    sender, a conversion's currency). ``inspect.Parameter`` refuses a keyword name; the
    handler is only ever called with keywords, so the name need not be one Python could
    spell, and the core binds such calls by name without ``Signature.bind``."""
    parameter = inspect.Parameter("_", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameter._name = name  # type: ignore[attr-defined]
    return parameter


async def _quietly(done: Awaitable[Any]) -> None:
    """Wait for a requester note; one that failed is logged, never the call's problem."""
    try:
        await done
    except Exception:
        log.exception("openonce mcp: could not journal the requester")


def _record_event(event: EffectEvent) -> None:
    events = _events.get()
    if events is not None:
        events.append(event)


def _effect_meta(events: list[EffectEvent]) -> dict[str, Any]:
    if not events:
        return {}
    last = events[-1]
    return {META_EFFECT_ID: last.effect_id, META_OUTCOME: last.outcome}


def _kind(value: Any) -> str:
    """What a JSON value is, in the words of the protocol's JSON, not Python's."""
    if value is None:
        return "null"
    kinds = {dict: "an object", list: "a list", bool: "true/false", int: "a number"}
    return kinds.get(type(value), "a number" if isinstance(value, float) else type(value).__name__)


def _is_business(effect: ToolEffect, text: str) -> bool:
    if isinstance(effect.business_errors, bool):
        return effect.business_errors
    return any(pattern in text for pattern in effect.business_errors)


def _inner(exc: BaseException) -> str:
    """What went wrong, out of the task groups' exception groups around it."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _result_text(payload: Mapping[str, Any]) -> str:
    texts = [
        str(block.get("text", ""))
        for block in payload.get("content") or ()
        if isinstance(block, Mapping) and block.get("type") == "text"
    ]
    return "\n".join(texts)


def _with_meta(
    payload: Any, meta: dict[str, Any], output_schema: Mapping[str, Any] | None = None
) -> types.CallToolResult:
    if isinstance(payload, Mapping) and isinstance(payload.get("content"), list):
        result = types.CallToolResult.model_validate(payload)
    else:
        result = _receipt_answer(payload, output_schema)
    if meta:
        result.meta = {**(result.meta or {}), **meta}  # type: ignore[typeddict-item]
    return result


def _receipt_answer(receipt: Any, output_schema: Mapping[str, Any] | None) -> types.CallToolResult:
    """The answer to a call whose upstream answer was lost and whose effect a person or
    the reconciler settled with a receipt. A receipt that fits the tool's output schema is
    the answer; one that does not (a client checks a result against the schema) is told
    as a tool error that says the call happened, so the model neither retries it nor
    reads a malformed result."""
    structured = dict(receipt) if isinstance(receipt, Mapping) else {"result": receipt}
    fits = output_schema is None or not any(
        jsonschema.validators.validator_for(output_schema)(output_schema).iter_errors(structured)
    )
    if fits:
        text = json.dumps(receipt)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )
    signal = {
        "status": HAPPENED,
        "receipt": receipt,
        "instruction": (
            "This call happened: its answer was lost and it was settled from the provider's"
            " record (the receipt). Do not call it again; use the receipt."
        ),
    }
    text = f"Happened; the answer was lost, the receipt is: {json.dumps(receipt)}"
    return _error(text, signal)


def _error(text: str, signal: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text + "\n" + json.dumps(signal))],
        structured_content=signal,
        is_error=True,
    )


def _unreplayable(exc: ResultUnavailableError, tool: str) -> types.CallToolResult:
    signal = {
        "status": HAPPENED,
        "tool": tool,
        "effect_id": exc.effect_id,
        "instruction": (
            "This call happened: it is recorded as done, but the upstream's answer could not"
            f" be stored ({exc.detail}), so it cannot be given again. Do not call it again."
        ),
    }
    return _error(f"Happened; its answer cannot be given again.\n{signal['instruction']}", signal)


def _refused(tool: str, why: str) -> types.CallToolResult:
    signal = {
        "status": REFUSED,
        "tool": tool,
        "effect_id": None,
        "instruction": f"This call was refused and nothing ran: {why}",
    }
    return _error(f"Refused, nothing ran: {why}", signal)


def _version() -> str:
    from . import __version__

    return __version__


# -- the MCP server ----------------------------------------------------------------------------


def caller_of(
    ctx: ServerRequestContext[Any, Any], meta: Mapping[str, Any], gateway: Gateway
) -> Caller:
    """The MCP client's name (its handshake's or this request's clientInfo) and session
    (``_meta["openonce/session"]``, the streamable HTTP session, or the stdio process's)."""
    name = ""
    params = ctx.session.client_params
    if params is not None:
        name = params.client_info.name
    info = meta.get(CLIENT_INFO)
    if not name and isinstance(info, Mapping):
        name = str(info.get("name") or "")
    session = meta.get(META_SESSION)
    if not isinstance(session, str) or not session:
        headers = getattr(ctx.request, "headers", None)
        session = headers.get("mcp-session-id") if headers is not None else None
        if not session and ctx.request is None:
            session = gateway.session
    return Caller(client=name or "unknown", session=session or None)


def build_server(gateway: Gateway) -> Server[Any]:
    """The gateway as a low-level MCP server: the upstreams' tool list, unchanged, and
    every call through :meth:`Gateway.call`."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=gateway.tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        meta: Mapping[str, Any] = params.meta or ctx.meta or {}
        caller = caller_of(ctx, meta, gateway)
        try:
            return await gateway.call(params.name, dict(params.arguments or {}), meta, caller)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise  # the upstream's own protocol error, passed on as it is
            # Never raised on: the SDK's server reads "connection closed" as its own
            # client's connection and stops serving.
            why = (
                f"the upstream's connection closed during this call ({exc.message}); it may"
                " or may not have reached the upstream"
            )
            return _error(why, {"status": "upstream_lost", "tool": params.name})
        except Exception as exc:
            log.exception("openonce mcp: %s failed", params.name)
            why = f"the gateway could not answer: {type(exc).__name__}: {exc}"
            return _error(why, {"status": "error", "tool": params.name})

    return Server(
        GATEWAY_NAME,
        version=_version(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def make_client(target: str, config: GatewayConfig) -> OpenOnce:
    """The ledger client the gateway runs calls through: the configuration's policy,
    attempts, leases and provider knowledge, as ``OpenOnce(...)`` takes them."""
    policy = config.policy
    return OpenOnce(
        target,
        policy=require_approval_for(
            policy.require_approval_for,
            approvers=policy.approvers,
            approval_ttl=policy.approval_ttl,
        )
        if policy.require_approval_for
        else None,
        max_attempts=config.max_attempts,
        lease_seconds=config.lease_seconds,
        wait_seconds=config.wait_seconds,
        provider_capabilities=config.provider_capabilities,
        enforce_provider_receipts=config.enforce_provider_receipts,
        require_provider_capability_for_receipts=config.require_provider_capability_for_receipts,
    )


@asynccontextmanager
async def open_gateway(
    config: GatewayConfig, oo: OpenOnce, *, targets: Mapping[str, Any] | None = None
) -> AsyncIterator[Gateway]:
    """Connect to every upstream, list their tools and check the configuration against
    them; yields the gateway, and disconnects when done. ``targets`` replaces an upstream's
    transport by name (an in-process ``MCPServer`` in tests)."""
    gateway = Gateway(config, oo)
    upstreams = [UpstreamServer(spec, (targets or {}).get(spec.name)) for spec in config.upstreams]
    misfit: ConfigurationError | None = None
    async with anyio.create_task_group() as holders:
        try:
            for upstream in upstreams:
                gateway.add_upstream(upstream, await holders.start(upstream.run))
            config.check_tools({tool.name: tool.input_schema for tool in gateway.tools})
            gateway.check_declarations()
            yield gateway
        except ConfigurationError as exc:
            # Raised once the upstreams are closed: from inside, the task group would
            # hand it on wrapped in an exception group.
            misfit = exc
        finally:
            for upstream in upstreams:
                upstream.stop()
    if misfit is not None:
        raise misfit


async def serve_stdio(gateway: Gateway) -> None:
    from mcp.server.stdio import stdio_server

    server = build_server(gateway)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(gateway: Gateway, host: str, port: int) -> None:
    import uvicorn

    app = build_server(gateway).streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve()
