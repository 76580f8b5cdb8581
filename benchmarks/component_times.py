"""Raw component timings, for engine efficiency: what the engine's work costs with no engine around it.

`ForwardTrace` watches a running engine: for every denoiser forward it records the
latent size and the row count (from the scheduler's plan), and it sums the encode seconds
the runner reports and the decode seconds the engine counts (decodes report to the engine
directly, not through the runner's output). `time_forwards` then times the bare denoiser at exactly
those (size, rows) shapes, in the same process, so

    ideal seconds = sum over forwards of t_forward(size, rows) + encode + decode

is the time the engine would need if scheduling, batch building, per-job sampler steps
and Python overhead were free. The bare timings are taken right after each run, for the
shapes that run used. The trace wraps `ModelRunner.execute` of one engine
instance (a benchmark probe; the engine itself is unchanged).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

ForwardShape = tuple[int, int, int]  # (height, width, rows): image pixels, rows in the forward


@dataclass
class ForwardTrace:
    forwards: Counter = field(default_factory=Counter)  # (height, width, rows) -> forwards run
    forward_seconds: float = 0.0  # in-run wall time of those forwards (batch building and guidance included)
    encode_seconds: float = 0.0  # in-run text-encoder time
    decode_seconds: float = 0.0  # in-run VAE decode time
    is_complete: bool = True  # False if a forward could not be matched to one shape (a failed group, mixed sizes)
    engine: Any = None  # the engine attached to
    decode_seconds_before: float = 0.0  # its stats' decode seconds at the last reset

    def attach(self, engine) -> None:
        self.engine = engine
        self.decode_seconds_before = engine.stats()["decode_seconds"]
        runner = engine.model_runner
        execute = runner.execute

        def traced_execute(plan, *args):
            output = execute(plan, *args)
            self._record(plan, output)
            return output

        runner.execute = traced_execute

    def reset(self) -> None:
        """Call only while the engine is idle."""
        self.forwards.clear()
        self.forward_seconds = self.encode_seconds = self.decode_seconds = 0.0
        self.decode_seconds_before = self.engine.stats()["decode_seconds"] if self.engine is not None else 0.0
        self.is_complete = True

    def _record(self, plan, output) -> None:
        keys = list(plan.groups)
        if len(keys) != len(output.rows_per_forward):
            self.is_complete = False
        for key, rows in zip(keys, output.rows_per_forward):
            if key.height is None:  # a group mixing sizes (Z-Image) has no one shape to time bare
                self.is_complete = False
                continue
            self.forwards[(key.height, key.width, rows)] += 1
        self.forward_seconds += sum(output.forward_seconds)
        self.encode_seconds += output.encode_seconds

    def as_dict(self) -> dict:
        if self.engine is not None:
            self.decode_seconds = self.engine.stats()["decode_seconds"] - self.decode_seconds_before
        return {
            "forwards": [
                {"height": h, "width": w, "rows": r, "count": n} for (h, w, r), n in sorted(self.forwards.items())
            ],
            "forward_seconds": self.forward_seconds,
            "encode_seconds": self.encode_seconds,
            "decode_seconds": self.decode_seconds,
            "is_complete": self.is_complete,
        }


class UNetRowCounter:
    """Counts the rows of every denoiser call of a diffusers pipeline (static batching's forwards).

    The UNet takes its latents first; FLUX's transformer takes them as `hidden_states=`; Z-Image's
    takes a list with one latent per row."""

    def __init__(self, denoiser: torch.nn.Module) -> None:
        self.forwards: Counter = Counter()  # rows -> forwards
        denoiser.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        latents = args[0] if args else kwargs.get("hidden_states", kwargs.get("sample", kwargs.get("x")))
        self.forwards[len(latents) if isinstance(latents, list) else int(latents.shape[0])] += 1

    def reset(self) -> None:
        self.forwards.clear()


def time_forwards(adapter, shapes: set[ForwardShape], repeats: int = 3) -> dict[ForwardShape, float]:
    """Median seconds of one bare denoiser forward per shape (after one untimed call per shape).

    Called right after the run whose shapes these are, so the machine's load is as close
    as it gets to the load the run saw. Any family: every row is the conditional row of one prompt."""
    from batching.pipelines.contract import ForwardBatch
    from core.params import GenerationParams

    medians = {}
    for height, width, rows in sorted(shapes):
        params = GenerationParams(
            prompt="a red fox in the snow", model=adapter.model, height=height, width=width, seed=0
        )
        sampler = adapter.new_sampler(params)
        latents = adapter.initial_latents(params, sampler, torch.Generator("cpu").manual_seed(0))  # [1, *latent_shape]
        texts = adapter.texts_to_encode(params)
        row = adapter.row_conditioning(params, dict(zip(texts, adapter.encode_prompts(texts))))[0]
        batch = ForwardBatch(
            latents=latents.expand(rows, *latents.shape[1:]).contiguous(),
            timesteps=sampler.timesteps[:1].float().expand(rows).contiguous(),  # [rows]
            conditioning={
                name: tensor.unsqueeze(0).expand(rows, *tensor.shape).contiguous() for name, tensor in row.items()
            },
            lengths={},
        )
        adapter.forward(batch)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            adapter.forward(batch)
            if adapter.device.type == "cuda":
                torch.cuda.synchronize(adapter.device)
            seconds.append(time.perf_counter() - start)
        medians[(height, width, rows)] = statistics.median(seconds)
    return medians


def ideal_seconds(trace: dict, forward_times: dict[ForwardShape, float]) -> dict:
    """The run's time by raw component timings, from `ForwardTrace.as_dict()` and `time_forwards`."""
    denoise = sum(f["count"] * forward_times[(f["height"], f["width"], f["rows"])] for f in trace["forwards"])
    return {
        "denoise": denoise,
        "encode": trace["encode_seconds"],
        "decode": trace["decode_seconds"],
        "total": denoise + trace["encode_seconds"] + trace["decode_seconds"],
    }
