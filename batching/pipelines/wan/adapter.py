"""The Wan family behind the pipeline contract: `WanPipeline` (Wan 2.1 T2V; Wan 2.2 A14B's two experts; Wan 2.2
TI2V-5B's per-token timesteps) and `WanImageToVideoPipeline`, each as its diffusers pipeline runs it.

- Prompts: cleaned as the pipelines clean them (`prompt_clean`), UMT5's last hidden states of each
  prompt's own tokens, zero-padded to 512 (every row carries [512, text_dim]: no mask, the zeros are
  the model's input as in the pipeline).
- Latents: [1, z, latent frames, h, w] float32 noise from the sample's own generator, as the pipeline
  draws it (4 frames to a latent frame after the first, `num_frames` = 4k+1), stepped in float32 and
  cast to the transformer's dtype for each forward.
- Sampler: flow-matching UniPC (the checkpoints') or Euler, shifted by the model's `flow_shift`
  (`wan.samplers`), one per sample.
- Guidance: CFG above 1, rows [cond, uncond] (the negative prompt, "" unless given), combined as the
  pipeline does; a two-expert model's low-noise steps use `guidance_scale_2` when the job names one.
- Experts: a two-expert model (Wan 2.2 A14B: `transformer_2` and `boundary_ratio`) runs `transformer`
  for steps whose timestep is at least `boundary_ratio` x 1000 and `transformer_2` for the others. The
  expert is a fact of the step, not of the job, so rows of one group may need different experts in
  one iteration: the forward runs each expert once over the rows that need it. In deterministic mode
  each expert needed runs over the whole padded batch (a row's arithmetic must not depend on how many
  rows share its expert), and each row keeps its own expert's output.
- Mixed shapes: rows of any size and frame count share a forward, packed (`batching.pipelines.packed_video`).
- Step caching: TeaCache's feature, the first block's modulated input (`packed_video.run_cached`), per
  expert: a sample's cache is the expert's that computed it, so the first step of its second expert computes.
- Image-to-video (`wan.image`): the job's `init_image` is the first frame; it conditions every row
  (`edits_init_image`), and the sample starts from noise.
- Decode: the video VAE (`batching.pipelines.vae.LatentVae.decode_video`) to each sample's frames; a
  one-frame job decodes to a plain image.
The transformer's two-expert choice reads the rows' timesteps on the host: one device sync per
forward of a two-expert model (small beside a video forward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from PIL import Image

from batching.pipelines import packed_video
from batching.pipelines import published_latent_rgb as published
from batching.pipelines.adapter_base import tokenize
from batching.pipelines.contract import CachedForward, CachedSample, Conditioning, ForwardBatch, Sampler
from batching.pipelines.flow_matching import FlowMatchingAdapter
from batching.pipelines.loading import load_pipeline, pipeline_class_name
from batching.pipelines.packed_video import VideoLayout
from batching.pipelines.packing import LayoutCache
from batching.pipelines.step_cache_rows import sample_rows
from batching.pipelines.wan import image, samplers
from core.errors import InvalidParamsError, ModelLoadError
from core.image_inputs import InputImages
from core.params import GenerationParams

MAX_SEQUENCE_LENGTH = 512  # the pipelines' max_sequence_length: every prompt is padded (with zeros) to it
IMAGE_TO_VIDEO = "WanImageToVideoPipeline"


class WanAdapter(FlowMatchingAdapter):
    family = "wan"
    pipeline_classes = ("WanPipeline", IMAGE_TO_VIDEO)
    published_latent_rgb = published.WAN21  # Wan 2.1's VAE (16 channels); none for Wan 2.2 TI2V-5B's 48
    latent_dtype = torch.float32  # the pipelines draw and step the latents in float32 whatever the model's dtype

    def __init__(self, model: str, pipeline: Any, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, pipeline, device, dtype)
        config = pipeline.config
        self.is_image_to_video = type(pipeline).__name__ == IMAGE_TO_VIDEO
        self.edits_init_image = self.is_image_to_video  # its first frame conditions every row
        self.needs_init_image = self.is_image_to_video  # image-to-video requires its first frame
        self.expand_timesteps = bool(config.get("expand_timesteps"))  # TI2V-5B: a timestep per token
        if self.is_image_to_video and self.expand_timesteps:
            raise ModelLoadError(f"model {model!r}: image-to-video with per-token timesteps is not served yet")
        self.experts = [pipeline.transformer]  # [high noise, low noise] for a two-expert model
        self.boundary_timestep: float | None = None  # two experts: the first expert's steps have t >= this
        if getattr(pipeline, "transformer_2", None) is not None and config.get("boundary_ratio") is not None:
            self.experts.append(pipeline.transformer_2)
            self.boundary_timestep = config.boundary_ratio * pipeline.scheduler.config.num_train_timesteps
        self.unusable_fields = frozenset(
            {"init_image"} if not self.is_image_to_video else set()  # text-to-video: no first frame
        ) | frozenset({"guidance_scale_2"} if self.boundary_timestep is None else set())  # one expert
        self.layouts: list[LayoutCache[VideoLayout]] = [LayoutCache() for _ in self.experts]
        self.latent_channels = self.vae.config.z_dim
        self.frames_per_latent = pipeline.vae_scale_factor_temporal
        self.patch_size = tuple(self.transformer.config.patch_size)  # (frames, height, width)
        self.first_frame = image.FirstFrame(pipeline, self.latent_vae, device) if self.is_image_to_video else None
        self.num_cache_blocks = len(self.transformer.blocks)  # an expert's blocks, which a skip saves (TeaCache)
        self.num_blocks_kept = 0

    @classmethod
    def load(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> WanAdapter:
        adapter = super().load(model, source, device, dtype)
        rgb = adapter.latent_rgb
        if rgb is not None and rgb.num_channels != adapter.latent_channels:  # Wan 2.1's factors, a 48-channel VAE
            adapter.latent_rgb = None  # no previews
        return adapter

    @classmethod
    def load_pipeline(cls, model: str, source: str, device: torch.device, dtype: torch.dtype) -> Any:
        """The checkpoint's own pipeline class (text- or image-to-video), as its model_index.json names it."""
        import diffusers

        pipeline_class = getattr(diffusers, pipeline_class_name(model, source))
        return load_pipeline(pipeline_class, model, source, device, dtype)

    def check_params(self, params: GenerationParams) -> None:
        super().check_params(params)  # a text-to-video model's first frame, a one-expert model's guidance_scale_2
        if self.is_image_to_video and params.init_image is None:
            raise InvalidParamsError("init_image", None, "is required by image-to-video models: the first frame")
        unit = self.vae_scale_factor * self.patch_size[1]  # Wan 2.2 TI2V-5B's VAE: 16 x 2
        for name in ("height", "width"):
            if getattr(params, name) % unit:
                raise InvalidParamsError(name, getattr(params, name), f"must be a multiple of {unit} for this model")

    @torch.inference_mode()
    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        """Each text as the pipelines' `_get_t5_prompt_embeds` makes it: [512, text_dim], zeros past its tokens."""
        from diffusers.pipelines.wan.pipeline_wan import prompt_clean

        if not texts:
            return []
        pipeline = self.pipeline
        tokens = tokenize(pipeline.tokenizer, [prompt_clean(text) for text in texts], MAX_SEQUENCE_LENGTH)
        lengths = tokens.attention_mask.gt(0).sum(dim=1).tolist()  # each text's own tokens
        hidden = pipeline.text_encoder(
            tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        ).last_hidden_state  # [n, 512, dim]
        embeds = []
        for row, length in zip(hidden, lengths):
            own = torch.zeros_like(row)
            own[:length] = row[:length]
            embeds.append({"embeds": own.to(self.transformer.dtype)})
        return embeds

    def new_sampler(self, params: GenerationParams) -> Sampler:
        return samplers.new_sampler(
            params.sampler, self.pipeline.scheduler.config, params.num_inference_steps, self.device
        )

    def noise_shape(self, params: GenerationParams) -> tuple[int, ...]:
        num_latent_frames = (params.num_frames - 1) // self.frames_per_latent + 1
        scale = self.vae_scale_factor
        return (1, self.latent_channels, num_latent_frames, params.height // scale, params.width // scale)

    def image_conditioning(self, params: GenerationParams, images: InputImages) -> Conditioning:
        """An image-to-video sample's first frame, as every one of its rows carries it (`wan.image`)."""
        assert self.first_frame is not None, "text-to-video models refuse init_image at submit"
        return self.first_frame.conditioning(params, images.init)

    def padding_row(self, params: GenerationParams) -> Conditioning:
        row = {
            "embeds": self.zeros(MAX_SEQUENCE_LENGTH, self.transformer.config.text_dim, dtype=self.transformer.dtype)
        }
        if self.first_frame is not None:
            row.update(self.first_frame.padding(self.noise_shape(params), self.transformer.dtype))
        return row

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        hidden = self._hidden_states(batch)  # [rows, c_in, f, h, w], or per row [c_in, f, h, w] of mixed shapes
        return self._by_expert(batch, hidden, lambda expert, rows, _: self._run(expert, hidden, rows, batch))

    @torch.inference_mode()
    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        """The step cache (TeaCache's feature: `packed_video.run_cached`), run per expert as `forward` runs them.
        A sample's cache is its expert's: the first step of a sample's second expert computes."""
        hidden = list(self._hidden_states(batch))  # per row [c_in, f, h, w]
        skipped = [False] * len(samples)

        def run(expert: int, rows: list[int], row_experts: list[int]) -> list[torch.Tensor]:
            call, own = [], []  # the call's samples (those whose rows run); of them, the indices of this expert's
            for index, (sample, sample_range) in enumerate(zip(samples, sample_rows(samples))):
                if sample_range[0] not in rows:
                    continue
                if row_experts[sample_range[0]] != expert:  # deterministic mode: computed here, the result dropped
                    call.append(CachedSample(sample.num_rows, None, False))
                    continue
                state = sample.state
                own.append((index, len(call)))
                may_skip = sample.may_skip and state is not None and state.denoiser == expert
                call.append(CachedSample(sample.num_rows, state, may_skip))
            chosen = [hidden[row] for row in rows]
            model, shapes = self.experts[expert], tuple(row.shape for row in chosen)
            layout = self.layouts[expert].get(shapes, lambda: packed_video.build_layout(model, shapes))
            predictions, call_skipped = packed_video.run_cached(
                model, layout, chosen, self._row_inputs(rows, batch), call, may_gather=may_gather
            )
            for index, position in own:
                skipped[index] = call_skipped[position]
                state = samples[index].state
                if state is not None and not skipped[index]:
                    state.denoiser = expert
            return predictions

        return CachedForward(self._by_expert(batch, hidden, run), skipped)

    def _by_expert(
        self,
        batch: ForwardBatch,
        hidden: torch.Tensor | list[torch.Tensor],
        run: Callable[[int, list[int], list[int]], list[torch.Tensor]],
    ) -> torch.Tensor | list[torch.Tensor]:
        """Each row's prediction, each expert run once (`run(expert, rows, each real row's expert)`: the predictions
        of `rows`) over the rows that need it; in deterministic mode over every row, each row keeping its own
        expert's. Counts the forward's positions."""
        num_rows = batch.timesteps.shape[0]
        num_real = batch.num_real_rows if batch.num_real_rows is not None else num_rows
        row_experts = self._experts_of(batch.timesteps, num_real)  # per real row: the index of its expert
        positions = self._row_positions(hidden, batch)
        outputs: dict[int, torch.Tensor] = {}  # row -> its prediction
        for expert in sorted(set(row_experts)):
            if batch.num_real_rows is None:
                rows = [row for row, own in enumerate(row_experts) if own == expert]
            else:  # deterministic mode: a fixed row count per call
                rows = list(range(num_rows))
            for row, prediction in zip(rows, run(expert, rows, row_experts)):
                if row >= num_real or row_experts[row] == expert:
                    outputs[row] = prediction
            kept = [row for row in rows if row < num_real and row_experts[row] == expert]
            computed = sum(positions[row] for row in rows)
            batch.num_positions += computed
            batch.num_padded_positions += computed - sum(positions[row] for row in kept)
        return batch.like_latents([outputs[row] for row in range(num_rows)])

    def _row_positions(self, hidden: torch.Tensor | list[torch.Tensor], batch: ForwardBatch) -> list[int]:
        """Each row's sequence positions: its video tokens, and its context's (512 text tokens, an image-to-video
        row's image tokens too), which the transformer embeds per row."""
        p_t, p_h, p_w = self.patch_size
        image_embeds = batch.conditioning.get("image_embeds")
        context = MAX_SEQUENCE_LENGTH + (image_embeds.shape[1] if image_embeds is not None else 0)
        shapes = [row.shape for row in hidden]
        return [(f // p_t) * (h // p_h) * (w // p_w) + context for _, f, h, w in shapes]

    def guidance_scale(self, params: GenerationParams, timestep: torch.Tensor) -> float:
        """The low-noise expert's steps of a two-expert model guide with `guidance_scale_2` where the job names it,
        as the pipeline does."""
        if params.guidance_scale_2 is not None and self._expert_of(float(timestep)) == 1:
            return params.guidance_scale_2
        return params.guidance_scale

    def decode(  # type: ignore[override]  # the flow-matching base decodes images; Wan, videos' frames too
        self, latents: torch.Tensor, params_list: Sequence[GenerationParams]
    ) -> list[Image.Image | list[Image.Image] | None]:
        """Each sample's frames (a list of PIL images), or its image for a one-frame job; None where a frame
        came out not finite."""
        videos = self.latent_vae.decode_video(latents)
        return [frames[0] if frames and p.num_frames == 1 else frames for frames, p in zip(videos, params_list)]

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        return latents[0, :, 0]  # [c, h, w]: the first latent frame, which decodes to the first frame alone

    def _experts_of(self, timesteps: torch.Tensor, num_real: int) -> list[int]:
        if self.boundary_timestep is None:
            return [0] * num_real
        return [self._expert_of(t) for t in timesteps[:num_real].tolist()]

    def _expert_of(self, timestep: float) -> int:
        """0: the high-noise expert (`transformer`), 1: the low-noise one, as the pipeline switches (`t >= boundary`
        runs the first)."""
        return 0 if self.boundary_timestep is None or timestep >= self.boundary_timestep else 1

    def _hidden_states(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        """The rows' model inputs in the transformer's dtype: their latents, and an image-to-video row's
        first-frame condition after them on the channels."""
        dtype = self.transformer.dtype
        if self.first_frame is None:
            if isinstance(batch.latents, list):
                return [latents.to(dtype) for latents in batch.latents]
            return batch.latents.to(dtype)
        conditions = batch.conditioning["condition"]  # [rows, tokens, channels]: each row's, zero-padded
        if isinstance(batch.latents, list):
            return [
                torch.cat([latents, image.unflatten_condition(condition, latents.shape)]).to(dtype)
                for latents, condition in zip(batch.latents, conditions)
            ]
        grids = image.unflatten_condition(conditions, batch.latents.shape[1:])
        return torch.cat([batch.latents, grids], dim=1).to(dtype)

    def _run(
        self, expert: int, hidden: torch.Tensor | list[torch.Tensor], rows: list[int], batch: ForwardBatch
    ) -> list[torch.Tensor]:
        """The expert's forward over `rows` of the batch: each row's prediction [c_out, f, h, w]."""
        timesteps, embeds, image_embeds = self._row_inputs(rows, batch)
        model = self.experts[expert]
        if isinstance(hidden, torch.Tensor):
            index = torch.tensor(rows, device=self.device)
            selected = hidden if len(rows) == hidden.shape[0] else hidden.index_select(0, index)
            timestep = self._timestep(timesteps, [selected.shape[1:]] * len(rows))
            return list(packed_video.run_uniform(model, selected, timestep, embeds, image_embeds))
        chosen = [hidden[row] for row in rows]
        if all(row.shape == chosen[0].shape for row in chosen):
            timestep = self._timestep(timesteps, [row.shape for row in chosen])
            return list(packed_video.run_uniform(model, torch.stack(chosen), timestep, embeds, image_embeds))
        shapes = tuple(row.shape for row in chosen)
        layout = self.layouts[expert].get(shapes, lambda: packed_video.build_layout(model, shapes))
        return packed_video.run_packed(model, layout, chosen, timesteps, embeds, image_embeds)

    def _row_inputs(
        self, rows: list[int], batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The timesteps [n] float32, prompt states [n, 512, text_dim] and (image-to-video) image states of `rows`."""
        index = torch.tensor(rows, device=self.device)
        image_embeds = batch.conditioning.get("image_embeds")
        return (
            batch.timesteps.index_select(0, index),
            batch.conditioning["embeds"].index_select(0, index),
            None if image_embeds is None else image_embeds.index_select(0, index),
        )

    def _timestep(self, timesteps: torch.Tensor, shapes: Sequence[torch.Size]) -> torch.Tensor:
        """The transformer's `timestep`: one per row, or (TI2V-5B's `expand_timesteps`) one per token of each row,
        as the pipeline expands it, padded with 0 past a shorter row's tokens."""
        if not self.expand_timesteps:
            return timesteps
        p_t, p_h, p_w = self.patch_size
        counts = [(shape[1] // p_t) * (shape[2] // p_h) * (shape[3] // p_w) for shape in shapes]
        expanded = torch.zeros(len(counts), max(counts), device=timesteps.device, dtype=torch.float32)
        for row, count in enumerate(counts):
            expanded[row, :count] = timesteps[row]
        return expanded
