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

from core.errors import LoraError
from core.lora_files import LORA_SUFFIX, MAX_LORA_BYTES, LoraFileError, check_lora_file

LoraFetcher = Callable[[str], "bytes | None"]  # a job's `lora` (the store key without suffix) -> the file's
# bytes, None when there is none (storage.lora_store.LoraStore.get)


@dataclass(frozen=True)
class LoraFile:
    name: str  # the job's `lora`
    data: bytes  # the safetensors file, checked (file_format's rules, finite weights)

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
        """The adapter's file, or LoraError naming it: missing, too large, breaking the file rules
        (`file_format`), or holding weights that are not finite."""
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
            check_lora_file(data)  # from the header alone: nothing it declares is allocated unless it is there
        except LoraFileError as e:
            raise LoraError(f"LoRA adapter {name!r} {e}") from e
        try:
            state_dict = load(data)
        except (SafetensorError, ValueError, OSError) as e:
            raise LoraError(f"LoRA adapter {name!r} is not a valid safetensors file: {e}") from e
        for key, tensor in state_dict.items():
            if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
                # refused, not loaded: one NaN weight turns every image of the adapter into a black one
                raise LoraError(f"LoRA adapter {name!r} has weights that are not finite (NaN or infinity) in {key!r}")
        return LoraFile(name=name, data=data)

    def _read_file(self, name: str) -> bytes | None:
        path = self._root / f"{name}{LORA_SUFFIX}"
        if ".." in Path(name).parts or Path(name).is_absolute() or not path.is_file():
            return None
        if os.path.getsize(path) > self.max_bytes:  # checked before reading it
            raise LoraError(
                f"LoRA adapter {name!r} is {os.path.getsize(path)} bytes, above the limit of {self.max_bytes}"
            )
        return path.read_bytes()
