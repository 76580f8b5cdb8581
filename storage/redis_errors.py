"""Redis errors as the storage package's own: unavailable (retry later, 503) or any other."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis

from storage.errors import StorageError, StorageUnavailableError

UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
)


def wraps_redis_errors(method: Callable) -> Callable:
    """A store method whose Redis errors come out as StorageUnavailableError or StorageError; the store has
    `redis_location` (host:port, for the message)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except UNAVAILABLE_ERRORS as e:
            raise StorageUnavailableError(f"Redis at {self.redis_location} is unavailable: {e}") from e
        except redis.exceptions.RedisError as e:
            raise StorageError(f"Redis error in JobStore.{method.__name__}: {e}") from e

    return wrapper
