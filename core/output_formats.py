"""What a job's output is stored as: `output_format` names a format, and its MIME type follows from it.

An image family's jobs are images (PNG, JPEG, WebP); a video family's are videos (MP4 as H.264, WebM as VP9, GIF),
and one of its one-frame jobs may also be stored as an image. The storage key's extension is the format
(`storage.image_store_interface`), so every reader derives the content type from here. Torch-free.
"""

from __future__ import annotations

IMAGE_FORMATS = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}  # output_format -> MIME type
VIDEO_FORMATS = {"mp4": "video/mp4", "webm": "video/webm", "gif": "image/gif"}
OUTPUT_FORMATS = {**IMAGE_FORMATS, **VIDEO_FORMATS}
DEFAULT_IMAGE_FORMAT = "png"
DEFAULT_VIDEO_FORMAT = "mp4"  # H.264 in MP4: what every browser and player takes


def is_video_format(output_format: str) -> bool:
    return output_format in VIDEO_FORMATS


DEFAULT_VIDEO_FPS = 16  # a video's frame rate when neither its job nor its family names one (a folder model's job)
