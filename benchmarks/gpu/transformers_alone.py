"""The GPU suite's sections that run one large transformer alone, outside the engine: FLUX.1's forward ceiling and
Wan 2.1's video batching (`benchmarks.gpu.suite` runs them after the engine sections, while its budget lasts)."""

from __future__ import annotations

import functools
import gc
import statistics
import time
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.gpu.models import flux_transformer, wan_transformer

if TYPE_CHECKING:
    from benchmarks.gpu.suite import Profile


def flux_ceiling(profile: Profile) -> list[dict]:
    """The FLUX-sized transformer alone at `flux_size`, 512 text tokens, guidance-distilled (one row per image)."""
    device = torch.device(profile.device)
    dtype = getattr(torch, "bfloat16" if profile.device == "cuda" else profile.dtype)
    model = flux_transformer(profile.scale, device, dtype)
    tokens, text_tokens = (profile.flux_size // 16) ** 2, 512 if profile.scale == "real" else 8
    config = model.config
    figures: list[dict[str, Any]] = []
    with torch.inference_mode():
        for rows in profile.rows:
            inputs = dict(
                hidden_states=torch.randn(rows, tokens, config.in_channels, device=device, dtype=dtype),
                encoder_hidden_states=torch.randn(
                    rows, text_tokens, config.joint_attention_dim, device=device, dtype=dtype
                ),
                pooled_projections=torch.randn(rows, config.pooled_projection_dim, device=device, dtype=dtype),
                timestep=torch.full((rows,), 0.5, device=device, dtype=dtype),
                guidance=torch.full((rows,), 3.5, device=device, dtype=dtype),
                img_ids=torch.zeros(tokens, 3, device=device, dtype=dtype),
                txt_ids=torch.zeros(text_tokens, 3, device=device, dtype=dtype),
                return_dict=False,
            )
            try:
                seconds = time_call(functools.partial(model, **inputs), device, profile.repeats)
            except torch.OutOfMemoryError:
                figures.append({"rows": rows, "seconds": None, "error": "out of memory"})
                break
            figures.append({"rows": rows, "seconds": seconds, "rows_per_second": rows / seconds})
    del model
    free_device(profile.device)
    return figures


def wan_batching(profile: Profile) -> dict:
    """A Wan 2.1 1.3B-sized transformer alone (random weights, bf16 on a GPU), as the engine's Wan adapter runs it
    (`batching.pipelines.packed_video`), 512 prompt tokens per row and the rows' own timesteps.
    - uniform: `rows` videos of the first shape in one forward (batched) against one forward per video (serial);
    - mixed: one video of each shape in one forward (packed: per-row rotary tables, attention per row, no padding)
      against each alone, and the largest difference of a mixed video's prediction from its alone one, absolute
      and relative to the largest alone value."""
    from batching.pipelines.packed_video import build_layout, run_packed, run_uniform

    device = torch.device(profile.device)
    dtype = getattr(torch, "bfloat16" if profile.device == "cuda" else profile.dtype)
    model = wan_transformer(profile.scale, device, dtype)
    generator = torch.Generator("cpu").manual_seed(0)
    text = torch.randn(1, 512, model.config.text_dim, generator=generator).to(device, dtype)

    channels = model.config.in_channels

    def video_latents(height: int, width: int, frames: int) -> torch.Tensor:
        shape = (channels, (frames - 1) // 4 + 1, height // 8, width // 8)
        return torch.randn(shape, generator=generator).to(device, dtype)

    def timesteps(count: int) -> torch.Tensor:
        return torch.linspace(950.0, 250.0, count).to(device)

    videos = [video_latents(*shape) for shape in profile.wan_videos]
    first = videos[0]
    figures: dict = {
        "videos": [list(shape) for shape in profile.wan_videos],
        "tokens": [int(video[0].numel()) // 4 for video in videos],  # 1x2x2 patches of one channel
        "uniform": [],
    }
    with torch.inference_mode():
        try:
            one = None
            for rows in profile.wan_rows:
                call = functools.partial(
                    run_uniform,
                    model,
                    first.expand(rows, *first.shape),
                    timesteps(rows),
                    text.expand(rows, -1, -1),
                    None,
                )
                seconds = time_call(call, device, profile.repeats)
                one = one or seconds
                figures["uniform"].append(
                    {"rows": rows, "seconds": seconds, "serial_seconds": rows * one, "speedup": rows * one / seconds}
                )
            steps = timesteps(len(videos))
            layout = build_layout(model, [video.shape for video in videos])
            mixed_call = functools.partial(
                run_packed, model, layout, videos, steps, text.expand(len(videos), -1, -1), None
            )
            alone_calls = [
                functools.partial(run_uniform, model, video[None], steps[index : index + 1], text, None)
                for index, video in enumerate(videos)
            ]
            mixed_seconds = time_call(mixed_call, device, profile.repeats)
            alone_seconds = sum(time_call(call, device, profile.repeats) for call in alone_calls)
            mixed, alone = mixed_call(), [call()[0] for call in alone_calls]
            largest = max(float(prediction.abs().max()) for prediction in alone)
            difference = max(float((a.float() - b.float()).abs().max()) for a, b in zip(mixed, alone))
            figures["mixed"] = {
                "seconds": mixed_seconds,
                "alone_seconds": alone_seconds,
                "speedup": alone_seconds / mixed_seconds,
                "max_abs_difference": difference,
                "relative_difference": difference / largest,
            }
        except torch.OutOfMemoryError:
            figures["error"] = "out of memory"
    del model
    free_device(profile.device)
    return figures


def time_call(call, device: torch.device, repeats: int) -> float:
    call()  # warm-up
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            call()
            end.record()
            end.synchronize()
            seconds.append(begin.elapsed_time(end) / 1000)
        else:
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def free_device(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
