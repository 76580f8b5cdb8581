"""Qwen-Image-Edit behind the pipeline contract: the Qwen-Image adapter, with an image to edit in every row.

As `QwenImageEditPipeline` does it: the job's `init_image` is resized (the pipeline's own
image processor) to its aspect ratio at about 1024x1024 pixels (`FamilySpec.edit_size`),
whatever the output size; the Qwen2.5-VL encoder sees that image and the prompt in the
edit template (through the checkpoint's processor, which expands the image into its
patch tokens), and the conditioning is the last hidden states after the template's
system part: the image's tokens, then the prompt's. The VAE encodes the image (its
latent distribution's mode, normalised and packed), and those latents follow each row's
own latents in the image stream, with their own rotary positions (`img_shapes` lists
both); only the row's own tokens' predictions are stepped. The sample starts from noise:
`init_image` conditions it, it is not a starting point (`edits_init_image`), and there is
no strength. The output's size is the job's (the pipeline's default for the image when
the job names none: core.params).

An edit job's conditioning depends on its image, so its prompts are encoded per sample
when it starts (`image_conditioning`, on the encoder's thread, with the image decoded
once at submit) rather than in the shared text-encoder call, each text alone as the
pipeline encodes it. Rows of edit jobs share forwards whatever their output sizes, edit
images and prompt lengths (packed: `qwenimage.packed`); a model serves
either editing or text-to-image jobs, so edit rows never meet plain Qwen-Image rows
(their checkpoints differ anyway).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from PIL import Image

from batching.pipelines.contract import Conditioning, ForwardBatch
from batching.pipelines.encoded_images import EncodedImages
from batching.pipelines.loading import load_pipeline
from batching.pipelines.qwenimage.adapter import QwenImageAdapter
from batching.pipelines.qwenimage.processor import image_processor_only
from core.errors import ModelLoadError
from core.image_inputs import InputImages
from core.params import GenerationParams

PADDING_TEXT_LENGTH = 512  # a deterministic-mode padding row's prompt states (real edit prompts are longer with a real
# model's ~1300 image tokens; there a group pads to its longest)
NUM_CACHED_IMAGES = 8  # edit images whose VAE latents are kept (a job's images, or edits of one picture, share them)
# (model, device, dtype, image and size) -> its latents and img_shapes entry; one per process, as engines of one
# model in one process (a worker has one) load the same VAE, whose encoding no adapter or job changes
_EDIT_LATENTS: EncodedImages[tuple[torch.Tensor, torch.Tensor]] = EncodedImages(NUM_CACHED_IMAGES)


class QwenImageEditAdapter(QwenImageAdapter):
    family = "qwenimage_edit"
    pipeline_classes = ("QwenImageEditPipeline",)
    edits_init_image = True

    @classmethod
    def load_pipeline(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> Any:
        """The checkpoint's pipeline with its processor loaded without a video processor (qwenimage.processor)."""
        import diffusers

        try:
            processor = image_processor_only().from_pretrained(source, subfolder="processor", local_files_only=True)
        except Exception as e:
            raise ModelLoadError(
                f"could not load the processor of model {model!r} from a local folder or the Hugging Face cache "
                f"(nothing is downloaded at run time): {type(e).__name__}: {e}"
            ) from e
        pipeline_class = getattr(diffusers, cls.pipeline_classes[0])
        return load_pipeline(pipeline_class, model, source, device, dtype, processor=processor)

    def texts_to_encode(self, params: GenerationParams) -> list[str]:
        return []  # encoded with the job's image, in image_conditioning

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        return [{} for _ in range(self.spec.num_rows(params.guidance_scale, params.negative_prompt))]

    @torch.inference_mode()
    def image_conditioning(self, params: GenerationParams, images: InputImages) -> list[Conditioning]:
        """Each row's prompt (cond, then uncond) encoded with the edit images, and the images' latents one after
        another, each at its own size (its img_shapes entry after the row's own image)."""
        edited = self.edit_images(params, images)
        latents, shapes = [], [self._image_shapes(params)]
        for reference, image in edited:
            width, height = self.spec.edit_size(image.width, image.height)
            image_latents, image_shape = self._edit_latents(reference, image, height, width)
            latents.append(image_latents)
            shapes.append(image_shape)
        prefix, seen = self.encoder_view([image for _, image in edited])
        image_latents, image_shapes = torch.cat(latents), torch.cat(shapes)  # [tokens, 64], [1 + images, 3]
        return [
            {"embeds": self._encode_with_images(prefix + text, seen), "image_latents": image_latents,
             "image_shapes": image_shapes}
            for text in super().texts_to_encode(params)  # [cond, uncond]
        ]  # fmt: skip

    def edit_images(self, params: GenerationParams, images: InputImages) -> list[tuple[str, Image.Image]]:
        """(data URI, RGB image as given) of each image the job edits: its init_image."""
        assert params.init_image is not None and images.init is not None  # required: core.params
        return [(params.init_image, images.init)]

    def encoder_view(self, images: list[Image.Image]) -> tuple[str, list[Image.Image]]:
        """What the text encoder reads with the prompt: the text before it (the edit template holds the image's
        own vision tokens), and the image as the pipeline resizes it for the encoder (the edit size)."""
        (image,) = images
        width, height = self.spec.edit_size(image.width, image.height)
        return "", [self.pipeline.image_processor.resize(image, height, width)]

    def _encode_with_images(self, text: str, images: list[Image.Image]) -> torch.Tensor:
        """[tokens, dim]: the text encoder's last states of the images' and the prompt's tokens (one text per call,
        as the pipelines encode their prompt and negative prompt)."""
        pipeline = self.pipeline
        inputs = pipeline.processor(
            text=[pipeline.prompt_template_encode.format(text)], images=images, padding=True, return_tensors="pt"
        ).to(self.device)
        hidden = pipeline.text_encoder(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            output_hidden_states=True,
        ).hidden_states[-1][0]  # [tokens, dim]
        return hidden[inputs["attention_mask"][0].bool()][pipeline.prompt_template_encode_start_idx :].to(self.dtype)

    def _edit_latents(
        self, reference: str, image: Image.Image, height: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """([tokens, 64] packed, normalised latents of an edit image at height x width, [1, 3] their img_shapes
        entry), cached by the image and its size."""
        image_key = hashlib.sha256(f"{width}x{height}:{reference}".encode()).hexdigest()
        key = (self.model, str(self.device), str(self.dtype), image_key)
        return _EDIT_LATENTS.get(key, lambda: self._encode_edit_image(image, height, width))

    def _encode_edit_image(self, image: Image.Image, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = self.pipeline.image_processor.preprocess(image, height, width).unsqueeze(2)  # [1, 3, 1, H, W]
        raw = self.latent_vae.encode_mode(pixels)  # [1, 16, 1, h, w]
        latents = self.latent_vae.to_latent_space(raw).to(self.dtype)  # as the pipeline normalises
        latent_height, latent_width = latents.shape[-2:]
        packed = self.pack_latents(latents.view(1, self.latent_channels, latent_height, latent_width))[0]
        return packed, torch.tensor([[1, latent_height // 2, latent_width // 2]])

    def padding_row(self, params: GenerationParams) -> Conditioning:
        dim = self.transformer.config.joint_attention_dim
        side = round((self.spec.edit_area**0.5) / (self.vae_scale_factor * 2))  # a square edit image, in patches
        return {
            "embeds": self.zeros(PADDING_TEXT_LENGTH, dim),
            "image_latents": self.zeros(side * side, 4 * self.latent_channels),
            "image_shapes": torch.cat([self._image_shapes(params), torch.tensor([[1, side, side]])]),
        }

    def image_tokens(self, latents: list[torch.Tensor], batch: ForwardBatch) -> list[torch.Tensor]:
        image_latents = batch.conditioning["image_latents"]  # [rows, most edit-image tokens, 64], zero-padded
        lengths = batch.row_lengths("image_latents")
        return [torch.cat([own, edit[:length]]) for own, edit, length in zip(latents, image_latents, lengths)]
