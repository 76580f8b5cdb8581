"""Procedural training images: one flat-coloured shape, centred, on a flat background.

The shape's bounding box is a square whose side is 50-75% of the image side, so a
square covers 25-56% of the image, a circle 20-44% and a triangle 13-28%, and none
reaches the image's corners. Shapes are drawn at 4x and downsampled, so edges are
anti-aliased like a real render rather than stair-stepped.

builtin:shapes-wan's clips (`draw_clip`) are smaller shapes (a box of 30-40% of the side) whose
centre travels at a steady speed from 30% to 70% of the side (or back) across the clip, on the
image's middle line, so the first and last frames' shapes are 40% of the side apart.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from core.shapes_vocabulary import COLOURS, MovingShapePrompt, ShapePrompt

MIN_BOX_FRACTION = 0.50
MAX_BOX_FRACTION = 0.75
SUPERSAMPLE = 4
CLIP_MIN_BOX_FRACTION = 0.30  # a moving shape's box, of the side
CLIP_MAX_BOX_FRACTION = 0.40
CLIP_TRAVEL = 0.40  # how far a moving shape's centre goes over the clip, of the side
# (x, y) unit steps of each direction, y downward as in an image
DIRECTION_STEPS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}


def draw(prompt: ShapePrompt, size: int = 128, box_fraction: float = 0.6) -> Image.Image:
    """The image `prompt` describes, with the shape's bounding box `box_fraction` of the side."""
    assert MIN_BOX_FRACTION <= box_fraction <= MAX_BOX_FRACTION
    return _draw_shape(prompt, size, box_fraction, (0.5, 0.5))


def draw_clip(prompt: MovingShapePrompt, size: int = 64, num_frames: int = 9, box_fraction: float = 0.35) -> list:
    """The clip `prompt` describes: `num_frames` frames of its shape moving at a steady speed in its direction."""
    assert CLIP_MIN_BOX_FRACTION <= box_fraction <= CLIP_MAX_BOX_FRACTION and num_frames >= 2
    step_x, step_y = DIRECTION_STEPS[prompt.direction]
    frames = []
    for index in range(num_frames):
        offset = CLIP_TRAVEL * (index / (num_frames - 1) - 0.5)  # -travel/2 .. travel/2 along the direction
        frames.append(_draw_shape(prompt, size, box_fraction, (0.5 + step_x * offset, 0.5 + step_y * offset)))
    return frames


def _draw_shape(
    prompt: ShapePrompt | MovingShapePrompt, size: int, box_fraction: float, centre: tuple[float, float]
) -> Image.Image:
    """One image: the prompt's shape with its box `box_fraction` of the side, centred at `centre` (fractions of
    the side), on the prompt's background."""
    big = size * SUPERSAMPLE
    image = Image.new("RGB", (big, big), COLOURS[prompt.background])
    pen = ImageDraw.Draw(image)
    half = box_fraction * big / 2
    centre_x, centre_y = centre[0] * big, centre[1] * big
    left, top, right, bottom = centre_x - half, centre_y - half, centre_x + half, centre_y + half
    fill = COLOURS[prompt.foreground]
    if prompt.shape == "circle":
        pen.ellipse((left, top, right, bottom), fill=fill)
    elif prompt.shape == "square":
        pen.rectangle((left, top, right, bottom), fill=fill)
    else:  # an upright isosceles triangle filling its box
        pen.polygon([(centre_x, top), (right, bottom), (left, bottom)], fill=fill)
    return image.resize((size, size), Image.Resampling.LANCZOS)


def random_example(
    rng: np.random.Generator, prompts: list[ShapePrompt], size: int = 128
) -> tuple[ShapePrompt, Image.Image]:
    """A prompt drawn uniformly from `prompts`, and its image at a random shape size."""
    prompt = prompts[int(rng.integers(len(prompts)))]
    box_fraction = float(rng.uniform(MIN_BOX_FRACTION, MAX_BOX_FRACTION))
    return prompt, draw(prompt, size, box_fraction)
