"""Encoding a job's outputs as files: images with Pillow, videos with PyAV (FFmpeg).

MP4 is H.264 (yuv420p, the moov atom first so browsers play it while it loads), WebM is VP9, GIF has an adaptive
palette per frame. The worker encodes on its job threads (worker.output_images), `stepwise generate` on the
command line. PyAV (the engine extra) is imported when a video is encoded: the API never does.
"""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.output_formats import DEFAULT_VIDEO_FPS, VIDEO_FORMATS

PILLOW_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}  # GenerationParams.output_format -> Pillow's name


@dataclass(frozen=True)
class VideoCodec:
    container: str  # FFmpeg's muxer
    codec: str  # FFmpeg's encoder
    pixel_format: str
    options: dict[str, str]  # the encoder's


VIDEO_CODECS = {
    # CRF 18: visually lossless for H.264 and VP9 alike; VP9 needs a zero bitrate for CRF alone to rule
    "mp4": VideoCodec("mp4", "libx264", "yuv420p", {"crf": "18", "preset": "medium"}),
    "webm": VideoCodec("webm", "libvpx-vp9", "yuv420p", {"crf": "18", "b": "0", "row-mt": "1"}),
    "gif": VideoCodec("gif", "gif", "pal8", {}),
}
assert set(VIDEO_CODECS) == set(VIDEO_FORMATS)
MP4_OPTIONS = {"movflags": "+faststart"}


def encode_image(image: Any, output_format: str = "png", quality: int = 90) -> bytes:
    """PNG (lossless; quality ignored), or JPEG/WebP at `quality` (1-100)."""
    buffer = io.BytesIO()
    options = {} if output_format == "png" else {"quality": quality}
    image.convert("RGB").save(buffer, format=PILLOW_FORMATS[output_format], **options)
    return buffer.getvalue()


def encode_video(frames: list[Any], output_format: str = "mp4", fps: int = DEFAULT_VIDEO_FPS) -> bytes:
    """The frames (PIL images of one size) as a video at `fps` frames per second. Written to a temporary file: the
    MP4 muxer's faststart pass reopens its output, which an in-memory buffer cannot do."""
    import av

    codec = VIDEO_CODECS[output_format]
    container_options = MP4_OPTIONS if output_format == "mp4" else {}
    with tempfile.TemporaryDirectory(prefix="stepwise-video-") as folder:
        path = Path(folder) / f"video.{output_format}"
        with av.open(str(path), mode="w", format=codec.container, options=container_options) as container:
            stream = container.add_stream(codec.codec, rate=fps, options=codec.options)
            assert isinstance(stream, av.VideoStream)
            stream.width, stream.height = frames[0].size
            stream.pix_fmt = codec.pixel_format
            for frame in frames:
                for packet in stream.encode(_video_frame(frame, codec.pixel_format)):
                    container.mux(packet)
            for packet in stream.encode():  # flush the encoder's delayed frames
                container.mux(packet)
        return path.read_bytes()


def _video_frame(image: Any, pixel_format: str) -> Any:
    """An av.VideoFrame of the image."""
    import av
    import numpy as np

    if pixel_format != "pal8":
        return av.VideoFrame.from_image(image.convert("RGB"))
    # FFmpeg's scaler cannot make a palette: Pillow picks each frame's 256 colours, PyAV takes them as ARGB
    paletted = image.convert("RGB").quantize(256)
    rgb = np.zeros((256, 3), np.uint8)
    colours = np.array(paletted.getpalette()[: 256 * 3], np.uint8).reshape(-1, 3)
    rgb[: len(colours)] = colours
    argb = np.concatenate([np.full((256, 1), 255, np.uint8), rgb], axis=1)
    # pal8 takes (indices, palette), which PyAV's stubs do not declare
    return av.VideoFrame.from_ndarray([np.asarray(paletted), argb], format="pal8")  # type: ignore[arg-type]


def encode_outputs(result: Any) -> list[bytes]:
    """Each output of a finished job (`GenerationResult`) in its job's output format: images, or videos of their
    frames."""
    params = result.params
    if params.output_format in VIDEO_FORMATS:
        fps = params.fps if params.fps is not None else DEFAULT_VIDEO_FPS
        return [encode_video(frames, params.output_format, fps) for frames in result.frames]
    return [encode_image(image, params.output_format, params.output_quality) for image in result.images]
