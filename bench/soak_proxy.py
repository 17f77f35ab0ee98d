"""A TCP proxy in front of Postgres for the nemesis soak (bench/soak.py): asyncio, in a thread.

It reads the Postgres wire protocol just enough to hurt at the worst moments:

* ``drop_after_commit(n)``: the next ``n`` client batches that write (a ``COMMIT``, or an
  ``INSERT``/``UPDATE``/``DELETE``/data-modifying ``WITH`` in autocommit, also through a
  prepared statement bound by name) are forwarded; the server's answer is read up to its
  ``ReadyForQuery`` — so the commit happened — and thrown away, and both sides of the
  connection are cut. The client saw its write fail; the database has it.
* ``delay(seconds, for_seconds)``: every client message waits ``seconds`` before it is
  forwarded, for a while (a slow network, a stalled database).

Clients must connect with ``sslmode=disable`` and ``gssencmode=disable`` (the soak's DSN
does), so the protocol is readable.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import threading
import time
from collections import Counter

_WRITE = re.compile(rb"^\s*(COMMIT|END|INSERT|UPDATE|DELETE|WITH\b[\s\S]*\b(INSERT|UPDATE|DELETE))",
                    re.IGNORECASE)  # fmt: skip
PROTOCOL_3 = 196608


class Messages:
    """Splits a byte stream into Postgres messages (typed; untyped at the start)."""

    def __init__(self, startup: bool) -> None:
        self.buf = bytearray()
        self.startup = startup  # untyped messages until the StartupMessage

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.buf += data
        out: list[tuple[bytes, bytes]] = []
        while True:
            if self.startup:
                if len(self.buf) < 8:
                    return out
                (length,) = struct.unpack("!I", self.buf[:4])
                if len(self.buf) < length:
                    return out
                (code,) = struct.unpack("!I", self.buf[4:8])
                body = bytes(self.buf[4:length])
                del self.buf[:length]
                out.append((b"", body))
                if code == PROTOCOL_3:
                    self.startup = False
                continue
            if len(self.buf) < 5:
                return out
            (length,) = struct.unpack("!I", self.buf[1:5])
            if len(self.buf) < 1 + length:
                return out
            kind, body = bytes(self.buf[:1]), bytes(self.buf[5 : 1 + length])
            del self.buf[: 1 + length]
            out.append((kind, body))


class PgProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.counts: Counter[str] = Counter()
        self._drops = 0
        self._delay = 0.0
        self._delay_until = 0.0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, name="soak-pg-proxy", daemon=True)

    # -- controls ------------------------------------------------------------------------

    def start(self) -> PgProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def drop_after_commit(self, n: int = 1) -> None:
        with self._lock:
            self._drops += n

    def delay(self, seconds: float, for_seconds: float) -> None:
        with self._lock:
            self._delay = seconds
            self._delay_until = time.monotonic() + for_seconds

    def calm(self) -> None:
        with self._lock:
            self._drops = 0
            self._delay = 0.0

    def stop(self) -> None:
        def _close() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._conns):
                w.close()

        self._loop.call_soon_threadsafe(_close)
        time.sleep(0.2)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _take_drop(self) -> bool:
        with self._lock:
            if self._drops > 0:
                self._drops -= 1
                return True
            return False

    def _current_delay(self) -> float:
        with self._lock:
            return self._delay if time.monotonic() < self._delay_until else 0.0

    # -- serving -----------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    async def _client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            sreader, swriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.close()
            return
        self._conns.update((cwriter, swriter))
        self.counts["connections"] += 1
        state = {"armed": False, "cut": False}
        prepared: dict[bytes, bool] = {}  # statement name -> writes

        def cut() -> None:
            state["cut"] = True
            for w in (cwriter, swriter):
                with contextlib.suppress(Exception):
                    w.transport.abort()

        async def upstream() -> None:
            parser = Messages(startup=True)
            while not state["cut"]:
                data = await creader.read(65536)
                if not data:
                    break
                writes = False
                for kind, body in parser.feed(data):
                    if kind == b"Q":
                        writes |= bool(_WRITE.match(body))
                    elif kind == b"P":
                        name, _, rest = body.partition(b"\0")
                        prepared[name] = bool(_WRITE.match(rest))
                        writes |= prepared[name]
                    elif kind == b"B":
                        _portal, _, rest = body.partition(b"\0")
                        writes |= prepared.get(rest.partition(b"\0")[0], False)
                if writes and not state["armed"] and self._take_drop():
                    state["armed"] = True
                    self.counts["replies_dropped"] += 1
                delay = self._current_delay()
                if delay:
                    self.counts["delayed"] += 1
                    await asyncio.sleep(delay)
                swriter.write(data)
                await swriter.drain()

        async def downstream() -> None:
            parser = Messages(startup=False)
            while not state["cut"]:
                data = await sreader.read(65536)
                if not data:
                    break
                if state["armed"]:
                    # Swallow the answer; once the server is ready again the write is
                    # committed (or failed on its own): cut the connection.
                    if any(kind == b"Z" for kind, _ in parser.feed(data)):
                        cut()
                        return
                    continue
                parser.feed(data)
                cwriter.write(data)
                await cwriter.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for w in (cwriter, swriter):
            with contextlib.suppress(Exception):
                w.close()
            self._conns.discard(w)
