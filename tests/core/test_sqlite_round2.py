"""The SQLite ledger file across processes, names and threads.

* A client opened before ``fork``: SQLite keeps a file's lock state in process memory, so a
  child that inherits an open connection never takes a real lock, and the parent closing
  (or exiting) deleted the WAL under it: recorded outcomes vanished, keys ran twice.
* One file under two names (a hard link), or on a network filesystem: each name is a
  ledger of its own to SQLite, so every key could run twice, each a clean COMMITTED.
* A connection for every thread that ever used the store: short-lived threads leaked one
  each (file descriptors) for the life of the process.

What is checked is what a user sees: handler runs counted in a file outside the ledger,
states after a restart, a rerun that replays, descriptors the process holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from openonce_core import EffectState, OpenOnce, SQLiteStore
from openonce_core.errors import ConfigurationError
from tests.support.workers import append_line, read_lines

S = EffectState
ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 120.0  # real seconds a multi-process test may take before it is called hung

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded"  # the lease keeper's thread, as in production
)


def declare(oo: OpenOnce, runs: Path) -> Callable[[int], int]:
    @oo.effect(tool="charge", idempotency_key=lambda n: f"k{n}")
    def charge(n: int) -> int:
        append_line(runs, str(n))  # the independent truth: one line per handler run
        return n

    return charge


def db_fds(path: str | Path) -> int:
    """How many of this process's file descriptors are open on the ledger file itself."""
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir used, closed by now
            count += os.readlink(f"/proc/self/fd/{fd}") == target
    return count


def read_or_eof(fd: int, deadline: float) -> bytes:
    """One byte from a pipe (b"" at end of file), failing the test at the deadline."""
    ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, "timed out waiting for the other processes"
    return os.read(fd, 1)


def run_child(work: Callable[[], None], errors: Path, name: str) -> NoReturn:
    """In a forked child: run ``work``, report a failure through a file, never return."""
    code = 0
    try:
        work()
    except BaseException as exc:
        (errors / f"{name}.err").write_text(f"{type(exc).__name__}: {exc}")
        code = 1
    os._exit(code)


def reap(pids: list[int], deadline: float) -> list[int]:
    """Exit codes of the children, killing any still running at the deadline."""
    codes = []
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"child {pid} hung")
            time.sleep(0.01)
    return codes


def assert_recorded_once(path: Path, runs: Path, keys: list[int]) -> None:
    """After a restart: every key recorded COMMITTED, its handler ran once, and running
    every key again replays (the handler count does not move)."""
    assert sorted(int(n) for n in read_lines(runs)) == sorted(keys)
    oo = OpenOnce(str(path))
    try:
        states = {n: getattr(oo.store.find("charge", f"k{n}"), "state", None) for n in keys}
        assert states == {n: S.COMMITTED for n in keys}
        charge = declare(oo, runs)
        assert [charge(n) for n in keys] == keys
        assert sorted(int(n) for n in read_lines(runs)) == sorted(keys)
    finally:
        oo.close()


# -- 1. fork with a client open -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("parent_used_it", [False, True])
def test_children_outcomes_survive_the_parent_closing_its_client(tmp_path, parent_used_it):
    """A plain ``OpenOnce(path)`` (its migrate opened a connection), then 4 children record 6
    effects each; half-way the parent closes its client. Every outcome is still recorded
    after a restart, and a rerun of every key replays."""
    path, runs, errors = tmp_path / "ledger.db", tmp_path / "runs", tmp_path
    oo = OpenOnce(str(path))
    charge = declare(oo, runs)
    keys = [-1] if parent_used_it else []
    if parent_used_it:
        assert charge(-1) == -1
    ready_r, ready_w = os.pipe()  # each child writes a byte half-way through
    go_r, go_w = os.pipe()  # closed by the parent after its close: end of file goes on
    children, per_child = 4, 6
    pids = []
    for c in range(children):
        mine = list(range(c * per_child, (c + 1) * per_child))
        keys += mine
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)

            def work(mine: list[int] = mine) -> None:
                for n in mine[: per_child // 2]:
                    assert charge(n) == n
                os.write(ready_w, b"r")
                assert os.read(go_r, 1) == b""  # the parent has closed its client
                for n in mine[per_child // 2 :]:
                    assert charge(n) == n

            run_child(work, errors, f"child-{c}")
        pids.append(pid)
    os.close(ready_w)
    os.close(go_r)
    deadline = time.monotonic() + DEADLINE
    try:
        for _ in range(children):
            assert read_or_eof(ready_r, deadline) == b"r", list(errors.glob("*.err"))
        oo.close()  # the parent's last connection closes while its children are mid-run
    finally:
        os.close(go_w)
        os.close(ready_r)
    assert reap(pids, deadline) == [0] * children, [p.read_text() for p in errors.glob("*.err")]
    assert_recorded_once(path, runs, keys)


PARENT_EXITS = """
import os, select, sys, traceback
from openonce_core import OpenOnce
from tests.support.workers import append_line

path, runs, errors = sys.argv[1], sys.argv[2], sys.argv[3]
children, per_child = int(sys.argv[4]), int(sys.argv[5])
oo = OpenOnce(path)  # a client opened at import time (its migrate opened a connection)


@oo.effect(tool="charge", idempotency_key=lambda n: f"k{n}")
def charge(n):
    append_line(runs, str(n))
    return n


ready_r, ready_w = os.pipe()  # each child writes a byte half-way through
alive_r, alive_w = os.pipe()  # end of file for the children once this parent has exited
for c in range(children):
    if os.fork() == 0:
        os.close(alive_w)
        os.close(ready_r)
        code = 0
        try:
            mine = range(c * per_child, (c + 1) * per_child)
            for n in mine[: per_child // 2]:
                assert charge(n) == n
            os.write(ready_w, b"r")
            assert os.read(alive_r, 1) == b""
            for n in mine[per_child // 2 :]:
                assert charge(n) == n
        except BaseException:
            with open(os.path.join(errors, f"child-{c}.err"), "w") as f:
                f.write(traceback.format_exc())
            code = 1
        os._exit(code)
os.close(ready_w)
for _ in range(children):  # then exit, the client still open, while the children run
    if not select.select([ready_r], [], [], 60)[0] or not os.read(ready_r, 1):
        break
"""


@pytest.mark.slow
def test_children_outcomes_survive_the_parent_exiting(tmp_path):
    """A process opens the client at import, forks 4 children and exits while they are
    half-way through. Their outcomes are all recorded, and a rerun replays each."""
    path, runs = tmp_path / "ledger.db", tmp_path / "runs"
    # Every process of the tree holds done_w: end of file once the last of them exited.
    done_r, done_w = os.pipe()
    children, per_child = 4, 6
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            PARENT_EXITS,
            *map(str, (path, runs, tmp_path, children, per_child)),
        ],
        cwd=ROOT,
        pass_fds=(done_w,),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    os.close(done_w)
    try:
        assert parent.returncode == 0, parent.stderr
        assert read_or_eof(done_r, time.monotonic() + DEADLINE) == b""
    finally:
        os.close(done_r)
    assert [p.read_text() for p in tmp_path.glob("*.err")] == []
    assert_recorded_once(path, runs, list(range(children * per_child)))


@pytest.mark.slow
def test_no_connection_is_open_at_fork_while_other_threads_use_the_ledger(tmp_path):
    """Two threads keep the store busy (one writing as the lease keeper does, one reading)
    while the main thread forks 10 times: each child starts with no descriptor on the
    ledger file, and works."""
    path, runs = tmp_path / "ledger.db", tmp_path / "runs"
    oo = OpenOnce(str(path))
    charge = declare(oo, runs)
    assert charge(-1) == -1
    effect = oo.store.find("charge", "k-1")
    stop = threading.Event()
    busy: list[int] = [0, 0]
    failures: list[BaseException] = []

    def hammer(i: int, use: Callable[[], Any]) -> None:
        try:
            while not stop.is_set():
                use()
                busy[i] += 1
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=hammer, args=(0, lambda: oo.store.renew(effect.id, 0, "x", 1))),
        threading.Thread(target=hammer, args=(1, lambda: oo.store.find("charge", "k-1"))),
    ]
    for t in threads:
        t.start()
    pids = []
    try:
        for c in range(10):
            before = list(busy)
            deadline = time.monotonic() + 30
            while busy == before and not failures:  # the threads are in their loops
                assert time.monotonic() < deadline, "the hammering threads stopped"
                time.sleep(0.001)
            pid = os.fork()
            if pid == 0:

                def work(c: int = c) -> None:
                    assert db_fds(path) == 0, f"{db_fds(path)} descriptors crossed the fork"
                    assert charge(c) == c

                run_child(work, tmp_path, f"child-{c}")
            pids.append(pid)
            assert charge(100 + c) == 100 + c  # the parent goes on with new connections
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    assert reap(pids, time.monotonic() + DEADLINE) == [0] * 10, [
        p.read_text() for p in tmp_path.glob("*.err")
    ]
    oo.close()
    assert_recorded_once(path, runs, [-1, *range(10), *range(100, 110)])


@pytest.mark.slow
def test_forks_while_the_lease_keeper_renews_a_running_effect(tmp_path):
    """A handler runs in a thread while the test moves the clock past renewal after
    renewal and forks after each: the keeper's renewals and the forks wait for each other,
    never for ever; each child starts with nothing open on the ledger; the long effect
    commits with its lease kept alive."""
    from openonce_core.testing import FakeClock

    clock = FakeClock()
    path, runs = tmp_path / "ledger.db", tmp_path / "runs"
    oo = OpenOnce(str(path), clock=clock)
    charge = declare(oo, runs)
    started, finish = threading.Event(), threading.Event()

    @oo.effect(tool="long", idempotency_key=lambda: "long", lease_seconds=30)
    def long() -> str:
        started.set()
        finish.wait()
        return "done"

    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(long()))
    runner.start()
    assert started.wait(30), "the long effect's handler never started"
    pids = []
    try:
        for c in range(8):
            clock.advance(11)  # past a third of the lease: the keeper renews it now...
            renewed_past = clock.now() + 29
            pid = os.fork()  # ...while this fork closes the connections
            if pid == 0:

                def work(c: int = c) -> None:
                    assert db_fds(path) == 0, f"{db_fds(path)} descriptors crossed the fork"
                    assert charge(c) == c

                run_child(work, tmp_path, f"child-{c}")
            pids.append(pid)
            # The keeper renewed after this fork too (real time, bounded: it is a thread).
            deadline = time.monotonic() + 30
            while oo.store.find("long", "long").lease_expires_at < renewed_past:
                assert time.monotonic() < deadline, "the lease keeper stopped renewing"
                time.sleep(0.002)
    finally:
        finish.set()
        runner.join()
    assert result == ["done"]
    assert reap(pids, time.monotonic() + DEADLINE) == [0] * 8, [
        p.read_text() for p in tmp_path.glob("*.err")
    ]
    effect = oo.store.find("long", "long")
    assert effect is not None and effect.state == S.COMMITTED
    oo.close()
    assert_recorded_once(path, runs, list(range(8)))


FORK_INSIDE_A_STATEMENT = """
import os, sys, warnings
from openonce_core import SQLiteStore

store = SQLiteStore(sys.argv[1])
store.migrate()
with store._use() as conn:  # this thread is inside a use of its connection
    conn.execute("SELECT count(*) FROM openonce_effects").fetchone()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert [w.category for w in seen] == [RuntimeWarning], seen
    conn.execute("SELECT 1").fetchone()  # its connection was kept for it
store.migrate()  # and the store goes on
print("ok")
"""


def test_a_fork_from_inside_a_statement_does_not_wait_for_itself(tmp_path):
    """The gate waits for statements in flight before a fork; the forking thread's own
    must not make it wait forever. (A subprocess, so a hang fails instead of blocking.)"""
    done = subprocess.run(
        [sys.executable, "-c", FORK_INSIDE_A_STATEMENT, str(tmp_path / "ledger.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_an_in_memory_ledger_is_forked_between_transactions(tmp_path):
    """The in-memory store keeps its one connection across a fork (fork copies the ledger),
    but not in the middle of another thread's transaction: the fork waits for it to end, so
    the child's copy is whole and writable."""
    from openonce_core import InMemoryStore

    store = InMemoryStore()
    in_transaction, go = threading.Event(), threading.Event()

    def writer() -> None:
        with store._use() as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE half (x)")
            in_transaction.set()
            go.wait()
            conn.execute("COMMIT")

    thread = threading.Thread(target=writer)
    thread.start()
    assert in_transaction.wait(30), "the writer never began its transaction"
    go.set()  # the writer needs the GIL back to commit; the fork must wait for it
    pid = os.fork()
    if pid == 0:

        def work() -> None:
            with store._use() as conn:
                assert not conn.in_transaction, "the child copied a transaction half-done"
                assert conn.execute("SELECT count(*) FROM half").fetchone() == (0,)
            oo = OpenOnce(store)
            assert declare(oo, tmp_path / "runs")(1) == 1

        run_child(work, tmp_path, "child")
    thread.join()
    assert reap([pid], time.monotonic() + DEADLINE) == [0], [
        p.read_text() for p in tmp_path.glob("*.err")
    ]


# -- 2. one file, one name, one host ------------------------------------------------------


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_a_ledger_file_with_a_second_name_is_refused(tmp_path):
    """A hard link is a second ledger to SQLite (its WAL and locks go by the name). Opening
    either name is refused with the path and the reason, and nothing is written."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    path = ledger / "ledger.db"
    oo = OpenOnce(str(path))
    declare(oo, tmp_path / "runs")(1)
    oo.close()
    other = ledger / "other.db"
    os.link(path, other)
    before = snapshot(ledger)
    for name in (other, path):
        with pytest.raises(ConfigurationError, match="hard link") as refused:
            OpenOnce(str(name))
        assert repr(str(name)) in str(refused.value)
        with pytest.raises(ConfigurationError, match="hard link"):
            SQLiteStore(str(name))
    assert snapshot(ledger) == before  # no -wal, no -shm, not a byte changed


def test_a_link_made_while_the_store_is_open_is_refused_at_the_next_connection(tmp_path):
    path = tmp_path / "ledger.db"
    store = SQLiteStore(str(path))
    store.migrate()
    os.link(path, tmp_path / "other.db")
    store.close()
    with pytest.raises(ConfigurationError, match="2 hard links"):
        store.get("eff_1")


MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
50 27 0:53 / /mnt/nfs rw,relatime shared:30 master:2 - nfs4 server:/export rw,vers=4.2
51 50 254:1 / /mnt/nfs/local rw - ext4 /dev/vdb rw
52 27 0:54 / /mnt/nfsish rw - ext4 /dev/vdc rw
53 27 0:60 / /srv/my\040share rw - cifs //host/share rw
54 27 0:61 / /home/u/remote rw,nosuid - fuse.sshfs u@host:/ rw
55 27 0:62 / /data rw - ext4 /dev/vdd rw
56 27 0:63 / /data rw - nfs host:/data rw
57 27 0:64 / /tmp rw - tmpfs tmpfs rw
58 27 0:65 / /wsl rw - 9p drvfs rw
not a mountinfo line
"""


@pytest.mark.parametrize(
    ("path", "mount", "fstype", "network"),
    [
        ("/mnt/nfs/ledger.db", "/mnt/nfs", "nfs4", True),
        ("/mnt/nfs", "/mnt/nfs", "nfs4", True),
        ("/mnt/nfs/local/ledger.db", "/mnt/nfs/local", "ext4", False),  # the longest wins
        ("/mnt/nfsish/ledger.db", "/mnt/nfsish", "ext4", False),  # a prefix, not a parent
        ("/srv/my share/ledger.db", "/srv/my share", "cifs", True),  # \040 is a space
        ("/home/u/remote/app/ledger.db", "/home/u/remote", "fuse.sshfs", True),
        ("/data/ledger.db", "/data", "nfs", True),  # mounted on top of the ext4
        ("/tmp/ledger.db", "/tmp", "tmpfs", False),
        ("/wsl/c/ledger.db", "/wsl", "9p", True),
        ("/var/lib/app/ledger.db", "/", "ext4", False),
    ],
)
def test_the_filesystem_of_a_path_is_read_from_the_mount_table(path, mount, fstype, network):
    from openonce_core.stores.sqlite import filesystem_of, is_network_filesystem

    assert filesystem_of(path, MOUNTINFO) == (mount, fstype)
    assert is_network_filesystem(fstype) is network


def test_filesystem_types_that_other_hosts_share():
    from openonce_core.stores.sqlite import is_network_filesystem

    for fstype in ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "afs"):
        assert is_network_filesystem(fstype), fstype
    for fstype in ("lustre", "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "fuse.rclone"):
        assert is_network_filesystem(fstype), fstype
    for fstype in ("ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "fuse", "fuse.portal"):
        assert not is_network_filesystem(fstype), fstype


def test_a_ledger_on_a_network_filesystem_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
):
    from openonce_core.stores import sqlite as sqlite_module

    real = sqlite_module._read_mountinfo()
    assert real is not None and "/" in real
    # This machine's own mount table allows a local temporary directory.
    sqlite_module.refuse_network_filesystem(str(tmp_path / "ledger.db"))
    local = OpenOnce(str(tmp_path / "local.db"))
    local.close()

    shared = tmp_path / "shared"
    shared.mkdir()
    mounted = real + f"99 27 0:99 / {os.path.realpath(shared)} rw - nfs4 nas:/ledgers rw\n"
    monkeypatch.setattr(sqlite_module, "_read_mountinfo", lambda: mounted)
    path = str(shared / "ledger.db")
    with pytest.raises(ConfigurationError, match="nfs4 network filesystem") as refused:
        OpenOnce(path)
    assert repr(path) in str(refused.value)
    assert list(shared.iterdir()) == []  # not even an empty file


# -- 3. connections of threads that ended -------------------------------------------------


def test_short_lived_threads_do_not_leave_a_connection_each(tmp_path):
    """200 threads, 4 alive at a time, each running one effect: the descriptors open on
    the ledger file stay few, and every effect is recorded once."""
    path, runs = tmp_path / "ledger.db", tmp_path / "runs"
    oo = OpenOnce(str(path))
    charge = declare(oo, runs)
    assert charge(-1) == -1
    failures: list[BaseException] = []
    most = 0

    def run(n: int) -> None:
        try:
            assert charge(n) == n
        except BaseException as exc:
            failures.append(exc)

    for wave in range(50):
        threads = [threading.Thread(target=run, args=(wave * 4 + i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        most = max(most, db_fds(path))
    assert failures == []
    assert most <= 10, f"{most} descriptors open on the ledger file"
    oo.close()
    assert db_fds(path) == 0
    assert_recorded_once(path, runs, [-1, *range(200)])


@pytest.mark.parametrize("target", ["memory://", "sqlite:///ledger.db", "mysql://u@h/db"])
def test_a_url_that_names_no_store_is_refused_not_made_a_file(tmp_path, monkeypatch, target):
    # "memory://" once became a SQLite file named "memory:" in the working directory.
    from openonce_core.stores import open_store

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="is not a store"):
        open_store(target)
    assert list(tmp_path.iterdir()) == []
