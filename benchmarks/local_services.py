"""Small helpers the benchmark scripts share for starting services on loopback."""

from __future__ import annotations

import contextlib
import socket
import time


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, timeout: float, what: str, interval: float = 0.05) -> None:
    """Call `check` until it returns true (exceptions count as not yet); TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready within {timeout}s")
