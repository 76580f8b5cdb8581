"""Riding out a short Redis outage on a job's thread.

A job that has finished denoising must not be thrown away because Redis restarted at that moment. The
job thread's record I/O (take, finish, re-queue, spooling) is retried with backoff for up to
`STEPWISE_REDIS_RETRY_SECONDS`; only after that does the error reach the job's straight line, which leaves
the job to its lease (a lease sweeper re-queues it).
The API does not wait like this: it answers 503 at once and the client retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_exponential

from storage.errors import StorageUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")


def retry_through_outage(max_seconds: float, call: Callable[..., T], *args, **kwargs) -> T:
    """`call(*args, **kwargs)`, tried again while Redis is unavailable, for up to `max_seconds`."""
    retrying = Retrying(
        stop=stop_after_delay(max_seconds),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        retry=retry_if_exception_type(StorageUnavailableError),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    return retrying(call, *args, **kwargs)
