"""OpenAI images request fields -> a stepwise job request (api.openai_images).

Generations arrive as JSON, edits as a multipart form whose values are all strings; both go
through `translate`, which refuses unknown names as OpenAI does and leaves every value check it
can to the job's own validation (api.submission.validate_job), so the rules are the same as
`POST /v1/jobs`'s.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

from werkzeug.datastructures import FileStorage, MultiDict

from api.errors import ApiError, from_params_error, invalid
from core.errors import InvalidParamsError
from core.image_inputs import INPUT_FORMATS, MAX_IMAGE_BYTES, open_image, to_data_uri

RESPONSE_FORMATS = ("b64_json", "url")
OUTPUT_FORMATS = ("png", "jpeg", "webp")
# OpenAI fields that change nothing here (quality tiers, moderation, identifiers, ...): accepted, ignored.
IGNORED = frozenset(
    {"quality", "style", "user", "safety_identifier", "moderation", "complexity", "input_fidelity", "partial_images"}
)
# stepwise's own job fields a client may add (the SDKs' extra_body), with their types for multipart strings.
EXTENSIONS: dict[str, type] = {
    "seed": int,
    "negative_prompt": str,
    "num_inference_steps": int,
    "guidance_scale": float,
    "sampler": str,
    "priority": str,
    "strength": float,
    "lora": str,
    "lora_scale": float,
}
TRANSLATED = frozenset(
    {"prompt", "model", "n", "size", "response_format", "output_format", "output_compression", "background", "stream"}
)
SIZE = re.compile(r"(\d{1,5})x(\d{1,5})")


@dataclass(frozen=True)
class JobTranslation:
    job: dict[str, Any]  # a POST /v1/jobs body
    response_format: str  # b64_json or url


def translate(fields: Any, *, images: dict[str, str]) -> JobTranslation:
    """`fields`: the JSON object or the form's values; `images`: init_image / mask_image data URIs (edits)."""
    if not isinstance(fields, dict):
        raise invalid(None, "the request body must be a JSON object")
    for name in fields:
        if name not in TRANSLATED and name not in IGNORED and name not in EXTENSIONS:
            raise invalid(name, f"Unrecognized request argument supplied: {name}")
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise invalid("prompt", "prompt: a text description of the image is required")
    job: dict[str, Any] = {"prompt": prompt, **images}
    if fields.get("model") is not None:
        job["model"] = fields["model"]
    if fields.get("n") is not None:
        job["num_images"] = number("n", fields["n"], int)
    size = fields.get("size")
    if size is not None and size != "auto":
        match = SIZE.fullmatch(size) if isinstance(size, str) else None
        if match is None:
            raise invalid("size", f"size must be WIDTHxHEIGHT in pixels, such as 512x512, or auto (got {size!r})")
        job["width"], job["height"] = int(match.group(1)), int(match.group(2))
        if images:
            job["resize_mode"] = "crop"  # an image of another size is scaled to cover the size, then cropped
    response_format = fields.get("response_format") or "b64_json"
    if response_format not in RESPONSE_FORMATS:
        raise invalid("response_format", f"response_format must be b64_json or url (got {response_format!r})")
    output_format = fields.get("output_format")
    if output_format is not None:
        if output_format not in OUTPUT_FORMATS:
            raise invalid("output_format", f"output_format must be one of {', '.join(OUTPUT_FORMATS)} here")
        job["output_format"] = output_format
    if fields.get("output_compression") is not None:
        job["output_quality"] = max(1, number("output_compression", fields["output_compression"], int))
    if fields.get("background") not in (None, "auto", "opaque"):
        raise invalid("background", "background: only auto or opaque; these models draw no transparency")
    if fields.get("stream") not in (None, False, "false"):
        raise invalid("stream", "stream is not supported here: GET /v1/jobs/{id}/events streams a job's progress")
    for name, kind in EXTENSIONS.items():
        if fields.get(name) is not None:
            job[name] = number(name, fields[name], kind) if kind is not str else fields[name]
    return JobTranslation(job, response_format)


def number(name: str, value: Any, kind: type) -> Any:
    """A number as JSON sends it, or as a form field's text."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise invalid(name, f"{name} must be {what} (got {value!r})") from None
    return value  # the job's validation checks its type and range


def edit_images(files: MultiDict[str, FileStorage]) -> dict[str, str]:
    """`image` (or the first `image[]`) and the optional `mask` as data URIs. OpenAI's mask edits where it
    is transparent; stepwise's repaints where it is white: the mask's alpha channel becomes that."""
    part = files.get("image") or files.get("image[]")
    if part is None:
        raise invalid("image", "image: send the image to edit as a file part named image")
    images = {"init_image": data_uri("image", part)}
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
