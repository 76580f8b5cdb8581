"""The image and video flags `stepwise submit` and `stepwise backfill` share: --init-image, --reference-image
(repeatable), --mask, --strength, --num-frames, --fps and the output format; and the file extension of a job's
outputs."""

from __future__ import annotations

import argparse
import base64
import mimetypes
from pathlib import Path
from typing import Any

from core.output_formats import OUTPUT_FORMATS

INPUT_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}


def file_or_url(value: str) -> Path | str:
    """An http(s) URL is sent as is (the API fetches it, if its operator allows the host); anything else is a
    file."""
    return value if value.lower().startswith(("http://", "https://")) else Path(value)


def add_image_arguments(parser: argparse.ArgumentParser, *, format_flag: str) -> None:
    parser.add_argument(
        "--init-image",
        type=file_or_url,
        help="image-to-image: start from this PNG/JPEG/WebP file, or an http(s) URL the API may fetch",
    )
    parser.add_argument(
        "--reference-image",
        dest="reference_images",
        type=file_or_url,
        action="append",
        help="once per image, in order: the images a Qwen-Image-Edit-Plus or FLUX.2 model reads (reference_images); "
        "a file or an http(s) URL",
    )
    parser.add_argument(
        "--mask",
        type=file_or_url,
        help="inpainting: white repaints, black keeps (the init image's size); a file or an http(s) URL",
    )
    parser.add_argument("--strength", type=float, help="with --init-image: fraction of the steps run (0 < s <= 1)")
    parser.add_argument(
        "--resize-mode",
        choices=("none", "stretch", "crop"),
        help="an image of another size than --size: none (refused), stretch or crop",
    )
    parser.add_argument(
        format_flag,
        dest="output_format",
        choices=tuple(OUTPUT_FORMATS),
        help="png, jpeg, webp (images; default png), or mp4, webm, gif (videos; default mp4)",
    )
    parser.add_argument("--num-frames", type=int, help="video models: frames (Wan: 4k+1; default: the family's)")
    parser.add_argument("--fps", type=int, help="video models: frames per second (default: the family's)")
    parser.add_argument("--quality", type=int, dest="output_quality", help="JPEG/WebP quality 1-100 (default 90)")


def image_file_uri(path: Path) -> str:
    """A file as a data URI (the API checks that it really is an image)."""
    content_type = INPUT_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{content_type};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def image_fields(args: argparse.Namespace, upload: Any = None) -> dict[str, Any]:
    """The request fields of the image flags; `upload(path) -> id` sends files as uploads, else inline."""
    fields: dict[str, Any] = {}

    def sent(path: Path | str) -> str:
        if isinstance(path, str):  # a URL
            return path
        return upload(path) if upload else image_file_uri(path)

    for flag, name in (("init_image", "init_image"), ("mask", "mask_image")):
        path = getattr(args, flag, None)
        if path is not None:
            fields[name] = sent(path)
    if getattr(args, "reference_images", None):
        fields["reference_images"] = [sent(path) for path in args.reference_images]
    for name in ("strength", "resize_mode", "output_format", "output_quality", "num_frames", "fps"):
        if getattr(args, name, None) is not None:
            fields[name] = getattr(args, name)
    return fields


def image_extension(job: dict[str, Any]) -> str:
    """The file extension of a job's outputs: its output format's (.mp4 for a video job)."""
    params = job.get("params") or {}
    return "." + (params.get("output_format") or "png")
