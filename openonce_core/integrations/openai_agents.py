"""OpenAI Agents SDK: a durable effect that is also a function tool, and the run context
its dedup scope comes from.

::

    from openonce_core.integrations.openai_agents import (
        OpenOnceRunContext,
        effect_function_tool,
    )

    @effect_function_tool(oo, tool="stripe.refund", idempotency_fields=["charge"])
    def refund(charge: str, amount_cents: int) -> dict:
        '''Refund a Stripe charge.'''
        ...

    context = OpenOnceRunContext(openonce_scope="conv-123")
    result = Runner.run_sync(agent, "refund ch_1", context=context)

A model cannot catch an exception, so the calls OpenOnce stops become structured JSON tool
outputs it reads and acts on:

* ``approval_required`` — nothing ran; tell the user, and after a person approved
  (``oo.approve``, the console, the CLI) call again with the same arguments: it runs once;
* ``outcome_unknown`` — the call may have happened: do NOT retry; a probe or a person
  resolves it, and a later identical call replays what they recorded;
* ``approval_denied``, ``cancelled`` — it will not run; ``in_progress`` — it runs elsewhere.

The application sees the same objects in ``context.openonce_signals`` after the run, so it
can page the approver without parsing the model's reply. Any other exception a handler
raises is the tool's own failure and takes the SDK's usual path
(``failure_error_function``); a duplicate call replays it.

Dedup scope: ``dedup="scope"`` (the default) dedups identical calls within the context's
``openonce_scope`` — a model that repeats a call in the conversation gets the recorded
result. ``dedup="call"`` narrows it to one model decision, the tool call id: only a
re-execution of that very call (a resumed or restarted run) replays. Without an
``openonce_scope`` the current ``oo.scope()`` is used.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.tool_context import ToolContext

from .._context import current_scope
from .._options import EffectOptions, split_options
from .._runtime import OpenOnce
from ..errors import OpenOnceError, ScopeRequiredError
from ._signals import STOPS, as_text, signal_for

__all__ = ["OpenOnceRunContext", "effect_function_tool"]

Dedup = Literal["scope", "call"]


@dataclass
class OpenOnceRunContext:
    """The run context to pass as ``Runner.run(..., context=...)``.

    ``openonce_scope`` is the dedup scope of the run's effects: a conversation or a task
    id, stable across restarts so a resumed run replays what an earlier one did. Subclass
    it to carry your own fields; any context with an ``openonce_scope`` attribute works.
    ``openonce_signals`` collects the structured outputs given to the model for calls
    that OpenOnce stopped (approval required, outcome unknown, ...), in order.
    """

    openonce_scope: str | None = None
    openonce_signals: list[dict[str, Any]] = field(default_factory=list)


# The effect options are written out (not ``Unpack[EffectKeywords]``) because every other
# keyword goes to the SDK; tests/core/test_effect_options.py keeps them EffectOptions'.
@overload
def effect_function_tool(
    oo: OpenOnce,
    fn: Callable[..., Any],
    *,
    tool: str | None = None,
    idempotency_fields: Sequence[str] | None = None,
    idempotency_key: Callable[..., Any] | str | None = None,
    max_attempts: int | None = None,
    secret_fields: Sequence[str] = (),
    business_errors: Sequence[type[BaseException]] = (),
    lease_seconds: float | None = None,
    wait_seconds: float | None = None,
    dedup: Dedup = "scope",
    **function_tool_options: Any,
) -> FunctionTool: ...


@overload
def effect_function_tool(
    oo: OpenOnce,
    fn: None = None,
    *,
    tool: str | None = None,
    idempotency_fields: Sequence[str] | None = None,
    idempotency_key: Callable[..., Any] | str | None = None,
    max_attempts: int | None = None,
    secret_fields: Sequence[str] = (),
    business_errors: Sequence[type[BaseException]] = (),
    lease_seconds: float | None = None,
    wait_seconds: float | None = None,
    dedup: Dedup = "scope",
    **function_tool_options: Any,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def effect_function_tool(
    oo: OpenOnce,
    fn: Callable[..., Any] | None = None,
    *,
    dedup: Dedup = "scope",
    **keywords: Any,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make ``fn`` a durable effect (``tool`` names it in the ledger) and an Agents SDK
    ``FunctionTool`` (named after the function unless ``name_override=`` says otherwise).

    The effect options are ``oo.effect``'s (``EffectOptions``); every other keyword goes to
    the SDK's ``function_tool`` (``name_override``, ``failure_error_function``,
    ``timeout``, ...). The handler takes the tool's arguments only; inside it
    ``current_effect()`` works.
    """
    options, function_tool_options = split_options(keywords)
    if dedup not in ("scope", "call"):
        raise ValueError(f"dedup must be 'scope' or 'call', not {dedup!r}")
    if fn is None:
        return functools.partial(
            _function_tool, oo, options=options, dedup=dedup, **function_tool_options
        )
    return _function_tool(oo, fn, options, dedup, **function_tool_options)


def _function_tool(
    oo: OpenOnce,
    fn: Callable[..., Any],
    options: EffectOptions,
    dedup: Dedup,
    **function_tool_options: Any,
) -> FunctionTool:
    effect = oo.declare(fn, options)
    tool_name: str = effect.openonce_tool
    needs_scope = options.idempotency_key is None

    def scope_of(ctx: ToolContext[Any]) -> contextlib.AbstractContextManager[Any]:
        scope = getattr(ctx.context, "openonce_scope", None) or current_scope()
        if dedup == "call":
            call = f"call:{ctx.tool_call_id}"
            scope = f"{scope}/{call}" if scope else call
        if scope is None:
            if needs_scope:
                raise ScopeRequiredError(
                    f"{tool_name}: a key derived from arguments needs a scope; run the agent"
                    " with context=OpenOnceRunContext(openonce_scope='<conversation id>'),"
                    " or declare the tool with dedup='call'"
                )
            return contextlib.nullcontext()
        return oo.scope(scope)

    def stopped(ctx: ToolContext[Any], exc: OpenOnceError) -> str:
        signal = signal_for(exc, tool_name)
        signals = getattr(ctx.context, "openonce_signals", None)
        if isinstance(signals, list):
            signals.append(signal)
        return as_text(signal)  # the SDK would hand the model a dict's repr, not JSON

    if inspect.iscoroutinefunction(effect):

        async def invoke_async(ctx: ToolContext[Any], *args: Any, **kwargs: Any) -> Any:
            with scope_of(ctx):
                try:
                    return await effect(*args, **kwargs)
                except STOPS as exc:
                    return stopped(ctx, exc)

        invoke: Callable[..., Any] = invoke_async
    else:

        def invoke_sync(ctx: ToolContext[Any], *args: Any, **kwargs: Any) -> Any:
            with scope_of(ctx):
                try:
                    return effect(*args, **kwargs)
                except STOPS as exc:
                    return stopped(ctx, exc)

        invoke = invoke_sync
    _present_as(invoke, fn)
    return function_tool(invoke, **function_tool_options)


def _present_as(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> None:
    """Give ``wrapper`` the handler's name, docstring and parameters, after a leading
    ``ToolContext``: the SDK builds the tool's JSON schema from them, and passes the
    context (with the tool call id) to a first parameter of that type."""
    hints = typing.get_type_hints(fn)  # resolved in the handler's own module
    for param, hint in hints.items():
        origin = typing.get_origin(hint) or hint
        if inspect.isclass(origin) and issubclass(origin, RunContextWrapper):
            raise TypeError(
                f"{fn.__qualname__} takes the run context ({param}): an effect's arguments"
                " are its key material and must be JSON. Take only the tool's arguments;"
                " read the effect with current_effect()"
            )
    signature = inspect.signature(fn)
    context = inspect.Parameter(
        "openonce_tool_context",
        inspect.Parameter.POSITIONAL_ONLY,
        annotation=ToolContext[Any],
    )
    parameters = [
        p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
    ]
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[context, *parameters],
        return_annotation=hints.get("return", signature.return_annotation),
    )
    wrapper.__annotations__ = {"openonce_tool_context": ToolContext[Any], **hints}
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    wrapper.__doc__ = fn.__doc__
    wrapper.__module__ = fn.__module__
