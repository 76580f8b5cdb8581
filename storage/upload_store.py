"""Input images (uploads) in Redis: one string key per upload, scoped by tenant, expiring like job records.

Why Redis and not the image store: input images are small (bounded by
`core.image_inputs.MAX_IMAGE_BYTES`), short-lived, read once by the worker that runs
the job, and must expire on their own; a key with a TTL does all of that atomically, in
the store the API and the workers already share, and keeps the job record small (the
record's params hold the upload id, not the image). The value is the image's data URI,
the form the engine takes. Keys carry the tenant, so another tenant's lookup of an id
finds nothing: the same answer as an id that never existed or has expired.

An image a job sends inline as a data URI is stored here too (as an upload of the
job's tenant), so records never hold images. Such an upload is written by the script that
creates its job, in the same step (`pending`, `storage.new_job`): a job refused there (a 409, a
full queue, an idempotent replay) leaves no upload behind.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote

from storage.errors import StorageError


class UploadStore:
    def __init__(self, redis_client: Any, *, namespace: str, ttl_seconds: int) -> None:
        self._redis = redis_client  # decode_responses=True: values are data URI strings
        self.namespace = namespace
        self.ttl_seconds = ttl_seconds

    @classmethod
    def beside(cls, job_store: Any) -> UploadStore:
        """Uploads in the job store's Redis and namespace, with its record TTL."""
        return cls(job_store.redis, namespace=job_store.namespace, ttl_seconds=job_store.job_ttl_seconds)

    def key(self, tenant: str, upload_id: str) -> str:
        return f"{self.namespace}:upload:{quote(tenant, safe='')}:{upload_id}"

    def pending(self, tenant: str, data_uri: str) -> tuple[str, str]:
        """A new upload id for an image of `tenant`, and the Redis key under which the script that creates its
        job stores it (with `ttl_seconds`) if, and only if, the job is created. Writes nothing."""
        upload_id = new_upload_id()
        return upload_id, self.key(tenant, upload_id)

    def put(self, tenant: str, data_uri: str) -> str:
        """Store an image (as a data URI) for `tenant`; returns its new id."""
        upload_id = new_upload_id()
        try:
            self._redis.set(self.key(tenant, upload_id), data_uri, ex=self.ttl_seconds)
        except Exception as e:
            raise StorageError(f"could not store upload: {e}") from e
        return upload_id

    def get(self, tenant: str, upload_id: str) -> str | None:
        """The data URI of the tenant's upload; None when missing, expired or another tenant's."""
        try:
            return self._redis.get(self.key(tenant, upload_id))
        except Exception as e:
            raise StorageError(f"could not read upload: {e}") from e


def new_upload_id() -> str:
    return f"upl_{secrets.token_hex(16)}"
