"""One image of a job as the scheduler sees it, from its job's submit until it leaves. Torch-free.

A `Sample` is made once, when its job is submitted (`make_samples`): that is where how
many denoise steps it runs, what it costs a forward and its compatibility key are
computed, and everything downstream reads them from here. The scheduler keeps it in its
waiting and running sets; the model runner counts its steps (`num_steps_done`), which the
scheduler, the job's progress and its previews read; the plan that admits it hands the same
object to the model runner once, which keeps the sample's tensors beside it
(`batching.sample_tensors.SampleTensors`). The split is nano-vllm's `Sequence` seen from
two sides: this view needs no torch, so the scheduler is tested without a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.families import FamilySpec
from core.image_inputs import InputImages
from core.params import PRIORITIES, CompatibilityKey, GenerationParams


@dataclass(slots=True, eq=False)
class Sample:
    sample_id: str  # the job id for a one-image job, `job_id#i` for image i of several
    params: GenerationParams  # one image: num_images == 1, seed = the job's seed + i
    key: CompatibilityKey  # samples of one key share a forward
    num_steps: int  # denoise steps it runs: all of them, or the last `strength` fraction with an init image
    cost: int  # tokens it adds to each forward while running (FamilySpec.sample_cost, and a reference image's)
    priority_rank: int = 1  # its job's priority, an index in core.params.PRIORITIES: 0 high, 1 normal, 2 low
    images: InputImages | None = None  # its job's init image and mask, decoded once at submit; None: text-to-image
    tenant: str = ""  # its job's tenant: admission prefers tenants with fewer running samples (batching.preemption)
    complete_by: float | None = None  # unix seconds its job should finish by: least slack first (batching.preemption)
    preview_every: int = 0  # a live preview after every this many of its steps (batching.previews); 0: none
    # On the engine loop thread:
    num_steps_done: int = 0  # denoise steps it took: advanced by the model runner alone, after each sampler step
    num_iterations_overtaken: int = 0  # waiting iterations in which a later arrival was admitted
    arrival: int = 0  # its place in arrival order among the scheduler's samples
    is_paused: bool = False  # waiting again after it ran: set aside at a step boundary, its tensors kept in the runner
    num_times_paused: int = 0

    @property
    def first_step(self) -> int:
        """Index into its sampler's timesteps of its first step: the steps its strength skips (image-to-image)."""
        return self.params.num_inference_steps - self.num_steps


def make_samples(
    job_id: str,
    params: GenerationParams,
    family: FamilySpec,
    *,
    has_size: bool = True,
    has_lora: bool = False,
    priority: str = "normal",
    images: InputImages | None = None,
    tenant: str = "",
    complete_by: float | None = None,
    preview_every: int = 0,
) -> list[Sample]:
    """A job's samples, one per image in seed order. `has_size`/`has_lora`: what the compatibility key holds
    (`CompatibilityKey.of`); `family` is the engine's loaded one (a folder model's params do not know it);
    `images`: the job's decoded input images (`batching.image_inputs.input_images`), needed with an init image;
    `preview_every`: the job's previews, which show its first image."""
    num_steps = params.steps_to_run(family.name)
    assert num_steps >= 1, "validation refuses a strength that runs no step"
    assert (images is None) == (params.init_image is None and params.reference_images is None), "decoded once"
    samples = []
    for index in range(params.num_images):
        one = params.for_image(index)
        samples.append(
            Sample(
                sample_id=job_id if params.num_images == 1 else f"{job_id}#{index}",
                params=one,
                key=CompatibilityKey.of(one, has_size=has_size, has_lora=has_lora),
                num_steps=num_steps,
                cost=family.sample_cost(one.height, one.width, one.guidance_scale, one.negative_prompt, one.num_frames)
                + _reference_cost(family, one, images),
                priority_rank=PRIORITIES.index(priority),
                images=images,
                tenant=tenant,
                complete_by=complete_by,
                preview_every=preview_every if index == 0 else 0,
            )
        )
    return samples


def _reference_cost(family: FamilySpec, params: GenerationParams, images: InputImages | None) -> int:
    """The tokens a list-taking family's images add to each of the sample's rows (FLUX.2's references as its
    pipeline prepared them, Qwen-Image-Edit-Plus's each at the pipeline's size for its latents)."""
    if images is None:
        return 0
    tokens = 0
    for image in images.listed:
        width, height = image.size if family.init_image_role == "reference" else family.edit_size(*image.size)
        tokens += (width // family.size_multiple) * (height // family.size_multiple)
    return family.num_rows(params.guidance_scale, params.negative_prompt) * tokens
