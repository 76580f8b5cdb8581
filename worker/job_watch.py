"""A job thread's wait for its job's result.

While the engine works, the job's thread wakes every `STEPWISE_WORKER_POLL_INTERVAL` and does
the job's Redis I/O there, never on the engine loop thread: it encodes and writes the newest live
preview, if the job asked for them (a small JPEG data URI on the job's event stream; one older
than progress already written is dropped, so the stream's steps never go back, and one that cannot
be encoded is dropped and logged: a preview never costs the job), writes progress
(at most once per `STEPWISE_PROGRESS_INTERVAL`; the record's progress also goes on the job's event stream),
queues a `progress` webhook when the job asked for one (at most once per second), and notices a
cancel request recorded by the API and passes it to the engine, which stops the job at its next
step boundary. The job's lease is renewed by the
worker's `LeaseKeeper` (`worker.leases`), not here, so a long step cannot let it lapse.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from storage.errors import StorageError
from storage.job_record import JobRecord
from storage.webhooks import PROGRESS_SECONDS
from worker import metrics
from worker.held_job import HeldJob, StopReason
from worker.runtime import WorkerRuntime
from worker.webhooks import emit_event

log = logging.getLogger(__name__)


class JobWatch:
    def __init__(self, runtime: WorkerRuntime, held: HeldJob, record: JobRecord) -> None:
        self.runtime = runtime
        self.held = held
        self.record = record
        self.wants_progress_webhooks = "progress" in record.webhook_events
        self.written_step = 0
        self.written_image = 0  # the current image as last written
        self.written_flags = (False, False)  # (is_paused, is_late) as last written
        self.last_progress_write = 0.0
        self.last_progress_webhook = 0.0
        self.is_store_failing = False  # log an outage once, not at every poll

    def wait(self) -> Any:
        """The engine's result; raises what the engine's future raises."""
        assert self.held.future is not None
        while True:
            try:
                return self.held.future.result(timeout=self.runtime.settings.poll_interval)
            except FutureTimeout:
                pass
            try:
                self.tick(time.monotonic())
            except StorageError as e:  # Redis trouble must not end a job the engine is running
                if not self.is_store_failing:
                    log.warning("job %s: could not update its record (%s); retrying", self.held.job_id, e)
                self.is_store_failing = True
            else:
                if self.is_store_failing:
                    log.info("job %s: its record can be updated again", self.held.job_id)
                self.is_store_failing = False

    def tick(self, now: float) -> None:
        held = self.held
        for interval in held.take_step_intervals():
            metrics.STEP_LATENCY.observe(interval)
        self.write_preview()
        self.write_progress(now)
        store = self.runtime.job_store
        if held.stop_reason is None and store.is_cancel_requested(held.job_id):
            log.info("job %s: cancel requested; stopping at the next step", held.job_id)
            self.runtime.stop_job(held, StopReason.CANCELED)

    def write_preview(self) -> None:
        """The newest preview on the job's event stream. One that cannot be encoded costs that preview, never the
        job (the engine's rule for a preview it cannot make): it is dropped and logged."""
        preview = self.held.take_preview()
        if preview is None or preview.step < self.written_step:
            return
        try:
            image = preview.data_uri()  # here, off the engine loop: waits for the device's copy, resizes, encodes
        except Exception as e:
            job_id, why = self.held.job_id, f"{type(e).__name__}: {e}"
            log.warning(
                "job %s: its preview at step %d could not be encoded and was dropped (%s)", job_id, preview.step, why
            )
            return
        self.runtime.job_store.add_preview(self.held.job_id, preview.step, preview.total, image)

    def write_progress(self, now: float, *, force: bool = False) -> None:
        """Progress, and whether the engine has the job paused or estimates it late (a change of those is
        written at once: a paused job reports no steps)."""
        progress = self.held.progress  # the job's own steps, as the engine derives them
        step, total, current_image = progress.step, progress.total, progress.current_image
        future = self.held.future
        flags = (future.is_paused, future.is_late) if future is not None else (False, False)
        if (step, current_image) == (self.written_step, self.written_image) and flags == self.written_flags:
            return
        is_due = force or now - self.last_progress_write >= self.runtime.settings.progress_interval
        if not is_due and flags == self.written_flags:
            return
        self.runtime.job_store.set_progress(
            self.held.job_id, step, total, current_image=current_image, is_paused=flags[0], is_late=flags[1]
        )
        self.written_step = step
        self.written_image = current_image
        self.written_flags = flags
        self.last_progress_write = now
        if self.wants_progress_webhooks and now - self.last_progress_webhook >= PROGRESS_SECONDS:
            self.last_progress_webhook = now
            written = dataclasses.replace(
                self.record, progress_step=step, progress_total=total, progress_current_image=current_image
            )
            emit_event(written, "progress")
