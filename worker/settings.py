"""The worker's own settings, read from `STEPWISE_*` environment variables.

Storage settings (Redis, image store, job lease) live in `storage.settings` and are shared
with the API; these are the ones only a worker reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from batching.params import DEFAULT_SERVICE_MODEL, DEVICE_PATTERN, service_model
from storage.queues import generate_queue
from storage.settings import StorageSettings, env_bool, env_float, env_int, env_url


def default_concurrency(max_num_seqs: int) -> int:
    """Task threads: enough to fill the batch plus a few waiting in the engine, so the
    scheduler can pick compatible jobs from behind an incompatible one."""
    return max_num_seqs + max(2, max_num_seqs // 2)


def setting(default: Any, variable: str) -> Any:
    """A settings field with its default and the environment variable that sets it."""
    return field(default=default, metadata={"env": variable})


@dataclass(frozen=True)
class WorkerSettings:
    storage: StorageSettings
    model: str = setting(DEFAULT_SERVICE_MODEL, "STEPWISE_MODEL")
    device: str = setting("auto", "STEPWISE_DEVICE")  # auto (cuda when available), cuda, cuda:N, cpu
    max_num_seqs: int = setting(8, "STEPWISE_MAX_NUM_SEQS")  # the engine's running capacity, in jobs
    # a step's budget in rows x latent tokens; 0: max_num_seqs jobs at the model's default size
    max_num_tokens: int = setting(0, "STEPWISE_MAX_NUM_TOKENS")
    policy: str = setting("default", "STEPWISE_POLICY")  # default or fifo
    # pause running jobs at a step boundary for jobs that outrank them (default policy)
    preemption: bool = setting(True, "STEPWISE_PREEMPTION")
    deterministic: bool = setting(False, "STEPWISE_DETERMINISTIC")  # pad forwards for bit-identical results
    # auto (the device's default), on or off: decode / start new jobs on a thread beside the denoise loop
    decode_overlap: str = setting("auto", "STEPWISE_DECODE_OVERLAP")
    encode_overlap: str = setting("auto", "STEPWISE_ENCODE_OVERLAP")
    # rows (different adapters share a forward) or group (one per forward)
    lora_mode: str = setting("rows", "STEPWISE_LORA_MODE")
    lora_cache_adapters: int = setting(16, "STEPWISE_LORA_CACHE_ADAPTERS")  # adapters kept loaded (LRU)
    lora_cache_bytes: int = setting(2 * 2**30, "STEPWISE_LORA_CACHE_BYTES")  # their summed file sizes (LRU)
    concurrency: int = setting(12, "STEPWISE_WORKER_CONCURRENCY")  # task threads (default from max_num_seqs)
    # seconds before Redis redelivers an unacked message
    visibility_timeout: int = setting(7200, "STEPWISE_VISIBILITY_TIMEOUT")
    metrics_port: int = setting(9101, "STEPWISE_WORKER_METRICS_PORT")  # Prometheus exporter; 0 turns it off
    # the exporter has no auth; 0.0.0.0 exposes it
    metrics_host: str = setting("127.0.0.1", "STEPWISE_WORKER_METRICS_HOST")
    # how often a task thread checks its job's cancel flag
    poll_interval: float = setting(0.2, "STEPWISE_WORKER_POLL_INTERVAL")
    # at most one progress write per job per interval
    progress_interval: float = setting(0.5, "STEPWISE_PROGRESS_INTERVAL")
    lease_sweep_interval: float = setting(15.0, "STEPWISE_LEASE_SWEEP_INTERVAL")  # how often to look for lapsed leases
    # seconds running jobs get at warm shutdown before re-queue
    shutdown_grace: float = setting(30.0, "STEPWISE_SHUTDOWN_GRACE")
    webhook_max_attempts: int = setting(8, "STEPWISE_WEBHOOK_MAX_ATTEMPTS")
    webhook_backoff: float = setting(2.0, "STEPWISE_WEBHOOK_BACKOFF")  # first retry delay; doubles per attempt
    webhook_timeout: float = setting(10.0, "STEPWISE_WEBHOOK_TIMEOUT")  # per attempt, seconds
    # how long a task thread retries its record I/O
    redis_retry_seconds: float = setting(60.0, "STEPWISE_REDIS_RETRY_SECONDS")
    # the API's base URL, for the URLs in webhook payloads
    public_url: str | None = setting(None, "STEPWISE_PUBLIC_URL")

    @property
    def queue(self) -> str:
        """The generate queue of the model this worker serves."""
        return generate_queue(self.model)

    @classmethod
    def from_env(cls) -> WorkerSettings:
        """Every field from its variable in ENV_NAMES; a variable left unset keeps the field's default above."""
        storage = StorageSettings.from_env()
        max_num_seqs = env_int(ENV_NAMES["max_num_seqs"], _default("max_num_seqs"))
        if max_num_seqs < 1:
            raise ValueError(f"STEPWISE_MAX_NUM_SEQS must be at least 1 (got {max_num_seqs})")
        policy = os.environ.get("STEPWISE_POLICY") or _default("policy")
        if policy not in ("default", "fifo"):
            raise ValueError(f"STEPWISE_POLICY must be default or fifo (got {policy!r})")
        device = os.environ.get("STEPWISE_DEVICE") or _default("device")
        if not DEVICE_PATTERN.fullmatch(device):
            raise ValueError(f"STEPWISE_DEVICE must be auto, cpu, cuda or cuda:N (got {device!r})")
        derived_defaults = {  # defaults that depend on other settings
            "concurrency": default_concurrency(max_num_seqs),
            "lease_sweep_interval": max(1.0, storage.job_lease_seconds / 4),
        }
        parsed = {
            name: PARSERS[type(_default(name))](variable, derived_defaults.get(name, _default(name)))
            for name, variable in ENV_NAMES.items()
            if name not in ("max_num_seqs", "policy", "device", "model", "public_url")
        }
        settings = cls(
            storage=storage,
            model=service_model(),
            device=device,
            max_num_seqs=max_num_seqs,
            policy=policy,
            public_url=(env_url("STEPWISE_PUBLIC_URL", ("http", "https")) or "").rstrip("/") or None,
            **parsed,
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse values that parse but make no sense, naming the variable."""
        for name in ("decode_overlap", "encode_overlap"):
            if getattr(self, name) not in OVERLAP_CHOICES:
                raise ValueError(f"{ENV_NAMES[name]} must be auto, on or off (got {getattr(self, name)!r})")
        for name in ("concurrency", "visibility_timeout", "webhook_max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{ENV_NAMES[name]} must be at least 1 (got {getattr(self, name)})")
        if self.max_num_tokens < 0:
            raise ValueError(
                f"STEPWISE_MAX_NUM_TOKENS must be 0 (derived) or a positive budget (got {self.max_num_tokens})"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(
                f"STEPWISE_WORKER_METRICS_PORT must be a port number, or 0 for none (got {self.metrics_port})"
            )
        for name in ("poll_interval", "progress_interval", "lease_sweep_interval", "webhook_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{ENV_NAMES[name]} must be a positive number of seconds (got {getattr(self, name)})")
        for name in ("shutdown_grace", "webhook_backoff", "redis_retry_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(
                    f"{ENV_NAMES[name]} must be a number of seconds, 0 or more (got {getattr(self, name)})"
                )


ENV_NAMES = {  # field -> the variable that sets it
    name: field.metadata["env"]
    for name, field in WorkerSettings.__dataclass_fields__.items()
    if "env" in field.metadata
}
PARSERS = {int: env_int, float: env_float, bool: env_bool, str: lambda name, default: os.environ.get(name) or default}


OVERLAP_CHOICES = {"auto": None, "on": True, "off": False}  # setting -> EngineConfig's decode/encode_overlap


def _default(name: str):
    return WorkerSettings.__dataclass_fields__[name].default
