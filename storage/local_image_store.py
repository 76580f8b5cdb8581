"""Images in a local folder: `{root}/{job_id}/{index}.{format}`, metadata in a `.meta.json` beside it.

Every write goes to a temporary file in the same folder and is renamed into place, so a reader
sees the old image or the new one, never half of one. The image is flushed to disk before the
rename (the job's record says succeeded only after that); its metadata sidecar is not (it only
describes the image: one disk flush per image, not two, on the job's path to its end state).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path, PurePosixPath

from storage.errors import ImageNotFoundError, StorageError
from storage.image_store import ImageInfo, ImageStore, content_type_of_key


class LocalImageStore(ImageStore):
    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ValueError(f"the local image folder must be an absolute path (got {str(root)!r})")
        self.root = root
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
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(self._metadata_path(key), metadata_json.encode(), is_durable=False)
            _write_atomically(path, data)
        except OSError as e:
            raise StorageError(f"could not write image {key!r} under {self.root}: {e}") from e

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

    def presigned_url(self, key: str, expiry: int | None = None) -> str | None:
        return None

    def ping(self) -> bool:
        return self.root.is_dir() and os.access(self.root, os.W_OK)


def _write_atomically(path: Path, data: bytes, *, is_durable: bool = True) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as tmp:
        try:
            tmp.write(data)
            tmp.flush()
            if is_durable:
                os.fsync(tmp.fileno())
        except BaseException:
            os.unlink(tmp.name)
            raise
    try:
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, path)
    except BaseException:
        os.unlink(tmp.name)
        raise
