"""An agent process of the nemesis soak (bench/soak.py): ``python bench/soak_agent.py JSON``.

It holds one ``OpenOnce(target)`` and calls ``stripe.charge`` for orders drawn from a window
that slides over the soak's key space, so the agents keep meeting each other's keys (in
flight, committed, unknown) and re-running them. The handler pays through the soak's
provider over HTTP, the way a Stripe handler must (``Idempotency-Key`` = the effect's
provider key, ``effect_metadata`` stamped on the PaymentIntent, for the prober).

What it saw goes to ``<out>/agent-<name>.jsonl``, one JSON line per call, flushed before
the next call (the kernel keeps it through a kill -9): ``o`` is the outcome (``ok`` with
the result ``r`` and ``ran`` when this call's own handler ran, ``unknown``, ``failed``,
``pending``, ``in_flight``, ``error`` with ``e``), with ``pid``, the real (unstepped) wall
clock at its start ``t`` and end ``end``, and ``a``, the attempts its handler ran (the
checker's ``live_leases_kept`` finds an expired attempt's call by pid, order and attempt).

Clock faults: ``clock_file`` holds an offset in seconds that the nemesis writes. On SQLite
the ledger's clock is this host's wall clock, so the agent's ``OpenOnce`` gets a clock
that adds the offset (a host whose clock stepped). On Postgres the ledger's clock is the
database's, and the offset is added to ``time.time()`` of the whole process instead: the
host's clock steps, which the core must not care about.

Modes: ``loop`` (until ``stop_file`` exists); ``prefork`` (on the soak's ledger, or on a
SQLite ledger of the family's own, where the parent's client is the only one): open the
client, call, fork ``children`` workers that record effects with the inherited client, go
on calling for ``parent_life`` seconds, then close the client (``oo.close()``) while the
children still run, and wait for them; ``orphan``: the same, but the parent closes its
client and exits (a normal exit, not ``os._exit``) right after forking, while its children
run. On SQLite a parent's last close checkpoints the WAL and may delete ``-wal``/``-shm``:
it must not do so under children that still write to them (the children's outcomes would
vanish, and their keys run again).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from soak_clock import ClockOffset  # noqa: E402

from openonce_core import (  # noqa: E402
    ApprovalPending,
    EffectFailed,
    OpenOnce,
    OutcomeUnknownError,
    current_effect,
)
from openonce_core._clock import SystemClock  # noqa: E402
from openonce_core._policy import ALLOW, PolicyDecision  # noqa: E402
from openonce_core.errors import EffectInFlightError  # noqa: E402
from openonce_core.probers.stripe import effect_metadata  # noqa: E402

API_KEY = "sk_test_good"
APPROVE_EVERY = 13  # orders whose number is a multiple wait for a person (policy "approve")
CLIENT_TIMEOUT = 2.0  # the handler's read timeout at the provider
PREPARE = 0.3  # up to this long in the handler before the request leaves

_real_time = time.time


class SteppedClock(SystemClock):
    """This host's wall clock plus the nemesis' offset: a clock that steps."""

    def __init__(self, offset: ClockOffset) -> None:
        self.offset = offset

    def now(self) -> float:
        return _real_time() + self.offset.value


def approval_policy(tool: str, args: Any) -> PolicyDecision:
    order = str(args.get("order", ""))
    if order.rsplit("-", 1)[-1].isdigit() and int(order.rsplit("-", 1)[1]) % APPROVE_EVERY == 0:
        return PolicyDecision(requires_approval=True, reason="soak: every 13th order")
    return ALLOW


def open_client(
    target: str,
    *,
    offset: ClockOffset | None = None,
    lease_seconds: float = 6.0,
    policy: bool = False,
) -> OpenOnce:
    kwargs: dict[str, Any] = {
        "lease_seconds": lease_seconds,
        "wait_seconds": 3.0,
        "retry_delay": 0.05,
        "max_attempts": 3,
        "policy": approval_policy if policy else None,
    }
    if target.startswith("postgresql"):
        from openonce_core.stores.postgres import PostgresStore

        return OpenOnce(PostgresStore(target, max_size=3), **kwargs)
    return OpenOnce(target, clock=SteppedClock(offset) if offset else None, **kwargs)


class Payer:
    """The ``stripe.charge`` effect of one client, and what its handler saw."""

    def __init__(self, oo: OpenOnce, provider_url: str) -> None:
        self.oo = oo
        self.url = provider_url.rstrip("/") + "/v1/payment_intents"
        self.ran: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, list[int]] = {}  # order -> the attempts its handler ran

        @oo.effect(tool="stripe.charge", idempotency_key=lambda order, amount: order)
        def charge(order: str, amount: int) -> dict[str, Any]:
            ctx = current_effect()
            self.attempts.setdefault(order, []).append(ctx.attempt)
            time.sleep(random.uniform(0.0, PREPARE))  # the agent builds its request
            metadata = {**effect_metadata(ctx), "soak_key": order}
            form = {"amount": amount, "currency": "usd"}
            form.update({f"metadata[{k}]": v for k, v in metadata.items()})
            request = urllib.request.Request(
                self.url,
                data=urllib.parse.urlencode(form).encode(),
                headers={
                    "Authorization": f"Bearer {API_KEY}",
                    "Idempotency-Key": ctx.provider_key,
                    "Content-Type": "application/x-www-form-urlencoded",
                },
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT) as response:
                obj = json.loads(response.read())
            result = {
                "stripe_id": obj["id"],
                "amount": obj["amount"],
                "currency": obj["currency"],
                "status": obj["status"],
            }
            self.ran[order] = result
            return result

        self.charge = charge

    def call(self, order: str) -> dict[str, Any]:
        """One call; what it saw, as a record line."""
        amount = 100 + int(order.rsplit("-", 1)[1])
        self.ran.pop(order, None)
        self.attempts.pop(order, None)
        line: dict[str, Any] = {"k": order, "t": round(_real_time(), 3), "pid": os.getpid()}
        try:
            result = self.charge(order, amount)
        except OutcomeUnknownError:
            line["o"] = "unknown"
        except EffectFailed as exc:
            line["o"] = "failed"
            line["e"] = type(exc.__cause__ or exc).__name__
        except ApprovalPending:
            line["o"] = "pending"
        except EffectInFlightError:
            line["o"] = "in_flight"
        except urllib.error.HTTPError as exc:  # a replayed decline
            line["o"] = "failed" if exc.code == 402 else "error"
            line["e"] = f"HTTPError {exc.code}"
        except Exception as exc:
            line["o"] = "error"
            line["e"] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            line["o"] = "ok"
            line["r"] = result
            line["ran"] = self.ran.get(order) == result
        line["end"] = round(_real_time(), 3)
        if order in self.attempts:
            line["a"] = self.attempts.pop(order)
        return line


class Record:
    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, line: dict[str, Any]) -> None:
        self.f.write(json.dumps(line, sort_keys=True) + "\n")
        self.f.flush()


def pick(rng: random.Random, cfg: dict[str, Any]) -> str:
    """An order from the window that slides over the key space with the soak's time (or,
    for a fork family on a ledger of its own, one of its ``keys`` orders ``<prefix>order-N``,
    so its processes keep meeting and replaying each other's keys)."""
    if cfg.get("prefix"):
        return f"{cfg['prefix']}order-{rng.randint(1, cfg['keys'])}"
    elapsed = time.monotonic() - cfg["t0"]
    head = int(elapsed * cfg["key_rate"]) + 1
    low = max(0, head - cfg["window"])
    return f"order-{rng.randrange(low, head)}"


def loop(
    payer: Payer, record: Record, rng: random.Random, cfg: dict[str, Any], until: float
) -> int:
    calls = 0
    while time.monotonic() < until and not os.path.exists(cfg["stop_file"]):
        record.write(payer.call(pick(rng, cfg)))
        calls += 1
        time.sleep(rng.uniform(*cfg["pause"]))
    return calls


def main(cfg: dict[str, Any]) -> int:
    name = cfg["name"]
    out = Path(cfg["out"])
    offset = ClockOffset(cfg.get("clock_file"))
    postgres = cfg["target"].startswith("postgresql")
    if postgres:
        time.time = lambda: _real_time() + offset.value  # the host's clock steps
    oo = open_client(
        cfg["target"], offset=offset, lease_seconds=cfg["lease_seconds"], policy=cfg["policy"]
    )
    payer = Payer(oo, cfg["provider"])
    rng = random.Random(f"{cfg['seed']}:{name}:{os.getpid()}")
    mode = cfg.get("mode", "loop")
    if mode == "loop":
        record = Record(out / f"agent-{name}.jsonl")
        loop(payer, record, rng, cfg, float("inf"))
        oo.close()
        return 0
    # prefork / orphan: the client is open and has been used before the fork.
    record = Record(out / f"agent-{name}.jsonl")
    record.write(payer.call(pick(rng, cfg)))
    children = []
    for i in range(int(cfg.get("children", 2))):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                child_rng = random.Random(f"{cfg['seed']}:{name}:child{i}:{os.getpid()}")
                child_record = Record(out / f"agent-{name}-c{i}.jsonl")
                loop(payer, child_record, child_rng, cfg, time.monotonic() + cfg["fork_life"])
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    if mode == "orphan":
        # The parent closes its client and exits while its children run (and hold its
        # client's copy): its close must leave their ledger alone.
        time.sleep(0.3)
        oo.close()
        return 0
    loop(payer, record, rng, cfg, time.monotonic() + cfg.get("parent_life", cfg["fork_life"]))
    oo.close()  # while the children still run
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    try:
        code = main(json.loads(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        code = 1
    sys.exit(code)
