"""Images in an S3 bucket (AWS, SeaweedFS or any S3-compatible server), through boto3.

Credentials and region come from the standard `AWS_*` variables. Path-style addressing, so a
local endpoint such as `http://127.0.0.1:9000` works without DNS for bucket subdomains.
Transient failures (connection errors, 5xx, throttling) are retried here with tenacity and
botocore's own retries are off, so one policy decides how long a call may take.
"""

from __future__ import annotations

import logging

import boto3
import botocore.exceptions
from botocore.config import Config
from tenacity import retry_if_exception

from storage.errors import ImageNotFoundError, StorageError, StorageUnavailableError
from storage.image_store_interface import ImageInfo, ImageStore, RetryPolicy, content_type_of_key

logger = logging.getLogger(__name__)

_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


def is_transient(error: BaseException) -> bool:
    """Worth another try: the server was unreachable, failed, or asked us to slow down."""
    if isinstance(error, (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)):
        return True
    if isinstance(error, botocore.exceptions.ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return status >= 500 or status == 429 or error.response.get("Error", {}).get("Code") in _THROTTLING_CODES
    return False


def _is_not_found(error: BaseException) -> bool:
    return (
        isinstance(error, botocore.exceptions.ClientError)
        and str(error.response.get("Error", {}).get("Code")) in _NOT_FOUND_CODES
    )


class S3ImageStore(ImageStore):
    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        public_endpoint_url: str | None = None,
        presign_expiry_seconds: int = 3600,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.presign_expiry_seconds = presign_expiry_seconds
        self.retry = retry or RetryPolicy()
        config = Config(
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=30,
        )
        # An own session: boto3's default session is not safe to share between threads.
        self._client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        # Presigned URLs are for clients, who may reach the server by another name than this process
        # (compose: `http://s3:9000` inside, `http://localhost:9000` outside). Presigning makes no request.
        self._presigner = self._client
        if public_endpoint_url and public_endpoint_url != endpoint_url:
            self._presigner = boto3.session.Session().client("s3", endpoint_url=public_endpoint_url, config=config)

    def _call(self, action: str, key: str, operation, **kwargs):
        retrying = self.retry.retrying(retry_if_exception(is_transient))
        location = f"s3://{self.bucket}/{key}"
        try:
            return retrying(operation, **kwargs)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
            if _is_not_found(e):
                raise ImageNotFoundError(f"no image {key!r} in s3://{self.bucket}") from e
            if is_transient(e):
                raise StorageUnavailableError(
                    f"S3 {action} of {location} failed after {self.retry.max_attempts} attempts: {e}"
                ) from e
            raise StorageError(f"S3 {action} of {location} failed: {e}") from e

    def put_image(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        self._call(
            "upload",
            key,
            self._client.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ContentType=content_type_of_key(key),
            Metadata={name: str(value) for name, value in metadata.items()},
        )

    def flush(self, keys: list[str]) -> None:
        """Nothing to do: an S3 put is durable when it returns."""

    def get_bytes(self, key: str) -> bytes:
        def download() -> bytes:
            # The body is read inside the retried call: a connection dropped mid-body is retried too.
            return self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

        return self._call("download", key, download)

    def head(self, key: str) -> ImageInfo | None:
        try:
            response = self._call("head", key, self._client.head_object, Bucket=self.bucket, Key=key)
        except ImageNotFoundError:
            return None
        return ImageInfo(
            size=response["ContentLength"],
            content_type=response.get("ContentType", ""),
            metadata=response.get("Metadata", {}),
        )

    def delete_job_images(self, job_id: str) -> int:
        prefix = self.job_prefix(job_id)
        listed = self._call("list", prefix, self._client.list_objects_v2, Bucket=self.bucket, Prefix=prefix)
        keys = [{"Key": item["Key"]} for item in listed.get("Contents", [])]
        if keys:  # a job has at most MAX_NUM_IMAGES images: one page, one request
            self._call("delete", prefix, self._client.delete_objects, Bucket=self.bucket, Delete={"Objects": keys})
        return len(keys)

    def presigned_url(self, key: str, expiry: int | None = None) -> str | None:
        expiry = self.presign_expiry_seconds if expiry is None else expiry
        try:
            return self._presigner.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expiry
            )
        except botocore.exceptions.BotoCoreError as e:  # no credentials, for example; no network involved
            raise StorageError(f"could not presign s3://{self.bucket}/{key}: {e}") from e

    def ping(self) -> bool:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return False
        return True

    def close(self) -> None:
        self._client.close()
        if self._presigner is not self._client:
            self._presigner.close()
