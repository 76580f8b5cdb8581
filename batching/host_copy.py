"""Host values to the device without waiting for it.

A `torch.tensor(values, device="cuda")` copies from pageable memory and synchronises the stream after
the copy: the loop would wait for every forward it queued. From pinned memory a non-blocking copy is
queued on the stream like a kernel, and torch's pinned allocator keeps the host block until the copy
has run. On the CPU the tensor is the copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def to_device(values: Sequence[Any], device: torch.device, extra_dims: int = 0) -> torch.Tensor:
    """Host scalars (floats, or 0-dim host tensors) as a float32 tensor [n, 1 x `extra_dims`] on `device`.
    float32 values stay exact (a float32 host tensor's value goes through a Python float and back)."""
    host = torch.tensor([float(value) for value in values], dtype=torch.float32)
    if device.type == "cuda":
        host = host.pin_memory().to(device, non_blocking=True)
    return host.view(len(values), *([1] * extra_dims))
