"""The options of a durable effect, written once: ``oo.effect``, LangGraph's
``effect_tool`` and the OpenAI Agents ``effect_function_tool`` take the same keywords, with
the same meaning, the same defaults and the same validation (``_keys.make_spec``).

``EffectFunction`` is what the decorator returns, for type checkers: the handler's own
parameters and return type (an async handler stays a coroutine function), plus the
``openonce_tool`` and ``openonce_spec`` attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypedDict

from ._keys import Spec


@dataclass(frozen=True, slots=True)
class EffectOptions:
    """How one tool's calls become effects. ``None`` means the client's setting
    (``OpenOnce(max_attempts=..., lease_seconds=..., wait_seconds=...)``).

    * ``tool``: the effect's name in the ledger (default: the handler's module and name).
    * ``idempotency_fields``: only these arguments form the key (the intent fingerprint),
      so reworded prose does not defeat dedup. Needs a scope.
    * ``idempotency_key``: a function of the call's arguments returning an explicit key
      (``lambda charge, **_: f"refund-{charge}"``), or a literal key; needs no scope, and
      the same key with different arguments is refused.
    * ``secret_fields``: stored only as digests (HMAC with the pepper), still usable as
      key material; needs ``OpenOnce(secret_pepper=...)``.
    * ``business_errors``: exception classes that mean "the provider said no" — recorded
      FAILED and replayed; other exceptions the classifier cannot place are UNKNOWN.
    """

    tool: str | None = None
    idempotency_fields: Sequence[str] | None = None
    idempotency_key: Callable[..., Any] | str | None = None
    max_attempts: int | None = None
    secret_fields: Sequence[str] = ()
    business_errors: Sequence[type[BaseException]] = ()
    lease_seconds: float | None = None
    wait_seconds: float | None = None


class EffectKeywords(TypedDict, total=False):
    """``EffectOptions`` as keyword arguments, for the decorators' type signatures
    (``**options: Unpack[EffectKeywords]``). A test keeps the two the same."""

    tool: str | None
    idempotency_fields: Sequence[str] | None
    idempotency_key: Callable[..., Any] | str | None
    max_attempts: int | None
    secret_fields: Sequence[str]
    business_errors: Sequence[type[BaseException]]
    lease_seconds: float | None
    wait_seconds: float | None


OPTION_NAMES = frozenset(f.name for f in fields(EffectOptions))


def effect_options(where: str, keywords: Mapping[str, Any]) -> EffectOptions:
    """The options a decorator was given as keywords, or a TypeError naming the stray
    keyword and the options there are (the decorators' implementations take ``**keywords``:
    their overloads carry the types)."""
    stray = sorted(set(keywords) - OPTION_NAMES)
    if stray:
        raise TypeError(
            f"{where}() got an unexpected keyword argument {', '.join(map(repr, stray))};"
            f" the effect options are {', '.join(sorted(OPTION_NAMES))}"
        )
    return EffectOptions(**keywords)


def split_options(keywords: Mapping[str, Any]) -> tuple[EffectOptions, dict[str, Any]]:
    """(the effect options among ``keywords``, the other keywords), for a decorator that
    passes the rest on (the OpenAI Agents SDK's ``function_tool``)."""
    mine = {name: value for name, value in keywords.items() if name in OPTION_NAMES}
    rest = {name: value for name, value in keywords.items() if name not in OPTION_NAMES}
    return EffectOptions(**mine), rest


class EffectFunction[**P, R](Protocol):
    """A handler made a durable effect: called as the handler is, returning what it
    returns (through the ledger), with the effect's tool name and declaration attached."""

    openonce_tool: str
    openonce_spec: Spec

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


class EffectDecorator(Protocol):
    """What ``oo.effect(...)`` with options only returns: applied to a handler, its
    ``EffectFunction``."""

    def __call__[**P, R](self, fn: Callable[P, R], /) -> EffectFunction[P, R]: ...
