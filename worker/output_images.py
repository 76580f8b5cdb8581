"""A finished job's output images: encoded in its output format and stored in the image store, on its task thread."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from storage.image_store import ImageStore

PILLOW_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}  # GenerationParams.output_format -> Pillow's name


@dataclass
class OutputImage:
    """One encoded image of a job, with the key and metadata it is stored under."""

    key: str
    data: bytes
    metadata: dict[str, str]


def encode_image(image: Any, output_format: str = "png", quality: int = 90) -> bytes:
    """PNG (lossless; quality ignored), or JPEG/WebP at `quality` (1-100)."""
    buffer = io.BytesIO()
    options = {} if output_format == "png" else {"quality": quality}
    image.convert("RGB").save(buffer, format=PILLOW_FORMATS[output_format], **options)
    return buffer.getvalue()


def output_images(
    image_store: ImageStore, job_id: str, encoded: list[bytes], seeds: list[int], model: str, output_format: str
) -> list[OutputImage]:
    """Each encoded image under its deterministic key (its extension the format): a repeated run or upload
    overwrites the same keys."""
    return [
        OutputImage(
            key=image_store.key_for(job_id, index, output_format),
            data=data,
            metadata={"job_id": job_id, "index": str(index), "seed": str(seeds[index]), "model": model},
        )
        for index, data in enumerate(encoded)
    ]


def put_images(image_store: ImageStore, images: list[OutputImage]) -> list[str]:
    """Store the images; returns their keys. Raises the store's StorageError."""
    for image in images:
        image_store.put_image(image.key, image.data, image.metadata)
    return [image.key for image in images]


def store_images(
    image_store: ImageStore, job_id: str, encoded: list[bytes], seeds: list[int], model: str, output_format: str
) -> list[str]:
    return put_images(image_store, output_images(image_store, job_id, encoded, seeds, model, output_format))
