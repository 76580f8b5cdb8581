"""`WorkerSettings`: what only a worker reads, from the `STEPWISE_*` variables settings/table.py declares.

Storage settings (Redis, image store, job lease) live in `storage.settings` and are shared with the
API. Each field below names its variable; the table holds its default, kind and check, and the
defaults that depend on other settings (jobs held at once, the lease sweep) are derived in `from_env`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from settings import default, read
from storage.queue_names import generate_queue
from storage.settings import StorageSettings
from storage.url_policy import AllowList


def default_concurrency(max_num_seqs: int) -> int:
    """Jobs held at once: enough to fill the batch plus a few waiting in the engine, so the
    scheduler can pick compatible jobs from behind an incompatible one."""
    return max_num_seqs + max(2, max_num_seqs // 2)


def setting(variable: str, derived: Any = None) -> Any:
    """A settings field read from `variable`, with its declared default (or `derived` where the table
    declares none: the value for other settings at their defaults)."""
    return field(default=default(variable) if derived is None else derived, metadata={"env": variable})


@dataclass(frozen=True)
class WorkerSettings:
    storage: StorageSettings
    model: str = setting("STEPWISE_MODEL")
    device: str = setting("STEPWISE_DEVICE")  # auto (cuda when available), cuda, cuda:N, cpu
    max_num_seqs: int = setting("STEPWISE_MAX_NUM_SEQS")  # the engine's running capacity, in images
    # a step's budget in rows x latent tokens; 0: max_num_seqs images at the model's default size
    max_num_tokens: int = setting("STEPWISE_MAX_NUM_TOKENS")
    policy: str = setting("STEPWISE_POLICY")  # default or fifo
    # pause running jobs at a step boundary for jobs that outrank them (default policy)
    preemption: bool = setting("STEPWISE_PREEMPTION")
    deterministic: bool = setting("STEPWISE_DETERMINISTIC")  # pad forwards for bit-identical results
    # auto (the device's default), on or off: decode / start new jobs on a thread beside the denoise loop
    cache: str = setting("STEPWISE_STEP_CACHE")  # the step cache of jobs that name none: off, a preset or a threshold
    decode_overlap: str = setting("STEPWISE_DECODE_OVERLAP")
    encode_overlap: str = setting("STEPWISE_ENCODE_OVERLAP")
    forward_curve: str = setting("STEPWISE_FORWARD_CURVE")  # auto, on or off: admit up to the measured knee
    denoiser_compile: str = setting("STEPWISE_DENOISER_COMPILE")  # off, inductor, graphs or aot_eager
    lora_mode: str = setting("STEPWISE_LORA_MODE")  # rows (different adapters share a forward) or group
    lora_cache_adapters: int = setting("STEPWISE_LORA_CACHE_ADAPTERS")  # adapters kept loaded (LRU)
    lora_cache_bytes: int = setting("STEPWISE_LORA_CACHE_BYTES")  # their summed file sizes (LRU)
    # jobs held at once (a thread each; a webhook-only worker: Celery threads); from max_num_seqs when unset
    concurrency: int = setting("STEPWISE_WORKER_CONCURRENCY", default_concurrency(default("STEPWISE_MAX_NUM_SEQS")))
    # seconds before Redis redelivers a webhook delivery whose worker died (jobs are not messages)
    visibility_timeout: int = setting("STEPWISE_VISIBILITY_TIMEOUT")
    metrics_port: int = setting("STEPWISE_WORKER_METRICS_PORT")  # Prometheus exporter; 0 turns it off
    metrics_host: str = setting("STEPWISE_WORKER_METRICS_HOST")  # the exporter has no auth; 0.0.0.0 exposes it
    poll_interval: float = setting("STEPWISE_WORKER_POLL_INTERVAL")  # how often a job's thread checks its job
    progress_interval: float = setting("STEPWISE_PROGRESS_INTERVAL")  # at most one progress write per interval
    preview_every: int = setting("STEPWISE_PREVIEW_EVERY")  # previews of jobs that give no preview_every; 0: none
    # how often to look for lapsed leases; a quarter of the lease when unset
    lease_sweep_interval: float = setting(
        "STEPWISE_LEASE_SWEEP_INTERVAL", max(1.0, default("STEPWISE_JOB_LEASE_SECONDS") / 4)
    )
    shutdown_grace: float | None = setting("STEPWISE_SHUTDOWN_GRACE")  # caps drain_seconds; None: no cap
    drain_seconds: float = setting("STEPWISE_DRAIN_SECONDS")  # after SIGTERM, how long the worker may take to stop
    webhook_max_attempts: int = setting("STEPWISE_WEBHOOK_MAX_ATTEMPTS")
    webhook_backoff: float = setting("STEPWISE_WEBHOOK_BACKOFF")  # first retry delay; doubles per attempt
    webhook_timeout: float = setting("STEPWISE_WEBHOOK_TIMEOUT")  # per attempt, seconds
    spool_dir: str | None = setting("STEPWISE_SPOOL_DIR")  # images waiting for the image store (worker.spool)
    spool_max_bytes: int = setting("STEPWISE_SPOOL_MAX_BYTES")  # full: the worker takes no new job
    redis_retry_seconds: float = setting("STEPWISE_REDIS_RETRY_SECONDS")  # how long a job retries its record I/O
    public_url: str | None = setting("STEPWISE_PUBLIC_URL")  # the API's base URL, for webhook payloads' URLs
    webhook_allow: AllowList = field(default_factory=AllowList)  # STEPWISE_WEBHOOK_ALLOW_HOSTS

    @property
    def queue(self) -> str:
        """The generate queue of the model this worker serves."""
        return generate_queue(self.model)

    @classmethod
    def from_env(cls) -> WorkerSettings:
        """Every field from its variable; a variable left unset keeps its default (derived ones below)."""
        storage = StorageSettings.from_env()
        values = {name: read(variable) for name, variable in ENV_NAMES.items()}
        if values["concurrency"] is None:
            values["concurrency"] = default_concurrency(values["max_num_seqs"])
        if values["lease_sweep_interval"] is None:
            values["lease_sweep_interval"] = max(1.0, storage.job_lease_seconds / 4)
        values["public_url"] = (values["public_url"] or "").rstrip("/") or None
        return cls(storage=storage, webhook_allow=AllowList.parse(read("STEPWISE_WEBHOOK_ALLOW_HOSTS")), **values)


ENV_NAMES = {  # field -> the variable that sets it
    name: field.metadata["env"]
    for name, field in WorkerSettings.__dataclass_fields__.items()
    if "env" in field.metadata
}

# setting -> EngineConfig's decode_overlap, encode_overlap and measure_forward_curve
OVERLAP_CHOICES = {"auto": None, "on": True, "off": False}
