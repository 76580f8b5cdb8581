"""Where generated images live: a local folder (the embedded default) or an S3 bucket.

`open_image_store(settings)` picks the backend from `STEPWISE_STORAGE_URL`: `file:///path` or
`s3://bucket/prefix`. What every store is and how its keys are made: `storage.image_store_interface`
(its names are re-exported here).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from storage.image_store_interface import CONTENT_TYPES, ImageInfo, ImageStore, RetryPolicy, content_type_of_key
from storage.local_image_store import LocalImageStore
from storage.settings import StorageSettings

__all__ = ["CONTENT_TYPES", "ImageInfo", "ImageStore", "RetryPolicy", "content_type_of_key", "open_image_store"]


def open_image_store(settings: StorageSettings, *, retry: RetryPolicy | None = None) -> ImageStore:
    retry = retry or RetryPolicy(max_attempts=settings.storage_max_attempts)
    url = settings.storage_url
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return LocalImageStore(Path(unquote(parts.path)), retry=retry)
    if parts.scheme == "s3" and parts.netloc:
        # Imported here: boto3 takes a noticeable time to import and local setups never need it.
        from storage.s3_image_store import S3ImageStore

        return S3ImageStore(
            bucket=parts.netloc,
            prefix=parts.path.strip("/"),
            endpoint_url=settings.s3_endpoint_url,
            public_endpoint_url=settings.s3_public_endpoint_url,
            presign_expiry_seconds=settings.presign_expiry_seconds,
            retry=retry,
        )
    raise ValueError(f"STEPWISE_STORAGE_URL must be file:///absolute/path or s3://bucket/prefix (got {url!r})")
