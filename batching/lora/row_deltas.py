"""Per-row LoRA deltas: one forward whose rows use different adapters, scales, or none.

The adapters' PEFT layers stay in the model with their adapters disabled, so the layer
itself computes only the base output; a forward hook then adds, for each adapter present in
the forward, `scale_row * B(A(x_rows)) * alpha/r` to that adapter's rows only (gathered by
index, computed once per adapter, scattered back with `index_add_`). Rows without an adapter
get nothing added. In a forward that packs rows of different sizes into one token sequence
(`batching.pipelines.packing`), a layer's input is a stream's packed tokens: each adapter's rows
are then their tokens in the stream the forward marks as current. This is PEFT's mixed-batch idea
(`adapter_names`), extended with a scale per row, which PEFT keeps per adapter. Outside
`RowLoras.rows(...)` the hooks add nothing. What is active is per thread: the text encoder may run on
the encoder's thread (`every_row`) while the loop runs a denoiser forward with its own rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch

from batching.pipelines.packing import current_lora_tokens

# PEFT's LoRA layers are recognised by their attributes: importing peft here would import accelerate,
# which imports boto3 when it is installed (batching must not load it). Typed Any: duck-typed too.
LoraLayer = Any


def is_lora_layer(module: torch.nn.Module) -> TypeGuard[LoraLayer]:
    return isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict) and hasattr(module, "enable_adapters")


@dataclass(frozen=True)
class AdapterRows:
    index: torch.Tensor | None  # [n] int64: the rows using this adapter; None: every row
    scales: torch.Tensor  # [n] float: each row's scale ([1] with index None)
    rows: tuple[int, ...] = ()  # the rows of `index`, on the host (a packed stream finds their tokens from them)


class _Active(threading.local):
    adapters: dict[str, AdapterRows] | None = None  # internal adapter name -> its rows, in this thread's call
    num_rows = 0


class RowLoras:
    def __init__(self) -> None:
        self._hooked: set[int] = set()  # id() of LoRA layers that carry the hook
        self._active = _Active()

    def hook_new_layers(self, module: torch.nn.Module) -> int:
        """Disable the PEFT layers' own adapter path and hook every LoRA layer of `module`; how many it has."""
        num_layers = 0
        for layer in module.modules():
            if not is_lora_layer(layer):
                continue
            num_layers += 1
            layer.enable_adapters(False)
            if id(layer) not in self._hooked:
                layer.register_forward_hook(self._add_deltas)
                self._hooked.add(id(layer))
        return num_layers

    @contextmanager
    def rows(self, row_adapters: Sequence[tuple[str | None, float]], device: torch.device) -> Iterator[None]:
        """Within the block, row i of every hooked layer's input uses adapter `row_adapters[i]` (None: none)."""
        by_adapter: dict[str, tuple[list[int], list[float]]] = {}
        for row, (name, scale) in enumerate(row_adapters):
            if name is not None and scale != 0:
                indices, scales = by_adapter.setdefault(name, ([], []))
                indices.append(row)
                scales.append(scale)
        self._active.adapters = {
            name: AdapterRows(torch.tensor(indices, device=device), torch.tensor(scales, device=device), tuple(indices))
            for name, (indices, scales) in by_adapter.items()
        } or None
        self._active.num_rows = len(row_adapters)
        try:
            yield
        finally:
            self._active.adapters = None

    @contextmanager
    def every_row(self, name: str, scale: float, device: torch.device) -> Iterator[None]:
        """Within the block, every row of every call uses adapter `name` (a text-encoder call of one adapter)."""
        self._active.adapters = {name: AdapterRows(None, torch.tensor([scale], device=device))}
        try:
            yield
        finally:
            self._active.adapters = None

    def _add_deltas(self, layer: LoraLayer, args: tuple, output: torch.Tensor) -> torch.Tensor:
        active = self._active.adapters
        if active is None:
            return output
        x = args[0]
        for name, rows in active.items():
            if name not in layer.lora_A:
                continue
            lora_A, lora_B = layer.lora_A[name], layer.lora_B[name]
            if rows.index is None:
                delta = lora_B(lora_A(x.to(lora_A.weight.dtype))) * layer.scaling[name]
                output += (delta * rows.scales.to(delta.dtype)).to(output.dtype)
            elif x.shape[0] == self._active.num_rows:  # a row per sample row (or rows of equal token counts)
                delta = lora_B(lora_A(x.index_select(0, rows.index).to(lora_A.weight.dtype))) * layer.scaling[name]
                row_scales = rows.scales.to(delta.dtype).view(-1, *([1] * (delta.dim() - 1)))
                output.index_add_(0, rows.index, (delta * row_scales).to(output.dtype))
            else:  # the tokens of a packed stream (batching.pipelines.packing)
                self._add_token_deltas(layer, name, rows, x, output)
        return output

    def _add_token_deltas(
        self, layer: LoraLayer, name: str, rows: AdapterRows, x: torch.Tensor, output: torch.Tensor
    ) -> None:
        stream = current_lora_tokens()
        tokens = x.reshape(-1, x.shape[-1])  # [packed tokens, in]
        assert stream is not None and tokens.shape[0] == stream.num_tokens, (
            f"a LoRA layer saw {tokens.shape[0]} packed tokens outside their stream"
        )
        index = stream.token_index(rows.rows)
        lora_A, lora_B = layer.lora_A[name], layer.lora_B[name]
        delta = lora_B(lora_A(tokens.index_select(0, index).to(lora_A.weight.dtype))) * layer.scaling[name]
        lengths = stream.row_lengths(rows.rows)  # kept by the stream: no copy to the device per layer
        token_scales = rows.scales.to(delta.dtype).repeat_interleave(lengths, output_size=index.shape[0])
        output.view(-1, output.shape[-1]).index_add_(0, index, (delta * token_scales[:, None]).to(output.dtype))
