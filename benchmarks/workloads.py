"""Benchmark workloads: seeded arrival schedules of generation requests.

A workload is a list of arrivals (offset in seconds from the start, params), identical
for every variant it runs on: same prompts, seeds, sizes, step counts and arrival times.
Poisson schedules draw exponential inter-arrival gaps from a seeded generator, so a
rate names one fixed schedule, not a random one per run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from batching import GenerationParams
from core.families import FAMILIES

PROMPTS = (
    "a red fox in the snow",
    "a lighthouse on a cliff at dusk",
    "a bowl of ramen, studio lighting",
    "an astronaut riding a horse",
    "a watercolor of a mountain lake",
    "a robot reading a newspaper",
    "a cat wearing a wizard hat",
    "a city street in the rain at night",
)
NEGATIVE_PROMPT = "blurry, low quality"
# Guidance values each family's mixed-guidance workload cycles through; the first turns CFG off where the
# family has it (FLUX-dev embeds its guidance, so every value is one row and its own tensor input).
GUIDANCE_MIX = {
    "sd": (1.0, 4.0, 7.5, 12.0),
    "sdxl": (1.0, 4.0, 7.5, 12.0),
    "flux": (1.0, 2.5, 3.5, 5.0),
    "zimage": (0.0, 2.0, 4.0, 6.0),
    "sd3": (1.0, 4.0, 7.0, 10.0),
    "qwenimage": (1.0, 2.5, 4.0, 6.0),  # true CFG: 1 runs one row even with the negative prompt
    "flux2": (1.0, 2.5, 4.0, 6.0),  # embedded, as FLUX.1's
    "flux2_klein": (1.0, 2.5, 4.0, 6.0),  # true CFG above 1
}


@dataclass(frozen=True)
class Arrival:
    at_seconds: float  # offset from the start of the run
    params: GenerationParams


@dataclass(frozen=True)
class Workload:
    name: str  # unique within a suite: "burst", "poisson_1.0x", "two_resolution" ...
    kind: str  # "burst" or "poisson"
    description: str  # one line for the report
    arrivals: tuple[Arrival, ...]
    rate_per_second: float | None = None  # Poisson arrival rate; None for a burst
    rate_multiple: float | None = None  # the rate as a multiple of the measured serial capacity

    @property
    def num_jobs(self) -> int:
        return len(self.arrivals)

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """Distinct (height, width) in the workload, for warm-ups."""
        return sorted({(a.params.height, a.params.width) for a in self.arrivals})


@dataclass(frozen=True)
class JobShape:
    """What every job of a workload shares unless the workload varies it."""

    model: str
    num_steps: int = 20
    size: int = 128
    second_size: int = 192  # the other resolution of the two-resolution mix
    sampler: str = "euler"  # one sampler everywhere: the static-batching pipeline holds one scheduler

    @property
    def family(self) -> str:
        return GenerationParams(prompt="x", model=self.model).family_spec.name

    @property
    def guidance_scale(self) -> float:
        return GUIDANCE_MIX[self.family][2]

    @property
    def negative_prompt(self) -> str:
        """Families without CFG refuse negative prompts."""
        return NEGATIVE_PROMPT if FAMILIES[self.family].guidance_kind == "cfg" else ""


def uniform_params(shape: JobShape, index: int, **changes) -> GenerationParams:
    fields: dict[str, Any] = dict(
        prompt=PROMPTS[index % len(PROMPTS)],
        negative_prompt=shape.negative_prompt,
        seed=1000 + index,
        model=shape.model,
        num_inference_steps=shape.num_steps,
        height=shape.size,
        width=shape.size,
        guidance_scale=shape.guidance_scale,
        sampler=shape.sampler,
    )
    fields.update(changes)
    return GenerationParams(**fields)


def burst(shape: JobShape, num_jobs: int) -> Workload:
    arrivals = tuple(Arrival(0.0, uniform_params(shape, i)) for i in range(num_jobs))
    return Workload("burst", "burst", f"{num_jobs} identical-shape jobs at once", arrivals)


def poisson(shape: JobShape, num_jobs: int, rate_per_second: float, rate_multiple: float, seed: int = 0) -> Workload:
    rng = random.Random(f"poisson-{seed}-{rate_multiple}")
    at, arrivals = 0.0, []
    for i in range(num_jobs):
        arrivals.append(Arrival(at, uniform_params(shape, i)))
        at += rng.expovariate(rate_per_second)
    return Workload(
        f"poisson_{rate_multiple:g}x",
        "poisson",
        f"{num_jobs} jobs, Poisson arrivals at {rate_per_second:.2f}/s ({rate_multiple:g}x serial capacity)",
        tuple(arrivals),
        rate_per_second=rate_per_second,
        rate_multiple=rate_multiple,
    )


def mixed_steps(shape: JobShape, num_jobs: int) -> Workload:
    """Step counts cycle through half, full and 1.5x the base count: same total work as uniform."""
    counts = (shape.num_steps // 2, shape.num_steps, shape.num_steps * 3 // 2)
    arrivals = tuple(
        Arrival(0.0, uniform_params(shape, i, num_inference_steps=max(1, counts[i % 3]))) for i in range(num_jobs)
    )
    steps = "/".join(str(max(1, c)) for c in counts)
    return Workload("mixed_steps", "burst", f"{num_jobs} jobs at once, {steps} steps interleaved", arrivals)


def two_resolution(shape: JobShape, num_jobs: int) -> Workload:
    sizes = (shape.size, shape.second_size)
    arrivals = tuple(
        Arrival(0.0, uniform_params(shape, i, height=sizes[i % 2], width=sizes[i % 2])) for i in range(num_jobs)
    )
    return Workload(
        "two_resolution", "burst", f"{num_jobs} jobs at once, {sizes[0]}px and {sizes[1]}px interleaved", arrivals
    )


def mixed_guidance(shape: JobShape, num_jobs: int) -> Workload:
    """Guidance cycles through the family's GUIDANCE_MIX (SD: none (1.0: one row), 4.0, 7.5 and 12.0)."""
    scales = GUIDANCE_MIX[shape.family]
    arrivals = tuple(Arrival(0.0, uniform_params(shape, i, guidance_scale=scales[i % 4])) for i in range(num_jobs))
    shown = "/".join(f"{scale:g}" for scale in scales)
    return Workload("mixed_guidance", "burst", f"{num_jobs} jobs at once, guidance {shown} interleaved", arrivals)


def mixed_sizes(shape: JobShape) -> tuple[tuple[int, int], ...]:
    """(height, width) of the mixed-size workload: square, landscape, and the larger square."""
    return ((shape.size, shape.size), (shape.size, shape.second_size), (shape.second_size, shape.second_size))


def mixed_size(shape: JobShape, num_jobs: int) -> Workload:
    """Three sizes at once, interleaved in arrival order; on transformer families they share forwards."""
    sizes = mixed_sizes(shape)
    num_jobs = max(len(sizes), num_jobs // len(sizes) * len(sizes))  # each size equally often
    arrivals = tuple(
        Arrival(0.0, uniform_params(shape, i, height=sizes[i % 3][0], width=sizes[i % 3][1])) for i in range(num_jobs)
    )
    shown = ", ".join(f"{h}x{w}" for h, w in sizes)
    return Workload("mixed_size", "burst", f"{num_jobs} jobs at once, {shown} interleaved", arrivals)


def total_tokens(workload: Workload) -> int:
    """Latent tokens summed over the workload's jobs (rows x tokens per row, FamilySpec.sample_cost)."""
    return sum(
        a.params.family_spec.sample_cost(a.params.height, a.params.width, a.params.guidance_scale)
        for a in workload.arrivals
    )


def mixed_size_uniform(shape: JobShape, mixed: Workload) -> Workload:
    """The mixed-size workload's total tokens as jobs of the smallest size only (to within one job): the
    mixed / uniform throughput ratio at equal tokens says what mixing sizes costs."""
    one = uniform_params(shape, 0)
    num_jobs = round(total_tokens(mixed) / one.family_spec.sample_cost(one.height, one.width, one.guidance_scale))
    arrivals = tuple(Arrival(0.0, uniform_params(shape, i)) for i in range(num_jobs))
    return Workload(
        "mixed_size_uniform",
        "burst",
        f"{num_jobs} jobs at once, all {shape.size}px: the mixed-size workload's tokens",
        arrivals,
    )
