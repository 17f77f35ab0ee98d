"""From a decorated tool and one call's arguments to the effect's identity: its idempotency
key, the fingerprint of its arguments, and its provider key.

Key derivation is strict (invariant 6): RFC 8785 canonical JSON hashed with SHA-256,
floats refused as key material, arguments that are not strict JSON refused with the field
named, before anything is written. A derived key needs a run scope; an explicit key (a
function of the arguments, or a literal) is global, and reusing it with other arguments is
refused.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._canonical import canonical, check_json, secret_digest
from .errors import InvalidArgumentsError, ScopeRequiredError


@dataclass(frozen=True, slots=True)
class Spec:
    """One decorated tool: how its calls become keys and how it runs."""

    fn: Callable[..., Any]
    tool: str
    signature: inspect.Signature
    idempotency_fields: tuple[str, ...] | None
    idempotency_key: Callable[..., Any] | None  # a literal key is held as a constant function
    secret_fields: frozenset[str]
    business_errors: tuple[type[BaseException], ...]
    max_attempts: int
    lease_seconds: float
    wait_seconds: float
    is_async: bool
    # Parameter names when every parameter is plain (positional-or-keyword): such calls
    # are bound without inspect.Signature.bind, which costs more than the rest of a replay.
    plain_names: tuple[str, ...] | None = None


class Call:
    """One call, checked and keyed, before anything is written. (A plain class: it is made
    on every call, and a frozen dataclass's __init__ costs more than its work.)"""

    __slots__ = ("args", "fingerprint", "key", "kwargs", "scope", "secrets", "spec",
                 "stored_args", "tool")  # fmt: skip

    def __init__(
        self,
        spec: Spec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stored_args: dict[str, Any],
        key: str,
        fingerprint: str,  # of every argument as stored: what an approval or re-arm covers
        scope: str | None,
        secrets: tuple[str, ...] = (),  # clear secret values, scrubbed from what is recorded
    ) -> None:
        self.spec = spec
        self.tool = spec.tool
        self.args = args
        self.kwargs = kwargs
        self.stored_args = stored_args
        self.key = key
        self.fingerprint = fingerprint
        self.scope = scope
        self.secrets = secrets


def make_spec(
    fn: Callable[..., Any],
    *,
    tool: str | None,
    idempotency_fields: Sequence[str] | None,
    idempotency_key: Any,
    secret_fields: Sequence[str],
    business_errors: Sequence[type[BaseException]],
    max_attempts: int,
    lease_seconds: float,
    wait_seconds: float,
) -> Spec:
    """Check a declaration up front: a bad option fails when the decorator is applied,
    naming the option, not on every call."""
    if idempotency_fields is not None and idempotency_key is not None:
        raise ValueError("give idempotency_fields or idempotency_key, not both")
    key_fn = _key_function(idempotency_key)
    if isinstance(idempotency_fields, str) or isinstance(secret_fields, str):
        raise ValueError("idempotency_fields and secret_fields take a list of names")
    signature = inspect.signature(fn)
    for name in (*(idempotency_fields or ()), *secret_fields):
        if name not in signature.parameters:
            raise ValueError(f"{name!r} is not a parameter of {_qualname(fn)}")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if not lease_seconds > 0:
        raise ValueError("lease_seconds must be a positive number of seconds")
    if not wait_seconds >= 0:
        raise ValueError("wait_seconds must be zero or more seconds")
    for cls in business_errors:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ValueError(f"business_errors takes exception classes, not {cls!r}")
    tool = tool or _tool_name(fn)
    check_text(tool, "tool")
    return Spec(
        fn=fn,
        tool=tool,
        signature=signature,
        idempotency_fields=tuple(idempotency_fields) if idempotency_fields else None,
        idempotency_key=key_fn,
        secret_fields=frozenset(secret_fields),
        business_errors=tuple(business_errors),
        max_attempts=max_attempts,
        lease_seconds=float(lease_seconds),
        wait_seconds=float(wait_seconds),
        is_async=_is_async(fn),
        plain_names=_plain_names(signature),
    )


def _key_function(idempotency_key: Any) -> Callable[..., Any] | None:
    if idempotency_key is None:
        return None
    if type(idempotency_key) is str:
        if not idempotency_key:
            raise ValueError("idempotency_key must not be empty")
        literal = idempotency_key
        return lambda **_: literal
    if callable(idempotency_key):
        return idempotency_key  # type: ignore[no-any-return]
    raise ValueError(
        "idempotency_key must be a function of the call's arguments or a literal string,"
        f" not {type(idempotency_key).__name__}"
    )


def prepare(
    spec: Spec,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    scope: str | None,
    pepper: bytes | None,
) -> Call:
    arguments = bind(spec, args, kwargs)
    derived_from_all = spec.idempotency_key is None and spec.idempotency_fields is None
    plain = False
    if not derived_from_all:
        plain = check_json(arguments)  # else the key-material check below covers them all
    stored = arguments
    secrets: tuple[str, ...] = ()
    if spec.secret_fields:
        stored = {
            name: secret_digest(value, pepper) if name in spec.secret_fields else value
            for name, value in arguments.items()
        }
        secrets = secret_texts(arguments[name] for name in spec.secret_fields)
    if spec.idempotency_key is not None:
        key = spec.idempotency_key(**arguments)
        if type(key) is not str or not key:
            raise InvalidArgumentsError("idempotency_key", "must return a non-empty string")
        check_text(key, "idempotency_key")
        if secrets and any(s in key for s in secrets):
            # The key is stored (and shown) in clear: it must not carry a secret field.
            raise InvalidArgumentsError(
                "idempotency_key",
                "contains the value of a secret field in clear; derive it from other"
                " fields, or use idempotency_fields (secret fields enter it as digests)",
            )
        # Explicit keys are global; the whole argument set must match on reuse.
        full = _fingerprint_stored(stored, plain)
        return Call(spec, args, kwargs, stored, key, full, scope, secrets)
    if scope is None:
        raise ScopeRequiredError(
            f"{spec.tool}: a key derived from arguments needs a run scope;"
            " wrap the calls in `with oo.scope():` (or pass idempotency_key=)"
        )
    # Checked on the clear values, so a float stays refused even in a secret field.
    if derived_from_all:
        plain = check_json(arguments, key_material=True)
        full = _fingerprint_stored(stored, plain)
        digest = full.removeprefix("sha256:")
    else:
        fields = spec.idempotency_fields or ()
        key_fields = {f: stored[f] for f in fields}
        check_json({f: arguments[f] for f in fields}, key_material=True)
        digest = _sha256(canonical(key_fields, plain=check_json(key_fields)))
        full = _fingerprint_stored(stored, plain)
    key = _sha256(f"{scope}\0{digest}")
    return Call(spec, args, kwargs, stored, key, full, scope, secrets)


_NUL = "holds a NUL character (\\u0000), which the ledger cannot store"


# The longest tool name, key, scope or owner (UTF-8 bytes): each is indexed, and a
# Postgres b-tree entry holds at most ~2.7 kB (a longer one fails the write there only).
MAX_IDENTIFIER_BYTES = 1024


def check_text(value: str, what: str) -> None:
    """Refuse an identifier (tool, key, scope, owner) the ledger cannot hold alike on every
    store (invariant 6): Postgres text cannot hold NUL, no store a lone surrogate, and
    Postgres cannot index a very long one."""
    if "\x00" in value:
        raise InvalidArgumentsError(what, _NUL)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentsError(what, "holds a lone surrogate") from None
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidArgumentsError(
            what, f"is {size} bytes long; at most {MAX_IDENTIFIER_BYTES} (it is indexed)"
        )


def _fingerprint_stored(stored: dict[str, Any], plain: bool) -> str:
    """The fingerprint of the arguments as stored, refusing a string that holds NUL:
    Postgres reads the stored arguments as jsonb, which cannot hold one."""
    text = canonical(stored, plain=plain)
    if "\\u0000" in text:  # JSON writes NUL so (a backslash before "u0000" too: look)
        path = _nul_path(stored, "$")
        if path is not None:
            raise InvalidArgumentsError(path, _NUL)
    return "sha256:" + _sha256(text)


def _nul_path(value: Any, path: str) -> str | None:
    if type(value) is str:
        return path if "\x00" in value else None
    items: Any = ()
    if type(value) is list:
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    elif type(value) is dict:
        for key in value:
            if "\x00" in key:
                return f"{path}.{key!r}"
        items = ((f"{path}.{key}", item) for key, item in value.items())
    for where, item in items:
        found = _nul_path(item, where)
        if found is not None:
            return found
    return None


def secret_texts(values: Any) -> tuple[str, ...]:
    """The clear forms of secret values that must never reach the ledger."""
    found: list[str] = []
    for value in values:
        if value in ("", None) or isinstance(value, bool):
            continue
        if isinstance(value, str | int):
            found.append(str(value))
        elif isinstance(value, list | dict):
            found.extend(secret_texts(value.values() if isinstance(value, dict) else value))
    return tuple(sorted(set(found), key=len, reverse=True))  # longest first when scrubbing


def provider_key(tool: str, key: str) -> str:
    """Stable for the effect's whole life, across attempts and processes: pass it as the
    provider's idempotency key (Stripe's Idempotency-Key, an email's Message-ID)."""
    return "oo_" + hashlib.sha256(f"{tool}\0{key}".encode()).hexdigest()[:40]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _plain_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    params = signature.parameters.values()
    if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return tuple(signature.parameters)
    return None


def bind(spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults applied; ``*args`` become a list."""
    names = spec.plain_names
    if names is not None and not kwargs and len(args) == len(names):
        return dict(zip(names, args, strict=True))  # the common call: every argument by place
    if names is not None and len(args) + len(kwargs) == len(names) and len(args) <= len(names):
        arguments = dict(zip(names, args, strict=False))
        if all(k in names and k not in arguments for k in kwargs):
            arguments.update(kwargs)
            return arguments
    try:
        bound = spec.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentsError("$", str(exc)) from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for name, param in spec.signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            arguments[name] = list(arguments[name])
    return arguments


def _qualname(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _tool_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or name == "<lambda>":
        raise ValueError(f"cannot name the tool of {fn!r}; pass tool='...'")
    return name


def _is_async(fn: Callable[..., Any]) -> bool:
    """Coroutine functions, and callable objects whose ``__call__`` is one."""
    target = getattr(fn, "func", fn)  # functools.partial
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - a method, not callability
    )
