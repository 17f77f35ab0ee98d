"""Worker processes for tests/test_concurrency.py.

Run as ``python tests/support/workers.py COMMAND 'JSON-KWARGS'``. Each worker opens its own
``OpenOnce(target)`` (a SQLite path or a Postgres DSN), so the only thing it shares with the
test process and the other workers is the ledger itself. Everything a worker observes is
written to files under the test's tmp_path, line by line and fsynced, so the test can read
it back even after the worker was killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from openonce_core import OpenOnce, current_effect


def append_line(path: str | Path, line: str) -> None:
    """Append one line durably: a handler's record of having run, outside the ledger."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_lines(path: str | Path) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line for line in f.read().splitlines() if line]
    except FileNotFoundError:
        return []


def write_json(path: str | Path, data: Any) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def wait_for_file(path: str | Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.001)


# -- commands --------------------------------------------------------------------------------


def race(target: str, keys: int, out_dir: str, index: int, seed: int, go: str) -> None:
    """Call the shared effect for keys 0..keys-1 in a shuffled order, after a start signal.

    The order is shuffled within blocks of ten consecutive keys (each process differently),
    so the processes sweep the key space together and keep meeting each other's claims in
    flight, rather than mostly finding keys already committed.

    Every handler run appends ``"<n> <effect_id>"`` to ``calls-<index>.log``; the value
    each call returned (or the error it raised) goes to ``results-<index>.json``, with
    counts of how often this process lost the insert race and waited on another's claim.
    """
    oo = OpenOnce(target, wait_seconds=60.0)
    calls = Path(out_dir) / f"calls-{index}.log"
    contention = {"insert_lost": 0, "waited": 0}
    store = oo.store
    insert, watch = store.insert, store.watch

    def counting_insert(*args: Any, **kwargs: Any) -> bool:
        done = insert(*args, **kwargs)
        contention["insert_lost"] += not done
        return done

    def counting_watch(*args: Any, **kwargs: Any) -> Any:
        contention["waited"] += 1  # only called to wait on a STARTED effect
        return watch(*args, **kwargs)

    store.insert = counting_insert  # type: ignore[method-assign]
    store.watch = counting_watch  # type: ignore[method-assign]

    @oo.effect(tool="race", idempotency_key=lambda n: f"k{n}")
    def race_effect(n: int) -> dict[str, Any]:
        append_line(calls, f"{n} {current_effect().effect_id}")
        time.sleep(0.002)  # keep the claim in flight a little, so others meet it STARTED
        return {"n": n, "by": index}

    rng = random.Random(seed)
    order: list[int] = []
    for start in range(0, keys, 10):
        block = list(range(start, min(start + 10, keys)))
        rng.shuffle(block)
        order += block
    Path(out_dir, f"ready-{index}").touch()
    wait_for_file(go)
    results: dict[str, Any] = {}
    for n in order:
        try:
            results[str(n)] = {"value": race_effect(n)}
        except Exception as exc:
            results[str(n)] = {"error": f"{type(exc).__name__}: {exc}"}
    stats = dict(oo.stats)
    oo.close()
    write_json(
        Path(out_dir) / f"results-{index}.json",
        {"order": order, "results": results, "stats": stats, "contention": contention},
    )


def hang(target: str, n: int, marker: str, lease_seconds: float, owner: str | None = None) -> None:
    """Claim effect ``hang``/``hang-<n>``, note the claim in ``marker`` and never return:
    the test kills this process with SIGKILL between the claim and the receipt. ``owner``
    names the lease owner as if the process ran on another host."""
    oo = OpenOnce(target, owner=owner)

    @oo.effect(tool="hang", idempotency_key=lambda n: f"hang-{n}", lease_seconds=lease_seconds)
    def hang_effect(n: int) -> str:
        append_line(marker, current_effect().effect_id)
        time.sleep(600)
        return "finished"  # never reached

    hang_effect(n)


def slow(target: str, keys: int, out_dir: str, sleep: float) -> None:
    """For each key in turn, run effect ``slow``/``slow-<n>`` whose handler announces itself in
    ``marker-<n>`` and then sleeps ``sleep`` seconds; stamp the wall-clock time the call
    returned in ``returned-<n>.json`` (so a waiter in another process can measure its delay).
    """
    oo = OpenOnce(target)

    @oo.effect(tool="slow", idempotency_key=lambda n: f"slow-{n}")
    def slow_effect(n: int) -> dict[str, Any]:
        append_line(Path(out_dir) / f"marker-{n}", current_effect().effect_id)
        time.sleep(sleep)
        return {"n": n, "pid": os.getpid()}

    for n in range(keys):
        result = slow_effect(n)
        returned_at = time.time()
        write_json(Path(out_dir) / f"returned-{n}.json", {"at": returned_at, "result": result})
    oo.close()


def stoppable(target: str, marker: str, release: str, lease_seconds: float) -> None:
    """Open a PR (``github.create_pr``), note the claim in ``marker``, then wait until the
    file ``release`` exists (the test stops and continues this process meanwhile)."""
    oo = OpenOnce(target)

    @oo.effect(tool="github.create_pr", idempotency_key=lambda head: head,
               lease_seconds=lease_seconds)  # fmt: skip
    def create_pr(head: str) -> dict[str, Any]:
        append_line(marker, current_effect().effect_id)
        while not os.path.exists(release):
            time.sleep(0.01)
        return {"number": 7, "head": head}

    create_pr("fix")
    oo.close()


COMMANDS = {"race": race, "hang": hang, "slow": slow, "stoppable": stoppable}


def main(argv: list[str]) -> int:
    command, kwargs = argv[1], json.loads(argv[2])
    try:
        COMMANDS[command](**kwargs)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
