"""The words builtin:shapes, builtin:shapes-dit and builtin:shapes-wan understand: colours with their RGB
values, shapes, directions of motion, and the prompt grammars (a still shape; a moving one).

Every other module (the drawing, the checker, the trainer, the tests, the API's note on a prompt
outside the grammar) reads the palette and the grammar from here, so a new colour or shape is one edit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "orange": (245, 140, 20),
    "purple": (140, 40, 170),
    "black": (10, 10, 10),
    "white": (245, 245, 245),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")  # builtin:shapes-wan's motions

_PROMPT = re.compile(  # a still prompt, or a moving one with "moving <direction>" after the shape
    r"^\s*an?\s+(?P<fg>[a-z]+)\s+(?P<shape>[a-z]+)(?:\s+moving\s+(?P<direction>[a-z]+))?"
    r"\s+on\s+an?\s+(?P<bg>[a-z]+)\s+background\s*\.?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ShapePrompt:
    foreground: str  # a key of COLOURS
    shape: str  # one of SHAPES
    background: str  # a key of COLOURS, different from foreground

    @property
    def text(self) -> str:
        return f"a {self.foreground} {self.shape} on a {self.background} background"


def parse_prompt(text: str) -> ShapePrompt | None:
    """The prompt's colours and shape, or None when it is not of the form the model draws."""
    words = _prompt_words(text)
    if words is None or words[2] is not None:
        return None
    return ShapePrompt(words[0], words[1], words[3])


def _prompt_words(text: str) -> tuple[str, str, str | None, str] | None:
    """(foreground, shape, direction or None, background) of a still or moving prompt of known words; None for
    any other text."""
    match = _PROMPT.match(text)
    if match is None:
        return None
    fg, shape, bg = (match.group(name).lower() for name in ("fg", "shape", "bg"))
    direction = match.group("direction").lower() if match.group("direction") else None
    if fg not in COLOURS or bg not in COLOURS or shape not in SHAPES or fg == bg:
        return None
    if direction is not None and direction not in DIRECTIONS:
        return None
    return fg, shape, direction, bg


def all_prompts() -> list[ShapePrompt]:
    """Every drawable combination (8 x 7 colour pairs x 3 shapes = 168), in a fixed order."""
    return [ShapePrompt(fg, shape, bg) for fg in COLOURS for bg in COLOURS if fg != bg for shape in SHAPES]


def grammar() -> str:
    """The grammar in one line, for a person: what to write instead of a prompt the model does not know."""
    colours, shapes = ", ".join(COLOURS), ", ".join(SHAPES)
    return f"a <colour> <shape> on a <colour> background, with colours {colours} and shapes {shapes}"


@dataclass(frozen=True)
class MovingShapePrompt:
    """builtin:shapes-wan's prompt: a still prompt's shape and colours, and the direction the shape moves."""

    foreground: str  # a key of COLOURS
    shape: str  # one of SHAPES
    direction: str  # one of DIRECTIONS
    background: str  # a key of COLOURS, different from foreground

    @property
    def text(self) -> str:
        return f"a {self.foreground} {self.shape} moving {self.direction} on a {self.background} background"


def parse_moving_prompt(text: str) -> MovingShapePrompt | None:
    """The prompt's colours, shape and direction, or None when it is not of the form builtin:shapes-wan draws."""
    words = _prompt_words(text)
    if words is None or words[2] is None:
        return None
    return MovingShapePrompt(words[0], words[1], words[2], words[3])


def all_moving_prompts() -> list[MovingShapePrompt]:
    """Every drawable moving combination (168 still prompts x 4 directions = 672), in a fixed order."""
    return [
        MovingShapePrompt(p.foreground, p.shape, direction, p.background)
        for p in all_prompts()
        for direction in DIRECTIONS
    ]


def moving_grammar() -> str:
    """builtin:shapes-wan's grammar in one line, for a person."""
    colours, shapes, directions = ", ".join(COLOURS), ", ".join(SHAPES), ", ".join(DIRECTIONS)
    return (
        f"a <colour> <shape> moving <direction> on a <colour> background, with colours {colours}, "
        f"shapes {shapes} and directions {directions}"
    )
