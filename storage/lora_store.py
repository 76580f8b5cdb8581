"""The LoRA adapter store: `<name>.safetensors` files in a local folder or an S3 prefix (`STEPWISE_LORA_URL`).

Layout: operator adapters at the top (`NAME.safetensors`, usable by every tenant); a tenant's
uploads under `tenants/<tenant slug>/NAME.safetensors`, usable only by that tenant. A job's
`lora` names `NAME`; `resolve()` turns it into the store key the engine reads (the tenant's
own upload first, then the operator's), or None, which every caller reports as a missing
adapter, so another tenant's upload is indistinguishable from one that does not exist.

The API checks uploads before they get here, without torch (`core.lora_files`): the safetensors header as
safetensors checks it, and the LoRA rules.
"""

from __future__ import annotations

import abc
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from core.lora_files import LORA_SUFFIX
from storage.errors import ImageNotFoundError, LoraTooLargeError, StorageError
from storage.settings import StorageSettings

TENANTS_PREFIX = "tenants"


@dataclass(frozen=True)
class LoraInfo:
    name: str
    size: int  # bytes


def tenant_slug(tenant: str) -> str:
    """A path-safe, stable stand-in for the tenant's name in store keys."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def tenant_key(tenant: str, name: str) -> str:
    """The store key (without suffix) of a tenant's upload; also what the worker hands the engine."""
    return f"{TENANTS_PREFIX}/{tenant_slug(tenant)}/{name}"


class LoraStore(abc.ABC):
    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """The file of store key `key` (without suffix), or None."""

    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """The file's size in bytes, or None when there is none."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Whether there was a file to delete."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[LoraInfo]:
        """The adapters directly under `prefix` ("" for the operator's), sorted by name."""

    def get_at_most(self, key: str, max_bytes: int) -> bytes | None:
        """`get(key)`, but LoraTooLargeError instead of reading a file above `max_bytes` (the worker's reads:
        an operator's file or one uploaded under a higher limit is not downloaded into memory to be refused)."""
        size = self.size(key)
        if size is None:
            return None
        if size > max_bytes:
            raise LoraTooLargeError(f"the file is {size} bytes, above the limit of {max_bytes}")
        return self.get(key)

    def resolve(self, tenant: str, name: str) -> str | None:
        """The key of the adapter `name` as `tenant` may use it: its own upload, else the operator's; else None."""
        for key in (tenant_key(tenant, name), name):
            if self.size(key) is not None:
                return key
        return None


class LocalLoraStore(LoraStore):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        assert ".." not in key.split("/"), key
        return self.root / f"{key}{LORA_SUFFIX}"

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temp.write_bytes(data)
        os.replace(temp, path)

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str) -> list[LoraInfo]:
        folder = self.root / prefix if prefix else self.root
        if not folder.is_dir():
            return []
        return [
            LoraInfo(path.name.removesuffix(LORA_SUFFIX), path.stat().st_size)
            for path in sorted(folder.glob(f"*{LORA_SUFFIX}"))
            if path.is_file()
        ]


class S3LoraStore(LoraStore):
    """Through `S3ImageStore`'s client and retry policy (the same bucket code as images)."""

    def __init__(self, settings: StorageSettings, bucket: str, prefix: str) -> None:
        from storage.s3_image_store import S3ImageStore

        self.s3 = S3ImageStore(bucket=bucket, prefix=prefix, endpoint_url=settings.s3_endpoint_url)

    def _object(self, key: str) -> str:
        return "/".join(part for part in (self.s3.prefix, f"{key}{LORA_SUFFIX}") if part)

    def get(self, key: str) -> bytes | None:
        try:
            return self.s3.get_bytes(self._object(key))
        except ImageNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        info = self.s3.head(self._object(key))
        return None if info is None else info.size

    def put(self, key: str, data: bytes) -> None:
        self.s3._call(
            "upload",
            key,
            self.s3._client.put_object,
            Bucket=self.s3.bucket,
            Key=self._object(key),
            Body=data,
            ContentType="application/octet-stream",
        )

    def delete(self, key: str) -> bool:
        if self.size(key) is None:
            return False
        self.s3._call("delete", key, self.s3._client.delete_object, Bucket=self.s3.bucket, Key=self._object(key))
        return True

    def list(self, prefix: str) -> list[LoraInfo]:
        folder = "/".join(part for part in (self.s3.prefix, prefix) if part)
        folder = f"{folder}/" if folder else ""
        response = self.s3._call(
            "list", folder, self.s3._client.list_objects_v2, Bucket=self.s3.bucket, Prefix=folder, Delimiter="/"
        )
        found = [
            LoraInfo(item["Key"][len(folder) :].removesuffix(LORA_SUFFIX), item["Size"])
            for item in response.get("Contents", [])
            if item["Key"].endswith(LORA_SUFFIX)
        ]
        return sorted(found, key=lambda info: info.name)


def open_lora_store(settings: StorageSettings) -> LoraStore | None:
    """The store of `STEPWISE_LORA_URL`, or None when it is unset (adapters are then refused)."""
    url = settings.lora_url
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return LocalLoraStore(Path(unquote(parts.path)))
    if parts.scheme == "s3" and parts.netloc:
        return S3LoraStore(settings, parts.netloc, parts.path.strip("/"))
    raise StorageError(f"STEPWISE_LORA_URL must be file:///absolute/path or s3://bucket/prefix (got {url!r})")
