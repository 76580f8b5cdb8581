"""Webhook events: `emit_event` queues a delivery; `deliver_webhook` POSTs it, with retries.

Delivery runs as its own task on its own queue, consumed by its own worker process
(`stepwise worker --queues stepwise.webhooks`, which loads no model; `stepwise up` and compose
start one), so a slow or failing receiver never holds a thread that generation needs. Each
attempt has one hard deadline, `STEPWISE_WEBHOOK_TIMEOUT`, for the name lookup, connect, send and
read together (`worker.webhook_http`). Every attempt of one event carries the same `webhook-id`
(receivers deduplicate on it), is signed afresh (Standard Webhooks, see `storage.webhooks`),
re-checks the URL against the webhook URL policy and connects to the addresses it checked (a
name that re-resolves elsewhere since submit is caught; DNS rebinding), does not follow
redirects, and is recorded on the job.
Retries back off exponentially: `STEPWISE_WEBHOOK_BACKOFF` * 2**(attempt-1) seconds.

`progress` events are queued at most once per second per job (worker.job_watch), and the latest
wins: an attempt of a progress event is dropped once a newer one was queued for its job, or once
the job has ended, so a lagging receiver never gets stale progress after fresher news.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from storage import public_urls
from storage.job_record import JobRecord, JobState
from storage.queue_names import WEBHOOK_QUEUE, WEBHOOK_TASK
from storage.url_policy import AllowList, WebhookURLError, webhook_addresses
from storage.webhooks import build_payload, rfc3339_now, signed_headers
from worker.app import app, settings
from worker.runtime import get_runtime
from worker.webhook_http import AttemptDeadlineError, post_within

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 3600.0
GONE = 410  # the receiver says: stop sending


def emit_event(record: JobRecord, event: str) -> str | None:
    """Queue delivery of `event` if the job asked for it; returns the webhook id. Never raises."""
    if not record.webhook_url or event not in record.webhook_events:
        return None
    webhook_id = f"msg_{uuid.uuid4().hex}"
    try:
        if event == "progress":
            get_runtime().job_store.set_latest_progress_webhook(record.job_id, webhook_id)
        base_url = settings.public_url or ""  # without STEPWISE_PUBLIC_URL: paths on the API
        images = (
            public_urls.image_urls(base_url, record.job_id, record.image_keys, get_runtime().image_store)
            if record.state is JobState.SUCCEEDED
            else []
        )
        payload = build_payload(
            record, event, status_url=public_urls.job_url(base_url, record.job_id), image_urls=images
        )
        app.send_task(WEBHOOK_TASK, args=[record.job_id, event, webhook_id, payload], queue=WEBHOOK_QUEUE)
    except Exception:
        log.exception("job %s: could not queue the %s webhook", record.job_id, event)
        return None
    return webhook_id


@dataclass(frozen=True)
class AttemptOutcome:
    is_delivered: bool
    is_final: bool  # no point retrying (refused URL, 410 Gone)
    status_code: int | None = None
    error: str | None = None


def post_once(
    url: str, webhook_id: str, payload: dict[str, Any], *, timeout: float, allow: AllowList, secret: bytes | None
) -> AttemptOutcome:
    """One attempt: check the URL's addresses against the policy (`allow`: STEPWISE_WEBHOOK_ALLOW_HOSTS),
    sign with `secret` (STEPWISE_WEBHOOK_SECRET; None: unsigned) and POST, all within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    try:
        addresses = webhook_addresses(url, allow, deadline=deadline)
    except WebhookURLError as e:
        # A name that resolved at submit and does not now may be a DNS outage: retried, as a timeout is.
        # An address the policy refuses stays refused.
        return AttemptOutcome(False, not e.unresolved, error=f"webhook URL refused: {e}")
    except TimeoutError:  # a resolver slow now may answer a later attempt
        return AttemptOutcome(
            False, False, error=f"{AttemptDeadlineError.__name__}: the host did not resolve within {timeout:g}s"
        )
    body = json.dumps(payload, separators=(",", ":"))
    headers = signed_headers(secret, webhook_id, body)
    try:
        code = post_within(url, addresses, body.encode("utf-8"), headers, timeout, deadline=deadline)
    except (OSError, http.client.HTTPException) as e:  # AttemptDeadlineError is an OSError (TimeoutError)
        return AttemptOutcome(False, False, error=f"{type(e).__name__}: {e}")
    except ValueError as e:  # a URL http.client cannot send (non-ASCII path): retrying changes nothing
        return AttemptOutcome(False, True, error=f"webhook URL cannot be sent: {e}")
    return AttemptOutcome(200 <= code < 300, code == GONE, status_code=code)


def backoff_seconds(attempt: int) -> float:
    return min(settings.webhook_backoff * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS, settings.visibility_timeout / 2)


@app.task(name=WEBHOOK_TASK, bind=True, queue=WEBHOOK_QUEUE, max_retries=None)
def deliver_webhook(self, job_id: str, event: str, webhook_id: str, payload: dict[str, Any]) -> str:
    attempt = self.request.retries + 1
    store = get_runtime().job_store
    record = store.get(job_id)
    if record is None or not record.webhook_url:
        log.info("webhook %s: job %s has no record or no webhook URL any more; dropped", webhook_id, job_id)
        return "dropped"
    if event == "progress" and (record.state.is_terminal or store.latest_progress_webhook(job_id) != webhook_id):
        log.info("webhook %s: a newer progress event of job %s, or its end, supersedes it; dropped", webhook_id, job_id)
        return "superseded"
    outcome = post_once(
        record.webhook_url,
        webhook_id,
        payload,
        timeout=settings.webhook_timeout,
        allow=settings.webhook_allow,
        secret=settings.storage.webhook_secret,
    )
    store.add_webhook_attempt(
        job_id,
        {
            "webhook_id": webhook_id,
            "event": event,
            "attempt": attempt,
            "at": rfc3339_now(),
            "status_code": outcome.status_code,
            "error": outcome.error,
            "delivered": outcome.is_delivered,
        },
    )
    if outcome.is_delivered:
        return "delivered"
    reason = outcome.error or f"HTTP {outcome.status_code}"
    if outcome.is_final or attempt >= settings.webhook_max_attempts:
        log.warning(
            "webhook %s (%s for job %s): giving up after attempt %d: %s", webhook_id, event, job_id, attempt, reason
        )
        return "failed"
    delay = backoff_seconds(attempt)
    log.info(
        "webhook %s (%s for job %s): attempt %d failed (%s); retrying in %.1fs",
        webhook_id,
        event,
        job_id,
        attempt,
        reason,
        delay,
    )
    raise self.retry(countdown=delay)
