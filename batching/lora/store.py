"""Reading adapter files from the LoRA store: `file:///folder` here, other schemes through a fetcher.

A job's `lora` is a store key without its suffix: `NAME` (an operator adapter, `NAME.safetensors`
at the top of the store) or `tenants/TENANT/NAME` (a tenant's upload, resolved by the worker).
Reading happens on the caller's thread (`DiffusionEngine.submit`), never in the engine loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from batching.errors import LoraError
from batching.params import LORA_SUFFIX, MAX_LORA_BYTES

LoraFetcher = Callable[[str], "bytes | None"]  # a job's `lora` (the store key without suffix) -> the file's
# bytes, None when there is none (storage.lora_store.LoraStore.get)


@dataclass(frozen=True)
class LoraFile:
    name: str  # the job's `lora`
    data: bytes  # the safetensors file, checked to parse

    @property
    def num_bytes(self) -> int:
        return len(self.data)


class LoraSource:
    def __init__(self, url: str, *, fetcher: LoraFetcher | None = None, max_bytes: int = MAX_LORA_BYTES) -> None:
        self.url = url
        self.max_bytes = max_bytes
        parts = urlsplit(url)
        if fetcher is not None:
            self._fetch = fetcher
        elif parts.scheme == "file" and parts.netloc in ("", "localhost"):
            self._root = Path(unquote(parts.path))
            self._fetch = self._read_file
        else:
            raise ValueError(f"the LoRA store {url!r} needs a fetcher (the engine reads only file:// stores itself)")

    def read(self, name: str) -> LoraFile:
        """The adapter's file, or LoraError naming it (missing, too large, or not safetensors)."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        try:
            data = self._fetch(name)
        except LoraError:
            raise
        except Exception as e:
            raise LoraError(f"LoRA adapter {name!r} could not be read from the store: {type(e).__name__}: {e}") from e
        if data is None:
            raise LoraError(f"LoRA adapter {name!r} does not exist")
        if len(data) > self.max_bytes:
            raise LoraError(f"LoRA adapter {name!r} is {len(data)} bytes, above the limit of {self.max_bytes}")
        try:
            load(data)
        except (SafetensorError, ValueError, OSError) as e:
            raise LoraError(f"LoRA adapter {name!r} is not a valid safetensors file: {e}") from e
        return LoraFile(name=name, data=data)

    def _read_file(self, name: str) -> bytes | None:
        path = self._root / f"{name}{LORA_SUFFIX}"
        if ".." in Path(name).parts or not path.is_file():
            return None
        if os.path.getsize(path) > self.max_bytes:  # checked before reading it
            raise LoraError(
                f"LoRA adapter {name!r} is {os.path.getsize(path)} bytes, above the limit of {self.max_bytes}"
            )
        return path.read_bytes()
