"""A job's input images on the worker: the record holds upload ids, the engine takes data URIs."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidParamsError
from core.image_inputs import image_entries, is_upload_id, with_images
from storage.upload_store import UploadStore


def with_input_images(params: dict[str, Any], tenant: str, uploads: UploadStore) -> dict[str, Any]:
    """The record's params with each upload id replaced by its image; an upload that expired while the job
    waited fails the job, naming the field."""
    resolved: dict[str, str] = {}
    for field, value in image_entries(params):
        if isinstance(value, str) and is_upload_id(value):
            data_uri = uploads.get(tenant, value)
            if data_uri is None:
                raise InvalidParamsError(field, value, "names an upload that no longer exists (expired)")
            resolved[field] = data_uri
    return with_images(params, resolved)
