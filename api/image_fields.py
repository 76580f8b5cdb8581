"""A job's input images in the API: resolving upload ids, checking the images, keeping records small.

`init_image` / `mask_image` and each item of `reference_images` (the field `reference_images[i]`,
`core.image_inputs.image_entries`) arrive as data URIs, upload ids or http(s) URLs. Before the
engine's rules run, an upload id is replaced by the tenant's stored image (a missing,
expired or other tenant's upload is one and the same 422 naming the field) and a URL by
the image fetched from it, if the operator allows its host (`api.remote_images`; otherwise
a 422 naming the field; a batch fetches all its items' URLs together first, with
`remote_image_urls` and `fetch_images`, and hands each item the results); then the images
are decoded and checked with Pillow (`core.image_inputs.input_images`: formats, byte and
pixel limits, sizes, the mask); and the record keeps upload ids only: an inline or fetched
image is stored as an upload of the tenant by the script that creates the job, only if it does (so a 409, a full
queue or an idempotent replay leaves none), as a canonical data URI (its own MIME type, plain base64: whatever
form of base64 or media type the caller sent, the worker reads one form).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.errors import ApiError, from_params_error, invalid
from api.remote_images import DEFAULT_FETCH_SECONDS, ImageURL, fetch_images, is_remote_url
from core.errors import InvalidParamsError
from core.image_inputs import canonical_data_uri, image_entries, input_images, is_upload_id, with_images
from core.params import GenerationParams
from storage.errors import StorageError
from storage.upload_store import UploadStore
from storage.url_policy import AllowList


def remote_image_urls(params: Any, prefix: str = "") -> list[ImageURL]:
    """The (field, url) of each image of a job's params (as sent) given as an http(s) URL."""
    if not isinstance(params, dict):
        return []
    return [(f"{prefix}{field}", value) for field, value in image_entries(params) if is_remote_url(value)]


def resolve_images(
    params: dict[str, Any],
    tenant: str,
    uploads: UploadStore | None,
    prefix: str = "",
    *,
    image_hosts: AllowList = AllowList(),  # noqa: B008  # frozen: a shared default is safe
    fetch_seconds: float = DEFAULT_FETCH_SECONDS,
    fetched: Mapping[ImageURL, str | ApiError] | None = None,
) -> dict[str, Any]:
    """The params with each upload id replaced by the tenant's image and each URL by the fetched image
    (data URIs). URLs not in `fetched` (a batch's results, fetched together) are fetched now, together."""
    fetched = fetched or {}
    missing = [image_url for image_url in remote_image_urls(params, prefix) if image_url not in fetched]
    if missing:
        fetched = {**fetched, **fetch_images(missing, image_hosts, seconds=fetch_seconds)}
    resolved: dict[str, str] = {}
    for field, value in image_entries(params):
        if is_remote_url(value):
            result = fetched[(f"{prefix}{field}", value)]
            if isinstance(result, ApiError):
                raise result
            resolved[field] = result
        elif isinstance(value, str) and is_upload_id(value):
            data_uri = _get(uploads, tenant, value) if uploads is not None else None
            if data_uri is None:
                raise invalid(f"{prefix}{field}", f"{prefix}{field} names no upload of yours (it may have expired)")
            resolved[field] = data_uri
    return with_images(params, resolved)


def check_images(params: GenerationParams, prefix: str = "") -> None:
    try:
        input_images(params)
    except InvalidParamsError as e:
        raise from_params_error(e, prefix) from e


def sent_upload_ids(sent: dict[str, Any]) -> dict[str, str]:
    """Image field -> upload id, for the images of a job (as sent) that name an upload."""
    return {field: value for field, value in image_entries(sent) if isinstance(value, str) and is_upload_id(value)}


def record_params(
    params: GenerationParams, upload_ids: Mapping[str, str], tenant: str, uploads: UploadStore | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """What the job record keeps: the params with upload ids in place of images; and the uploads to store with
    the job (Redis key -> data URI) for each image sent inline or by URL. Writes nothing: the script that creates
    the job stores them, only if it does (`storage.new_job`)."""
    stored = params.to_dict()
    new_uploads: dict[str, str] = {}
    if uploads is None:
        return stored, new_uploads
    kept: dict[str, str] = {}
    for field, value in image_entries(stored):
        if field in upload_ids:
            kept[field] = upload_ids[field]
        else:
            upload_id, key = uploads.pending(tenant, value)
            new_uploads[key] = canonical_data_uri(field, value)
            kept[field] = upload_id
    return with_images(stored, kept), new_uploads


def _get(uploads: UploadStore, tenant: str, upload_id: str) -> str | None:
    try:
        return uploads.get(tenant, upload_id)
    except StorageError as e:
        raise ApiError(
            503, "unavailable", "the job store is unavailable; retry later", headers={"Retry-After": "5"}
        ) from e
