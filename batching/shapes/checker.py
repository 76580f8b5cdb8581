"""Decide from pixels alone whether an image shows what a shapes prompt asked for.

Each pixel is labelled with its nearest palette colour (or "other" when it is far from
all of them). The background must be the asked colour: it is the label of most of
the image's border. The foreground is the pixels labelled with the asked shape colour;
it must be one sizeable, roughly centred blob, and the shape is read from how much of
its bounding box it fills (square 1, circle pi/4, triangle 1/2; on the box that holds
98% of the blob, which trims thin tips, about 1.0, 0.86 and 0.62) and, for the
triangle, from its mass sitting low in the box. No torch: the check runs
wherever numpy and Pillow do, and on any image, not only the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from core.shapes_vocabulary import COLOURS, ShapePrompt, parse_prompt

MAX_COLOUR_DISTANCE = 80.0  # RGB distance beyond which a pixel matches no palette colour
MIN_BACKGROUND_BORDER_SHARE = 0.6  # of border pixels in the asked background colour
MIN_FOREGROUND_SHARE = 0.08  # of the image in the asked shape colour
MAX_FOREGROUND_SHARE = 0.65
MAX_CENTRE_OFFSET = 0.15  # of the image side, between the blob's bounding-box centre and the image's
MIN_BLOB_SHARE = 0.85  # of the foreground colour's pixels inside the blob's bounding box
# bounding-box fill ratio ranges per shape; the gaps between them are where no shape is read
FILL_RANGES = {"triangle": (0.40, 0.70), "circle": (0.74, 0.93), "square": (0.93, 1.01)}
_PALETTE_NAMES = list(COLOURS)
_PALETTE = np.array([COLOURS[name] for name in _PALETTE_NAMES], dtype=np.float32)  # [num_colours, 3]


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    reason: str  # why it failed, or what was seen when it passed
    background: str | None = None  # the border's palette colour
    shape: str | None = None  # the shape read from the foreground blob

    def __bool__(self) -> bool:
        return self.passed


def palette_labels(image: Image.Image) -> np.ndarray:
    """Per-pixel index into the palette, -1 where no palette colour is near: [H, W] int."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)  # [H, W, 3]
    distances = np.linalg.norm(pixels[:, :, None, :] - _PALETTE[None, None], axis=-1)  # [H, W, num_colours]
    labels = distances.argmin(axis=-1)
    labels[distances.min(axis=-1) > MAX_COLOUR_DISTANCE] = -1
    return labels


def check_image(image: Image.Image, prompt: ShapePrompt | str) -> CheckResult:
    """Whether `image` shows `prompt`'s shape in its colours on its background."""
    if isinstance(prompt, str):
        parsed = parse_prompt(prompt)
        if parsed is None:
            return CheckResult(False, f"not a shapes prompt: {prompt!r}")
        prompt = parsed
    labels = palette_labels(image)
    height, width = labels.shape
    border = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    background_index = _PALETTE_NAMES.index(prompt.background)
    counts = np.bincount(border[border >= 0], minlength=len(_PALETTE_NAMES))
    seen_background = _PALETTE_NAMES[int(counts.argmax())] if counts.any() else None
    if np.mean(border == background_index) < MIN_BACKGROUND_BORDER_SHARE:
        return CheckResult(
            False, f"background is not {prompt.background} (border mostly {seen_background})", seen_background
        )

    mask = labels == _PALETTE_NAMES.index(prompt.foreground)  # [H, W] bool
    share = float(mask.mean())
    if not MIN_FOREGROUND_SHARE <= share <= MAX_FOREGROUND_SHARE:
        return CheckResult(False, f"{prompt.foreground} covers {share:.0%} of the image", seen_background)
    rows, cols = _blob_extent(mask)
    box = mask[rows[0] : rows[1] + 1, cols[0] : cols[1] + 1]
    if box.sum() < MIN_BLOB_SHARE * mask.sum():
        return CheckResult(False, f"{prompt.foreground} is scattered, not one shape", seen_background)
    centre_offset = max(
        abs((rows[0] + rows[1]) / 2 - (height - 1) / 2) / height, abs((cols[0] + cols[1]) / 2 - (width - 1) / 2) / width
    )
    if centre_offset > MAX_CENTRE_OFFSET:
        return CheckResult(
            False, f"the {prompt.foreground} shape is off centre by {centre_offset:.0%}", seen_background
        )
    shape = read_shape(box)
    if shape != prompt.shape:
        message = f"the {prompt.foreground} shape looks like a {shape or 'blob'}, not a {prompt.shape}"
        return CheckResult(False, message, seen_background, shape)
    return CheckResult(True, f"a {prompt.foreground} {shape} on {seen_background}", seen_background, shape)


def read_shape(box: np.ndarray) -> str | None:
    """The shape whose fill ratio the blob's bounding box has; None when it fits none or is not squarish."""
    box_height, box_width = box.shape
    if not 0.75 <= box_height / box_width <= 1.33:
        return None
    fill = float(box.mean())
    row_mass = box.sum(axis=1)  # [box_height]
    centroid_row = float((row_mass * np.arange(box_height)).sum() / row_mass.sum()) / max(box_height - 1, 1)
    for shape, (low, high) in FILL_RANGES.items():
        if low <= fill < high:
            if shape == "triangle" and centroid_row < 0.55:  # an upright triangle's mass sits at 2/3 of its height
                return None
            return shape
    return None


def _blob_extent(mask: np.ndarray) -> tuple[tuple[int, int], tuple[int, int]]:
    """The rows and columns that hold the central 98% of the mask's pixels (stray pixels don't stretch the box)."""
    extents = []
    for axis in (1, 0):
        profile = mask.sum(axis=axis).cumsum()
        total = profile[-1]
        low = int(np.searchsorted(profile, 0.01 * total))
        high = int(np.searchsorted(profile, 0.99 * total))
        extents.append((low, high))
    return extents[0], extents[1]
