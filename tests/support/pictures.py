"""Pictures and image bytes the tests feed to jobs: PNG data URIs, random-pixel images, masks."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image, ImageDraw

from core.image_inputs import to_data_uri

JOB = {"prompt": "a red fox", "seed": 1, "num_inference_steps": 4}  # a small job body for the API


def image_bytes(width: int = 64, height: int = 64, image_format: str = "PNG", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=image_format)
    return buffer.getvalue()


def data_uri(data: bytes, content_type: str = "image/png") -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode()}"


def mask_uri(width: int = 64, height: int = 64) -> str:
    buffer = io.BytesIO()
    Image.new("L", (width, height), 255).save(buffer, format="PNG")
    return data_uri(buffer.getvalue())


def png_data_uri(image) -> str:
    """`image` as a PNG data URI, as a job's init_image names it."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return to_data_uri(buffer.getvalue(), "image/png")


def init_picture(size: int = 64) -> Image.Image:
    """A picture with structure a VAE keeps: a gradient, a disc and a bar."""
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    array = np.stack([np.add.outer(ramp, ramp) / 2, np.tile(ramp, (size, 1)), np.tile(ramp[::-1, None], (1, size))], -1)
    image = Image.fromarray(array.astype(np.uint8))
    draw = ImageDraw.Draw(image)
    draw.ellipse((8, 8, 30, 30), fill=(250, 40, 40))
    draw.rectangle((36, 40, 60, 50), fill=(20, 20, 220))
    return image


def right_half_mask(size: int = 64) -> Image.Image:
    mask = Image.new("L", (size, size), 0)
    ImageDraw.Draw(mask).rectangle((size // 2, 0, size - 1, size - 1), fill=255)
    return mask
