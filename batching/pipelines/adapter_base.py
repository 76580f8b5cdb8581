"""What every family's adapter holds and does alike: the loaded pipeline, its VAE, where it runs, and a sample's
rows and their guidance as the pipelines run classifier-free guidance."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast

import torch

from batching.pipelines.contract import Conditioning
from batching.pipelines.image_latents import ImageLatentsMixin
from batching.pipelines.latent_rgb import LatentRgb, latent_rgb_for
from batching.pipelines.loading import load_pipeline
from batching.pipelines.vae import LatentVae
from core.errors import InvalidParamsError
from core.families import FAMILIES
from core.params import GenerationParams

if TYPE_CHECKING:
    from batching.pipelines.contract import PipelineAdapter


class AdapterBase(ImageLatentsMixin):
    family: str  # a key of core.families.FAMILIES, set by each adapter class
    # The diffusers pipeline classes (model_index.json `_class_name`) this adapter serves; it loads with the first.
    pipeline_classes: ClassVar[tuple[str, ...]]
    load_options: ClassVar[dict[str, Any]] = {}  # extra `from_pretrained` arguments of the family's pipeline
    guidance_argument: ClassVar[str] = "guidance_scale"  # the argument of the family's pipeline that a job's
    # guidance_scale is (the static-batching baseline calls the pipeline with it)
    published_latent_rgb: ClassVar[LatentRgb | None] = None  # the family's published latent-to-RGB factors, for
    # `preview_latents`' channels (batching.pipelines.latent_rgb); a model folder's own latent_rgb.json wins
    needs_init_image: bool | None = None  # the family's rule (the contract's ImageInputs)
    unusable_fields: frozenset[str] = frozenset()  # of the family's model_fields, those this model cannot use
    uncond_first: ClassVar[bool] = False  # a CFG sample's rows: [uncond, cond] (SD, SDXL, SD3) or [cond, uncond]

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model  # the name jobs ask for: "builtin:tiny", a folder, or a repo id
        self.device = device
        self.dtype = dtype
        self.spec = FAMILIES[self.family]
        self.pipeline = pipeline
        self.vae = pipeline.vae
        self.latent_vae = LatentVae(pipeline.vae)
        # The VAE's spatial downsampling, as the pipeline computes it (video pipelines name it per axis).
        self.vae_scale_factor = getattr(pipeline, "vae_scale_factor_spatial", None) or pipeline.vae_scale_factor
        self.latent_rgb: LatentRgb | None = self.published_latent_rgb  # `load` finds the model's own

    @property
    def native_size(self) -> tuple[int, int]:
        """(height, width) diffusers' pipeline draws when called without a size: the defaults of its `__call__`
        where they are numbers (Wan: 480x832), else its denoiser's sample size (or the pipeline's
        `default_sample_size`) times the VAE's downsampling (SD 1.5: 512, SDXL and FLUX: 1024, the tiny
        built-ins: their own small size)."""
        parameters = inspect.signature(type(self.pipeline).__call__).parameters
        height, width = (getattr(parameters.get(name), "default", None) for name in ("height", "width"))
        if isinstance(height, int) and isinstance(width, int):
            return height, width
        denoiser = getattr(self.pipeline, "unet", None) or getattr(self.pipeline, "transformer", None)
        sample_size = getattr(getattr(denoiser, "config", None), "sample_size", None)
        if not isinstance(sample_size, int):
            sample_size = getattr(self.pipeline, "default_sample_size", None)
        if not isinstance(sample_size, int):
            return self.spec.default_size, self.spec.default_size
        return sample_size * self.vae_scale_factor, sample_size * self.vae_scale_factor

    @property
    def max_rows_per_sample(self) -> int:
        """Rows a sample puts into a forward at most: with CFG an unconditional one beside its conditional one, one
        where the family embeds its guidance."""
        return 2 if self.spec.guidance_kind == "cfg" else 1

    def has_cfg(self, params: GenerationParams) -> bool:
        """Whether the sample runs an unconditional row beside its conditional one."""
        return self.spec.has_cfg(params.guidance_scale, params.negative_prompt)

    def texts_to_encode(self, params: GenerationParams) -> list[str]:
        """The prompt, and the negative prompt when the sample runs classifier-free guidance."""
        return [params.prompt, params.negative_prompt] if self.has_cfg(params) else [params.prompt]

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        """The conditional row, and with CFG the unconditional one in the family's order; each with `row_extras`."""
        extras = self.row_extras(params)
        cond = {**encoded[params.prompt], **extras}
        if not self.has_cfg(params):
            return [cond]
        uncond = {**self.unconditional(params, encoded), **extras}
        return [uncond, cond] if self.uncond_first else [cond, uncond]

    def row_extras(self, params: GenerationParams) -> Conditioning:
        """What each of a sample's rows carries beside its prompt's conditioning (positions, guidance, sizes)."""
        return {}

    def unconditional(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> Conditioning:
        """The unconditional row's text conditioning: the negative prompt's."""
        return encoded[params.negative_prompt]

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams, timestep: torch.Tensor) -> torch.Tensor:
        """`uncond + scale * (cond - uncond)` of a CFG sample's rows, as the pipelines combine them; a sample of
        one row (no CFG, or guidance embedded in the forward) steps with its row as is."""
        if len(rows) == 1:
            return rows
        uncond, cond = (rows[0:1], rows[1:2]) if self.uncond_first else (rows[1:2], rows[0:1])
        return uncond + self.guidance_scale(params, timestep) * (cond - uncond)

    def guidance_scale(self, params: GenerationParams, timestep: torch.Tensor) -> float:
        """The scale a CFG sample's rows combine with at `timestep`: the job's `guidance_scale`."""
        return params.guidance_scale

    def zeros(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A zero tensor on the adapter's device, in its dtype unless told: a padding row's conditioning."""
        return torch.zeros(shape, device=self.device, dtype=dtype or self.dtype)

    def check_params(self, params: GenerationParams) -> None:
        """Refuse a field this model cannot use (`unusable_fields`; `PipelineAdapter.check_params`)."""
        for name in sorted(self.unusable_fields):
            value = getattr(params, name)
            if value is not None:
                refusal = self.spec.model_field_refusal(name, self.model)
                raise InvalidParamsError(name, "<image>" if name.endswith("image") else value, refusal)

    @classmethod
    def load_pipeline(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> Any:
        """The family's own diffusers pipeline from `source`, as diffusers runs it (the static-batching baseline
        calls it too)."""
        import diffusers

        pipeline_class = getattr(diffusers, cls.pipeline_classes[0])
        return load_pipeline(pipeline_class, model, source, device, dtype, **cls.load_options)

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        """[c, h, w]: unpacked families' latents are a channel grid already."""
        return latents[0]

    @classmethod
    def load(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> Self:
        adapter = cls(model, cls.load_pipeline(model, source, device, dtype), device, dtype)
        adapter.latent_rgb = latent_rgb_for(cast("PipelineAdapter", adapter), source)  # each family completes it
        return adapter


def tokenize(tokenizer: Any, texts: Sequence[str], max_length: int | None = None, padding: str = "max_length") -> Any:
    """`texts` padded and truncated to `max_length` (the tokenizer's own maximum unless told), as the diffusers
    pipelines tokenize prompts: a BatchEncoding of [n, max_length] tensors (with `padding="longest"`, padded to
    the longest text instead)."""
    return tokenizer(
        list(texts),
        padding=padding,
        max_length=max_length or tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    )


def clip_prompt_states(
    encoders: Sequence[tuple[Any, Any]], texts: Sequence[str], device: torch.device, max_length: int | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The CLIP text encoders' outputs as SDXL's and SD3's pipelines read them, one call per (tokenizer, encoder)
    (a missing one skipped): each encoder's penultimate hidden states [n, tokens, width], and the projected pooled
    outputs [n, projection_dim] of those with a projection."""
    states, pooled = [], []
    for tokenizer, text_encoder in encoders:
        if tokenizer is None or text_encoder is None:
            continue
        input_ids = tokenize(tokenizer, texts, max_length).input_ids.to(device)  # [n, 77]
        output = text_encoder(input_ids, output_hidden_states=True)
        if output[0].ndim == 2:
            pooled.append(output[0])  # CLIPTextModelWithProjection's text embeds
        states.append(output.hidden_states[-2])
    return states, pooled
