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
from collections.abc import Sequence
from dataclasses import dataclass, field

from batching.shapes.checker import check_image
from core.params import GenerationParams
from core.shapes_vocabulary import COLOURS, SHAPES, ShapePrompt

MODEL = "builtin:shapes"
NUM_STEPS = 20
GUIDANCE_SCALES = (5.0, 7.5, 10.0)  # mixed within one run (chosen before training; 10 fails most, see docs/shapes.md)
JOIN_AFTER_STEPS = 2  # co-batched: the next job joins when the previous one has taken this many steps


@dataclass(frozen=True)
class Case:
    prompt: ShapePrompt
    seed: int
    guidance_scale: float
    model: str = MODEL
    size: int = 128  # the image's side in pixels

    def params(self, sampler: str = "euler") -> GenerationParams:
        return GenerationParams(
            prompt=self.prompt.text,
            seed=self.seed,
            guidance_scale=self.guidance_scale,
            num_inference_steps=NUM_STEPS,
            height=self.size,
            width=self.size,
            sampler=sampler,
            model=self.model,
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


def fixed_cases(num_cases: int = 24, model: str = MODEL, sizes: Sequence[int] = (128,)) -> list[Case]:
    """`num_cases` cases in a fixed order: shapes cycle, each colour is the shape's and the background's in turn;
    with several `sizes`, case i is drawn at sizes[i % len(sizes)] (mixed sizes in one co-batched run)."""
    colours = list(COLOURS)
    cases = []
    for index in range(num_cases):
        foreground = colours[index % len(colours)]
        background = colours[(index + 1 + index // len(colours)) % len(colours)]
        if background == foreground:
            background = colours[(colours.index(background) + 1) % len(colours)]
        prompt = ShapePrompt(foreground, SHAPES[index % len(SHAPES)], background)
        guidance_scale = GUIDANCE_SCALES[index % len(GUIDANCE_SCALES)]
        cases.append(Case(prompt, 1000 + index, guidance_scale, model, sizes[index % len(sizes)]))
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


def grid(images: list, columns: int = 8):
    """The images side by side, `columns` to a row (docs/images/shapes-grid.png)."""
    from PIL import Image

    width, height = images[0].size
    rows = -(-len(images) // columns)
    sheet = Image.new("RGB", (columns * width, rows * height), (255, 255, 255))
    for index, image in enumerate(images):
        sheet.paste(image, ((index % columns) * width, (index // columns) * height))
    return sheet


def main(argv: list[str] | None = None) -> int:
    """Print the fixed set's accuracy co-batched and alone at each size (and with the sizes mixed), and per
    guidance scale; optionally save images or a JSON report.

    python -m batching.shapes.accuracy --guidance 1 5 7.5 10 --grid docs/images/shapes-grid.png
    python -m batching.shapes.accuracy --model builtin:shapes-dit --sizes 96 128 --json report.json
    """
    import argparse
    import json
    from dataclasses import asdict, replace
    from pathlib import Path

    import torch

    from batching import DiffusionEngine, EngineConfig

    parser = argparse.ArgumentParser(description="accuracy of a shapes model on the fixed 24-case set")
    parser.add_argument("--model", default=MODEL, help="builtin:shapes, builtin:shapes-dit or a folder of either")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128], help="image sides; several: also mixed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--guidance", type=float, nargs="*", default=[], help="also run every case at these scales")
    parser.add_argument("--grid", type=Path, help="save the first co-batched run's images here, 8 to a row")
    parser.add_argument("--example", type=Path, help="save the README's example here (seed 7, the defaults)")
    parser.add_argument("--json", type=Path, help="write every run's report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = DiffusionEngine(EngineConfig(model=args.model, device="cpu", max_num_seqs=8))
    reports: dict[str, dict] = {}
    try:

        def run(name: str, run_cases: list[Case], co_batched: bool = False) -> list:
            started = time.perf_counter()
            images = run_co_batched(engine, run_cases) if co_batched else run_alone(engine, run_cases)
            report = score(run_cases, images, len(run_cases) / (time.perf_counter() - started))
            print(f"{name}: {report.num_passed}/{report.num_cases} ({report.accuracy:.0%}), "
                  f"{report.images_per_second:.2f} images/s", flush=True)  # fmt: skip
            for failure in report.failures:
                print(f"    {failure}")
            reports[name] = dict(asdict(report), accuracy=report.accuracy)
            return images

        grid_images = None
        for size in args.sizes:
            cases = fixed_cases(model=args.model, sizes=[size])
            images = run(f"{size}x{size} co-batched, guidance 5/7.5/10 mixed", cases, co_batched=True)
            grid_images = grid_images or images
            run(f"{size}x{size} alone, guidance 5/7.5/10 mixed", cases)
            for scale in args.guidance:
                scaled = [replace(case, guidance_scale=scale) for case in cases]
                run(f"{size}x{size} alone, guidance {scale:g}", scaled)
        if len(args.sizes) > 1:
            sizes_text = "/".join(map(str, args.sizes))
            mixed = fixed_cases(model=args.model, sizes=args.sizes)
            run(f"sizes {sizes_text} mixed, co-batched, guidance 5/7.5/10 mixed", mixed, co_batched=True)
        if args.grid and grid_images:
            grid(grid_images).save(args.grid)
        if args.json:
            args.json.write_text(json.dumps({"model": args.model, "runs": reports}, indent=2) + "\n")
        if args.example:
            # the README tour's `stepwise submit "a red circle on a blue background" --seed 7 --steps 20`
            example = GenerationParams(
                prompt="a red circle on a blue background", seed=7, num_inference_steps=20, model=args.model
            )
            engine.submit(example).result(timeout=300).image.save(args.example)
    finally:
        engine.shutdown(abort=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
