"""OpenAI images request fields -> a stepwise job request (api.openai_images).

Generations arrive as JSON, edits as a multipart form whose values are all strings; both are
validated by the OpenAI request model the OpenAPI document shows (api.openai_schemas: JSON
strictly, a form's text as the numbers it spells), then translated. Unknown names are refused as
OpenAI refuses them; what the job's own validation checks (api.job_validation.validate_job) it checks
there, so the rules are the same as `POST /v1/jobs`'s.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from werkzeug.datastructures import FileStorage, MultiDict

from api.errors import ApiError, from_params_error, from_validation_error, invalid
from api.openai_schemas import EXTENSIONS, OpenAIImageFields
from core.errors import InvalidParamsError
from core.families import FAMILIES
from core.image_inputs import INPUT_FORMATS, MAX_IMAGE_BYTES, REFERENCE_IMAGES, open_image, to_data_uri

SIZE = re.compile(r"([0-9]{1,5})x([0-9]{1,5})")


@dataclass(frozen=True)
class JobTranslation:
    job: dict[str, Any]  # a POST /v1/jobs body
    response_format: str  # b64_json or url


def translate(fields: Any, *, images: dict[str, Any], is_form: bool = False) -> JobTranslation:
    """`fields`: the JSON object, or the form's values (`is_form`); `images`: the job's image fields (edits:
    `edit_images`)."""
    if not isinstance(fields, dict):
        raise invalid(None, "the request body must be a JSON object")
    for name in fields:
        if name not in OpenAIImageFields.model_fields:
            raise invalid(name, f"Unrecognized request argument supplied: {name}")
    try:
        request = OpenAIImageFields.model_validate(fields, strict=not is_form)
    except ValidationError as e:
        raise from_validation_error(e) from e
    job: dict[str, Any] = {"prompt": request.prompt, **images}
    if request.model is not None:
        job["model"] = request.model
    if request.n is not None:
        job["num_images"] = request.n
    match = SIZE.fullmatch(request.size or "")
    if match is not None:  # else auto, or none: the job's (or its image's) own size
        job["width"], job["height"] = int(match.group(1)), int(match.group(2))
        if "init_image" in images:
            job["resize_mode"] = "crop"  # an image of another size is scaled to cover the size, then cropped
    if request.output_format is not None:
        job["output_format"] = request.output_format
    if request.output_compression is not None:
        job["output_quality"] = max(1, request.output_compression)  # OpenAI's 0 is JPEG/WebP's lowest, 1
    for name in EXTENSIONS:
        value = getattr(request, name)
        if value is not None:
            job[name] = value
    return JobTranslation(job, request.response_format or "b64_json")


def check_model_kind(model: str, family: str | None, *, wants_video: bool) -> None:
    """The images routes draw images and /v1/videos makes videos: a model of the other kind gets 400 naming
    `model` and the route that serves it (a video model's MP4 in `b64_json` helps no images client)."""
    if family is None or FAMILIES[family].is_video == wants_video:
        return
    if wants_video:
        message = f"model {model!r} draws images ({family} family): POST /v1/images/generations"
        raise ApiError(400, "model_not_video", message, field="model")
    message = f"model {model!r} makes videos ({family} family): POST /v1/videos"
    raise ApiError(400, "model_not_image", message, field="model")


def edit_images(files: MultiDict[str, FileStorage]) -> dict[str, Any]:
    """The images to edit and the optional `mask` as data URIs: one image (a part named `image`, or one `image[]`)
    is the job's `init_image`, several (repeated `image` parts, or `image[]` as OpenAI's SDKs send a list) its
    `reference_images` in order, for the models that read a list. OpenAI's mask edits where it is transparent;
    stepwise's repaints where it is white: the mask's alpha channel becomes that."""
    parts = files.getlist("image") + files.getlist("image[]")
    if not parts:
        raise invalid("image", "image: send the image to edit as a file part named image (several: image[])")
    uris = [data_uri("image" if len(parts) == 1 else f"image[{index}]", part) for index, part in enumerate(parts)]
    images: dict[str, Any] = {"init_image": uris[0]} if len(uris) == 1 else {REFERENCE_IMAGES: uris}
    mask = files.get("mask")
    if mask is not None:
        images["mask_image"] = mask_from_alpha(mask)
    return images


def read_part(field: str, part: FileStorage) -> bytes:
    data = part.read(MAX_IMAGE_BYTES + 1)
    if not data:
        raise invalid(field, f"{field}: the file is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ApiError(413, "payload_too_large", f"{field}: at most {MAX_IMAGE_BYTES} bytes", field=field)
    return data


def data_uri(field: str, part: FileStorage) -> str:
    data = read_part(field, part)
    try:
        image = open_image(field, data)
    except InvalidParamsError as e:
        raise from_params_error(e) from e
    return to_data_uri(data, INPUT_FORMATS[image.format or "PNG"])


def mask_from_alpha(part: FileStorage) -> str:
    data = read_part("mask", part)
    try:
        image = open_image("mask", data)
    except InvalidParamsError as e:
        raise from_params_error(e) from e
    if "A" not in image.getbands() and "transparency" not in image.info:
        raise invalid("mask", "mask must have an alpha channel: transparent where the image should be edited")
    alpha = image.convert("RGBA").getchannel("A")
    repaint = alpha.point(lambda value: 255 if value < 128 else 0)  # transparent: repaint (white)
    buffer = io.BytesIO()
    repaint.save(buffer, format="PNG")
    return to_data_uri(buffer.getvalue(), "image/png")
