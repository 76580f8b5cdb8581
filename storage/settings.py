"""`StorageSettings`: what everything that talks to Redis or image storage reads (the API and the workers).

Each variable is declared in settings/table.py (kind, default, meaning); this module reads them
through `settings.read`, parses the structured ones and checks what spans several variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from settings import SettingsError, default, read, read_if_set
from settings.placeholders import check_foreign_secrets
from storage.fair_share import TenantWeights
from storage.redis_location import find_redis
from storage.webhooks import secret_bytes


def default_storage_url() -> str:
    return (Path.cwd() / "var" / "images").resolve().as_uri()


@dataclass(frozen=True)
class StorageSettings:
    redis_url: str = default("STEPWISE_REDIS_URL")
    redis_source: str = "the default"  # where redis_url came from (storage.redis_location), for log lines
    # seconds an acknowledged write waits for a replica's confirmation while the master has replicas; 0: none
    redis_replica_wait: float = default("STEPWISE_REDIS_REPLICA_WAIT")
    storage_url: str = ""  # file:///path or s3://bucket/prefix; "": the local default (default_storage_url)
    s3_endpoint_url: str | None = None  # SeaweedFS or any S3-compatible server; None: AWS
    s3_public_endpoint_url: str | None = None  # the endpoint clients reach, for presigning
    presign_expiry_seconds: int = default("STEPWISE_PRESIGN_EXPIRY")
    job_ttl_seconds: int = default("STEPWISE_JOB_TTL")  # how long terminal records are kept
    # how long generated images are kept (0: for ever). A worker's sweeper enforces it for a local folder;
    # for S3 the bucket's lifecycle rule does (docs/worker.md)
    image_ttl_seconds: int = default("STEPWISE_JOB_TTL")
    job_lease_seconds: int = default("STEPWISE_JOB_LEASE_SECONDS")  # a running job's lease, renewed by its worker
    storage_max_attempts: int = default("STEPWISE_STORAGE_MAX_ATTEMPTS")  # tries of one image store call
    heartbeat_interval: float = default("STEPWISE_HEARTBEAT_INTERVAL")  # seconds between a worker's heartbeats
    worker_timeout: float = default("STEPWISE_WORKER_TIMEOUT")  # a worker silent this long is dead
    model_retention: float = default("STEPWISE_MODEL_RETENTION")  # a model stays listed this long after its beat
    lora_url: str = ""  # the LoRA adapter store, file:///path or s3://bucket/prefix; "": none
    lora_max_bytes: int = default("STEPWISE_LORA_MAX_BYTES")  # one adapter file (uploads and worker reads)
    # tenant:weight pairs of the fair order (storage.fair_share); others weigh 1
    tenant_weights: TenantWeights = field(default_factory=TenantWeights)
    webhook_secret: bytes | None = None  # the signing key (storage.webhooks.secret_bytes); None: unsigned

    @classmethod
    def from_env(cls) -> StorageSettings:
        """Every value checked here, so a process refuses a bad setting at start with a message naming it (the
        S3 credentials boto3 reads too: settings.placeholders)."""
        check_foreign_secrets()
        job_ttl_seconds = read("STEPWISE_JOB_TTL")
        heartbeat_interval = read("STEPWISE_HEARTBEAT_INTERVAL")
        worker_timeout = read("STEPWISE_WORKER_TIMEOUT")
        if not heartbeat_interval < worker_timeout:
            raise SettingsError(
                "STEPWISE_WORKER_TIMEOUT must be longer than STEPWISE_HEARTBEAT_INTERVAL "
                f"(got {worker_timeout:g} and {heartbeat_interval:g}): a live worker would count as dead"
            )
        secret = read("STEPWISE_WEBHOOK_SECRET")
        redis = find_redis(
            read_if_set("STEPWISE_REDIS_URL"), Path(read("STEPWISE_VAR_DIR")), read("STEPWISE_REDIS_SENTINEL_MASTER")
        )
        return cls(
            redis_url=redis.url,
            redis_source=redis.source,
            redis_replica_wait=read("STEPWISE_REDIS_REPLICA_WAIT"),
            storage_url=read("STEPWISE_STORAGE_URL") or default_storage_url(),
            s3_endpoint_url=read("STEPWISE_S3_ENDPOINT_URL"),
            s3_public_endpoint_url=read("STEPWISE_S3_PUBLIC_URL"),
            presign_expiry_seconds=read("STEPWISE_PRESIGN_EXPIRY"),
            job_ttl_seconds=job_ttl_seconds,
            image_ttl_seconds=read("STEPWISE_IMAGE_TTL", job_ttl_seconds),
            job_lease_seconds=read("STEPWISE_JOB_LEASE_SECONDS"),
            storage_max_attempts=read("STEPWISE_STORAGE_MAX_ATTEMPTS"),
            heartbeat_interval=heartbeat_interval,
            worker_timeout=worker_timeout,
            model_retention=read("STEPWISE_MODEL_RETENTION"),
            lora_url=read("STEPWISE_LORA_URL") or "",
            lora_max_bytes=read("STEPWISE_LORA_MAX_BYTES"),
            tenant_weights=TenantWeights.parse(read("STEPWISE_TENANT_WEIGHTS")),
            webhook_secret=secret_bytes(secret) if secret else None,
        )
