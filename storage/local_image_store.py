"""Images in a local folder: `{root}/{job_id}/{index}.{format}`, metadata in a `.meta.json` beside it.

Every write goes to a temporary file in the same folder and is renamed into place, so a reader
sees the old image or the new one, never half of one. A failed write is tried again under the same
retry policy as S3's (`STEPWISE_STORAGE_MAX_ATTEMPTS`); past it the worker keeps the image in its spool
(worker.spool). A put flushes nothing to disk: the worker
calls `flush(keys)` right after the job's end state is written, so the disk flush (several ms a
file, the largest part of a job's own overhead here) is off the job's latency, and it completes
within milliseconds, well inside Redis's own once-a-second flush of the record
(`appendfsync everysec`, as `stepwise up` and compose run it): after a power loss, a record that
says succeeded still has its image. The metadata sidecar is never flushed (it only describes the
image; `head()` reads a torn one as none).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path, PurePosixPath

from tenacity import retry_if_exception_type

from storage.errors import ImageNotFoundError, StorageError, StorageUnavailableError
from storage.image_store_interface import ImageInfo, ImageStore, RetryPolicy, content_type_of_key


class LocalImageStore(ImageStore):
    def __init__(self, root: Path, retry: RetryPolicy | None = None) -> None:
        if not root.is_absolute():
            raise ValueError(f"the local image folder must be an absolute path (got {str(root)!r})")
        self.root = root
        self.retry = retry or RetryPolicy()
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, key: str) -> Path:
        """The file that holds `key` (for the API to send it); refuses keys that leave the root."""
        parts = PurePosixPath(key).parts
        if not parts or key.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"image key {key!r} is not a relative path inside the image folder")
        return self.root.joinpath(*parts)

    def _metadata_path(self, key: str) -> Path:
        path = self.path_for(key)
        return path.with_name(path.name + ".meta.json")

    def put_image(self, key: str, data: bytes, metadata: dict[str, str]) -> None:
        path = self.path_for(key)
        metadata_json = json.dumps({name: str(value) for name, value in metadata.items()}, sort_keys=True)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(self._metadata_path(key), metadata_json.encode())
            _write_atomically(path, data)

        try:
            self.retry.retrying(retry_if_exception_type(OSError))(write)
        except OSError as e:
            raise StorageUnavailableError(
                f"could not write image {key!r} under {self.root} after {self.retry.max_attempts} attempts: {e}"
            ) from e

    def flush(self, keys: list[str]) -> None:
        folders = set()
        try:
            for key in keys:
                path = self.path_for(key)
                with path.open("rb") as file:
                    os.fsync(file.fileno())
                folders.add(path.parent)
            for folder in folders:  # the renames that put them there
                descriptor = os.open(folder, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
        except OSError as e:
            raise StorageError(f"could not flush images under {self.root} to disk: {e}") from e

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.path_for(key).read_bytes()
        except FileNotFoundError as e:
            raise ImageNotFoundError(f"no image {key!r}") from e
        except OSError as e:
            raise StorageError(f"could not read image {key!r} under {self.root}: {e}") from e

    def head(self, key: str) -> ImageInfo | None:
        try:
            size = self.path_for(key).stat().st_size
        except FileNotFoundError:
            return None
        try:
            metadata = json.loads(self._metadata_path(key).read_text())
        except (FileNotFoundError, ValueError):  # missing, or cut short by a crash (it is not flushed)
            metadata = {}
        return ImageInfo(size=size, content_type=content_type_of_key(key), metadata=metadata)

    def delete_job_images(self, job_id: str) -> int:
        folder = self.path_for(self.job_prefix(job_id).rstrip("/"))
        try:
            images = [path for path in folder.iterdir() if not path.name.endswith(".meta.json")]
            shutil.rmtree(folder)
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise StorageError(f"could not delete the images of job {job_id} under {self.root}: {e}") from e
        return len(images)

    def sweep_older_than(self, max_age_seconds: float, now: float | None = None) -> int:
        """Delete each job's images whose newest file is older than `max_age_seconds` (STEPWISE_IMAGE_TTL);
        returns how many jobs' images went. A folder being written is never that old."""
        now = time.time() if now is None else now
        num_deleted = 0
        for folder in list(self.root.iterdir()):
            if not folder.is_dir():
                continue
            try:
                newest = max((path.stat().st_mtime for path in folder.iterdir()), default=folder.stat().st_mtime)
                if now - newest > max_age_seconds:
                    shutil.rmtree(folder)
                    num_deleted += 1
            except FileNotFoundError:  # deleted meanwhile (DELETE /v1/jobs/{id}, another sweeper)
                continue
        return num_deleted

    def presigned_url(self, key: str, expiry: int | None = None) -> str | None:
        return None

    def ping(self) -> bool:
        return self.root.is_dir() and os.access(self.root, os.W_OK)


def _write_atomically(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as tmp:
        try:
            tmp.write(data)
            tmp.flush()
        except BaseException:
            os.unlink(tmp.name)
            raise
    try:
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, path)
    except BaseException:
        os.unlink(tmp.name)
        raise
