"""The `storage` package's one error hierarchy; foreign errors are wrapped with `raise ... from e`."""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error raised by the `storage` package."""


class StorageUnavailableError(StorageError):
    """Redis or the image store could not be reached (after retries); the API answers 503."""


class RedisUnavailableError(StorageUnavailableError):
    """Redis could not be reached (down, failing over to a replica, loading), or could not keep a write."""


class IdempotencyConflictError(StorageError):
    """The idempotency key was used before with a different request body."""


class InvalidTransitionError(StorageError):
    """The job is not in a state that allows this transition (for example it is terminal)."""


class JobStoringError(InvalidTransitionError):
    """A cancel that comes too late: the job's images are made and wait in its worker's spool for the image store
    (worker.spool); it ends succeeded once they are stored."""


class JobNotFoundError(StorageError):
    """No record for this job id (never created, or expired after its TTL)."""


class InvalidCursorError(StorageError, ValueError):
    """A listing cursor that this store did not hand out."""


class ImageNotFoundError(StorageError):
    """No image stored under this key."""


class LoraTooLargeError(StorageError):
    """A LoRA adapter file in the store is above the size limit; it was not read."""
