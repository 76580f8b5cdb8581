"""A finished job's output images: encoded in its output format and stored in the image store, on its task thread."""

from __future__ import annotations

import io
from typing import Any

from storage.image_store import ImageStore

PILLOW_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}  # GenerationParams.output_format -> Pillow's name


def encode_image(image: Any, output_format: str = "png", quality: int = 90) -> bytes:
    """PNG (lossless; quality ignored), or JPEG/WebP at `quality` (1-100)."""
    buffer = io.BytesIO()
    options = {} if output_format == "png" else {"quality": quality}
    image.convert("RGB").save(buffer, format=PILLOW_FORMATS[output_format], **options)
    return buffer.getvalue()


def store_images(
    image_store: ImageStore, job_id: str, encoded: list[bytes], seeds: list[int], model: str, output_format: str
) -> list[str]:
    """Store each encoded image under its deterministic key (its extension the format); a repeated run overwrites
    the same keys."""
    keys = []
    for index, data in enumerate(encoded):
        key = image_store.key_for(job_id, index, output_format)
        metadata = {"job_id": job_id, "index": str(index), "seed": str(seeds[index]), "model": model}
        image_store.put_image(key, data, metadata)
        keys.append(key)
    return keys
