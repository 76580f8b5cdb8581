"""Procedural training images: one flat-coloured shape, centred, on a flat background.

The shape's bounding box is a square whose side is 50-75% of the image side, so a
square covers 25-56% of the image, a circle 20-44% and a triangle 13-28%, and none
reaches the image's corners. Shapes are drawn at 4x and downsampled, so edges are
anti-aliased like a real render rather than stair-stepped.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from core.shapes_vocabulary import COLOURS, ShapePrompt

MIN_BOX_FRACTION = 0.50
MAX_BOX_FRACTION = 0.75
SUPERSAMPLE = 4


def draw(prompt: ShapePrompt, size: int = 128, box_fraction: float = 0.6) -> Image.Image:
    """The image `prompt` describes, with the shape's bounding box `box_fraction` of the side."""
    assert MIN_BOX_FRACTION <= box_fraction <= MAX_BOX_FRACTION
    big = size * SUPERSAMPLE
    image = Image.new("RGB", (big, big), COLOURS[prompt.background])
    pen = ImageDraw.Draw(image)
    half = box_fraction * big / 2
    centre = big / 2
    left, top, right, bottom = centre - half, centre - half, centre + half, centre + half
    fill = COLOURS[prompt.foreground]
    if prompt.shape == "circle":
        pen.ellipse((left, top, right, bottom), fill=fill)
    elif prompt.shape == "square":
        pen.rectangle((left, top, right, bottom), fill=fill)
    else:  # an upright isosceles triangle filling its box
        pen.polygon([(centre, top), (right, bottom), (left, bottom)], fill=fill)
    return image.resize((size, size), Image.Resampling.LANCZOS)


def random_example(
    rng: np.random.Generator, prompts: list[ShapePrompt], size: int = 128
) -> tuple[ShapePrompt, Image.Image]:
    """A prompt drawn uniformly from `prompts`, and its image at a random shape size."""
    prompt = prompts[int(rng.integers(len(prompts)))]
    box_fraction = float(rng.uniform(MIN_BOX_FRACTION, MAX_BOX_FRACTION))
    return prompt, draw(prompt, size, box_fraction)
