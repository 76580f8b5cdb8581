"""Input images of image-to-image and inpainting jobs: decoding, limits, resizing. Torch-free.

A job names its images in `init_image` / `mask_image` as a `data:` URI (base64 PNG, JPEG
or WebP) or, through the API, as an upload id (`upl_...`, resolved to a data URI by the
worker before the engine sees the job). Every check here raises `InvalidParamsError`
naming the field, so the API (which imports this module without torch) and the engine
refuse the same inputs with the same words.

`resize_mode` says what happens when an image's size differs from the job's:
- "none" (default): a mismatch is an error naming the field;
- "stretch": resize to the job's size, aspect ratio not kept;
- "crop": scale to cover the job's size keeping the aspect ratio, then center-crop.
A mask is resized/cropped the same way as its init image, and must have the init image's
size before that. Masks are read as grayscale: white (>= 128) is repainted, black is kept.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings

from PIL import Image

from batching.errors import InvalidParamsError

IMAGE_FIELDS = ("init_image", "mask_image")
RESIZE_MODES = ("none", "stretch", "crop")
INPUT_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}  # Pillow format -> MIME type
MAX_IMAGE_BYTES = 10 * 1024 * 1024  # one input image, encoded
MAX_IMAGE_PIXELS = 4096 * 4096  # one input image, decoded (Pillow's decompression-bomb guard is larger)
MAX_DATA_URI_CHARS = (MAX_IMAGE_BYTES + 2) // 3 * 4 + 100  # base64 of the largest image plus its header
UPLOAD_ID = re.compile(r"^upl_[0-9a-f]{32}$")
_DATA_URI = re.compile(r"^data:(image/(?:png|jpeg|jpg|webp));base64,", re.IGNORECASE)


def is_upload_id(value: str) -> bool:
    return bool(UPLOAD_ID.match(value))


def check_reference(field: str, value: object) -> str:
    """Cheap shape check of an image field's value (a data URI or an upload id), no decoding."""
    if not isinstance(value, str):
        raise InvalidParamsError(field, value, "must be a data: URI (base64 PNG, JPEG or WebP) or an upload id")
    if len(value) > MAX_DATA_URI_CHARS:
        raise InvalidParamsError(
            field, f"<{len(value)} characters>", f"must be at most {MAX_IMAGE_BYTES} bytes of image"
        )
    if not (is_upload_id(value) or _DATA_URI.match(value)):
        shown = value[:40] + ("..." if len(value) > 40 else "")
        raise InvalidParamsError(
            field,
            shown,
            "must be a data:image/png|jpeg|webp;base64,... URI or an upload id (URLs: only through the API, "
            "from hosts its operator allows)",
        )
    return value


def data_uri_bytes(field: str, value: str) -> bytes:
    """The image bytes of a data URI."""
    match = _DATA_URI.match(check_reference(field, value))
    if not match:
        raise InvalidParamsError(field, value[:40], "is an upload id: the worker resolves it before the engine runs")
    try:
        return base64.b64decode(value[match.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParamsError(field, value[:40] + "...", "is not valid base64") from None


def to_data_uri(data: bytes, content_type: str) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode('ascii')}"


def open_image(field: str, data: bytes) -> Image.Image:
    """Decode image bytes fully, within the byte and pixel limits; PNG, JPEG and WebP only."""
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidParamsError(field, f"<{len(data)} bytes>", f"must be at most {MAX_IMAGE_BYTES} bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in INPUT_FORMATS:
                raise InvalidParamsError(field, image.format, "must be a PNG, JPEG or WebP image")
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise InvalidParamsError(
                    field, f"{image.width}x{image.height}", f"must have at most {MAX_IMAGE_PIXELS} pixels"
                )
            image.load()
    except InvalidParamsError:
        raise
    except Exception as e:  # Pillow raises many kinds for corrupt data
        raise InvalidParamsError(
            field, f"<{len(data)} bytes>", f"is not a decodable image ({type(e).__name__})"
        ) from None
    return image


def content_type_of(field: str, data: bytes) -> str:
    image_format = open_image(field, data).format
    assert image_format is not None  # open_image refuses formats outside INPUT_FORMATS
    return INPUT_FORMATS[image_format]


def image_size(field: str, value: str) -> tuple[int, int]:
    """(width, height) of a data URI's image, reading only its header."""
    try:
        image = Image.open(io.BytesIO(data_uri_bytes(field, value)))
        return image.size
    except InvalidParamsError:
        raise
    except Exception as e:
        raise InvalidParamsError(field, value[:40] + "...", f"is not a decodable image ({type(e).__name__})") from None


def job_images(params: object) -> tuple[Image.Image | None, Image.Image | None]:
    """The job's init image (RGB) and mask (L, 0 or 255) at the job's size, resized as `resize_mode` says;
    each None when not given. Refuses what the fields' rules forbid, naming the field."""
    init_value, mask_value = getattr(params, "init_image", None), getattr(params, "mask_image", None)
    if init_value is None:
        if mask_value is not None:
            raise InvalidParamsError("mask_image", "<image>", "needs an init_image")
        return None, None
    init = open_image("init_image", data_uri_bytes("init_image", init_value))
    mask = open_image("mask_image", data_uri_bytes("mask_image", mask_value)) if mask_value is not None else None
    if mask is not None and mask.size != init.size:
        raise InvalidParamsError(
            "mask_image", f"{mask.width}x{mask.height}", f"must have the init_image's size {init.width}x{init.height}"
        )
    size = (params.width, params.height)  # type: ignore[attr-defined]
    mode = params.resize_mode  # type: ignore[attr-defined]
    init = _fit("init_image", init.convert("RGB"), size, mode)
    if mask is not None:
        mask = _fit("mask_image", mask.convert("L"), size, mode).point(lambda v: 255 if v >= 128 else 0)
    return init, mask


def keep_unmasked_pixels(params: object, image: Image.Image) -> Image.Image:
    """An inpainting result with the init image's own pixels outside the mask (diffusers' `apply_overlay`,
    what AUTOMATIC1111 does by default): the VAE round trip would otherwise blur the region the user kept."""
    if getattr(params, "mask_image", None) is None:
        return image
    init, mask = job_images(params)
    assert init is not None and mask is not None  # a mask_image is refused without an init_image
    return Image.composite(image.convert("RGB"), init, mask)  # mask white: the generated pixels


def _fit(field: str, image: Image.Image, size: tuple[int, int], mode: str) -> Image.Image:
    if image.size == size:
        return image
    if mode == "none":
        raise InvalidParamsError(
            field,
            f"{image.width}x{image.height}",
            f"must be {size[0]}x{size[1]} (the job's width x height), or set resize_mode "
            f"to {' or '.join(RESIZE_MODES[1:])}",
        )
    resample = Image.Resampling.NEAREST if image.mode == "L" else Image.Resampling.LANCZOS
    if mode == "stretch":
        return image.resize(size, resample)
    scale = max(size[0] / image.width, size[1] / image.height)  # "crop": cover, then center-crop
    scaled_size = (max(size[0], round(image.width * scale)), max(size[1], round(image.height * scale)))
    scaled = image.resize(scaled_size, resample)
    left, top = (scaled.width - size[0]) // 2, (scaled.height - size[1]) // 2
    return scaled.crop((left, top, left + size[0], top + size[1]))
