"""Redis errors as the storage package's own: unavailable (retry later, 503: RedisUnavailableError) or any other."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis

from storage.errors import RedisUnavailableError, StorageError

UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,  # Sentinel's MasterNotFoundError too (no master while it fails over)
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,  # a master demoted to a replica
)
# Replies of a server that cannot take the command now, but will: a replica that lost its master
# (MASTERDOWN), a master short of the replicas `min-replicas-to-write` asks for (NOREPLICAS), a client
# unblocked because its master became a replica (UNBLOCKED).
UNAVAILABLE_REPLIES = ("MASTERDOWN", "NOREPLICAS", "UNBLOCKED")


def is_unavailable(error: BaseException) -> bool:
    """True for a Redis error that means "not now, retry" (503), as opposed to a bug or bad data."""
    if isinstance(error, UNAVAILABLE_ERRORS):
        return True
    return isinstance(error, redis.exceptions.ResponseError) and str(error).startswith(UNAVAILABLE_REPLIES)


def wraps_redis_errors(method: Callable) -> Callable:
    """A store method whose Redis errors come out as RedisUnavailableError or StorageError; the store has
    `redis_location` (host:port, or the Sentinel master, for the message)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except redis.exceptions.RedisError as e:
            if is_unavailable(e):
                raise RedisUnavailableError(f"Redis ({self.redis_location}) is unavailable: {e}") from e
            raise StorageError(f"Redis error in JobStore.{method.__name__}: {e}") from e

    return wrapper
