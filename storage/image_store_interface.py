"""What every image store is (`ImageStore`): deterministic keys, the content type a key's extension gives, and the
operations a backend implements (`storage.local_image_store`, `storage.s3_image_store`). Keys are
`{prefix}/{job_id}/{index}.{format}`, so a retried upload overwrites the same object and never leaves a duplicate;
the key's extension is the output's format (png, jpeg, webp; a video's mp4, webm, gif: one object per output, its
"image" in this store's words) and the one place its content type is derived from.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field

from tenacity import Retrying, before_sleep_log, stop_after_attempt, wait_exponential, wait_random
from tenacity.retry import retry_base

from core.output_formats import OUTPUT_FORMATS

logger = logging.getLogger(__name__)

PNG_CONTENT_TYPE = OUTPUT_FORMATS["png"]
CONTENT_TYPES = OUTPUT_FORMATS  # key extension -> MIME


def content_type_of_key(key: str) -> str:
    """The MIME type of a stored image, from its key's extension (PNG for keys from before formats)."""
    return CONTENT_TYPES.get(key.rsplit(".", 1)[-1].lower(), PNG_CONTENT_TYPE)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient errors (S3: connection errors, 5xx, throttling; the local
    folder: any OS error), the same for both stores."""

    max_attempts: int = 5  # tries in all, the first one included
    initial_wait: float = 0.2  # seconds before the second try, doubling after each failure (+ up to this much jitter)
    max_wait: float = 5.0  # cap on the exponential part of one wait, in seconds

    def retrying(self, retry: retry_base) -> Retrying:
        """A tenacity runner of this policy, trying again on the errors `retry` accepts; it re-raises the last."""
        return Retrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_exponential(multiplier=self.initial_wait, max=self.max_wait) + wait_random(0, self.initial_wait),
            retry=retry,
            before_sleep=before_sleep_log(logger, logging.WARNING),
            reraise=True,
        )


@dataclass(frozen=True)
class ImageInfo:
    size: int  # bytes
    content_type: str
    metadata: dict[str, str] = field(default_factory=dict)


class ImageStore(abc.ABC):
    prefix: str = ""

    def key_for(self, job_id: str, index: int, image_format: str = "png") -> str:
        if image_format not in CONTENT_TYPES:
            raise ValueError(f"image format must be one of {', '.join(CONTENT_TYPES)} (got {image_format!r})")
        name = f"{job_id}/{int(index)}.{image_format}"
        return f"{self.prefix}/{name}" if self.prefix else name

    @abc.abstractmethod
    def put_image(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        """Store (or replace) an image with string metadata such as job id, seed and model; its content
        type is its key's (`content_type_of_key`)."""

    @abc.abstractmethod
    def flush(self, keys: list[str]) -> None:
        """Make images stored with `put_image` durable. A store whose put is durable when it returns (S3) has
        nothing to do; the local folder flushes them to disk, which the worker calls for after the job's end
        state is written, off the job's latency (`storage.local_image_store`)."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The stored bytes; ImageNotFoundError if there are none."""

    @abc.abstractmethod
    def head(self, key: str) -> ImageInfo | None:
        """Size, content type and metadata of a stored image; None if there is none."""

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def job_prefix(self, job_id: str) -> str:
        """The key prefix every image of the job is stored under (key_for)."""
        return f"{self.prefix}/{job_id}/" if self.prefix else f"{job_id}/"

    @abc.abstractmethod
    def delete_job_images(self, job_id: str) -> int:
        """Delete every stored image of the job (whatever its format); returns how many there were."""

    @abc.abstractmethod
    def presigned_url(self, key: str, expiry: int | None = None) -> str | None:
        """A URL clients can GET for `expiry` seconds, or None when the API must serve the bytes."""

    @abc.abstractmethod
    def ping(self) -> bool:
        """Whether the store can be reached now (one try, no retries)."""

    def close(self) -> None:  # noqa: B027 (a no-op unless the backend holds connections)
        pass
