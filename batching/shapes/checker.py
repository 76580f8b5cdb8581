"""Decide from pixels alone whether an image shows what a shapes prompt asked for.

Each pixel is labelled with its nearest palette colour (or "other" when it is far from
all of them). The background must be the asked colour: it is the label of most of
the image's border. The foreground is the pixels labelled with the asked shape colour;
it must be one sizeable, roughly centred blob, and the shape is read from how much of
its bounding box it fills (square 1, circle pi/4, triangle 1/2; on the box that holds
98% of the blob, which trims thin tips, about 1.0, 0.86 and 0.62) and, for the
triangle, from its mass sitting low in the box. A clip (`check_clip`, builtin:shapes-wan) is judged the
same way frame by frame, without the centring, and its direction from how the blob's centroid moves
between the first and the last frame that show it. No torch: the check runs
wherever numpy and Pillow do, and on any image, not only the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from core.shapes_vocabulary import COLOURS, MovingShapePrompt, ShapePrompt, parse_moving_prompt, parse_prompt

MAX_COLOUR_DISTANCE = 80.0  # RGB distance beyond which a pixel matches no palette colour
MIN_BACKGROUND_BORDER_SHARE = 0.6  # of border pixels in the asked background colour
MIN_FOREGROUND_SHARE = 0.08  # of the image in the asked shape colour
MAX_FOREGROUND_SHARE = 0.65
MAX_CENTRE_OFFSET = 0.15  # of the image side, between the blob's bounding-box centre and the image's
MIN_BLOB_SHARE = 0.85  # of the foreground colour's pixels inside the blob's bounding box
# bounding-box fill ratio ranges per shape; the gaps between them are where no shape is read
FILL_RANGES = {"triangle": (0.40, 0.70), "circle": (0.74, 0.93), "square": (0.93, 1.01)}
# a clip's moving shape (its box 30-40% of the side) covers less of a frame than a still one
CLIP_MIN_FOREGROUND_SHARE = 0.025
CLIP_MAX_FOREGROUND_SHARE = 0.30
MIN_FRAMES_WITH_SHAPE = 0.75  # of a clip's frames, each holding a sizeable foreground blob
MIN_TRAVEL = 0.15  # of the side: the least centroid motion read as a direction (drawn clips travel 0.40)
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


@dataclass(frozen=True)
class ClipCheckResult:
    passed: bool
    reason: str  # why it failed, or what was seen when it passed
    background: str | None = None  # the frames' borders' palette colour
    shape: str | None = None  # the shape most frames show
    direction: str | None = None  # where the shape's centroid went, from the first frame that shows it to the last

    def __bool__(self) -> bool:
        return self.passed


def check_clip(frames: list[Image.Image], prompt: MovingShapePrompt | str) -> ClipCheckResult:
    """Whether `frames` show `prompt`'s shape in its colours on its background, moving in its direction."""
    if isinstance(prompt, str):
        parsed = parse_moving_prompt(prompt)
        if parsed is None:
            return ClipCheckResult(False, f"not a moving shapes prompt: {prompt!r}")
        prompt = parsed
    labels = np.stack([palette_labels(frame) for frame in frames])  # [frames, H, W]
    height, width = labels.shape[1:]
    border = np.concatenate([labels[:, 0], labels[:, -1], labels[:, :, 0], labels[:, :, -1]], axis=1).ravel()
    counts = np.bincount(border[border >= 0], minlength=len(_PALETTE_NAMES))
    background = _PALETTE_NAMES[int(counts.argmax())] if counts.any() else None
    if np.mean(border == _PALETTE_NAMES.index(prompt.background)) < MIN_BACKGROUND_BORDER_SHARE:
        return ClipCheckResult(
            False, f"background is not {prompt.background} (borders mostly {background})", background
        )

    shapes, centroids = [], []  # per frame holding a sizeable foreground blob: its shape and centroid (x, y)
    for mask in labels == _PALETTE_NAMES.index(prompt.foreground):
        if not CLIP_MIN_FOREGROUND_SHARE <= mask.mean() <= CLIP_MAX_FOREGROUND_SHARE:
            continue
        rows, cols = _blob_extent(mask)
        shapes.append(read_shape(mask[rows[0] : rows[1] + 1, cols[0] : cols[1] + 1]))
        ys, xs = np.nonzero(mask)
        centroids.append((xs.mean() / width, ys.mean() / height))
    if len(shapes) < MIN_FRAMES_WITH_SHAPE * len(frames):
        message = f"{len(shapes)} of {len(frames)} frames show a {prompt.foreground} shape of a sensible size"
        return ClipCheckResult(False, message, background)
    shape = max(set(shapes), key=lambda name: (shapes.count(name), name is not None))  # the most frames' reading
    (first_x, first_y), (last_x, last_y) = centroids[0], centroids[-1]
    direction = read_direction(last_x - first_x, last_y - first_y)
    seen = f"a {prompt.foreground} {shape or 'blob'} moving {direction or 'nowhere'} on {background}"
    if shape != prompt.shape:
        return ClipCheckResult(False, f"{seen}: not a {prompt.shape}", background, shape, direction)
    if direction != prompt.direction:
        return ClipCheckResult(False, f"{seen}: not moving {prompt.direction}", background, shape, direction)
    return ClipCheckResult(True, seen, background, shape, direction)


def read_direction(dx: float, dy: float) -> str | None:
    """The direction of a displacement (fractions of the side, y downward) along its larger axis; None when it is
    shorter than MIN_TRAVEL."""
    if max(abs(dx), abs(dy)) < MIN_TRAVEL:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


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
