"""LangGraph: one decorator makes a handler a durable effect and a LangGraph tool.

::

    from openonce_core.integrations.langgraph import effect_tool

    @effect_tool(oo, tool="stripe.refund", idempotency_fields=["charge"])
    def refund(charge: str, amount_cents: int) -> dict:
        '''Refund a Stripe charge.'''
        ...

    graph = builder.compile(checkpointer=InMemorySaver())  # ToolNode([refund, ...])

Inside a graph run the effect's scope is the run's ``thread_id``: a model that repeats a
call in the same conversation, and LangGraph re-running a whole node when it resumes,
both replay the recorded result instead of running the handler again.

A call that needs approval pauses the graph with ``interrupt()``; the interrupt's value
names the effect (``{"openonce": "approval_required", "effect_id": ..., ...}``). Resume
with the person's decision and the same call runs once::

    graph.invoke(Command(resume={"effect_id": eid, "approved": True, "by": "eric"}), config)
    graph.invoke(Command(resume={"approved": False, "by": "eric", "reason": "no"}), config)

or approve out of band (``oo.approve``, the console, the CLI) and resume with any value.
Naming ``effect_id`` in the decision is the safe form when one step can hold several
approvals: LangGraph hands resume values to interrupts by their order in the node, and a
decision that names another effect is never applied to this one (the graph asks again).

An outcome that is UNKNOWN, a denial or a cancellation becomes the tool's error message
(``status="error"``), a JSON object whose ``instruction`` tells the model what to do next:
above all, never to retry a call that may have happened. Any other exception the handler
raises propagates as it would from a plain tool; a duplicate replays it. (Do not call
``interrupt()`` inside the handler itself: the effect would record it as a failure.)

Without a ``thread_id`` in the run's config (no checkpointer) the calls use the current
``oo.scope()``, and an approval becomes an ``approval_required`` message instead of an
interrupt: there is no checkpoint to resume.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Unpack, overload

from langchain_core.tools import StructuredTool, ToolException
from langgraph.config import get_config
from langgraph.types import interrupt

from .._options import EffectKeywords, EffectOptions, effect_options
from .._runtime import OpenOnce
from ..errors import (
    ApprovalPending,
    ApproverAlreadyCounted,
    IllegalTransitionError,
    OpenOnceError,
)
from ._signals import STOPS, as_text, signal_for

__all__ = ["APPROVAL_REQUEST", "effect_tool"]

# The ``openonce`` value of an interrupt raised for an approval.
APPROVAL_REQUEST = "approval_required"


@overload
def effect_tool(
    oo: OpenOnce,
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    return_direct: bool = False,
    **options: Unpack[EffectKeywords],
) -> StructuredTool: ...


@overload
def effect_tool(
    oo: OpenOnce,
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    return_direct: bool = False,
    **options: Unpack[EffectKeywords],
) -> Callable[[Callable[..., Any]], StructuredTool]: ...


def effect_tool(
    oo: OpenOnce,
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    return_direct: bool = False,
    **keywords: Any,
) -> StructuredTool | Callable[[Callable[..., Any]], StructuredTool]:
    """Make ``fn`` a durable effect (``tool`` names it in the ledger) and a LangChain
    ``StructuredTool`` (``name``, default the function's name, is what the model calls).

    The effect options are ``oo.effect``'s (``EffectOptions``). Use it bare on a handler
    (``effect_tool(oo, fn)``) or as a decorator (``@effect_tool(oo, tool=...)``). An async
    handler gives a tool for ``ainvoke``/``astream`` graphs.
    """
    options = effect_options("effect_tool", keywords)
    if fn is None:
        return functools.partial(
            _structured_tool,
            oo,
            options=options,
            name=name,
            description=description,
            return_direct=return_direct,
        )
    return _structured_tool(oo, fn, options, name, description, return_direct)


def _structured_tool(
    oo: OpenOnce,
    fn: Callable[..., Any],
    options: EffectOptions,
    name: str | None,
    description: str | None,
    return_direct: bool,
) -> StructuredTool:
    effect = oo.declare(fn, options)
    tool_name: str = effect.openonce_tool
    durable = _DurableCall(oo, tool_name)

    if inspect.iscoroutinefunction(effect):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with durable.thread_scope() as can_interrupt:
                while True:
                    try:
                        return await effect(*args, **kwargs)
                    except STOPS as exc:
                        # Ledger reads and decisions off the loop, as the effect does;
                        # the copied context keeps interrupt() inside this graph run.
                        await asyncio.to_thread(durable.stopped, exc, can_interrupt)

        structured = StructuredTool.from_function(
            coroutine=run_async,
            name=name or fn.__name__,
            description=description,
            return_direct=return_direct,
        )
    else:

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with durable.thread_scope() as can_interrupt:
                while True:
                    try:
                        return effect(*args, **kwargs)
                    except STOPS as exc:
                        durable.stopped(exc, can_interrupt)

        structured = StructuredTool.from_function(
            func=run,
            name=name or fn.__name__,
            description=description,
            return_direct=return_direct,
        )
    # Only ToolException is turned into a message; it carries the signals below.
    structured.handle_tool_error = True
    structured.metadata = {**(structured.metadata or {}), "openonce_tool": tool_name}
    return structured


class _DurableCall:
    """What a tool does around its effect: the scope, and the calls OpenOnce stops."""

    def __init__(self, oo: OpenOnce, tool: str) -> None:
        self.oo = oo
        self.tool = tool

    @contextmanager
    def thread_scope(self) -> Iterator[bool]:
        """Scope the call to the run's thread; yields whether it may ``interrupt()``."""
        thread_id = _thread_id()
        if thread_id is None:
            yield False
            return
        with self.oo.scope(thread_id):
            yield True

    def stopped(self, exc: OpenOnceError, can_interrupt: bool) -> None:
        """Return to retry the call (a decision was applied); raise to end it."""
        if not (isinstance(exc, ApprovalPending) and can_interrupt):
            raise ToolException(as_text(signal_for(exc, self.tool))) from exc
        # The first time through this raises GraphInterrupt and the graph pauses. When it
        # resumes, LangGraph runs the node again from the start; this call then gets the
        # decision back from interrupt() and applies it before retrying the same call,
        # which finds the same effect by its key and runs it once.
        decision = interrupt(self._request(exc))
        self._apply(exc.effect_id, decision)

    def _request(self, pending: ApprovalPending) -> dict[str, Any]:
        effect = self.oo.get(pending.effect_id)
        return {
            "openonce": APPROVAL_REQUEST,
            "effect_id": pending.effect_id,
            "tool": self.tool,
            "args": effect.args,  # as stored: secret fields are digests
            "approvals": pending.approvals,
            "required": pending.required,
            "message": (
                f"{self.tool} needs approval ({pending.approvals}/{pending.required}) before"
                f" it runs. Resume with Command(resume={{'effect_id': '{pending.effect_id}',"
                " 'approved': True, 'by': '<who approved>'}), or approved=False with a reason."
            ),
        }

    def _apply(self, effect_id: str, decision: Any) -> None:
        """Record a person's decision given on resume. Anything that is not a decision
        (``True``, ``None``) means "decided elsewhere": the retried call reads the ledger."""
        if not isinstance(decision, Mapping) or "approved" not in decision:
            return
        named = decision.get("effect_id")
        if named is not None and named != effect_id:
            return  # meant for another interrupt of this node: ask again, never apply it
        approved, by = decision["approved"], decision.get("by")
        if type(approved) is not bool or type(by) is not str or not by.strip():
            raise ValueError(
                "resume an OpenOnce approval with {'approved': True or False, 'by': '<name>'}"
                f" (and 'reason'); got {dict(decision)!r}"
            )
        reason = str(decision.get("reason") or "")
        try:
            if approved:
                self.oo.approve(effect_id, by=by, reason=reason or "approved on resume")
            else:
                self.oo.deny(effect_id, by=by, reason=reason or "denied on resume")
        except (ApproverAlreadyCounted, IllegalTransitionError):
            # The node re-ran after this decision was recorded (a later interrupt in the
            # same step resumed it), or the effect moved on: the retried call reads it.
            pass


def _thread_id() -> str | None:
    try:
        config = get_config()
    except RuntimeError:  # called outside any runnable: a plain function call
        return None
    thread_id = (config.get("configurable") or {}).get("thread_id")
    return None if thread_id in (None, "") else str(thread_id)
