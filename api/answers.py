"""What the API answers: the response models of its routes (job views, lists, models, readiness, errors). The
request models, and the literal types both use, are in `api.schemas`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas import JobStateName, Priority, RequeueReason, WebhookEvent


class UploadView(BaseModel):
    id: str = Field(
        description="upl_...: name it in init_image, mask_image or reference_images (only your tenant can)."
    )
    content_type: str = Field(description="image/png, image/jpeg or image/webp.")
    width: int
    height: int
    bytes: int
    expires_in: int = Field(description="Seconds until the upload is deleted (STEPWISE_JOB_TTL).")


class LoraView(BaseModel):
    name: str = Field(description="The adapter's name: give it as a job's lora.")
    size_bytes: int
    owner: Literal["tenant", "operator"] = Field(
        description="tenant: uploaded by your tenant (only it can use it); operator: usable by every tenant."
    )


class LoraList(BaseModel):
    loras: list[LoraView] = Field(description="Your tenant's uploads, then the operator's adapters.")


class ErrorDetail(BaseModel):
    code: str = Field(description="Machine-readable, e.g. invalid_params, not_found, queue_full.")
    message: str = Field(description="For humans.")
    field: str | None = Field(None, description="The request field at fault, when there is one.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Progress(BaseModel):
    step: int = Field(
        description="The job's denoising steps done: its images' mean, rounded down (each image's step while "
        "they run together)."
    )
    total: int = Field(
        description="The job's step count: the steps each of its images runs (num_inference_steps, or its "
        "strength's share of them with an init image); not multiplied by num_images."
    )
    current_image: int | None = Field(
        None,
        description="Only while the job runs its images one after another: the image (1-based) it is on. Absent "
        "while they run together, for a one-image job, and once it is not running.",
    )


class JobError(BaseModel):
    code: str
    message: str


class WebhookView(BaseModel):
    url: str
    events: list[WebhookEvent]
    attempts: list[dict[str, Any]] = Field(description="One entry per delivery attempt, oldest first.")


class QueueInfo(BaseModel):
    jobs_ahead: int = Field(
        description="Jobs of its model queued ahead of it: its position plus the jobs queued at "
        "higher priorities (approximate: counted up to a second ago)."
    )
    workers: int = Field(description="Workers serving its model now.")
    images_per_second: float = Field(description="Those workers' throughput while busy (engine statistics).")
    eta_seconds: float | None = Field(
        description="(jobs_ahead + 1) / images_per_second; null while no worker "
        "serves the model or none has finished an image yet."
    )


class ModelView(BaseModel):
    model: str
    family: str
    available: bool = Field(description="A worker serving it sent a heartbeat within STEPWISE_WORKER_TIMEOUT.")
    workers: int
    draining: int = Field(description="Workers an operator drained: heard from, but taking no job.")
    spooling: int = Field(description="Live workers holding finished images that image storage has not taken yet.")
    spool_full: int = Field(description="Of those, workers whose spool is full: they take no job until it drains.")
    capacity: int = Field(description="Jobs its live workers run at once (summed max_num_seqs).")
    queue_depth: int = Field(description="Jobs queued for it.")
    queued_by_priority: dict[str, int]
    last_seen: datetime
    defaults: dict[str, Any] = Field(description="What omitted fields become for this model's family.")
    limits: dict[str, Any] = Field(
        description="What this model's family accepts, and the API's cost limits for it (max_pixels: height x width "
        "of one image; max_pixel_steps: images x frames x height x width x steps of one job): what a job is checked "
        "against."
    )
    sizes: list[int] = Field(
        description="Square sizes (pixels a side) to offer, best first: a trained built-in's training sizes, a "
        "checkpoint family's trained sizes; any other size its family accepts (limits) is drawn too."
    )
    engine: dict[str, Any] = Field(description="Engine statistics summed over its live workers.")


class OpenAiModel(BaseModel):
    id: str = Field(description="The model's name, as a job's `model` takes it.")
    object: Literal["model"]
    created: int = Field(description="Unix time of its latest heartbeat.")
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[OpenAiModel] = Field(description="The same models in OpenAI's shape (`client.models.list()`).")
    models: list[ModelView]


class Requeued(BaseModel):
    reason: RequeueReason = Field(
        description="worker_lost: its worker stopped sending heartbeats; lease_expired: it stopped renewing the "
        "job's lease; worker_shutdown, worker_drained: the worker stopped or an operator drained it."
    )
    message: str
    at: datetime


class Storing(BaseModel):
    since: datetime = Field(description="When its images went to the spool.")
    reason: str = Field(description="Why: the image store's latest error.")


class JobView(BaseModel):
    job_id: str
    state: JobStateName
    priority: Priority
    preview_every: int | None = Field(description="A preview every this many steps (0: none); null: the worker's.")
    queue_position: int | None = Field(
        description="Queued jobs of the same model and priority ahead of this one (0: next); null unless queued."
    )
    queue: QueueInfo | None = Field(description="ETA inputs while queued; null otherwise.")
    progress: Progress
    cancel_requested: bool
    attempts: int = Field(description="Times a worker took the job: above 1 after a re-queue.")
    requeued: Requeued | None = Field(description="Why the job last went back to the queue; null if it never did.")
    created_at: datetime
    started_at: datetime | None = Field(description="The first start; a re-queued job keeps it.")
    finished_at: datetime | None
    deadline: datetime | None
    complete_by: datetime | None = Field(description="When the job should be finished (complete_by, or slo_seconds).")
    late: bool = Field(
        description="It has a complete_by and finished after it, or (queued or running) it is past it or its "
        "worker estimates it cannot make it."
    )
    paused: bool = Field(
        description="Running, but set aside at a step boundary for a job that outranks it; it resumes where it was."
    )
    storing: Storing | None = Field(
        description="Running, its images made but waiting in its worker's spool for image storage, which failed; "
        "it succeeds once they are stored. Null otherwise."
    )
    params: dict[str, Any] = Field(description="The generation parameters, with the seed that was used.")
    timings: dict[str, float] = Field(
        description="Seconds: queue_wait, denoise, decode, upload, total; storing when its images waited in the spool."
    )
    image_url: str | None = Field(description="The first image, when succeeded: presigned S3 URL or this API's route.")
    image_urls: list[str] = Field(description="One URL per image, when succeeded.")
    error: JobError | None = Field(description="Why the job failed, expired or was canceled; null otherwise.")
    warnings: list[str] = Field(
        description="Sentences about an accepted job that will not draw what was asked: a prompt outside what a "
        "trained built-in model knows (builtin:shapes draws only 'a <colour> <shape> on a <colour> background')."
    )
    webhook: WebhookView | None
    status_url: str
    cancel_url: str


class JobList(BaseModel):
    jobs: list[JobView] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class BatchItemResult(BaseModel):
    index: int
    status: int = Field(description="What POST /v1/jobs would have answered for this item (202, 422...).")
    job: JobView | None = None
    error: ErrorDetail | None = None


class BatchResponse(BaseModel):
    results: list[BatchItemResult]
    num_accepted: int


class TenantTotals(BaseModel):
    tenant: str
    queued: int
    running: int


class TenantTotalsList(BaseModel):
    tenants: list[TenantTotals] = Field(description="Every tenant with queued or running jobs now.")


class ModelLoad(BaseModel):
    model: str
    queued: int = Field(description="Its jobs waiting for a worker, every priority.")
    running: int = Field(description="Its jobs a worker holds now (paused ones included).")
    jobs: int = Field(description="queued + running: what an autoscaler divides by one worker's capacity.")
    workers: int = Field(description="Its live workers (heartbeats).")


class Health(BaseModel):
    status: Literal["ok"]


class WorkerReadiness(BaseModel):
    seen_recently: bool = Field(description="A worker sent a heartbeat within STEPWISE_WORKER_TIMEOUT and admits jobs.")
    num_workers: int
    num_draining: int = Field(description="Workers an operator drained (`celery -A worker control drain`).")
    num_spooling: int = Field(description="Workers holding images that image storage has not taken yet.")
    num_spool_full: int = Field(description="Workers whose spool is full: they take no job until storage is back.")
    available_models: list[str]
    last_seen: datetime | None = Field(
        description="The newest heartbeat of any worker; null if none within the retention."
    )


class ModelReadiness(BaseModel):
    model: str
    configured: bool = Field(description="Named in STEPWISE_MODELS: accepted whatever the workers' state.")
    accepted: bool = Field(description="POST /v1/jobs takes its jobs (they queue while no worker runs).")
    available: bool = Field(description="A live worker serves it.")
    workers: int = Field(description="Live workers.")
    draining: int = Field(description="Drained workers.")


class Readiness(BaseModel):
    status: Literal["ok", "unavailable"] = Field(
        description="This API can take jobs (Redis reachable). Image storage and workers do not count: jobs queue "
        "while no worker runs, and their images wait in the workers' spools while storage is down (a warning says so)."
    )
    checks: dict[str, bool] = Field(description="redis, storage: reachable or not.")
    workers: WorkerReadiness | None = Field(
        None, description="Whether any worker is running (null when Redis is down)."
    )
    models: list[ModelReadiness] = Field(
        default_factory=list, description="The models this API serves: configured (STEPWISE_MODELS) or seen."
    )
    warnings: list[str] = Field(
        default_factory=list, description="For example: a model without a live worker, or a draining worker."
    )
