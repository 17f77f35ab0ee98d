"""``OpenOnce``: the ledger client an agent process holds, and the ``@oo.effect`` decorator.

The client is assembled from parts that each do one job:

* ``_context.py`` is what a running handler knows (``current_effect()``);
* ``_keys.py`` turns a call into an effect's identity (key, fingerprint, provider key);
* ``_calls.py`` is the call path (claim, run, finish, replay, wait, late results);
* ``_decisions.py`` holds the decisions people make, and lease expiry;
* ``_contracts.py`` checks calls and receipts against provider knowledge;
* ``_ledger.py`` is the only writer of ledger state; ``_leases.py`` keeps leases alive;
* ``_bridge.py`` runs async handlers on their event loop with ledger I/O on a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Unpack, cast, overload

from . import _forksafe as forksafe
from . import _schema as schema
from ._bridge import run_on_loop
from ._calls import CallPath
from ._classify import Classifier
from ._clock import Clock, ClockLike, as_clock
from ._context import EffectContext, _current, _requested_by, _scope
from ._contracts import Contracts
from ._decisions import Decisions
from ._keys import Call, Spec, check_text, make_spec, prepare
from ._leases import LeaseKeeper, process_owner
from ._ledger import Ledger
from ._observe import Observer
from ._options import (
    EffectDecorator,
    EffectFunction,
    EffectKeywords,
    EffectOptions,
    effect_options,
)
from ._policy import ALLOW, Policy
from ._providers import Capability, CapabilityMatrix
from ._records import Effect
from ._states import EffectState
from .errors import ConfigurationError, OpenOnceError
from .stores import open_store
from .stores.base import Store

S = EffectState

MIN_PEPPER_BYTES = 16


class OpenOnce(Contracts, CallPath, Decisions):
    """The ledger client an agent process holds. Thread-safe, and safe across ``fork``;
    one per process is enough.

    ``target`` is a SQLite path, a ``postgresql://`` DSN, ``":memory:"`` or a Store.
    ``clock`` replaces the ledger's time source: a Clock (tests pass a FakeClock) or a
    zero-argument callable returning epoch seconds (``time.time``); by default it is the
    store's own (the database's clock on Postgres).
    """

    def __init__(
        self,
        target: str | Store = "openonce.db",
        *,
        policy: Policy | None = None,
        classifier: Classifier | None = None,
        max_attempts: int = 3,
        lease_seconds: float = 300.0,
        wait_seconds: float = 30.0,
        retry_delay: float = 0.2,
        owner: str | None = None,
        secret_pepper: bytes | str | None = None,
        migrate: bool | None = None,
        enforce_provider_receipts: bool = False,
        require_provider_capability_for_receipts: bool = False,
        provider_capabilities: Mapping[str, str] | None = None,
        extra_capabilities: Iterable[Capability] = (),
        clock: ClockLike | None = None,
        observers: Iterable[Observer] = (),
    ) -> None:
        _check_owner(owner)
        clock = as_clock(clock)
        self.store: Store = (
            target if not isinstance(target, str) else open_store(target, clock=clock)
        )
        self.clock: Clock = clock or self.store.clock
        if migrate is None:
            # Embedded stores install their schema on first use; Postgres is migrated
            # explicitly (``openonce --db DSN migrate``) and only checked here.
            migrate = self.store.dialect != "postgres"
        if migrate:
            self.store.migrate()
        else:
            _check_schema(self.store)
        self.ledger = Ledger(self.store, self.clock)
        self.keeper = LeaseKeeper(self.ledger, self.clock)
        self.policy: Policy = policy or (lambda tool, args: ALLOW)
        self.classifier = classifier or Classifier()
        self.max_attempts = max_attempts
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.retry_delay = retry_delay
        self._owner = owner
        self.owner = owner or process_owner()
        self.secret_pepper = _pepper(secret_pepper)
        self.observers: tuple[Observer, ...] = tuple(observers)
        # Counts per outcome (see observe.OUTCOMES), so metrics can tell a replay from a
        # fresh call.
        self.stats: Counter[str] = Counter()
        self._known_keys: dict[tuple[str, str], None] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        # Provider knowledge. With enforcement on, calls must meet their capability's
        # contract before they run and receipts after; off, whatever returns is recorded.
        self.extra_capabilities = tuple(extra_capabilities)
        self.matrix = CapabilityMatrix(extra=self.extra_capabilities)
        self.provider_capabilities = dict(provider_capabilities or {})
        for tool, name in self.provider_capabilities.items():
            self.matrix.resolve(tool, name)  # a pin that fits no capability fails here
        self.enforce_provider_receipts = enforce_provider_receipts
        self.require_provider_capability_for_receipts = require_provider_capability_for_receipts
        forksafe.register(self)

    def after_fork(self) -> None:
        # A child is another process: its own owner name (its leases are its own), and no
        # threads of the parent's thread pool.
        self.owner = self._owner or process_owner()
        self._executor = None

    def observe(self, observer: Observer) -> None:
        """Call ``observer`` with an EffectEvent at the end of every call (observe.py)."""
        self.observers = (*self.observers, observer)

    # -- declaring effects ----------------------------------------------------------------

    @overload
    def effect[**P, R](
        self, fn: Callable[P, R], **options: Unpack[EffectKeywords]
    ) -> EffectFunction[P, R]: ...

    @overload
    def effect(self, fn: None = None, **options: Unpack[EffectKeywords]) -> EffectDecorator: ...

    def effect(
        self, fn: Callable[..., Any] | None = None, **keywords: Any
    ) -> EffectFunction[..., Any] | EffectDecorator:
        """Make ``fn`` a durable effect: ``@oo.effect``, ``@oo.effect(tool=...)`` or
        ``oo.effect(existing_callable)``. The options are ``EffectOptions``' fields (their
        meaning is documented there). Type checkers see the handler's own parameters and
        return type, and the ``openonce_tool``/``openonce_spec`` attributes
        (``EffectFunction``)."""
        options = effect_options("effect", keywords)
        if fn is None:

            def decorate[**Q, T](handler: Callable[Q, T]) -> EffectFunction[Q, T]:
                return self.declare(handler, options)

            return decorate
        return self.declare(fn, options)

    def declare[**P, R](self, fn: Callable[P, R], options: EffectOptions) -> EffectFunction[P, R]:
        """``oo.effect(fn, ...)`` with the options as one ``EffectOptions`` object, which
        several tools can share; the integrations' decorators declare effects through it."""
        if options.secret_fields and not self.secret_pepper:
            raise ConfigurationError(
                "secret_fields need a pepper, or their digests can be reversed by guessing:"
                " pass OpenOnce(secret_pepper=...) or set OPENONCE_SECRET_PEPPER (at least"
                f" {MIN_PEPPER_BYTES} random bytes, e.g. `python -c 'import secrets;"
                " print(secrets.token_hex(32))'`), kept outside the ledger"
            )
        spec = make_spec(
            fn,
            tool=options.tool,
            idempotency_fields=options.idempotency_fields,
            idempotency_key=options.idempotency_key,
            secret_fields=options.secret_fields,
            business_errors=options.business_errors,
            max_attempts=_or_default(options.max_attempts, self.max_attempts),
            lease_seconds=_or_default(options.lease_seconds, self.lease_seconds),
            wait_seconds=_or_default(options.wait_seconds, self.wait_seconds),
        )
        wrapper: Any
        if spec.is_async:

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                call = self._prepare(spec, args, kwargs)
                context = contextvars.copy_context()
                loop = asyncio.get_running_loop()
                # Ledger I/O runs on a worker thread; the handler itself runs on this loop.
                job = functools.partial(context.run, self._execute, call, loop, context)
                return await loop.run_in_executor(self._threads(), job)

            wrapper = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return self._execute(self._prepare(spec, args, kwargs))

            wrapper = sync_wrapper
        wrapper.openonce_tool = spec.tool
        wrapper.openonce_spec = spec
        return cast("EffectFunction[P, R]", wrapper)

    @contextmanager
    def scope(self, run_id: str | None = None) -> Iterator[str]:
        """Dedup derived keys within a run. Without an id each ``with`` is a new run; with a
        stable id a resumed run after a crash replays what the first one did."""
        if run_id is not None and (type(run_id) is not str or not run_id):
            raise ValueError("scope id must be a non-empty string")
        if run_id is not None:
            check_text(run_id, "scope")
        scope_id = run_id or "run_" + uuid.uuid4().hex
        token = _scope.set(scope_id)
        try:
            yield scope_id
        finally:
            _scope.reset(token)

    @contextmanager
    def requested_by(self, who: str) -> Iterator[str]:
        """Record the effects first claimed inside as asked for by ``who`` (a user, an MCP
        client and its session): the claim's journal line carries it, in the same commit,
        and the console shows it as the requester. Duplicates of an effect keep the first
        requester."""
        if type(who) is not str or not who:
            raise ValueError("requested_by needs a non-empty string naming who asked")
        check_text(who, "requested_by")
        token = _requested_by.set(who)
        try:
            yield who
        finally:
            _requested_by.reset(token)

    def _prepare(self, spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        call = prepare(spec, args, kwargs, _scope.get(), self.secret_pepper)
        if self.enforce_provider_receipts or self.require_provider_capability_for_receipts:
            self._check_call_contract(spec, call.stored_args)
        return call

    # -- running a handler -------------------------------------------------------------------

    def _context(self, call: Call, effect: Effect) -> EffectContext:
        return EffectContext(
            effect.id, call.tool, effect.attempt, call.key, call.scope, effect.provider_key,
            effect.fence, self,
        )  # fmt: skip

    def _invoke(
        self,
        call: Call,
        ctx: EffectContext,
        loop: asyncio.AbstractEventLoop | None,
        context: contextvars.Context | None,
    ) -> Any:
        if loop is None:
            token = _current.set(ctx)
            try:
                return call.spec.fn(*call.args, **call.kwargs)
            finally:
                _current.reset(token)
        assert context is not None
        handler_context = context.copy()
        handler_context.run(_current.set, ctx)
        return run_on_loop(loop, lambda: call.spec.fn(*call.args, **call.kwargs), handler_context)

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor:
        # Ledger I/O of async calls. Threads lend store connections per statement, so more
        # threads than connections only wait briefly for one (stores/postgres.py).
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=64, thread_name_prefix="openonce"
            )
        return self._executor

    def close(self) -> None:
        self.keeper.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self.store.close()

    def __enter__(self) -> OpenOnce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _or_default[T](value: T | None, default: T) -> T:
    return default if value is None else value


def _check_schema(store: Store) -> None:
    """Refuse a ledger this code cannot use: an older one (migrate it) or a newer one whose
    oldest reader is newer than this code (upgrade OpenOnce)."""
    schema.require_usable_store(store)


MAX_OWNER = 256
MAX_PID = 2**22  # Linux's PID_MAX_LIMIT
_PID_LIKE = re.compile(r"\s*[+-]?[0-9]+\s*")


def _check_owner(owner: object) -> None:
    """Refuse an ``owner=`` the ledger cannot hold, or whose pid nothing could judge: it is
    written on every lease and journal line, and ``host:pid:token`` is what dead-owner
    detection reads (leases.process_owner makes the default)."""
    if owner is None:
        return
    if type(owner) is not str:
        raise ConfigurationError(f"owner must be a string, not {type(owner).__name__}")
    if len(owner) > MAX_OWNER:
        raise ConfigurationError(f"owner must be at most {MAX_OWNER} characters")
    try:
        check_text(owner, "owner")
    except OpenOnceError as exc:
        raise ConfigurationError(f"owner {owner!r}: {exc}") from None
    if not owner.isprintable():
        raise ConfigurationError(f"owner {owner!r} holds a control character")
    parts = owner.rsplit(":", 2)
    if len(parts) == 3 and _PID_LIKE.fullmatch(parts[1]):
        pid = int(parts[1])
        if not 1 <= pid <= MAX_PID:
            raise ConfigurationError(
                f"owner {owner!r} has the host:pid:token shape, but {parts[1].strip()} is no"
                f" process id (1 to {MAX_PID}); leave owner= unset for this process's own"
                " name, or pick one without that shape"
            )


def _pepper(given: bytes | str | None) -> bytes | None:
    if given is None:
        env = os.environ.get("OPENONCE_SECRET_PEPPER", "")
        given = env or None
    if given is None:
        return None
    pepper = given.encode("utf-8") if isinstance(given, str) else bytes(given)
    if len(pepper) < MIN_PEPPER_BYTES:
        raise ConfigurationError(
            f"secret_pepper must be at least {MIN_PEPPER_BYTES} bytes of random data"
        )
    return pepper


def load_pepper(path: str | os.PathLike[str]) -> bytes:
    """The deployment's pepper from ``path``, created there (32 random bytes, mode 0600)
    the first time. Keep the file outside the ledger's database and its backups."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass  # made earlier, or by another process just now
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32).hex().encode())
            f.flush()
            os.fsync(f.fileno())
    with open(path, "rb") as f:
        pepper = f.read().strip()
    if len(pepper) < MIN_PEPPER_BYTES:
        raise ConfigurationError(f"{os.fspath(path)} holds no usable pepper")
    return pepper
