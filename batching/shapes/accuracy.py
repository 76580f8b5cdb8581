"""How often an engine draws what builtin:shapes prompts ask for, judged by the pixel checker.

A fixed set of cases (prompt, seed, guidance) covers every colour as shape and as
background and every shape, with guidance mixed. The same cases run alone (one job
at a time) and co-batched (each job joins while the previous one is two steps in, so
up to `max_num_seqs` jobs share forwards at staggered steps with mixed guidance). A
faster engine that draws wrong (swapped guidance rows, a prompt given to the wrong
job, a wrong sigma) scores lower here even when alone and batched agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from batching.params import GenerationParams
from batching.shapes.checker import check_image
from batching.shapes.vocabulary import COLOURS, SHAPES, ShapePrompt

MODEL = "builtin:shapes"
NUM_STEPS = 20
GUIDANCE_SCALES = (5.0, 7.5, 10.0)  # mixed within one run (chosen before training; 10 fails most, see docs/shapes.md)
JOIN_AFTER_STEPS = 2  # co-batched: the next job joins when the previous one has taken this many steps


@dataclass(frozen=True)
class Case:
    prompt: ShapePrompt
    seed: int
    guidance_scale: float

    def params(self, sampler: str = "euler") -> GenerationParams:
        return GenerationParams(
            prompt=self.prompt.text,
            seed=self.seed,
            guidance_scale=self.guidance_scale,
            num_inference_steps=NUM_STEPS,
            height=128,
            width=128,
            sampler=sampler,
            model=MODEL,
        )


@dataclass
class AccuracyReport:
    num_passed: int
    num_cases: int
    images_per_second: float
    failures: list[str] = field(default_factory=list)  # "prompt (seed s, guidance g): why"

    @property
    def accuracy(self) -> float:
        return self.num_passed / self.num_cases


def fixed_cases(num_cases: int = 24) -> list[Case]:
    """`num_cases` cases in a fixed order: shapes cycle, each colour is the shape's and the background's in turn."""
    colours = list(COLOURS)
    cases = []
    for index in range(num_cases):
        foreground = colours[index % len(colours)]
        background = colours[(index + 1 + index // len(colours)) % len(colours)]
        if background == foreground:
            background = colours[(colours.index(background) + 1) % len(colours)]
        prompt = ShapePrompt(foreground, SHAPES[index % len(SHAPES)], background)
        cases.append(Case(prompt, seed=1000 + index, guidance_scale=GUIDANCE_SCALES[index % len(GUIDANCE_SCALES)]))
    return cases


def run_alone(engine, cases: list[Case]) -> list:
    """Each job submitted after the previous one finished; the images in case order."""
    return [engine.submit(case.params()).result(timeout=300).image for case in cases]


def run_co_batched(engine, cases: list[Case], join_after_steps: int = JOIN_AFTER_STEPS) -> list:
    """A chain of joins: job i+1 is submitted when job i has taken `join_after_steps` steps."""
    futures: list = [None] * len(cases)

    def submit(index: int) -> None:
        def on_progress(num_steps_done: int, num_steps_total: int) -> None:
            if num_steps_done == join_after_steps and index + 1 < len(cases):
                submit(index + 1)

        futures[index] = engine.submit(cases[index].params(), on_progress=on_progress)

    submit(0)
    deadline = time.monotonic() + 600
    while futures[-1] is None and time.monotonic() < deadline:  # the chain is still growing
        futures[0].result(timeout=300)
        time.sleep(0.01)
    return [future.result(timeout=300).image for future in futures]


def measure(engine, cases: list[Case], *, co_batched: bool) -> AccuracyReport:
    started = time.perf_counter()
    images = run_co_batched(engine, cases) if co_batched else run_alone(engine, cases)
    seconds = time.perf_counter() - started
    return score(cases, images, len(cases) / seconds)


def score(cases: list[Case], images: list, images_per_second: float = 0.0) -> AccuracyReport:
    failures = []
    for case, image in zip(cases, images, strict=True):
        result = check_image(image, case.prompt)
        if not result:
            failures.append(f"{case.prompt.text} (seed {case.seed}, guidance {case.guidance_scale}): {result.reason}")
    return AccuracyReport(len(cases) - len(failures), len(cases), images_per_second, failures)
