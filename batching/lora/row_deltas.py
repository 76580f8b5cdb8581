"""Per-row LoRA deltas: one forward whose rows use different adapters, scales, or none.

The adapters' PEFT layers stay in the model with their adapters disabled, so the layer
itself computes only the base output; a forward hook then adds, for each adapter present in
the forward, `scale_row * B(A(x_rows)) * alpha/r` to that adapter's rows only (gathered by
index, computed once per adapter, scattered back with `index_add_`). Rows without an adapter
get nothing added. This is PEFT's mixed-batch idea (`adapter_names`), extended with a scale
per row, which PEFT keeps per adapter. Outside `RowLoras.rows(...)` the hooks add nothing.
What is active is per thread: the text encoder may run on the encoder's thread (`every_row`)
while the loop runs a denoiser forward with its own rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch

# PEFT's LoRA layers are recognised by their attributes: importing peft here would import accelerate,
# which imports boto3 when it is installed (batching must not load it). Typed Any: duck-typed too.
LoraLayer = Any


def is_lora_layer(module: torch.nn.Module) -> TypeGuard[LoraLayer]:
    return isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict) and hasattr(module, "enable_adapters")


@dataclass(frozen=True)
class AdapterRows:
    index: torch.Tensor | None  # [n] int64: the rows using this adapter; None: every row
    scales: torch.Tensor  # [n] float: each row's scale ([1] with index None)


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
            name: AdapterRows(torch.tensor(indices, device=device), torch.tensor(scales, device=device))
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
                sub_batch = x.to(lora_A.weight.dtype)
            else:
                num_rows = self._active.num_rows
                assert x.shape[0] == num_rows, f"a LoRA layer saw {x.shape[0]} rows, not {num_rows}"
                sub_batch = x.index_select(0, rows.index).to(lora_A.weight.dtype)
            delta = lora_B(lora_A(sub_batch)) * layer.scaling[name]  # [n, *out_shape]
            row_scales = rows.scales.to(delta.dtype).view(-1, *([1] * (delta.dim() - 1)))
            if rows.index is None:
                output += (delta * row_scales).to(output.dtype)
            else:
                output.index_add_(0, rows.index, (delta * row_scales).to(output.dtype))
        return output
