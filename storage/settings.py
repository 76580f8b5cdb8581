"""Settings shared by everything that talks to Redis or image storage (worker and API).

Read from `STEPWISE_*` environment variables; each default is the embedded one-machine setup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload
from urllib.parse import urlsplit

from batching.params import MAX_LORA_BYTES
from storage.fair_share import WEIGHTS_VARIABLE, TenantWeights

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def default_storage_url() -> str:
    return (Path.cwd() / "var" / "images").resolve().as_uri()


def _env_number(name: str, default, convert, kind: str):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError as e:
        raise ValueError(f"{name} must be {kind} (got {raw!r})") from e


def env_int(name: str, default: int) -> int:
    return _env_number(name, default, int, "an integer")


def env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    word = raw.strip().lower()
    if word not in TRUE_WORDS | FALSE_WORDS:
        raise ValueError(f"{name} must be one of 1/0, true/false, yes/no, on/off (got {raw!r})")
    return word in TRUE_WORDS


def env_positive_int(name: str, default: int) -> int:
    value = env_int(name, default)
    if value < 1:
        raise ValueError(f"{name} must be at least 1 (got {value})")
    return value


@overload
def env_url(name: str, schemes: tuple[str, ...], *, default: str) -> str: ...
@overload
def env_url(name: str, schemes: tuple[str, ...], *, default: None = None) -> str | None: ...
def env_url(name: str, schemes: tuple[str, ...], *, default: str | None = None) -> str | None:
    """A URL setting whose scheme is one of `schemes` and which names a host (file: a path)."""
    raw = os.environ.get(name) or default
    if raw is None:
        return None
    parts = urlsplit(raw)
    if parts.scheme not in schemes or not (parts.netloc or parts.scheme in ("file", "unix")):
        raise ValueError(f"{name} must be a {' or '.join(s + '://' for s in schemes)} URL (got {raw!r})")
    return raw


@dataclass(frozen=True)
class StorageSettings:
    redis_url: str = DEFAULT_REDIS_URL  # STEPWISE_REDIS_URL
    storage_url: str = ""  # STEPWISE_STORAGE_URL: file:///path or s3://bucket/prefix
    s3_endpoint_url: str | None = None  # STEPWISE_S3_ENDPOINT_URL: SeaweedFS or any S3-compatible server
    s3_public_endpoint_url: str | None = None  # STEPWISE_S3_PUBLIC_URL: the endpoint clients reach, for presigning
    presign_expiry_seconds: int = 3600  # STEPWISE_PRESIGN_EXPIRY
    job_ttl_seconds: int = 7 * 24 * 3600  # STEPWISE_JOB_TTL: how long terminal records are kept
    # STEPWISE_IMAGE_TTL: how long generated images are kept (default: STEPWISE_JOB_TTL; 0: for ever). A
    # worker's sweeper enforces it for a local folder; for S3 the bucket's lifecycle rule does (docs/worker.md)
    image_ttl_seconds: int = 7 * 24 * 3600
    job_lease_seconds: int = 60  # STEPWISE_JOB_LEASE_SECONDS: a running job's lease, renewed by its worker
    storage_max_attempts: int = 5  # STEPWISE_STORAGE_MAX_ATTEMPTS: tries of one image store call on transient errors
    heartbeat_interval: float = 3.0  # STEPWISE_HEARTBEAT_INTERVAL: seconds between a worker's heartbeats
    # STEPWISE_WORKER_TIMEOUT: a worker silent this long is dead: its model unavailable, its running jobs re-queued
    worker_timeout: float = 10.0
    # STEPWISE_MODEL_RETENTION: a model stays listed (and accepts jobs) this long after its last heartbeat
    model_retention: float = 3600.0
    lora_url: str = ""  # STEPWISE_LORA_URL: the LoRA adapter store, file:///path or s3://bucket/prefix; "": none
    lora_max_bytes: int = MAX_LORA_BYTES  # STEPWISE_LORA_MAX_BYTES: one adapter file (uploads and worker reads)
    # STEPWISE_TENANT_WEIGHTS: tenant:weight pairs of the fair order (storage.fair_share); others weigh 1
    tenant_weights: TenantWeights = field(default_factory=TenantWeights)

    @classmethod
    def from_env(cls) -> StorageSettings:
        """Every value checked here, so a process refuses a bad setting at start with a message naming it."""
        from storage.webhooks import secret_from_env

        secret_from_env()  # STEPWISE_WEBHOOK_SECRET: whsec_ + valid base64, or a plain string
        job_ttl_seconds = env_positive_int("STEPWISE_JOB_TTL", 7 * 24 * 3600)
        image_ttl_seconds = env_int("STEPWISE_IMAGE_TTL", job_ttl_seconds)
        if image_ttl_seconds < 0:
            raise ValueError(
                f"STEPWISE_IMAGE_TTL must be 0 (keep images) or a number of seconds (got {image_ttl_seconds})"
            )
        heartbeat_interval = env_float("STEPWISE_HEARTBEAT_INTERVAL", 3.0)
        worker_timeout = env_float("STEPWISE_WORKER_TIMEOUT", 10.0)
        if not 0 < heartbeat_interval < worker_timeout:
            raise ValueError(
                "STEPWISE_WORKER_TIMEOUT must be longer than STEPWISE_HEARTBEAT_INTERVAL, which must be above 0 "
                f"(got {worker_timeout:g} and {heartbeat_interval:g}): a live worker would count as dead"
            )
        return cls(
            redis_url=env_url("STEPWISE_REDIS_URL", ("redis", "rediss", "unix"), default=DEFAULT_REDIS_URL),
            storage_url=env_url("STEPWISE_STORAGE_URL", ("file", "s3"), default=default_storage_url()),
            s3_endpoint_url=env_url("STEPWISE_S3_ENDPOINT_URL", ("http", "https")),
            s3_public_endpoint_url=env_url("STEPWISE_S3_PUBLIC_URL", ("http", "https")),
            presign_expiry_seconds=env_positive_int("STEPWISE_PRESIGN_EXPIRY", 3600),
            job_ttl_seconds=job_ttl_seconds,
            image_ttl_seconds=image_ttl_seconds,
            job_lease_seconds=env_positive_int("STEPWISE_JOB_LEASE_SECONDS", 60),
            storage_max_attempts=env_positive_int("STEPWISE_STORAGE_MAX_ATTEMPTS", 5),
            heartbeat_interval=heartbeat_interval,
            worker_timeout=worker_timeout,
            model_retention=env_float("STEPWISE_MODEL_RETENTION", 3600.0),
            lora_url=env_url("STEPWISE_LORA_URL", ("file", "s3")) or "",
            lora_max_bytes=env_positive_int("STEPWISE_LORA_MAX_BYTES", MAX_LORA_BYTES),
            tenant_weights=TenantWeights.parse(os.environ.get(WEIGHTS_VARIABLE, "")),
        )
