"""The pipeline contract: what a model family's adapter gives the family-agnostic engine.

The model runner, the input batch and the engine call only these methods, so everything
that differs between families lives in the family's adapter (one folder per family
under `batching/pipelines/`, on shared bases): how prompts become named conditioning tensors, how a
sample's initial latents are drawn (exactly as diffusers' own pipeline draws them for
the same seed), its sampler (timesteps, sigmas, shift), how many rows a sample puts into
a forward and how guidance combines them, the denoiser forward over a group's rows, and
decode.

Lifecycle of a sample, as the runner drives it:
1. `texts_to_encode(params)` for every new sample; all texts of an iteration go through
   one `encode_prompts(texts)` call.
2. `new_sampler(params)`, then `initial_latents(params, sampler, generator)` with the
   sample's own seeded CPU generator, and `row_conditioning(params, encoded)`: one
   `Conditioning` per row the sample contributes to each forward.
3. Every step: `model_input(sample)` per sample; the input batch stacks rows (padding
   variable-length tensors, see `ForwardBatch.lengths`) and the adapter runs
   `forward(batch)` once for the group; `guided_prediction(rows, params, timestep)` turns a
   sample's rows into the prediction its sampler steps with.
4. `decode(latents, params_list)` for finished samples of one size.

Live previews (`batching.previews`) read a sample's latents every few steps through
`preview_latents` (its latents as channels on a grid) and the model's `latent_rgb` factors
(`batching.pipelines.latent_rgb`), without the VAE.

Step caching (`core.step_cache`): an adapter whose family has a `step_cache` kind also
has the `StepCaching` part. For a forward in which some sample caches, the runner calls
`forward_cached(batch, samples)` instead of `forward(batch)`, with each sample's own
`StepCacheState` (None for a sample that does not cache) and whether it may skip this step;
the adapter decides per sample (`batching.pipelines.step_cache_rows`), runs the expensive
part only on the rows that compute, and says which samples skipped.

Image-to-image and inpainting samples (`batching.image_start`) also use the `ImageInputs`
part: their init images are VAE-encoded, drawn from and noised to their first step, and
an inpainting sample's region outside the mask is re-noised after every step. Every
adapter has it: `AdapterBase` provides it through `ImageLatentsMixin`, and each base noises
image latents as its samplers do, so a family overrides only what it does differently
(`pack_latents`, `mask_conditioning` where it needs them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from PIL import Image

from core.params import GenerationParams

if TYPE_CHECKING:
    from core.image_inputs import InputImages

Conditioning = dict[str, torch.Tensor]  # name -> one text's or one row's tensor, without a batch dimension


@dataclass
class ForwardBatch:
    """One group's denoiser input; row i belongs to one sample and carries its own timestep."""

    latents: torch.Tensor | list[torch.Tensor]  # [num_rows, *latent_shape], or one [*latent_shape] per row when
    # the group mixes sizes (families whose key holds no size)
    timesteps: torch.Tensor  # [num_rows] float32: each row's sampler timestep, as the sampler states it
    conditioning: dict[str, torch.Tensor]  # name -> [num_rows, *shape]; first dims zero-padded where lengths differ
    lengths: dict[str, list[int]]  # name -> each row's true first-dim length, for the names padded above
    num_real_rows: int | None = None  # deterministic mode: rows from this index on are padding, and an adapter
    # that splits a forward (Wan's two experts) keeps every call at the batch's row count; None: all rows are real
    membership: tuple[str, ...] = ()  # the samples whose rows these are, in order: their conditioning (positions
    # included) stays the same while this does, so an adapter may keep what it derives from it; (): unknown
    num_positions: int = 0  # filled by the forward: denoiser sequence positions it computed, all rows, text included
    num_padded_positions: int = 0  # filled by the forward: of those, positions of no sample's own (padding that
    # equalises rows' lengths, deterministic mode's padding rows)

    def row_lengths(self, name: str) -> list[int]:
        """Each row's true first-dim length of conditioning `name` (its padded length where no row was padded)."""
        padded = self.conditioning[name]
        return self.lengths.get(name) or [padded.shape[1]] * padded.shape[0]

    def count_positions(self, row_positions: Sequence[int], padded_width: int | None = None) -> None:
        """Record the forward's sequence positions: each row's own (`row_positions`, every row of the batch), and
        `padded_width` where its rows were padded to one length (None: packed, or equally long)."""
        num_real = len(row_positions) if self.num_real_rows is None else self.num_real_rows
        width = [padded_width] * len(row_positions) if padded_width is not None else list(row_positions)
        self.num_positions += sum(width)
        self.num_padded_positions += sum(width) - sum(row_positions[:num_real])

    def like_latents(self, predictions: Sequence[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """Each row's prediction as `forward` returns them: a list when the rows' latents came as one, else stacked."""
        return list(predictions) if isinstance(self.latents, list) else torch.stack(list(predictions))

    def own_tokens(self, predictions: Sequence[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """`like_latents` of each row's prediction of its own latent tokens (per row [tokens_i, c]): the tokens a row
        carries after its own (an edit image's, reference images') are dropped, as the pipelines drop them."""
        return self.like_latents([row[: own.shape[0]] for row, own in zip(predictions, self.latents)])


class Sampler(Protocol):
    """A sample's own diffusers scheduler (`new_sampler`), its timesteps set. It keeps state between steps (a step
    index, a solver's history of model outputs), so every sample has its own."""

    timesteps: torch.Tensor  # [num_inference_steps]: the timestep of each step, as the sampler states it
    order: int  # model calls per step: 1 for every sampler served

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor,
        sample: torch.Tensor,
        *,
        generator: torch.Generator | None,
        return_dict: bool,
    ) -> tuple[torch.Tensor, ...]:
        """(next latents,) or, for samplers that estimate it, (next latents, final latents)."""
        ...


class RunningSample(Protocol):
    """What `model_input` reads of a running sample (the runner's `batching.sample_tensors.SampleTensors`)."""

    latents: torch.Tensor  # [1, *latent_shape]
    sampler: Sampler

    @property
    def timestep(self) -> torch.Tensor: ...  # the sampler's timestep of the sample's next step


class LatentToRgb(Protocol):
    """A model's live-preview map (`batching.pipelines.latent_rgb.LatentRgb`), as previews read it."""

    def on(self, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
        """The map on `device`: a `preview_latents` grid [c, h, w] to RGB [h, w, 3] in about [-1, 1]."""
        ...


@dataclass(slots=True)
class StepCacheState:
    """One sample's step cache: what its adapter kept from the sample's last full step; freed with the sample."""

    threshold: float  # relative L1 of the early feature since the last full step under which the sample skips
    num_final_steps: int = 1  # the sample's last steps, which always compute
    reference: list[torch.Tensor] | None = None  # per row: the early feature at the last full step; None: no
    # full step yet
    cached: list[torch.Tensor] | None = None  # per row: what the skippable part produced at the last full step,
    # in the adapter's layout
    constant: list[torch.Tensor] | None = None  # per row: what the adapter computes once per sample, not per step
    # (Z-Image: the refined caption, which no timestep modulates)
    denoiser: int = 0  # which of the adapter's denoisers gave `reference` and `cached` (Wan 2.2: its expert); a
    # step another one runs computes


@dataclass
class CachedSample:
    """A sample of a forward, as `forward_cached` sees it: its rows are the next `num_rows` of the batch."""

    num_rows: int
    state: StepCacheState | None  # None: the sample does not cache (it computes every step, keeping nothing)
    may_skip: bool  # False on its first and last step, which always compute


@dataclass
class CachedForward:
    predictions: torch.Tensor | list[torch.Tensor]  # as `forward` returns them
    skipped: list[bool]  # per sample of the call: whether it reused its cache this step


class StepCaching(Protocol):
    """The step cache of a family with `FamilySpec.step_cache` (see the module docstring)."""

    num_cache_blocks: int  # blocks per row of a full forward, the unit the skipped fraction counts
    num_blocks_kept: int  # of those, the blocks a row that skips still runs

    def forward_cached(
        self, batch: ForwardBatch, samples: Sequence[CachedSample], *, may_gather: bool
    ) -> CachedForward:
        """`forward(batch)` where samples under their threshold reuse their cache. With `may_gather` the rows
        that compute run the expensive part as a smaller batch; without it (deterministic mode, per-row LoRA
        adapters) every row runs it, so each row's arithmetic keeps its batch size, and only the results of
        the rows that skip are replaced. Rows past the samples' (deterministic padding) compute."""
        ...


class ImageInputs(Protocol):
    """What image-to-image and inpainting samples need of an adapter (`batching.image_start`)."""

    has_mask_channels: bool  # the denoiser takes a mask and masked-image latents (an inpainting UNet; see
    # batching.image_start): every sample then carries them as per-row conditioning
    edits_init_image: bool  # an edit model: a sample's init_image conditions its rows (`image_conditioning`)
    # and the sample starts from noise, not from the image
    needs_init_image: bool | None  # this model beyond its family's rule: True requires an init_image (an
    # image-to-video model's first frame), False refuses one (a text-to-video model); None: the family's rule.
    # Workers report it, so the API refuses such a job naming init_image instead of the worker failing it
    unusable_fields: frozenset[str]  # of its family's `model_fields` (core.families), those this model cannot use
    # (a text-to-video model's init_image, a one-expert model's guidance_scale_2): check_params refuses them, and
    # workers report them, so the API refuses them at submit by the same rule

    def encode_images(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels [n, 3, H, W] in [-1, 1] (images of one size) to the VAE's (mean, std), raw layout."""
        ...

    def image_latents(self, mean: torch.Tensor, std: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """[1, *latent_shape]: one sample's draw from its image's latent distribution, in denoiser space."""
        ...

    def draw_noise(self, params: GenerationParams, generator: torch.Generator) -> torch.Tensor:
        """[1, *latent_shape] standard normal noise, drawn as the family's pipeline draws it."""
        ...

    def noised_latents(
        self, sampler: Sampler, image_latents: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor
    ) -> torch.Tensor:
        """The image latents noised to `timestep` of the sample's sampler."""
        ...

    def latent_mask(self, mask: torch.Tensor, raw_shape: torch.Size) -> torch.Tensor:
        """A [1, 1, H, W] pixel mask (1 = repaint) in the latents' layout."""
        ...

    def mask_conditioning(self, mask: torch.Tensor, masked_image_latents: torch.Tensor) -> Conditioning:
        """The per-row conditioning that carries a sample's mask channels (only with `has_mask_channels`)."""
        ...

    def image_conditioning(self, params: GenerationParams, images: InputImages) -> Conditioning | list[Conditioning]:
        """With `edits_init_image`: what a sample's init image (decoded once at submit, as its family reads it)
        adds to each of its rows' conditioning, over `row_conditioning`'s names: one dict for every row (FLUX.2:
        its reference tokens), or one per row (Qwen-Image-Edit: each prompt encoded with the image)."""
        ...


class PipelineAdapter(ImageInputs, Protocol):
    family: str  # a key of core.families.FAMILIES
    model: str  # the name jobs ask for: "builtin:tiny", a folder, or a repo id
    device: torch.device
    dtype: torch.dtype
    pipeline: Any  # the diffusers pipeline it wraps (LoRA adapters load onto its denoiser and text encoder); its
    # components are the family's (mypy reads diffusers' classes as torch-less dummies: not typed further here)

    @property
    def max_rows_per_sample(self) -> int:
        """Rows a sample puts into a forward at most (deterministic mode pads every forward to max_num_seqs times
        this)."""
        ...

    @property
    def latent_rgb(self) -> LatentToRgb | None:
        """Its live previews' latent-to-RGB factors, set at load; None: no previews."""
        ...

    @property
    def native_size(self) -> tuple[int, int]:
        """(height, width) its pipeline draws when a call names no size: what the checkpoint was made for (the
        engine's default token budget holds `max_num_seqs` samples of this size)."""
        ...

    def texts_to_encode(self, params: GenerationParams) -> list[str]: ...

    def encode_prompts(self, texts: Sequence[str]) -> list[Conditioning]:
        """One conditioning per text, from one batched call of each text encoder."""
        ...

    def new_sampler(self, params: GenerationParams) -> Sampler:
        """A fresh sampler for one sample, its timesteps set."""
        ...

    def initial_latents(self, params: GenerationParams, sampler: Sampler, generator: torch.Generator) -> torch.Tensor:
        """[1, *latent_shape] noise drawn from `generator` exactly as diffusers' own pipeline draws it."""
        ...

    def row_conditioning(self, params: GenerationParams, encoded: Mapping[str, Conditioning]) -> list[Conditioning]:
        """The conditioning of each row the sample contributes, from its encoded texts."""
        ...

    def padding_row(self, params: GenerationParams) -> Conditioning:
        """A padding row's conditioning in deterministic mode, for a group of samples like `params`
        (its result is discarded)."""
        ...

    def model_input(self, sample: RunningSample) -> torch.Tensor:
        """[1, *latent_shape]: the sample's latents as its denoiser row takes them this step."""
        ...

    def forward(self, batch: ForwardBatch) -> torch.Tensor | list[torch.Tensor]:
        """One denoiser call over every row: [num_rows, *latent_shape] predictions (a list per row when
        `batch.latents` is a list)."""
        ...

    def guided_prediction(self, rows: torch.Tensor, params: GenerationParams, timestep: torch.Tensor) -> torch.Tensor:
        """[1, *latent_shape]: what the sample's sampler steps with, from its rows' predictions at `timestep`
        (its sampler's timestep of this step: a two-expert Wan model guides each expert's steps with its own
        scale)."""
        ...

    def check_params(self, params: GenerationParams) -> None:
        """Raise InvalidParamsError naming the field for what this model, beyond its family's rules, cannot do: a
        field of `unusable_fields` (a text-to-video model given a first frame, a one-expert model given
        guidance_scale_2), or what its checkpoint needs (an image-to-video model's first frame)."""
        ...

    def decode(
        self, latents: torch.Tensor, params_list: Sequence[GenerationParams]
    ) -> Sequence[Image.Image | list[Image.Image] | None]:
        """Latents [n, *latent_shape] of samples of one size (and frame count) to n RGB PIL images, or for a
        video of several frames its frames (a list of them); None in place of an output with NaN or infinite
        pixels (the decoder fails that sample)."""
        ...

    def preview_latents(self, latents: torch.Tensor, params: GenerationParams) -> torch.Tensor:
        """[c, h, w]: a sample's latents [1, *latent_shape] as channels over a grid of its image's positions,
        the layout whose channels `latent_rgb`'s rows map to RGB."""
        ...
