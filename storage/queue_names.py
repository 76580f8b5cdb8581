"""Queue names, shared by the API (which queues jobs and sends webhook deliveries), the worker and the tools.

Jobs are not Celery messages. Each model has one queue of jobs in Redis, its fair-share order
(`storage.fair_share`), named by `generate_queue(model)`: a readable slug of the model name plus a hash of
the whole name, so any characters a model name may hold (slashes, colons, spaces, unicode) give a safe,
distinct name. A job's record keeps it (`JobRecord.queue`), and the workers serving the model take from it
(`worker.feeder`), woken by the script that queues a job.

Celery carries webhook deliveries only, on `WEBHOOK_QUEUE`. `ENGINE_ROLE` is what a worker is started with
(`-Q stepwise.generate`, `stepwise worker`'s default) to run an engine for its model: it selects that role,
and names no Celery queue the worker consumes (`worker.lifecycle`).
"""

from __future__ import annotations

import hashlib
import re

WEBHOOK_TASK = "stepwise.deliver_webhook"
WEBHOOK_QUEUE = "stepwise.webhooks"
ENGINE_ROLE = "stepwise.generate"  # `-Q stepwise.generate`: this worker runs an engine and takes its model's jobs
GENERATE_QUEUE_PREFIX = "stepwise.generate"  # of every model's job queue (names kept from when they were Celery's)
DEFAULT_PRIORITY = "normal"  # a job's priority when it names none (core.params.PRIORITIES)

MAX_SLUG_CHARS = 40


def generate_queue(model: str) -> str:
    """`builtin:tiny` -> `stepwise.generate.builtin-tiny-1f2e3d4c5b`; stable across processes and versions."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:MAX_SLUG_CHARS].strip("-") or "model"
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{GENERATE_QUEUE_PREFIX}.{slug}-{digest}"
