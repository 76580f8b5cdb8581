"""builtin:tiny, builtin:small and builtin:tiny-inpaint: Stable Diffusion 1.x-style pipelines.

`builtin:tiny` is small enough that a 20-step 128x128 job takes well under a second on
two CPU cores; `builtin:small` has a denoiser large enough to dominate the step time,
for benchmarks. `builtin:tiny-inpaint` is `builtin:tiny` with an inpainting UNet (9 input
channels: latents, mask, masked-image latents), saved as a `StableDiffusionInpaintPipeline`
as SD inpainting checkpoints are.
"""

from __future__ import annotations

from dataclasses import dataclass

from batching.builtin_models.components import (
    clip_text_encoder,
    clip_tokenizer,
    sd_ddim_scheduler,
    seeded,
    tiny_vae,
)


@dataclass(frozen=True)
class StableDiffusionSize:
    unet_channels: tuple[int, ...]
    text_hidden_size: int  # also the UNet's cross-attention dim
    unet_in_channels: int = 4  # 9: an inpainting UNet (4 latent + 1 mask + 4 masked-image latent channels)


SIZES = {
    "tiny": StableDiffusionSize(unet_channels=(32, 64), text_hidden_size=32),
    "small": StableDiffusionSize(unet_channels=(64, 128, 256), text_hidden_size=64),
    "tiny-inpaint": StableDiffusionSize(unet_channels=(32, 64), text_hidden_size=32, unet_in_channels=9),
}


def build_pipeline(name: str):
    from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline, UNet2DConditionModel

    size = SIZES[name]
    tokenizer = clip_tokenizer()
    num_unet_levels = len(size.unet_channels)
    with seeded(0):
        unet = UNet2DConditionModel(
            sample_size=16,
            in_channels=size.unet_in_channels,
            out_channels=4,
            block_out_channels=size.unet_channels,
            layers_per_block=2,
            down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (num_unet_levels - 1),
            up_block_types=("CrossAttnUpBlock2D",) * (num_unet_levels - 1) + ("UpBlock2D",),
            cross_attention_dim=size.text_hidden_size,
            attention_head_dim=8,
            norm_num_groups=32,
        )
    with seeded(1):
        vae = tiny_vae(latent_channels=4)
    with seeded(2):
        text_encoder = clip_text_encoder(tokenizer, size.text_hidden_size)
    scheduler = sd_ddim_scheduler()  # Stable Diffusion 1.x's training schedule
    pipeline_class = StableDiffusionInpaintPipeline if size.unet_in_channels == 9 else StableDiffusionPipeline
    return pipeline_class(
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        unet=unet.eval(),
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
