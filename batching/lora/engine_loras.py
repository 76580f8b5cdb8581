"""The engine's LoRA adapters: fetched on the submitting thread, loaded at admission, activated per row.

Where each part runs, and why:
- `fetch(name)` runs in `DiffusionEngine.submit`, on the caller's thread: reading the store
  (a file or S3) never stalls the engine loop. The file waits, checked, until admission.
- `prepare(name, in_use)` runs in the loop at admission: loading an already fetched file onto
  the model costs about one forward at most. Only if the cache evicted a fetched-and-loaded
  adapter before its sample was admitted is the store read here again.
- `rows(row_adapters)` wraps one denoiser forward: each row's adapter and scale.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from batching.lora.cache import LoraCache
from batching.lora.row_deltas import RowLoras
from batching.lora.store import LoraFile, LoraSource


class EngineLoras:
    def __init__(
        self, source: LoraSource, pipeline: Any, device: torch.device, *, max_adapters: int, max_bytes: int
    ) -> None:
        self.source = source
        self.device = device
        self.row_loras = RowLoras()
        denoiser = getattr(pipeline, "unet", None) or pipeline.transformer
        self.cache = LoraCache(pipeline, denoiser, self.row_loras, max_adapters=max_adapters, max_bytes=max_bytes)
        self._fetched: dict[str, LoraFile] = {}  # name -> file fetched for a job not yet admitted
        self._lock = threading.Lock()  # guards _fetched (submit threads and the loop)

    def fetch(self, name: str) -> None:
        """Make sure the adapter's file is at hand (LoraError naming it when it is missing or invalid)."""
        with self._lock:
            if name in self._fetched or self.cache.is_loaded(name):
                return
        lora_file = self.source.read(name)
        with self._lock:
            self._fetched[name] = lora_file

    def prepare(self, name: str, in_use: Collection[str]) -> None:
        """Load the adapter onto the model unless it is loaded (LoraError when it does not fit)."""
        if self.cache.is_loaded(name):
            return
        with self._lock:
            lora_file = self._fetched.get(name)
        if lora_file is None:
            lora_file = self.source.read(name)
        try:
            self.cache.load(lora_file, in_use)
        finally:
            with self._lock:
                self._fetched.pop(name, None)  # loaded, or refused: a later job reads the store again

    @contextmanager
    def rows(self, row_adapters: Sequence[tuple[str | None, float]]) -> Iterator[None]:
        """One forward's rows: (adapter name or None, scale) per row."""
        internal = [(self.cache.internal_name(name) if name else None, scale) for name, scale in row_adapters]
        with self.row_loras.rows(internal, self.device):
            yield

    def text_encoder_adapter(self, name: str | None, scale: float) -> tuple[str, float] | None:
        """(internal name, scale) when the loaded adapter changes the text encoder: its prompts are encoded
        with it. Resolved on the loop thread; the encoder may use it on its own thread."""
        if name is None or not self.cache.loaded[name].has_text_encoder:
            return None
        return self.cache.internal_name(name), scale

    @contextmanager
    def encoding_with(self, adapter: tuple[str, float] | None) -> Iterator[None]:
        """Text-encoder calls inside the block, on this thread, use `adapter` (from text_encoder_adapter)
        on every row; touches no cache state, so it may run beside the loop."""
        if adapter is None:
            yield
            return
        internal_name, scale = adapter
        with self.row_loras.every_row(internal_name, scale, self.device):
            yield

    def stats(self) -> dict:
        return {
            "loras_loaded": len(self.cache.loaded),
            "lora_loads": self.cache.num_loads,
            "lora_evictions": self.cache.num_evictions,
        }
