"""Progress for a log or a pipe: one plain line every few seconds, where a terminal gets tqdm's bar.

A cron job's or CI's log then shows that a long `stepwise backfill` is alive and how fast it goes
(`backfill: 120/500 rows, 117 ok, 3 failed, 8 in flight, 0 retries, 2.4 rows/s, 50s`), without the
carriage returns a redrawn bar would fill it with. It takes the calls the backfill makes on a tqdm
bar (`update`, `set_postfix`, `close`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, TextIO

LOG_INTERVAL_SECONDS = 5.0


class LogProgress:
    def __init__(self, total: int, desc: str, file: TextIO, interval: float = LOG_INTERVAL_SECONDS) -> None:
        self.total = total
        self.desc = desc
        self.file = file
        self.interval = interval
        self.num_done = 0
        self.postfix: dict[str, Any] = {}
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{desc}-progress", daemon=True)
        self._thread.start()

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.num_done += n

    def set_postfix(self, values: dict[str, Any], refresh: bool = True) -> None:
        with self._lock:
            self.postfix = dict(values)

    def line(self) -> str:
        with self._lock:
            elapsed = time.monotonic() - self._started
            rate = self.num_done / elapsed if elapsed > 0 else 0.0
            counts = "".join(f", {value} {name.replace('_', ' ')}" for name, value in self.postfix.items())
            return f"{self.desc}: {self.num_done}/{self.total} rows{counts}, {rate:.1f} rows/s, {elapsed:.0f}s"

    def close(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while True:
            self.file.write(self.line() + "\n")
            self.file.flush()
            if self._stopped.wait(self.interval):
                return
