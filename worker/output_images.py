"""A finished job's outputs: encoded in its output format (core.output_encoding) and stored in the image store, on
its task thread. Each output, an image or a video, is one stored object under a key whose extension is its format
(so its content type: `core.output_formats`).
"""

from __future__ import annotations

from core.output_encoding import encode_image, encode_outputs, encode_video
from storage.image_store import ImageStore

__all__ = ["encode_image", "encode_outputs", "encode_video", "store_images"]


def store_images(
    image_store: ImageStore, job_id: str, encoded: list[bytes], seeds: list[int], model: str, output_format: str
) -> list[str]:
    """Store each encoded output under its deterministic key (its extension the format); a repeated run overwrites
    the same keys."""
    keys = []
    for index, data in enumerate(encoded):
        key = image_store.key_for(job_id, index, output_format)
        metadata = {"job_id": job_id, "index": str(index), "seed": str(seeds[index]), "model": model}
        image_store.put_image(key, data, metadata)
        keys.append(key)
    return keys
