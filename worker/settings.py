"""The worker's own settings, read from `STEPWISE_*` environment variables.

Storage settings (Redis, image store, job lease) live in `storage.settings` and are shared
with the API; these are the ones only a worker reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from batching.params import DEFAULT_SERVICE_MODEL, DEVICE_PATTERN, service_model
from storage.queues import generate_queue
from storage.settings import StorageSettings, env_bool, env_float, env_int, env_url


def default_concurrency(max_num_seqs: int) -> int:
    """Task threads: enough to fill the batch plus a few waiting in the engine, so the
    scheduler can pick compatible jobs from behind an incompatible one."""
    return max_num_seqs + max(2, max_num_seqs // 2)


@dataclass(frozen=True)
class WorkerSettings:
    storage: StorageSettings
    model: str = DEFAULT_SERVICE_MODEL  # STEPWISE_MODEL
    device: str = "auto"  # STEPWISE_DEVICE: auto (cuda when available), cuda, cuda:N, cpu
    max_num_seqs: int = 8  # STEPWISE_MAX_NUM_SEQS: the engine's running capacity, in jobs
    policy: str = "default"  # STEPWISE_POLICY: default or fifo
    deterministic: bool = False  # STEPWISE_DETERMINISTIC: pad forwards for bit-identical results
    lora_mode: str = "rows"  # STEPWISE_LORA_MODE: rows (different adapters share a forward) or group (one per forward)
    lora_cache_adapters: int = 16  # STEPWISE_LORA_CACHE_ADAPTERS: adapters kept loaded (LRU)
    lora_cache_bytes: int = 2 * 2**30  # STEPWISE_LORA_CACHE_BYTES: their summed file sizes (LRU)
    concurrency: int = 12  # STEPWISE_WORKER_CONCURRENCY: task threads (default from max_num_seqs)
    visibility_timeout: int = 7200  # STEPWISE_VISIBILITY_TIMEOUT: seconds before Redis redelivers an unacked message
    metrics_port: int = 9101  # STEPWISE_WORKER_METRICS_PORT: Prometheus exporter; 0 turns it off
    metrics_host: str = "127.0.0.1"  # STEPWISE_WORKER_METRICS_HOST: the exporter has no auth; 0.0.0.0 exposes it
    poll_interval: float = 0.2  # STEPWISE_WORKER_POLL_INTERVAL: how often a task thread checks its job's cancel flag
    progress_interval: float = 0.5  # STEPWISE_PROGRESS_INTERVAL: at most one progress write per job per interval
    lease_sweep_interval: float = 15.0  # STEPWISE_LEASE_SWEEP_INTERVAL: how often to look for lapsed leases
    shutdown_grace: float = 30.0  # STEPWISE_SHUTDOWN_GRACE: seconds running jobs get at warm shutdown before re-queue
    webhook_max_attempts: int = 8  # STEPWISE_WEBHOOK_MAX_ATTEMPTS
    webhook_backoff: float = 2.0  # STEPWISE_WEBHOOK_BACKOFF: first retry delay; doubles per attempt
    webhook_timeout: float = 10.0  # STEPWISE_WEBHOOK_TIMEOUT: per attempt, seconds
    redis_retry_seconds: float = 60.0  # STEPWISE_REDIS_RETRY_SECONDS: how long a task thread retries its record I/O
    public_url: str | None = None  # STEPWISE_PUBLIC_URL: the API's base URL, for the URLs in webhook payloads

    @property
    def queue(self) -> str:
        """The generate queue of the model this worker serves."""
        return generate_queue(self.model)

    @classmethod
    def from_env(cls) -> WorkerSettings:
        storage = StorageSettings.from_env()
        max_num_seqs = env_int("STEPWISE_MAX_NUM_SEQS", 8)
        if max_num_seqs < 1:
            raise ValueError(f"STEPWISE_MAX_NUM_SEQS must be at least 1 (got {max_num_seqs})")
        policy = os.environ.get("STEPWISE_POLICY") or "default"
        if policy not in ("default", "fifo"):
            raise ValueError(f"STEPWISE_POLICY must be default or fifo (got {policy!r})")
        device = os.environ.get("STEPWISE_DEVICE") or "auto"
        if not DEVICE_PATTERN.fullmatch(device):
            raise ValueError(f"STEPWISE_DEVICE must be auto, cpu, cuda or cuda:N (got {device!r})")
        settings = cls(
            storage=storage,
            model=service_model(),
            device=device,
            max_num_seqs=max_num_seqs,
            policy=policy,
            deterministic=env_bool("STEPWISE_DETERMINISTIC", False),
            lora_mode=os.environ.get("STEPWISE_LORA_MODE") or "rows",
            lora_cache_adapters=env_int("STEPWISE_LORA_CACHE_ADAPTERS", 16),
            lora_cache_bytes=env_int("STEPWISE_LORA_CACHE_BYTES", 2 * 2**30),
            concurrency=env_int("STEPWISE_WORKER_CONCURRENCY", default_concurrency(max_num_seqs)),
            visibility_timeout=env_int("STEPWISE_VISIBILITY_TIMEOUT", 7200),
            metrics_port=env_int("STEPWISE_WORKER_METRICS_PORT", 9101),
            metrics_host=os.environ.get("STEPWISE_WORKER_METRICS_HOST") or "127.0.0.1",
            poll_interval=env_float("STEPWISE_WORKER_POLL_INTERVAL", 0.2),
            progress_interval=env_float("STEPWISE_PROGRESS_INTERVAL", 0.5),
            lease_sweep_interval=env_float("STEPWISE_LEASE_SWEEP_INTERVAL", max(1.0, storage.job_lease_seconds / 4)),
            shutdown_grace=env_float("STEPWISE_SHUTDOWN_GRACE", 30.0),
            webhook_max_attempts=env_int("STEPWISE_WEBHOOK_MAX_ATTEMPTS", 8),
            webhook_backoff=env_float("STEPWISE_WEBHOOK_BACKOFF", 2.0),
            webhook_timeout=env_float("STEPWISE_WEBHOOK_TIMEOUT", 10.0),
            redis_retry_seconds=env_float("STEPWISE_REDIS_RETRY_SECONDS", 60.0),
            public_url=(env_url("STEPWISE_PUBLIC_URL", ("http", "https")) or "").rstrip("/") or None,
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse values that parse but make no sense, naming the variable."""
        for name in ("concurrency", "visibility_timeout", "webhook_max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{ENV_NAMES[name]} must be at least 1 (got {getattr(self, name)})")
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


ENV_NAMES = {
    "concurrency": "STEPWISE_WORKER_CONCURRENCY",
    "visibility_timeout": "STEPWISE_VISIBILITY_TIMEOUT",
    "webhook_max_attempts": "STEPWISE_WEBHOOK_MAX_ATTEMPTS",
    "poll_interval": "STEPWISE_WORKER_POLL_INTERVAL",
    "progress_interval": "STEPWISE_PROGRESS_INTERVAL",
    "lease_sweep_interval": "STEPWISE_LEASE_SWEEP_INTERVAL",
    "webhook_timeout": "STEPWISE_WEBHOOK_TIMEOUT",
    "shutdown_grace": "STEPWISE_SHUTDOWN_GRACE",
    "webhook_backoff": "STEPWISE_WEBHOOK_BACKOFF",
    "redis_retry_seconds": "STEPWISE_REDIS_RETRY_SECONDS",
}
