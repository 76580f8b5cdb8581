"""What the API knows of the models it serves: its configuration, and the workers' heartbeats.

A model is *accepted* when it is configured (STEPWISE_MODELS) or a worker served it within
STEPWISE_MODEL_RETENTION (or any model, with STEPWISE_ACCEPT_UNSERVED_MODELS): a configured model's
jobs are taken whatever the workers' state, and wait in its queue until one runs. Heartbeats
decide only availability, ETAs and GET /v1/models. Submits and /readyz both ask `accepts`, so they
say the same. A job for a model not accepted is refused, and so is a field the model's family does
not support, or the model itself (its workers report the family's `model_fields` it cannot use). A
queued job's view gets its ETA inputs from it. The list is read from Redis at most once per `ttl` per
process (and once more when a job names a model the cached list lacks, so a worker that just started is
seen at once), which keeps the submit path at one Redis round trip.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from api.errors import from_params_error, invalid
from api.settings import ApiSettings
from core.errors import InvalidParamsError
from core.families import FAMILIES, family_of_model
from core.params import PRIORITIES, GenerationParams
from storage.heartbeats import ModelStatus
from storage.job_record import JobRecord
from storage.job_store import JobStore

CACHE_SECONDS = 1.0
MIN_REFRESH_SECONDS = 0.2  # an unknown model forces a refresh at most this often


class Fleet:
    def __init__(self, store: JobStore, settings: ApiSettings, ttl: float = CACHE_SECONDS) -> None:
        self.store = store
        self.settings = settings
        self.ttl = ttl
        self._lock = threading.Lock()
        self._models: dict[str, ModelStatus] = {}
        self._read_at = float("-inf")

    def models(self, *, max_age: float | None = None) -> dict[str, ModelStatus]:
        max_age = self.ttl if max_age is None else max_age
        with self._lock:
            if time.monotonic() - self._read_at > max_age:
                self._models = {status.model: status for status in self.store.models()}
                self._read_at = time.monotonic()
            return self._models

    def status(self, model: str) -> ModelStatus | None:
        status = self.models().get(model)
        if status is None:
            status = self.models(max_age=MIN_REFRESH_SECONDS).get(model)
        return status

    def family_of(self, model: str) -> str | None:
        """The family a worker serves `model` with (a folder or repo model's is known only from its worker, as its
        engine loaded it); None when no worker was heard from within the retention."""
        status = self.models().get(model)
        return status.family if status is not None and status.family in FAMILIES else None

    def family_for(self, model: str) -> str | None:
        """The family a worker serves `model` with, else a built-in's own; None for a folder or repo model no
        worker has served yet."""
        return self.family_of(model) or family_of_model(model)

    def served_models(self, statuses: dict[str, ModelStatus] | None = None) -> list[str]:
        """The configured models and those a worker served within the retention, sorted."""
        seen = self.models() if statuses is None else statuses
        return sorted(set(self.settings.configured_models) | set(seen))

    def accepts(self, model: str, status: ModelStatus | None) -> bool:
        return status is not None or model in self.settings.configured_models or self.settings.accept_unserved_models

    def check_job(self, params: GenerationParams, field_prefix: str = "") -> None:
        """Raise a 422 naming the field when this API does not serve the job's model or its family lacks a feature."""
        status = self.status(params.model)
        if not self.accepts(params.model, status):
            served = ", ".join(self.served_models()) or "none"
            raise invalid(
                f"{field_prefix}model",
                f"{field_prefix}model {params.model!r} is not configured (STEPWISE_MODELS) and no worker served it "
                f"in the last {self.store_retention():.0f}s; served models: {served}",
            )
        if status is None:
            return
        if status.family in FAMILIES and status.family != params.family_spec.name:
            # A folder or repo model's family is known only from its worker: check the job against it now.
            try:
                params.validate(status.family)
            except InvalidParamsError as e:
                raise from_params_error(e, field_prefix) from e
        limits = status.limits
        if params.lora is not None and not limits.get("supports_lora", True):
            raise invalid(
                f"{field_prefix}lora",
                f"{field_prefix}lora: the {status.family} family served for "
                f"{params.model!r} does not support LoRA adapters",
            )
        # what this model, beyond its family, cannot use (core.families' model_fields): the engine's own rule
        for name in limits.get("unusable_fields", ()):
            if getattr(params, name, None) is not None:
                refusal = FAMILIES[status.family].model_field_refusal(name, params.model)
                raise invalid(f"{field_prefix}{name}", f"{field_prefix}{name} {refusal}")
        if limits.get("needs_init_image") is True and params.init_image is None:  # an image-to-video model
            raise invalid(
                f"{field_prefix}init_image",
                f"{field_prefix}init_image is required by {params.model!r}: an image-to-video model's first frame",
            )
        if "samplers" in limits and params.sampler not in limits["samplers"]:
            raise invalid(
                f"{field_prefix}sampler",
                f"{field_prefix}sampler must be one of {', '.join(limits['samplers'])} for {params.model!r}",
            )

    def store_retention(self) -> float:
        return self.settings.storage.model_retention

    def queue_info(self, record: JobRecord, position: int | None) -> dict[str, Any] | None:
        """ETA inputs of a queued job: jobs ahead of it (approximate), live workers, their throughput."""
        if position is None:
            return None
        status = self.models().get(record.params.get("model", ""))
        rank = PRIORITIES.index(record.priority) if record.priority in PRIORITIES else 1
        ahead = position
        images_per_second, workers = 0.0, 0
        if status is not None:
            ahead += sum(status.queued_by_priority.get(higher, 0) for higher in PRIORITIES[:rank])
            images_per_second = float(status.engine.get("images_per_second") or 0.0)
            workers = status.workers
        eta = (ahead + 1) / images_per_second if images_per_second > 0 and workers else None
        return {
            "jobs_ahead": ahead,
            "workers": workers,
            "images_per_second": round(images_per_second, 4),
            "eta_seconds": None if eta is None else round(eta, 1),
        }
