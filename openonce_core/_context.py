"""What a running handler knows about its effect (``current_effect()``) and the scope
it runs in (``current_scope()``), held in context variables the call path sets."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from ._states import EffectState
from .errors import OpenOnceError

S = EffectState

_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("openonce_scope", default=None)
# Who the calls are made for (a user, an MCP client and its session): written into each
# new effect's first journal line, where the console reads its requester.
_requested_by: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "openonce_requested_by", default=None
)
_current: contextvars.ContextVar[EffectContext | None] = contextvars.ContextVar(
    "openonce_effect", default=None
)


@dataclass(frozen=True, slots=True)
class EffectContext:
    """What a running handler knows about its effect (``openonce_core.current_effect()``)."""

    effect_id: str
    tool: str
    attempt: int
    idempotency_key: str
    scope: str | None
    # Stable for the effect's whole life, across attempts and processes: pass it as the
    # provider's idempotency key (Stripe's Idempotency-Key header, an email's Message-ID).
    provider_key: str
    fence: int = 0
    _oo: Any = field(default=None, repr=False, compare=False)
    _sent: bool = field(default=False, repr=False, compare=False)

    def owns(self) -> bool:
        """Whether this attempt still holds the effect (reads the ledger). A handler about
        to do something irreversible after a long pause can ask first."""
        if self._oo is None:
            return False
        current = self._oo.store.get(self.effect_id)
        return (
            current is not None
            and current.state == S.STARTED
            and current.fence == self.fence
            and current.lease_owner == self._oo.owner
        )

    def renew(self) -> bool:
        """Renew the lease now (the heartbeat does it on its own); False if it was lost."""
        return bool(self._oo is not None and self._oo.keeper.renew_now(self.effect_id))

    def mark_sent(self) -> None:
        """Say that this attempt has sent a request that may have taken effect. A handler
        making more than one external call marks it after the first: from then on an
        error that means "nothing was sent" (a refused connection on the second call) is
        UNKNOWN, not a retry that would send the first call again."""
        object.__setattr__(self, "_sent", True)  # the context is frozen but for this flag

    @property
    def sent(self) -> bool:
        """Whether :meth:`mark_sent` was called in this attempt."""
        return self._sent


def current_effect() -> EffectContext:
    ctx = _current.get()
    if ctx is None:
        raise OpenOnceError("current_effect() is only available inside an @oo.effect handler")
    return ctx


def current_scope() -> str | None:
    return _scope.get()
