"""The denoiser compiled per row-count bucket (`EngineConfig.denoiser_compile`; off by default).

Modes:
- "off": eager PyTorch, as diffusers runs it;
- "inductor": `torch.compile` (TorchInductor's generated kernels);
- "graphs": `torch.compile(mode="reduce-overhead")`: Inductor's kernels replayed as CUDA graphs, one
  launch a forward instead of one per kernel (CUDA only: on another device it is "inductor");
- "aot_eager": captured and traced as Inductor would be, then run eagerly, no code generated: what the
  CPU tests use (Inductor's C++ compile of a UNet takes minutes on a small CPU).

A compiled module is specialised to its input shapes, so with a compiled denoiser every forward is padded
to a row-count bucket (`batching.forward_curve.row_buckets`: 1, 2, 4 ... samples' rows, and the most rows a
forward carries) with the adapter's padding rows, as deterministic mode pads to its one bucket: a few
compilations, each done once (at start, when the forward curve is measured, or at a bucket's first use).
Groups that mix sizes in one forward (the DiT families' packed rows) change shape with their company;
they recompile for each new shape up to torch's cache limit, then run eagerly: compile is for fixed-size
groups. The padding rows cost their compute; results differ from eager by floating-point rounding only.
Which is faster on a device is measured (the GPU suite runs eager and compiled side by side), so the
default stays off until a GPU run says otherwise.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from batching.engine_config import COMPILE_MODES

logger = logging.getLogger(__name__)

DENOISER_ATTRIBUTES = ("unet", "transformer", "transformer_2")  # the pipelines' denoisers (Wan 2.2: two experts)


def compile_denoiser(pipeline: Any, mode: str, device: torch.device) -> list[str]:
    """Compile the pipeline's denoiser modules in place (`nn.Module.compile`: every holder of the module sees
    it): the names of those compiled."""
    assert mode in COMPILE_MODES, mode
    if mode == "off":
        return []
    options: dict[str, Any] = {"dynamic": False, "fullgraph": False}
    if mode == "aot_eager":
        options["backend"] = "aot_eager"
    elif mode == "graphs" and device.type == "cuda":
        options["mode"] = "reduce-overhead"
    compiled = []
    for name in DENOISER_ATTRIBUTES:
        module = getattr(pipeline, name, None)
        if isinstance(module, torch.nn.Module):
            module.compile(**options)
            compiled.append(name)
    logger.info("denoiser compiled (%s): %s", mode, ", ".join(compiled) or "none found")
    return compiled


def mark_forward_start(mode: str, device: torch.device) -> None:
    """Before each compiled forward in "graphs" mode: the previous forward's outputs (already consumed) may be
    overwritten by this replay (torch's CUDA-graph trees reuse their memory)."""
    if mode == "graphs" and device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
