"""Qwen2.5-VL's processor for images only, as the Qwen-Image-Edit pipelines call it.

Qwen-Image-Edit checkpoints ship a `Qwen2VLProcessor` (tokenizer, image processor, video
processor), which transformers builds only with torchvision installed, for its video
processor. The edit pipelines never give it a video, so the engine loads the same
processor without one: `image_processor_only()` is `Qwen2VLProcessor` (its `__call__`
expands each `<|image_pad|>` into one token per merged image patch and returns the pixel
patches) whose sub-processors are the tokenizer and the image processor alone. The class
is made on first use: importing transformers' processors loads boto3, which no batching
module may load at import (tests/test_layering.py).
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def image_processor_only() -> Any:
    """The processor class (call `.from_pretrained(folder, subfolder="processor")`, or build it from an image
    processor and a tokenizer)."""
    from transformers import Qwen2VLProcessor

    class ImageProcessorOnly(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs) -> None:
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    ImageProcessorOnly.__module__ = __name__
    return ImageProcessorOnly
