"""Qwen-Image-Edit-Plus (2509, 2511) behind the pipeline contract: the edit adapter, with one to three images.

As `QwenImageEditPlusPipeline` does it: a job's `reference_images` (or its `init_image`, the
one-image form) are each read at their own size. The text encoder sees each image resized to its
aspect ratio at about 384x384 pixels (`FamilySpec.edit_condition_area`), announced in the prompt as
"Picture 1: <|vision_start|><|image_pad|><|vision_end|>Picture 2: ..." before the user's text; the
VAE encodes each image at its aspect ratio at about 1024x1024 pixels (`edit_area`), and the images'
latents follow the row's own in the image stream in order, each with its own `img_shapes` entry (so
its own rotary positions: the transformer's rope gives the i-th image frame index i + 1). The output's
default size is the last image's at 1024x1024 pixels (core.params). A job needs at least one image,
as the pipeline does; jobs with one, two or three images share forwards, their image tokens packed
(`qwenimage.packed`).
"""

from __future__ import annotations

from PIL import Image

from batching.pipelines.qwenimage.edit import QwenImageEditAdapter
from core.image_inputs import InputImages, listed_images
from core.params import GenerationParams

PICTURE_PROMPT = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"  # the pipeline's, per image


class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    family = "qwenimage_edit_plus"
    pipeline_classes = ("QwenImageEditPlusPipeline",)

    def edit_images(self, params: GenerationParams, images: InputImages) -> list[tuple[str, Image.Image]]:
        listed = listed_images(params, self.spec)
        return [(value, image) for (_, value), image in zip(listed, images.listed, strict=True)]

    def encoder_view(self, images: list[Image.Image]) -> tuple[str, list[Image.Image]]:
        """Each image named in the prompt ("Picture i: " and its vision tokens) and resized to the condition area."""
        prefix = "".join(PICTURE_PROMPT.format(index + 1) for index in range(len(images)))
        seen = []
        for image in images:
            width, height = self.spec.edit_size(image.width, image.height, self.spec.edit_condition_area)
            seen.append(self.pipeline.image_processor.resize(image, height, width))
        return prefix, seen
