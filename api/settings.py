"""`ApiSettings`: what the HTTP layer decides, read from the `STEPWISE_*` variables settings/table.py declares.

Storage settings (Redis, image storage) are shared with the worker and live in `storage.settings`;
this module reads the API's own, parses the structured ones (key pairs, priorities, model lists,
limits) and checks what spans several.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from api.limits import LimitTable
from core.params import PRIORITIES
from settings import SettingsError, default, read
from storage.settings import StorageSettings
from storage.url_policy import AllowList

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"


def parse_api_keys(text: str, variable: str = "STEPWISE_API_KEYS") -> tuple[tuple[str, str], ...]:
    """`name:key,name:key` -> ((tenant, key), ...). A tenant may hold several keys (rotation)."""
    pairs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        tenant, sep, key = item.partition(":")
        tenant, key = tenant.strip(), key.strip()
        if not sep or not tenant or not key:
            raise SettingsError(f"{variable} must be comma-separated name:key pairs")
        if not key.isascii() or not key.isprintable():
            raise SettingsError(f"{variable}: the key of tenant {tenant!r} must be printable ASCII")
        pairs.append((tenant, key))
    if not pairs:
        raise SettingsError(f"{variable} names no keys")
    return tuple(pairs)


def parse_tenant_priorities(text: str) -> dict[str, str]:
    """`tenant:normal,other:low` -> the highest priority each named tenant may ask for."""
    limits = {}
    for item in text.split(","):
        if not item.strip():
            continue
        tenant, sep, priority = (part.strip() for part in item.partition(":"))
        if not sep or not tenant or priority not in PRIORITIES:
            raise SettingsError(
                "STEPWISE_TENANT_MAX_PRIORITY must be comma-separated tenant:priority pairs, "
                f"priority one of {', '.join(PRIORITIES)} (got {item.strip()!r})"
            )
        limits[tenant] = priority
    return limits


def parse_models(text: str) -> tuple[str, ...]:
    """`builtin:tiny, /models/sd15` -> the models this API serves by configuration (STEPWISE_MODELS)."""
    models = []
    for item in text.split(","):
        model = item.strip()
        if not model:
            continue
        if not model.isprintable():
            raise SettingsError(f"STEPWISE_MODELS: {model!r} holds control characters")
        if model not in models:
            models.append(model)
    return tuple(models)


def local_dev_key(path: Path) -> str:
    """The key of the single local tenant when STEPWISE_API_KEYS is unset.

    Generated once and kept in a 0600 file, so every API worker process and every restart
    agrees on it without a well-known default key ever being accepted.
    """
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"sk_{secrets.token_urlsafe(24)}\n")
    try:
        os.link(temp, path)  # atomic: the first worker to get here wins
        log.warning("STEPWISE_API_KEYS is unset: generated a key for tenant %r in %s", DEFAULT_TENANT, path)
    except FileExistsError:
        pass
    finally:
        temp.unlink()
    return path.read_text().strip()


def default_key_file() -> Path:
    return Path(read("STEPWISE_VAR_DIR")) / "api-key"


def read_limits() -> LimitTable:
    """The per-model cost limits from STEPWISE_DEVICE, STEPWISE_MAX_PIXELS, STEPWISE_MAX_PIXEL_STEPS and
    STEPWISE_MODEL_LIMITS."""
    return LimitTable.configured(
        device=read("STEPWISE_DEVICE"),
        max_pixels=read("STEPWISE_MAX_PIXELS"),
        max_pixel_steps=read("STEPWISE_MAX_PIXEL_STEPS"),
        model_limits=read("STEPWISE_MODEL_LIMITS"),
    )


@dataclass(frozen=True)
class ApiSettings:
    api_keys: tuple[tuple[str, str], ...]  # STEPWISE_API_KEYS: (tenant, key) pairs
    admin_api_keys: tuple[tuple[str, str], ...] = ()  # STEPWISE_ADMIN_API_KEYS: operators' (tenant, key) pairs
    storage: StorageSettings = field(default_factory=StorageSettings)
    max_queue_depth: int = default("STEPWISE_MAX_QUEUE_DEPTH")  # 429 at or above this many queued jobs
    tenant_max_queued: int = default("STEPWISE_TENANT_MAX_QUEUED")  # one tenant's queued jobs at most; 0: no cap
    tenant_jobs_per_minute: int = default("STEPWISE_TENANT_JOBS_PER_MINUTE")  # one tenant's submits; 0: no cap
    max_body_bytes: int = default("STEPWISE_MAX_BODY_BYTES")  # larger request bodies get 413
    max_form_parts: int = default("STEPWISE_MAX_FORM_PARTS")  # a multipart body with more parts gets 413
    max_batch_jobs: int = default("STEPWISE_MAX_BATCH_JOBS")  # jobs per POST /v1/jobs/batch
    public_url: str | None = None  # STEPWISE_PUBLIC_URL: base of absolute URLs; None: from the request
    webhook_allow: AllowList = field(default_factory=AllowList)  # STEPWISE_WEBHOOK_ALLOW_HOSTS
    # one deadline for the name lookups of a request's webhook hosts
    webhook_lookup_timeout_seconds: float = default("STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS")
    # STEPWISE_IMAGE_URL_HOSTS: hosts (names or CIDR ranges) init_image / mask_image URLs may name; empty: no
    # URL is fetched. STEPWISE_IMAGE_URL_TIMEOUT_SECONDS bounds all of one request's fetches, redirects included.
    image_url_hosts: AllowList = field(default_factory=AllowList)
    image_url_timeout_seconds: float = default("STEPWISE_IMAGE_URL_TIMEOUT_SECONDS")
    retry_after_seconds: int = 5  # Retry-After sent with 429
    default_model: str = default("STEPWISE_MODEL")  # the model of a job that names none
    limits: LimitTable = field(default_factory=LimitTable)  # per-model cost limits checked at submit
    # STEPWISE_TENANT_MAX_PRIORITY: tenant -> highest priority it may use
    tenant_max_priority: dict[str, str] = field(default_factory=dict)
    # queue jobs for models no worker served recently
    accept_unserved_models: bool = default("STEPWISE_ACCEPT_UNSERVED_MODELS")
    # an idle event stream sends a comment line this often
    events_keepalive_seconds: float = default("STEPWISE_EVENTS_KEEPALIVE_SECONDS")
    # how long /v1/images/* wait for their job before answering 504
    images_wait_seconds: float = default("STEPWISE_IMAGES_WAIT_SECONDS")
    # STEPWISE_MODELS: models this API serves whatever the workers' state (their jobs queue until a worker
    # runs); the default model is one of them whenever the variable is set
    configured_models: tuple[str, ...] = ()
    metrics_tenant_labels: bool = default("STEPWISE_METRICS_TENANT_LABELS")  # a series per tenant in /metrics

    def max_priority(self, tenant: str) -> str:
        return self.tenant_max_priority.get(tenant, PRIORITIES[0])

    @classmethod
    def from_env(cls) -> ApiSettings:
        keys_text = read("STEPWISE_API_KEYS") or ""
        admin_text = read("STEPWISE_ADMIN_API_KEYS") or ""
        admin_api_keys = parse_api_keys(admin_text, "STEPWISE_ADMIN_API_KEYS") if admin_text.strip() else ()
        if keys_text.strip():
            api_keys = parse_api_keys(keys_text)
        elif admin_api_keys:
            api_keys = ()
        else:
            api_keys = ((DEFAULT_TENANT, local_dev_key(default_key_file())),)
        configured_models = parse_models(read("STEPWISE_MODELS"))
        # unset: the first configured model, else the declared default
        default_model = read("STEPWISE_MODEL", configured_models[0] if configured_models else None)
        if configured_models and default_model not in configured_models:
            configured_models = (default_model, *configured_models)
        return cls(
            api_keys=api_keys,
            admin_api_keys=admin_api_keys,
            storage=StorageSettings.from_env(),
            max_queue_depth=read("STEPWISE_MAX_QUEUE_DEPTH"),
            tenant_max_queued=read("STEPWISE_TENANT_MAX_QUEUED"),
            tenant_jobs_per_minute=read("STEPWISE_TENANT_JOBS_PER_MINUTE"),
            max_body_bytes=read("STEPWISE_MAX_BODY_BYTES"),
            max_form_parts=read("STEPWISE_MAX_FORM_PARTS"),
            max_batch_jobs=read("STEPWISE_MAX_BATCH_JOBS"),
            public_url=(read("STEPWISE_PUBLIC_URL") or "").rstrip("/") or None,
            webhook_allow=AllowList.parse(read("STEPWISE_WEBHOOK_ALLOW_HOSTS")),
            webhook_lookup_timeout_seconds=read("STEPWISE_WEBHOOK_LOOKUP_TIMEOUT_SECONDS"),
            image_url_hosts=AllowList.parse(read("STEPWISE_IMAGE_URL_HOSTS")),
            image_url_timeout_seconds=read("STEPWISE_IMAGE_URL_TIMEOUT_SECONDS"),
            default_model=default_model,
            limits=read_limits(),
            tenant_max_priority=parse_tenant_priorities(read("STEPWISE_TENANT_MAX_PRIORITY")),
            accept_unserved_models=read("STEPWISE_ACCEPT_UNSERVED_MODELS"),
            events_keepalive_seconds=read("STEPWISE_EVENTS_KEEPALIVE_SECONDS"),
            images_wait_seconds=read("STEPWISE_IMAGES_WAIT_SECONDS"),
            configured_models=configured_models,
            metrics_tenant_labels=read("STEPWISE_METRICS_TENANT_LABELS"),
        )
