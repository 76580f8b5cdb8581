"""Input images of image-to-image and inpainting jobs: decoding, limits, resizing. Torch-free.

A job names its images in `init_image` / `mask_image`, and a list of them in `reference_images` (for
the families that read several: `FamilySpec.max_reference_images`; there `init_image` is the list's
one-image form), each as a `data:` URI (base64 PNG, JPEG or WebP) or, through the API, as an upload
id (`upl_...`, resolved to a data URI by the worker before the engine sees the job) or a URL (fetched
by the API). A listed image's field is `reference_images[i]` (`image_entries`). Every check here raises
`InvalidParamsError` naming the field, so the API (which imports this module without torch) and the engine
refuse the same inputs with the same words, and read the same pixels from what they accept.

Hostile bytes: only Pillow's PNG, JPEG and WebP plugins ever parse them, and the byte and
pixel limits are checked on the header, before any pixel is decoded (Pillow's own
decompression-bomb error and warning, and its limit on PNG text and ICC chunks, become the
same refusal). Odd but valid images are read as diffusers' `load_image` reads them: the
first frame of an animation or of a multi-picture camera JPEG (MPO), turned as the EXIF
orientation says, converted to RGB (alpha dropped, not composited) or, for a mask, to
grayscale (ITU-R 601 luma of the colours, alpha ignored); one difference: 16-bit gray is
scaled to 8 bits, where Pillow's conversion would clip it to near white.

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
import contextlib
import io
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from core.errors import InvalidParamsError
from core.families import FAMILIES, FamilySpec, ReferenceRules

IMAGE_FIELDS = ("init_image", "mask_image")  # the one-image fields
REFERENCE_IMAGES = "reference_images"  # the list field
RESIZE_MODES = ("none", "stretch", "crop")
PILLOW_FORMATS = ("PNG", "JPEG", "WEBP")  # the only Pillow plugins that ever parse input bytes
INPUT_FORMATS = {  # Pillow format -> MIME type; MPO: a camera JPEG holding more pictures, read as its first
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",
    "WEBP": "image/webp",
}
MAX_IMAGE_BYTES = 10 * 1024 * 1024  # one input image, encoded
MAX_IMAGE_PIXELS = 4096 * 4096  # one input image, decoded (Pillow's decompression-bomb guard is larger)
MAX_DATA_URI_CHARS = (MAX_IMAGE_BYTES + 2) // 3 * 4 * 78 // 76 + 100  # its base64, wrapped at 76 with CRLF, header
UPLOAD_ID = re.compile(r"^upl_[0-9a-f]{32}$")
# data:[<type>/<subtype>][;<name>=<value>]*;base64, -- the media type is not trusted: the bytes decide the format
_DATA_URI = re.compile(r"^data:(?:[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[^;,]*)*;base64,", re.IGNORECASE)
_URL_SAFE_BASE64 = str.maketrans("-_", "+/")
_OTHER_FORMATS = {  # leading bytes -> name, only for the message refusing them
    b"GIF8": "GIF",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
    b"BM": "BMP",
    b"\x00\x00\x01\x00": "ICO",
    b"\xff\x0a": "JPEG XL",
    b"\x00\x00\x00\x0cJXL ": "JPEG XL",
    b"\x00\x00\x00\x0cjP  ": "JPEG 2000",
}
_TURNED_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def image_entries(params: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(field, value) of each image a job's params (a dict, as sent or stored) name: init_image and mask_image,
    then each item of reference_images as `reference_images[i]`. Values are not checked."""
    entries = [(name, params[name]) for name in IMAGE_FIELDS if params.get(name) is not None]
    listed = params.get(REFERENCE_IMAGES)
    if isinstance(listed, (list, tuple)):
        entries += [(f"{REFERENCE_IMAGES}[{index}]", value) for index, value in enumerate(listed)]
    return entries


def with_images(params: Mapping[str, Any], images: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `params` with the image at each field of `images` (an `image_entries` field) replaced."""
    replaced = dict(params)
    for field, value in images.items():
        name, _, index = field.partition("[")
        if index:
            listed = list(replaced[name])
            listed[int(index.rstrip("]"))] = value
            replaced[name] = listed
        else:
            replaced[name] = value
    return replaced


def listed_images(params: object, spec: FamilySpec) -> list[tuple[str, Any]]:
    """(field, value) of the images a list-taking family reads, in order: reference_images' items, or init_image
    as the list's one-image form; [] for other families and for a job with neither."""
    if not spec.max_reference_images:
        return []
    listed = getattr(params, REFERENCE_IMAGES, None)
    if isinstance(listed, tuple) and listed:
        return [(f"{REFERENCE_IMAGES}[{index}]", value) for index, value in enumerate(listed)]
    init = getattr(params, "init_image", None)
    return [("init_image", init)] if init is not None else []


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


def is_data_uri(value: object) -> bool:
    return isinstance(value, str) and bool(_DATA_URI.match(value))


def data_uri_bytes(field: str, value: str) -> bytes:
    """The image bytes of a data URI. The base64 may be line-wrapped, URL-safe or unpadded: what encoders send."""
    match = _DATA_URI.match(check_reference(field, value))
    if not match:
        raise InvalidParamsError(field, value[:40], "is an upload id: the worker resolves it before the engine runs")
    text = "".join(value[match.end() :].split()).translate(_URL_SAFE_BASE64)
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParamsError(field, value[:40] + "...", "is not valid base64") from None


def to_data_uri(data: bytes, content_type: str) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode('ascii')}"


def canonical_data_uri(field: str, value: str) -> str:
    """A data URI in the one form every reader takes: the image's own MIME type, plain padded base64."""
    data = data_uri_bytes(field, value)
    image_format = _open_header(field, data).format
    assert image_format is not None  # _open_header refuses formats outside INPUT_FORMATS
    return to_data_uri(data, INPUT_FORMATS[image_format])


def open_image(field: str, data: bytes) -> Image.Image:
    """Decode image bytes (the first frame of an animation) within the byte and pixel limits; PNG, JPEG and
    WebP only. The pixels are as stored: `upright_size` and `job_images` turn them as EXIF says."""
    image = _open_header(field, data)
    with _refusing(field, f"<{len(data)} bytes>"):
        image.load()
    return image


def upright_size(field: str, image: Image.Image) -> tuple[int, int]:
    """(width, height) of an opened image as viewers show it: turned as its EXIF orientation says."""
    with _refusing(field, f"{image.width}x{image.height}"):
        orientation = image.getexif().get(ExifTags.Base.Orientation)
    return (image.height, image.width) if orientation in _TURNED_ORIENTATIONS else image.size


def image_size(field: str, value: str) -> tuple[int, int]:
    """(width, height) of a data URI's image as viewers show it, decoding no more than the limits allow."""
    return upright_size(field, _open_header(field, data_uri_bytes(field, value)))


def job_images(params: object, family: str | None = None) -> tuple[Image.Image | None, Image.Image | None]:
    """The job's init image (RGB) and mask (L, 0 or 255) at the job's size, resized as `resize_mode` says;
    each None when not given. Refuses what the fields' rules forbid, naming the field. `family`: the family
    the engine loaded (else the model name's). An edit family's init_image is the image to edit, as given.
    (A list-taking family's images: `input_images`.)"""
    init_value, mask_value = getattr(params, "init_image", None), getattr(params, "mask_image", None)
    if init_value is None:
        if mask_value is not None:
            raise InvalidParamsError("mask_image", "<image>", "needs an init_image")
        return None, None
    init = _upright_pixels("init_image", init_value, "RGB")
    spec = _spec_of(params, family)
    if spec.init_image_role == "edit":  # the image to edit, as given: the edit pipeline sizes it itself
        return init, None
    mask = _upright_pixels("mask_image", mask_value, "L") if mask_value is not None else None
    if mask is not None and mask.size != init.size:
        raise InvalidParamsError(
            "mask_image", f"{mask.width}x{mask.height}", f"must have the init_image's size {init.width}x{init.height}"
        )
    size = (params.width, params.height)  # type: ignore[attr-defined]
    mode = params.resize_mode  # type: ignore[attr-defined]
    init = _fit("init_image", init, size, mode)
    if mask is not None:
        mask = _fit("mask_image", mask, size, mode).point(lambda v: 255 if v >= 128 else 0)
    return init, mask


def reference_image(field: str, image: Image.Image, rules: ReferenceRules, size_multiple: int) -> Image.Image:
    """A reference image as its family's pipeline prepares it: refused where that pipeline refuses it (naming
    `field`), scaled down to `rules.max_pixels` if above (Lanczos), then center-cropped to multiples of
    `size_multiple`."""
    problem = rules.problem(image.width, image.height)
    if problem is not None:
        raise InvalidParamsError(field, f"{image.width}x{image.height}", problem)
    size = rules.scaled_size(image.width, image.height)
    if size != image.size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    width, height = size[0] - size[0] % size_multiple, size[1] - size[1] % size_multiple
    left, top = (image.width - width) // 2, (image.height - height) // 2
    return image.crop((left, top, left + width, top + height))


@dataclass(frozen=True)
class InputImages:
    """A job's input images, decoded once (`input_images`) and shared by its samples."""

    init: Image.Image | None  # RGB at the job's size (an edit family's: the image to edit, as given); None for a
    # list-taking family, whose images are `listed`
    mask: Image.Image | None  # L, 0 or 255 (white is repainted); None: image-to-image without a mask
    listed: tuple[Image.Image, ...] = ()  # a list-taking family's images in order (init_image: its one-image
    # form), RGB: a reference family's as its pipeline prepares them (`reference_image`), an edit family's as given


def input_images(params: object, family: str | None = None) -> InputImages | None:
    """The job's decoded input images; None for text-to-image. Refuses an image its family's pipeline would not
    read, naming its field (`reference_images[i]` for a listed one)."""
    spec = _spec_of(params, family)
    listed = listed_images(params, spec)
    if listed:
        images = [_upright_pixels(field, value, "RGB") for field, value in listed]
        if spec.reference_rules is not None:
            rules, multiple = spec.reference_rules, spec.size_multiple
            images = [reference_image(field, image, rules, multiple) for (field, _), image in zip(listed, images)]
        return InputImages(None, None, tuple(images))
    init, mask = job_images(params, family)
    return None if init is None else InputImages(init, mask)


def keep_unmasked_pixels(images: InputImages | None, image: Image.Image) -> Image.Image:
    """An inpainting result with the init image's own pixels outside the mask (diffusers' `apply_overlay`,
    what AUTOMATIC1111 does by default): the VAE round trip would otherwise blur the region the user kept."""
    if images is None or images.mask is None:
        return image
    assert images.init is not None  # a mask comes with its init image
    return Image.composite(image.convert("RGB"), images.init, images.mask)  # mask white: the generated pixels


def _spec_of(params: object, family: str | None) -> FamilySpec:
    """The family a job's images are read by: the engine's loaded one, else its model name's."""
    return FAMILIES[family] if family else params.family_spec  # type: ignore[attr-defined]


def _open_header(field: str, data: bytes) -> Image.Image:
    """The image with its header read, no pixels decoded; refused unless PNG, JPEG or WebP within the limits."""
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidParamsError(field, f"<{len(data)} bytes>", f"must be at most {MAX_IMAGE_BYTES} bytes")
    with _refusing(field, f"<{len(data)} bytes>"):
        try:
            image = Image.open(io.BytesIO(data), formats=PILLOW_FORMATS)
        except UnidentifiedImageError:
            other = next((name for magic, name in _OTHER_FORMATS.items() if data.startswith(magic)), None)
            raise InvalidParamsError(
                field, other or f"<{len(data)} bytes>", "must be a PNG, JPEG or WebP image"
            ) from None
    if image.format not in INPUT_FORMATS:
        raise InvalidParamsError(field, image.format, "must be a PNG, JPEG or WebP image")
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise InvalidParamsError(field, f"{image.width}x{image.height}", f"must have at most {MAX_IMAGE_PIXELS} pixels")
    return image


@contextlib.contextmanager
def _refusing(field: str, shown: str) -> Iterator[None]:
    """Pillow's errors (it raises many kinds for corrupt data) and its decompression-bomb warning as
    InvalidParamsError naming the field."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except InvalidParamsError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidParamsError(
            field, shown, f"declares more pixels than Pillow will decode: at most {MAX_IMAGE_PIXELS} are allowed"
        ) from None
    except Exception as e:
        reason = f"{type(e).__name__}: {e}" if isinstance(e, (OSError, ValueError, SyntaxError)) else type(e).__name__
        raise InvalidParamsError(field, shown, f"is not a decodable image ({reason[:100]})") from None


def _upright_pixels(field: str, value: str, mode: str) -> Image.Image:
    """The image in `mode` as diffusers' `load_image` reads it (first frame, turned as EXIF says), 16-bit gray
    scaled to 8 bits rather than clipped."""
    data = data_uri_bytes(field, value)
    image = open_image(field, data)
    with _refusing(field, f"<{len(data)} bytes>"):
        image = ImageOps.exif_transpose(image)
        if image.mode.startswith("I"):  # a 16-bit gray PNG ("I;16"): Pillow's convert would clip at 255
            image = Image.fromarray((np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8))  # mode L
        return image.convert(mode)


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
    box_width, box_height = size[0] / scale, size[1] / scale  # the job's aspect ratio, in the image's pixels
    left, top = (image.width - box_width) / 2, (image.height - box_height) / 2
    return image.resize(size, resample, box=(left, top, left + box_width, top + box_height))  # resizes the box only
