"""A video job's frames as the worker stores them: each video format decodes (FFmpeg, through PyAV) to the frames,
size and rate it was given, close to the frames' own colours."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from PIL import Image

from worker.output_images import encode_video

FRAMES = [Image.new("RGB", (96, 64), (20 * index, 120, 200 - 20 * index)) for index in range(9)]


@pytest.mark.parametrize("output_format", ["mp4", "webm", "gif"])
def test_each_video_format_decodes_to_its_frames_size_and_colours(output_format):
    data = encode_video(FRAMES, output_format, fps=12)

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_image().convert("RGB") for frame in container.decode(stream)]
        rate = float(stream.guessed_rate)  # GIF holds delays in 1/100 s: its rate is near

    assert (len(frames), frames[0].size) == (9, (96, 64))
    assert rate == pytest.approx(12, rel=0.05)
    for made, given in zip(frames, FRAMES, strict=True):
        assert np.abs(np.asarray(made, int) - np.asarray(given, int)).mean() < 4  # lossy, but the same picture
