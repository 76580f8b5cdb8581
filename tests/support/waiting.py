"""The one bounded wait of the tests: poll a condition until it holds, or fail saying what did not happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.1) -> T:
    """Poll until `condition()` is truthy; return its value or fail saying what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {described}")
        time.sleep(interval)
