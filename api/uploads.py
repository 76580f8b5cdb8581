"""POST /v1/uploads: store an input image for the caller's tenant and return its id.

The body is the image itself or a multipart form with the image in a `file` part (its
filename is never read). The bytes decide the format, not the Content-Type: the image is
decoded with Pillow (core.image_inputs: PNG, JPEG or WebP) and checked
against the same byte and pixel limits as inline images, then kept in Redis as long as a
job record (storage.upload_store). Jobs name it in `init_image`, `mask_image` or `reference_images`; only the
uploading tenant can.
"""

from __future__ import annotations

from flask import Blueprint, g, request

from api.answers import UploadView
from api.auth import require_tenant
from api.errors import ApiError, from_params_error, invalid
from api.openapi_operations import BINARY, IMAGE_TYPES, Answer, api_errors, documented
from api.request_body import read_form
from api.resources import get_upload_store
from core.errors import InvalidParamsError
from core.image_inputs import INPUT_FORMATS, MAX_IMAGE_BYTES, open_image, to_data_uri, upright_size
from storage.errors import StorageError

bp = Blueprint("uploads", __name__, url_prefix="/v1/uploads")
bp.before_request(require_tenant)

MULTIPART_OVERHEAD_BYTES = 64 * 1024  # form boundaries and part headers around the image


@bp.post("")
@documented(
    "Store an input image (init_image, mask_image, an item of reference_images) for the caller's tenant; expires "
    "like jobs.",
    body_content={
        **dict.fromkeys(IMAGE_TYPES, BINARY),
        "multipart/form-data": {
            "schema": {"type": "object", "required": ["file"], "properties": {"file": BINARY["schema"]}}
        },
    },
    responses={201: Answer("Stored; name its id in init_image, mask_image or reference_images.", UploadView)},
    errors=api_errors(413, 422, 503),
)
def upload_image():
    limit = MAX_IMAGE_BYTES + MULTIPART_OVERHEAD_BYTES  # this route's own limit, not STEPWISE_MAX_BODY_BYTES
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "too_large", f"file: an upload is at most {MAX_IMAGE_BYTES} bytes", field="file")
    request.max_content_length = limit
    data = _image_bytes()
    try:
        image = open_image("file", data)
        width, height = upright_size("file", image)
    except InvalidParamsError as e:
        raise from_params_error(e) from e
    assert image.format is not None  # open_image accepts only the formats it knows
    content_type = INPUT_FORMATS[image.format]
    uploads = get_upload_store()
    try:
        upload_id = uploads.put(g.tenant, to_data_uri(data, content_type))
    except StorageError as e:
        raise ApiError(
            503, "unavailable", "the upload store is unavailable; retry later", headers={"Retry-After": "5"}
        ) from e
    return {
        "id": upload_id,
        "content_type": content_type,
        "width": width,
        "height": height,
        "bytes": len(data),
        "expires_in": uploads.ttl_seconds,
    }, 201


def _image_bytes() -> bytes:
    if request.mimetype == "multipart/form-data":
        part = read_form()[1].get("file")
        if part is None:
            raise invalid("file", "file: send the image in a multipart part named 'file'")
        data = part.read(MAX_IMAGE_BYTES + 1)
    else:
        data = request.get_data(cache=False)
    if not data:
        raise invalid("file", "file: the request carries no image; send the image as the body or a 'file' part")
    return data
