"""Adapters loaded onto the model: a bounded LRU (by count and by bytes) of unfused PEFT adapters.

Loading goes through diffusers' `load_lora_weights`, so diffusers' own format conversions
(kohya and other trainers' key names) apply. Each adapter gets an internal PEFT name
(`lora0`, `lora1`, ...), since store keys may hold characters module names cannot.
Adapters whose names are in `in_use` (running samples) are never evicted: the cache may then
exceed its bounds until they finish.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from batching.lora.row_deltas import RowLoras
from batching.lora.store import LoraFile
from batching.lora.text_encoder import inject, split_text_encoder
from core.errors import LoraError, describe

logger = logging.getLogger(__name__)

# Diffusers' and kohya's text-encoder key prefixes, for any of a pipeline's text encoders ("text_encoder_2.",
# "lora_te1_", ...): weights for one the engine does not hook would change every job's prompts, not its own.
TEXT_ENCODER_PREFIXES = ("text_encoder", "lora_te")


@dataclass(frozen=True)
class LoadedLora:
    name: str  # the job's `lora`
    internal_name: str  # the PEFT adapter name on the model's layers
    num_bytes: int
    has_text_encoder: bool  # prompts of its jobs are encoded with it


class LoraCache:
    def __init__(self, pipeline: Any, denoiser: Any, row_loras: RowLoras, *, max_adapters: int, max_bytes: int) -> None:
        self.pipeline = pipeline
        self.denoiser = denoiser
        self.row_loras = row_loras
        self.max_adapters = max_adapters
        self.max_bytes = max_bytes
        self.loaded: OrderedDict[str, LoadedLora] = OrderedDict()  # name -> adapter, least recently used first
        self._internal_names = (f"lora{index}" for index in itertools.count())
        self.num_loads = 0
        self.num_evictions = 0

    def internal_name(self, name: str) -> str:
        """The PEFT name of a loaded adapter, marking it recently used."""
        self.loaded.move_to_end(name)
        return self.loaded[name].internal_name

    def is_loaded(self, name: str) -> bool:
        return name in self.loaded

    def load(self, lora_file: LoraFile, in_use: Collection[str]) -> None:
        """Load the adapter onto the model (evicting unused ones over the bounds); LoraError naming it if it
        does not fit. Whatever goes wrong, a refused adapter leaves nothing on the model or in the cache."""
        internal_name = next(self._internal_names)
        try:
            has_text_encoder, num_layers = self._load(lora_file, internal_name, in_use)
        except Exception as e:
            self._delete(internal_name)
            if isinstance(e, LoraError):
                raise
            raise LoraError(f"LoRA adapter {lora_file.name!r} does not fit the model: {describe(e)}") from e
        self.loaded[lora_file.name] = LoadedLora(lora_file.name, internal_name, lora_file.num_bytes, has_text_encoder)
        self.num_loads += 1
        logger.info("loaded LoRA adapter %r into %d layers", lora_file.name, num_layers)

    def _load(self, lora_file: LoraFile, internal_name: str, in_use: Collection[str]) -> tuple[bool, int]:
        """(whether it adapts the text encoder, how many denoiser layers it adapts)."""
        from safetensors.torch import load

        name = lora_file.name
        state_dict = load(lora_file.data)
        text_encoder_weights: dict = {}
        alphas = None
        if any(key.startswith(TEXT_ENCODER_PREFIXES) for key in state_dict):
            text_encoder = getattr(self.pipeline, "text_encoder", None)
            if text_encoder is None or hasattr(self.pipeline, "text_encoder_2"):
                raise LoraError(
                    f"LoRA adapter {name!r} has text-encoder weights, which this engine loads only "
                    "for single-text-encoder SD models"
                )
            converted, alphas = self.pipeline.lora_state_dict(dict(state_dict))[:2]  # diffusers' key conversions
            text_encoder_weights, _ = split_text_encoder(converted)
            state_dict = {key: value for key, value in state_dict.items() if not key.startswith(TEXT_ENCODER_PREFIXES)}
            if not state_dict:
                raise LoraError(
                    f"LoRA adapter {name!r} has weights only for the text encoder; this engine needs "
                    "weights for the denoiser too"
                )
        self._evict(in_use, incoming_bytes=lora_file.num_bytes)
        try:
            self.pipeline.load_lora_weights(state_dict, adapter_name=internal_name)
        except Exception as e:
            raise LoraError(f"LoRA adapter {name!r} does not fit the model: {describe(e)}") from e
        if text_encoder_weights:
            inject(self.pipeline.text_encoder, text_encoder_weights, alphas, internal_name, name)
            self.row_loras.hook_new_layers(self.pipeline.text_encoder)
        self.row_loras.hook_new_layers(self.denoiser)
        num_layers = sum(1 for layer in self.denoiser.modules() if internal_name in getattr(layer, "lora_A", {}))
        if num_layers == 0:
            raise LoraError(f"LoRA adapter {name!r} does not fit the model: none of its weights match its layers")
        return bool(text_encoder_weights), num_layers

    def _evict(self, in_use: Collection[str], *, incoming_bytes: int) -> None:
        for name in list(self.loaded):
            total_bytes = sum(lora.num_bytes for lora in self.loaded.values()) + incoming_bytes
            if len(self.loaded) < self.max_adapters and total_bytes <= self.max_bytes:
                return
            if name not in in_use:
                self._delete(self.loaded.pop(name).internal_name)
                self.num_evictions += 1

    def _delete(self, internal_name: str) -> None:
        try:
            self.pipeline.delete_adapters(internal_name)
        except Exception:  # a half-loaded adapter may have left nothing to delete
            logger.debug("could not delete adapter %s", internal_name, exc_info=True)
