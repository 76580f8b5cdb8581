"""How often builtin:shapes-wan draws what its prompts ask for, judged clip by clip by the pixel checker.

The fixed cases are held out: training (`training/shapes_wan/`) never shows the model their prompts,
so a case drawn right shows the model composing colours, shape and direction it learned apart.
They cover every colour as shape and as background, every shape and every direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batching.shapes.checker import check_clip
from core.params import GenerationParams
from core.shapes_vocabulary import COLOURS, DIRECTIONS, SHAPES, MovingShapePrompt

MODEL = "builtin:shapes-wan"
SIZE = 64  # the side it was trained at
NUM_FRAMES = 9
NUM_STEPS = 10
GUIDANCE_SCALE = 5.0  # Wan's pipelines' default


@dataclass(frozen=True)
class ClipCase:
    prompt: MovingShapePrompt
    seed: int
    model: str = MODEL

    def params(self, num_inference_steps: int = NUM_STEPS) -> GenerationParams:
        return GenerationParams(
            prompt=self.prompt.text,
            seed=self.seed,
            guidance_scale=GUIDANCE_SCALE,
            num_inference_steps=num_inference_steps,
            height=SIZE,
            width=SIZE,
            num_frames=NUM_FRAMES,
            model=self.model,
        )


@dataclass
class ClipReport:
    num_passed: int
    num_cases: int
    failures: list[str] = field(default_factory=list)  # "prompt (seed s): why"

    @property
    def accuracy(self) -> float:
        return self.num_passed / self.num_cases


def fixed_clip_cases(num_cases: int = 24, model: str = MODEL) -> list[ClipCase]:
    """`num_cases` held-out cases in a fixed order: shapes and directions cycle, each colour is the shape's and the
    background's in turn."""
    colours = list(COLOURS)
    cases = []
    for index in range(num_cases):
        foreground = colours[index % len(colours)]
        background = colours[(index + 3 + index // len(colours)) % len(colours)]
        if background == foreground:
            background = colours[(colours.index(background) + 1) % len(colours)]
        shape, direction = SHAPES[index % len(SHAPES)], DIRECTIONS[index % len(DIRECTIONS)]
        cases.append(ClipCase(MovingShapePrompt(foreground, shape, direction, background), 2000 + index, model))
    return cases


def held_out_prompts() -> set[MovingShapePrompt]:
    """The prompts training leaves out: every fixed case's."""
    return {case.prompt for case in fixed_clip_cases()}


def score_clips(cases: list[ClipCase], clips: list[list]) -> ClipReport:
    failures = []
    for case, frames in zip(cases, clips, strict=True):
        result = check_clip(frames, case.prompt)
        if not result:
            failures.append(f"{case.prompt.text} (seed {case.seed}): {result.reason}")
    return ClipReport(len(cases) - len(failures), len(cases), failures)
