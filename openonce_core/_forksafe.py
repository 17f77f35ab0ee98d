"""What a forked child must not inherit from its parent's ledger clients.

Celery's prefork pool, ``gunicorn --preload`` and ``multiprocessing`` fork a process that
may already hold an open ledger client. A child that used the parent's Postgres
connection would read replies meant for its parent (and "win" claims that are not its
own); a child that used its parent's locks, threads or thread pool could hang on a lock
held by a thread that does not exist in the child. So every store, client and clock that
holds such things registers here, and right after ``fork`` each one starts afresh in the
child: new connections, pools, locks, listener and owner identity.

The parent's sockets are made harmless in the child without touching the parent's side:
each inherited descriptor is pointed at ``/dev/null``, so neither closing it nor a
finalizer's goodbye message can reach the server on the parent's connection.

Some things cannot be repaired in the child at all, so they must not exist at the moment
of ``fork``: SQLite keeps each file's POSIX lock state in process memory, and a child that
inherits it believes it already holds the locks its parent holds (see ``stores/sqlite.py``).
An object with a ``before_fork`` method gets it called in the forking thread just before
``fork``, and its ``after_fork_in_parent`` in the parent right after.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any, Protocol


class ForkAware(Protocol):
    def after_fork(self) -> None: ...


_registered: weakref.WeakSet[Any] = weakref.WeakSet()
# Objects a child inherited and must never use nor finalize (their sockets are disarmed).
_abandoned: list[Any] = []


def register(obj: ForkAware) -> None:
    _registered.add(obj)


def abandon(obj: Any) -> None:
    """Keep ``obj`` alive and untouched for the rest of this process's life."""
    _abandoned.append(obj)


def disarm(fd: int) -> None:
    """Point the inherited descriptor ``fd`` at /dev/null in this process only."""
    if fd < 0:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)


def _before_fork() -> None:
    # One fixed order (by id) for every forking thread: two threads forking at once then
    # wait for each other's stores in the same order, never each for the other's.
    for obj in sorted(list(_registered), key=id):
        hook = getattr(obj, "before_fork", None)
        if hook is not None:
            with contextlib.suppress(Exception):
                hook()


def _after_fork_in_parent() -> None:
    # Each object knows whether this thread stopped it (one registered since the fork began,
    # or stopped by another thread's fork, is left alone), so a hook that failed half-way is
    # undone as well.
    for obj in list(_registered):
        hook = getattr(obj, "after_fork_in_parent", None)
        if hook is not None:
            with contextlib.suppress(Exception):
                hook()


def _after_fork_in_child() -> None:
    for obj in list(_registered):
        with contextlib.suppress(Exception):  # one broken client must not break the others
            obj.after_fork()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
