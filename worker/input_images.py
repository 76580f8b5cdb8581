"""A job's input images on the worker: the record holds upload ids, the engine takes data URIs."""

from __future__ import annotations

from typing import Any

from core.errors import InvalidParamsError
from core.image_inputs import IMAGE_FIELDS, is_upload_id
from storage.upload_store import UploadStore


def with_input_images(params: dict[str, Any], tenant: str, uploads: UploadStore) -> dict[str, Any]:
    """The record's params with each upload id replaced by its image; an upload that expired while the job
    waited fails the job, naming the field."""
    resolved = dict(params)
    for name in IMAGE_FIELDS:
        value = resolved.get(name)
        if isinstance(value, str) and is_upload_id(value):
            data_uri = uploads.get(tenant, value)
            if data_uri is None:
                raise InvalidParamsError(name, value, "names an upload that no longer exists (expired)")
            resolved[name] = data_uri
    return resolved
