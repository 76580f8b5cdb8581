"""`EngineConfig`: what an engine serves and how it batches, validated before any model loads."""

from __future__ import annotations

from dataclasses import dataclass

from batching.scheduler import SchedulerConfig
from core.lora_files import MAX_LORA_BYTES
from core.step_cache import CacheSetting, check_cache

DTYPES = ("auto", "float32", "float16", "bfloat16")
LORA_MODES = ("rows", "group")
COMPILE_MODES = ("off", "inductor", "graphs", "aot_eager")  # EngineConfig.denoiser_compile (batching.denoiser_compile)
# Device type -> whether decode overlaps the denoise loop by default. On CUDA the decode runs in its own
# stream and the loop only launches work; on the CPU both threads compete for the same cores
# (benchmarks/decode_overlap.py measured it; docs/benchmarks.md gives the figures).
DECODE_OVERLAP_DEFAULT = {"cuda": True, "cpu": True}
# Device type -> whether new samples are started (prompts encoded) beside the loop by default. On CUDA the encoder
# runs in its own stream; on the CPU a second torch thread slowed the loop more than the built-in models' encodes
# (a tenth of a forward) ever stall it (benchmarks/encode_overlap.py; docs/benchmarks.md gives the figures).
ENCODE_OVERLAP_DEFAULT = {"cuda": True, "cpu": False}
# Device type -> whether the engine measures its denoiser's forward curve at start and admits up to its knee
# (batching.forward_curve). On CUDA a forward's time is flat in its rows until the device fills, and the knee
# bounds every job's step time; on the CPU time grows with rows from the first one, and the measurement
# would cost every engine start (tests start hundreds) seconds for a budget the default one already gives.
FORWARD_CURVE_DEFAULT = {"cuda": True, "cpu": False}


@dataclass(frozen=True)
class EngineConfig:
    model: str = "builtin:tiny"  # built-in (core.builtin_models), diffusers folder or cached HF repo
    device: str = "auto"  # "auto" (cuda when available), "cpu", "cuda", "cuda:N"
    dtype: str = "auto"  # "auto" (float16 on cuda, float32 on cpu), "float32", "float16", "bfloat16"
    max_num_seqs: int = 8  # running capacity in samples (images); 1 = step-wise without batching
    policy: str = "default"  # admission policy: "default" or "fifo" (see batching.scheduler)
    max_num_groups: int = 2  # default policy: compatibility groups running at once
    max_wait_iterations: int = 50  # default policy: bound on how long a waiting sample is passed over
    preemption: bool = True  # default policy: pause running samples at a step boundary for ones that outrank them
    max_num_tokens: int | None = None  # token budget of a step (rows x latent tokens, FamilySpec.sample_cost);
    # None: max_num_seqs samples at the model family's default size and guidance
    deterministic: bool = False  # fixed batch sizes everywhere: images bit-identical alone and batched
    num_threads: int | None = None  # torch CPU threads, process-wide; None keeps torch's default
    # the LoRA store: file:///folder, or any URL the engine's `lora_fetcher` reads (s3://...); None: adapters
    # refused. The worker passes STEPWISE_LORA_URL; the engine reads no environment variable.
    lora_url: str | None = None
    lora_mode: str = "rows"  # "rows": rows with different adapters share a forward; "group": one adapter per group
    lora_cache_adapters: int = 16  # adapters kept loaded on the model (LRU)
    lora_cache_bytes: int = 2 * 2**30  # their summed file sizes (LRU)
    lora_max_bytes: int = MAX_LORA_BYTES  # one adapter file
    decode_overlap: bool | None = None  # decode on a worker thread beside the loop; None: the device's default
    # (DECODE_OVERLAP_DEFAULT, chosen by measurement: docs/benchmarks.md)
    cache: CacheSetting = "off"  # the step cache of jobs that name none (GenerationParams.cache; the worker passes
    # STEPWISE_STEP_CACHE); ignored by a family without a step cache
    encode_overlap: bool | None = None  # start new samples (prompt encoding) on a worker thread beside the loop,
    # so running samples keep stepping; None: the device's default (ENCODE_OVERLAP_DEFAULT, docs/benchmarks.md)
    measure_forward_curve: bool | None = None  # measure the denoiser's time against its rows at start and admit
    # up to the knee (batching.forward_curve; never in deterministic mode); None: the device's default
    # (FORWARD_CURVE_DEFAULT)
    denoiser_compile: str = "off"  # "off", "inductor", "graphs" (CUDA graphs) or "aot_eager": the denoiser compiled
    # per row-count bucket (batching.denoiser_compile); off until a GPU run measures it faster
    phase_timing: bool = False  # time each iteration's phases (batching.step_phases) and report them in
    # stats()["phases"]; on CUDA it records device events around every phase (a profile, not for serving)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N (got {self.device!r})")
        if self.denoiser_compile not in COMPILE_MODES:
            raise ValueError(
                f"denoiser_compile must be one of {', '.join(COMPILE_MODES)} (got {self.denoiser_compile!r})"
            )
        if self.lora_mode not in LORA_MODES:
            raise ValueError(f"lora_mode must be one of {', '.join(LORA_MODES)} (got {self.lora_mode!r})")
        check_cache(self.cache, "any", "any", field="cache")  # the family's support is checked once it loads
        _ = self.scheduler_config  # validates the scheduling fields now rather than at engine start

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            policy=self.policy,
            max_num_groups=self.max_num_groups,
            max_wait_iterations=self.max_wait_iterations,
            max_num_tokens=self.max_num_tokens,
            preemption=self.preemption,
        )
