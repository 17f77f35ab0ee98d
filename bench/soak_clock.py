"""A process's clock offset in the nemesis soak: the nemesis writes seconds to a file, the
agent or reconciler process adds them to its wall clock (a clock step, or skew)."""

from __future__ import annotations

import contextlib
import threading
import time


class ClockOffset:
    """The offset the nemesis wrote to ``path`` (seconds), re-read every 0.1 s."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.value = 0.0
        self._read()
        if path:
            threading.Thread(target=self._follow, name="soak-clock", daemon=True).start()

    def _read(self) -> None:
        if not self.path:
            return
        with contextlib.suppress(OSError, ValueError), open(self.path, encoding="ascii") as f:
            self.value = float(f.read().strip() or 0)

    def _follow(self) -> None:
        while True:
            time.sleep(0.1)
            self._read()
