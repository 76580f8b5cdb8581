"""PNG encoding and upload of a finished job's images, on its task thread."""

from __future__ import annotations

import io
from typing import Any

from storage.image_store import ImageStore


def encode_png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def upload_images(image_store: ImageStore, job_id: str, images: list[Any], seeds: list[int], model: str) -> list[str]:
    """Store each image under its deterministic key; a repeated run overwrites the same keys."""
    keys = []
    for index, image in enumerate(images):
        key = image_store.key_for(job_id, index)
        metadata = {"job_id": job_id, "index": str(index), "seed": str(seeds[index]), "model": model}
        image_store.put_png(key, encode_png(image), metadata)
        keys.append(key)
    return keys
