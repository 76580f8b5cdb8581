"""The model families the engine serves, and what a job may ask of each. Torch-free.

`GenerationParams` validates a job against the family of its model (samplers, size
multiple, guidance range) and takes its defaults from here; the API and the worker read
the same table. The family of a built-in model is known by name (`core.builtin_models`);
a folder or repo id is classified when the engine loads it (the adapter that serves its
`model_index.json` `_class_name`, see `batching.pipelines`), and the engine validates
jobs against that family at submit. What a family's diffusers classes are and how they
are driven lives in its adapter, under `batching/pipelines/`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from core.builtin_models import BUILTIN_MODELS, builtin_field_defaults, is_builtin, short_name
from core.output_formats import DEFAULT_IMAGE_FORMAT, DEFAULT_VIDEO_FORMAT, IMAGE_FORMATS, VIDEO_FORMATS

UNET_SAMPLERS = ("ddim", "euler", "euler_ancestral", "dpmpp_2m")
FLOW_SAMPLERS = ("euler",)  # FlowMatchEulerDiscreteScheduler, as the families' own pipelines use
# Wan's: flow-matching UniPC (UniPCMultistepScheduler with flow sigmas and `flow_shift`, what the checkpoints
# ship) and flow-matching Euler (FlowMatchEulerDiscreteScheduler with the same shift)
VIDEO_SAMPLERS = ("unipc", "euler")
# FLUX.2's reference images: its pipeline takes any number; Black Forest Labs' playground takes up to 10 (and
# advises at most 6 for [dev], 4 for [klein])
MAX_FLUX2_REFERENCES = 10


@dataclass(frozen=True)
class ReferenceRules:
    """How a family whose init_image is a reference image reads it (FLUX.2's multi-reference editing).

    No mask_image or resize_mode, and strength does not apply: the image conditions the whole run, whatever
    its size. As the family's pipeline does: an image above `max_pixels` is scaled down to that area (aspect
    kept, sides rounded down), then center-cropped to the size multiple; a job that names no size gets that
    size."""

    max_pixels: int = 1024 * 1024
    min_side: int = 64  # the pipeline refuses smaller images
    max_aspect_ratio: float = 8.0  # and longer ones

    def scaled_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) once the area is capped at `max_pixels`, before the crop to the size multiple."""
        if width * height <= self.max_pixels:
            return width, height
        scale = math.sqrt(self.max_pixels / (width * height))
        return int(width * scale), int(height * scale)

    def problem(self, width: int, height: int) -> str | None:
        """Why the pipeline would refuse an image of this size, or None."""
        if min(width, height) < self.min_side:
            return f"must be at least {self.min_side} pixels on each side"
        if max(width / height, height / width) > self.max_aspect_ratio:
            return f"must have an aspect ratio of at most {self.max_aspect_ratio:g}:1"
        return None


@dataclass(frozen=True)
class FamilySpec:
    name: str
    samplers: tuple[str, ...]  # the samplers its jobs may name
    size_multiple: int  # height and width: VAE downsampling x the denoiser's patch size
    default_guidance: float
    default_sampler: str = "euler"  # the sampler of a job that names none
    default_size: int = 128  # height and width when the job names none
    default_steps: int = 20
    min_steps: int = 1  # 2 where the sampler's schedule needs two (Qwen-Image's terminal shift divides by the last)
    max_guidance: float = 50.0
    guidance_kind: str = "cfg"  # "cfg": two rows above `cfg_above`; "embedded": a per-row model input, one row
    cfg_above: float = 1.0  # "cfg" families: guidance_scale above this runs classifier-free guidance
    cfg_needs_negative_prompt: bool = False  # ... and only with a negative prompt (Qwen-Image's true CFG)
    mixes_sizes: bool = False  # its denoiser takes rows of different sizes and frame counts in one forward, packed
    # (batching.pipelines.packing): size and frame count are not in the key outside deterministic mode
    supports_lora: bool = True  # the engine serves LoRA adapters for it (batching.lora)
    # How img2img turns a strength into steps run, as the family's own diffusers img2img pipeline rounds:
    # "floor_steps" runs int(steps * strength) (the UNet families); "floor_start" starts at
    # int(steps - steps * strength) and runs the rest (the flow-matching families).
    strength_rounding: str = "floor_steps"
    # What `init_image` is to its models: "start", where image-to-image and inpainting start from (every
    # family but edit and reference models); "edit", the image an edit model changes (required: it conditions
    # every forward, and the output has its own size, by `edit_size`); "reference", an optional reference image
    # that conditions every forward (its latents join the sequence, the sample starts from noise) read by
    # `reference_rules`; "first_frame", a video's first frame (image-to-video: it conditions every forward, the
    # sample starts from noise; fitted to the job's size as "start" images are); "none": not served yet.
    init_image_role: str = "start"
    edit_area: int = 0  # "edit" families: the pixel area the pipeline gives the output when the job names no size
    # (and, with several images, each image's latents)
    edit_condition_area: int = 0  # an "edit" family whose text encoder sees each image at its own smaller area
    # (Qwen-Image-Edit-Plus: 384x384); 0: at `edit_area`
    # How many images `reference_images` may hold (0: the family takes none). Where it is above 0, `init_image` is
    # the list's one-image form: a job gives one or the other. A "reference" family's default size is its first
    # image's (Flux2Pipeline), an "edit" family's its last image's (QwenImageEditPlusPipeline).
    max_reference_images: int = 0
    extra_tokens_per_row: int = 0  # tokens each row carries besides its image's own (an edit image's latents)
    reference_rules: ReferenceRules | None = None  # "reference" families: how the pipeline reads the image
    step_cache: str | None = None  # the per-sample step cache its adapter runs (core.step_cache.STEP_CACHE_KINDS);
    # None: jobs may ask only for cache "off"
    checkpoint_sizes: tuple[int, ...] = ()  # pixels a side its real checkpoints were trained at, offered first for a
    # folder or repo model (the built-ins' own are in core.builtin_models)
    # Video families (max_num_frames above 1); an image family's jobs are one frame and name no fps.
    max_num_frames: int = 1  # the most frames a job may ask for
    default_num_frames: int = 1  # of a job that names none
    frames_per_latent: int = 1  # the VAE's temporal compression: latent frames are (num_frames - 1) / this + 1,
    # so num_frames is a multiple of it plus one (Wan: 4k+1)
    default_fps: int | None = None  # the frame rate of a video job that names none (a playback fact: it changes
    # nothing the model computes)
    # Job fields only some models of the family can use -> which models (the refusal says so). Each model's
    # adapter names those it cannot use (`unusable_fields`), its workers' heartbeats carry them, and the API
    # refuses such a field at submit naming it (api.fleet), as the engine does: one rule for every such field.
    model_fields: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert (self.init_image_role == "reference") == (self.reference_rules is not None), self.name
        assert self.default_sampler in self.samplers, self.name
        assert 1 <= self.default_num_frames <= self.max_num_frames, self.name
        assert (self.default_num_frames - 1) % self.frames_per_latent == 0, self.name
        assert (self.default_fps is not None) == self.is_video, self.name
        assert self.max_reference_images == 0 or self.init_image_role in ("edit", "reference"), self.name

    @property
    def is_video(self) -> bool:
        return self.max_num_frames > 1

    def model_field_refusal(self, name: str, model: str) -> str:
        """Why `model`, one of this family's models that cannot use field `name`, refuses it."""
        return f"is not supported by {model!r}: only {self.model_fields.get(name, 'other models')} of the family use it"

    @property
    def default_output_format(self) -> str:
        """A video family's jobs are videos (MP4), an image family's PNG images."""
        return DEFAULT_VIDEO_FORMAT if self.is_video else DEFAULT_IMAGE_FORMAT

    def field_defaults(self) -> dict[str, int | float | str | None]:
        """What a job's omitted fields become in this family: GenerationParams fills them, workers report them."""
        return {
            "height": self.default_size,
            "width": self.default_size,
            "num_inference_steps": self.default_steps,
            "guidance_scale": self.default_guidance,
            "sampler": self.default_sampler,
            "num_frames": self.default_num_frames,
            "fps": self.default_fps,
        }

    def output_formats(self, num_frames: int = 1) -> tuple[str, ...]:
        """What a job of `num_frames` may be stored as: an image family's, images; a video family's, videos, and
        a one-frame job's also images."""
        if not self.is_video:
            return tuple(IMAGE_FORMATS)
        return tuple(VIDEO_FORMATS) + (tuple(IMAGE_FORMATS) if num_frames == 1 else ())

    def has_cfg(self, guidance_scale: float, negative_prompt: str = "") -> bool:
        """Whether a job with this guidance (and negative prompt) runs an unconditional row beside its
        conditional one."""
        if self.guidance_kind != "cfg" or guidance_scale <= self.cfg_above:
            return False
        return bool(negative_prompt) or not self.cfg_needs_negative_prompt

    def steps_to_run(self, num_steps: int, strength: float) -> int:
        """Denoise steps an image-to-image sample runs: the last `strength` fraction of its schedule."""
        if self.strength_rounding == "floor_start":
            return num_steps - int(max(num_steps - num_steps * strength, 0))
        return min(int(num_steps * strength), num_steps)

    def num_rows(self, guidance_scale: float, negative_prompt: str = "") -> int:
        """Rows a job contributes to each denoiser forward."""
        return 2 if self.has_cfg(guidance_scale, negative_prompt) else 1

    def num_latent_frames(self, num_frames: int) -> int:
        """Latent frames of a video of `num_frames` frames (one for an image)."""
        return (num_frames - 1) // self.frames_per_latent + 1

    def tokens_per_row(self, height: int, width: int, num_frames: int = 1) -> int:
        """Latent positions of one row (UNet: latent pixels; transformer: image tokens, and an edit image's; video:
        the tokens of every latent frame), which a forward's cost follows."""
        grid = (height // self.size_multiple) * (width // self.size_multiple)
        return self.num_latent_frames(num_frames) * grid + self.extra_tokens_per_row

    def sample_cost(
        self, height: int, width: int, guidance_scale: float, negative_prompt: str = "", num_frames: int = 1
    ) -> int:
        """What one sample adds to each forward it runs in: rows x latent tokens per row (the scheduler's
        token budget counts these: a video costs its frames x height x width in latent tokens)."""
        return self.num_rows(guidance_scale, negative_prompt) * self.tokens_per_row(height, width, num_frames)

    def default_token_budget(self, max_num_seqs: int, native_size: tuple[int, int] | None = None) -> int:
        """The engine's default token budget: `max_num_seqs` samples at the model's native size (what its
        checkpoint draws by default; the family's default size when not given or smaller), default frames and
        guidance (with a negative prompt where guidance needs one). A budget from the family's small default
        size alone would run every real-size job alone (a 512x512 SD 1.5 job costs 16x a 128x128 one)."""
        negative_prompt = "-" if self.cfg_needs_negative_prompt else ""
        height, width = native_size or (self.default_size, self.default_size)
        height, width = max(height, self.default_size), max(width, self.default_size)
        return max_num_seqs * self.sample_cost(
            height, width, self.default_guidance, negative_prompt, self.default_num_frames
        )

    def edit_size(self, image_width: int, image_height: int, area: int | None = None) -> tuple[int, int]:
        """(width, height) the edit pipeline sizes an edit image to, and an edit's output when the job names no
        size: the image's aspect ratio at `area` pixels (`edit_area` unless given), each side rounded to a
        multiple of 32 (the Qwen-Image-Edit pipelines' `calculate_dimensions`)."""
        ratio = image_width / image_height
        width = math.sqrt((area or self.edit_area) * ratio)
        return round(width / 32) * 32, round(width / ratio / 32) * 32

    def edit_areas(self) -> tuple[int, ...]:
        """The areas an edit image is sized to: for the VAE, and for the text encoder where that differs."""
        return (self.edit_area, self.edit_condition_area) if self.edit_condition_area else (self.edit_area,)


# guidance_scale is the Qwen-Image pipeline's true_cfg_scale: CFG above 1 with a negative prompt
QWEN_IMAGE = FamilySpec(
    name="qwenimage",
    samplers=FLOW_SAMPLERS,
    size_multiple=16,
    default_guidance=4.0,
    cfg_needs_negative_prompt=True,
    min_steps=2,
    mixes_sizes=True,  # image streams and prompts packed (batching/pipelines/qwenimage/packed.py)
    init_image_role="none",  # Qwen-Image's img2img and inpaint pipelines: not served yet
    step_cache="first_block",  # its editors' too (dataclasses.replace below)
    checkpoint_sizes=(1328, 1024),  # its pipeline's own 1:1 size, and its default
)
QWEN_IMAGE_EDIT = dataclasses.replace(  # Qwen-Image-Edit: the edit image's latents join every row's image tokens
    QWEN_IMAGE,
    name="qwenimage_edit",
    init_image_role="edit",
    edit_area=1024 * 1024,
    extra_tokens_per_row=(1024 // 16) ** 2,  # the edit image, sized to about 1024x1024 pixels
    checkpoint_sizes=(1024,),
)


FAMILIES: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in (
        FamilySpec(  # SD 1.x at 512, 2.x at 768
            name="sd",
            samplers=UNET_SAMPLERS,
            size_multiple=8,
            default_guidance=7.5,
            step_cache="deep",
            checkpoint_sizes=(512, 768),
        ),
        FamilySpec(
            name="sdxl",
            samplers=UNET_SAMPLERS,
            size_multiple=8,
            default_guidance=5.0,
            step_cache="deep",
            checkpoint_sizes=(1024,),
        ),
        FamilySpec(  # FLUX.1-dev embeds its guidance; schnell ignores it (no guidance embedder)
            name="flux",
            samplers=FLOW_SAMPLERS,
            size_multiple=16,
            default_guidance=3.5,
            max_guidance=20.0,
            guidance_kind="embedded",
            mixes_sizes=True,  # rows packed, each with its own positions (batching/pipelines/flux/packed.py)
            strength_rounding="floor_start",
            step_cache="first_block",
            checkpoint_sizes=(1024, 768, 512),
        ),
        FamilySpec(  # FLUX.2-dev embeds its guidance; an init_image is a reference image (multi-reference editing)
            name="flux2",
            samplers=FLOW_SAMPLERS,
            size_multiple=16,
            default_guidance=4.0,
            default_steps=28,
            max_guidance=20.0,
            guidance_kind="embedded",
            mixes_sizes=True,  # rows (noise and reference tokens) packed (batching/pipelines/flux2/packed.py)
            init_image_role="reference",
            reference_rules=ReferenceRules(),
            max_reference_images=MAX_FLUX2_REFERENCES,
            step_cache="first_block",
            checkpoint_sizes=(1024,),
        ),
        FamilySpec(  # FLUX.2 [klein]: true CFG above 1 (none for step-distilled checkpoints)
            name="flux2_klein",
            samplers=FLOW_SAMPLERS,
            size_multiple=16,
            default_guidance=4.0,
            default_steps=28,
            mixes_sizes=True,
            init_image_role="reference",
            reference_rules=ReferenceRules(),
            max_reference_images=MAX_FLUX2_REFERENCES,
            step_cache="first_block",
            checkpoint_sizes=(1024,),
        ),
        FamilySpec(  # its pipeline runs CFG for any guidance above 0
            name="zimage",
            samplers=FLOW_SAMPLERS,
            size_multiple=16,
            default_guidance=5.0,
            cfg_above=0.0,
            mixes_sizes=True,  # rows packed, captions of their own lengths (batching/pipelines/zimage/packed.py)
            strength_rounding="floor_start",
            step_cache="modulated_input",
            checkpoint_sizes=(1024,),
        ),
        QWEN_IMAGE,
        QWEN_IMAGE_EDIT,
        dataclasses.replace(  # Qwen-Image-Edit-2509/2511 (QwenImageEditPlusPipeline): one to three images
            QWEN_IMAGE_EDIT,
            name="qwenimage_edit_plus",
            edit_condition_area=384 * 384,  # what the text encoder sees of each (the pipeline's CONDITION_IMAGE_SIZE)
            max_reference_images=3,  # the model card's "1 to 3 images"; each image's latents at `edit_area` (its
            # VAE_IMAGE_SIZE), and the output's default size from the last
            extra_tokens_per_row=0,  # its images' tokens are counted per job (batching.sample)
        ),
        FamilySpec(  # Stable Diffusion 3: CFG above 1, as the SD families
            name="sd3",
            samplers=FLOW_SAMPLERS,
            size_multiple=16,  # the VAE's 8 x the 2x2 patches
            default_guidance=7.0,
            mixes_sizes=True,  # rows packed, each with its own crop of the positions (batching/pipelines/sd3/packed.py)
            strength_rounding="floor_start",
            step_cache="first_block",
            checkpoint_sizes=(1024,),
        ),
        FamilySpec(  # Wan 2.1 / 2.2 video: CFG above 1, as WanPipeline and WanImageToVideoPipeline run it
            name="wan",
            samplers=VIDEO_SAMPLERS,
            default_sampler="unipc",  # the checkpoints' own scheduler
            size_multiple=16,  # the VAE's 8 x the 2x2 patches (Wan 2.2 TI2V-5B's VAE: 32, its adapter checks)
            default_guidance=5.0,
            # Rows of every size and frame count share a forward, packed (batching/pipelines/packed_video.py); a
            # two-expert model's expert is chosen per step, not per job.
            mixes_sizes=True,
            init_image_role="first_frame",  # an image-to-video model's first frame (a text-to-video one refuses it)
            supports_lora=False,
            max_num_frames=161,  # 4 x 40 + 1: ten seconds at 16 fps (the checkpoints are trained on 81)
            default_num_frames=33,  # two seconds at 16 fps
            frames_per_latent=4,
            default_fps=16,  # Wan 2.1's and Wan 2.2 A14B's (TI2V-5B's videos are 24)
            step_cache="modulated_input",  # TeaCache's feature (its Wan 2.1 results), per expert
            model_fields={
                "guidance_scale_2": "two-expert models (Wan 2.2 A14B: the low-noise expert's guidance)",
                "init_image": "image-to-video models (WanImageToVideoPipeline: the first frame)",
            },
        ),
    )
}

# Jobs for a model whose family is not known yet (a folder or repo id) get these defaults and the
# loosest rules; the engine serving the model checks them against its family at submit.
FALLBACK_FAMILY = "sd"


def family_of_model(model: str) -> str | None:
    """The family of a built-in model; None for a folder or repo id (known once loaded)."""
    built_in = BUILTIN_MODELS.get(short_name(model)) if is_builtin(model) else None
    return built_in.family if built_in else None


def model_field_defaults(model: str | None, spec: FamilySpec) -> dict[str, int | float | str | None]:
    """What a job's omitted fields become for `model` of family `spec`: the family's defaults, a trained built-in's
    own size and clip length over them (builtin:shapes-wan draws 9 frames of 64x64)."""
    return {**spec.field_defaults(), **(builtin_field_defaults(model) if isinstance(model, str) else {})}


def recommended_sizes(model: str, family: str) -> list[int]:
    """Square sizes (pixels a side) to offer for `model`, best first: a trained built-in's training sizes, a
    random-weight built-in's default size (it draws any size alike), a checkpoint's family's trained sizes."""
    spec = FAMILIES[family]
    built_in = BUILTIN_MODELS.get(short_name(model)) if is_builtin(model) else None
    if built_in is not None:
        return list(built_in.sizes or (spec.default_size,))
    return list(spec.checkpoint_sizes or (spec.default_size,))
