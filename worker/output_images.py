"""A finished job's outputs: encoded in its output format (core.output_encoding) and stored in the image store, on
its job's thread. Each output, an image or a video, is one stored object under a key whose extension is its format
(so its content type: `core.output_formats`).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.output_encoding import encode_image, encode_outputs, encode_video
from storage.image_store import ImageStore

__all__ = [
    "OutputImage",
    "encode_image",
    "encode_outputs",
    "encode_video",
    "output_images",
    "put_images",
    "store_images",
]


@dataclass
class OutputImage:
    """One encoded output of a job (an image or a video), with the key and metadata it is stored under."""

    key: str
    data: bytes
    metadata: dict[str, str]


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
    """Store each encoded output under its deterministic key (its extension the format); a repeated run overwrites
    the same keys."""
    return put_images(image_store, output_images(image_store, job_id, encoded, seeds, model, output_format))
