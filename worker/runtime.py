"""One worker process's shared state: its engine, its stores and the jobs it holds.

There is one `WorkerRuntime` per worker process. The model is loaded once, when the worker
starts (`worker.lifecycle`), and every task thread submits to the same engine, which is what
lets their jobs share forwards. Admission (drain, resume, the drain at SIGTERM: `worker.drain`) is decided here,
under one lock, so a job is either in the engine or sent back to the queue, never neither. The lock is
never held across I/O or the engine's submit (which decodes input images and may download a LoRA file).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

from core.errors import EngineShutdownError
from core.params import GenerationParams
from core.step_cache import cache_setting
from storage.image_store import ImageStore, open_image_store
from storage.job_store import JobStore
from storage.lora_store import LoraStore, open_lora_store
from storage.upload_store import UploadStore
from worker.active_job import ActiveJob, StopReason
from worker.drain import Drain
from worker.leases import LeaseKeeper
from worker.settings import OVERLAP_CHOICES, WorkerSettings
from worker.spool import ImageSpool, open_spool
from worker.warm_up import WarmUp, warm_up

if TYPE_CHECKING:
    from batching import DiffusionEngine

log = logging.getLogger(__name__)


def new_worker_id(nodename: str | None = None) -> str:
    """Unique per process start, so a restarted worker never mistakes old leases for its own."""
    name = nodename or f"{socket.gethostname()}"
    return f"{name}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class WorkerRuntime:
    def __init__(self, settings: WorkerSettings, worker_id: str | None = None, *, runs_engine: bool = True) -> None:
        self.settings = settings
        self.runs_engine = runs_engine  # False in a worker that only delivers webhooks
        self.worker_id = worker_id or new_worker_id()
        self.job_store = JobStore.from_settings(settings.storage)
        self.uploads = UploadStore.beside(self.job_store)  # input images of jobs (upload ids in records)
        self._image_store: ImageStore | None = None
        self._spool: ImageSpool | None = None
        self.lora_store: LoraStore | None = open_lora_store(settings.storage)
        self._engine: DiffusionEngine | None = None
        self._build_lock = threading.Lock()  # guards building the engine and the image store
        self._lock = threading.Lock()  # guards admission and the held jobs
        self._active: dict[str, ActiveJob] = {}
        self._is_idle = threading.Event()  # set while no job is held
        self._is_idle.set()
        self.is_admitting = True
        self.is_shutting_down = False
        self.room_changed = threading.Event()  # set when a held job ends or admission resumes (worker.feeder)
        self.warmed_up: WarmUp | None = None  # the warm-up job's outcome, once run (worker.warm_up)
        self.leases = LeaseKeeper(self.job_store, self.worker_id, self.lease_seconds, self._on_lease_lost)

    @property
    def lease_seconds(self) -> int:
        return self.settings.storage.job_lease_seconds

    @property
    def image_store(self) -> ImageStore:
        with self._build_lock:
            if self._image_store is None:
                self._image_store = open_image_store(self.settings.storage)
            return self._image_store

    @property
    def spool(self) -> ImageSpool:
        """Finished images the image store could not take yet (worker.spool)."""
        with self._build_lock:
            if self._spool is None:
                s = self.settings
                self._spool = open_spool(s.spool_dir, self.worker_id, s.spool_max_bytes)
            return self._spool

    @property
    def engine(self) -> DiffusionEngine:
        with self._build_lock:
            if self._engine is None:
                self._engine = self._build_engine()
            return self._engine

    def _build_engine(self) -> DiffusionEngine:
        from batching import DiffusionEngine, EngineConfig
        from batching.pipelines.loading import quiet_model_libraries

        quiet_model_libraries()
        s = self.settings
        config = EngineConfig(
            model=s.model,
            device=s.device,
            max_num_seqs=s.max_num_seqs,
            max_num_tokens=s.max_num_tokens or None,
            policy=s.policy,
            preemption=s.preemption,
            deterministic=s.deterministic,
            cache=cache_setting(s.cache),
            decode_overlap=OVERLAP_CHOICES[s.decode_overlap],
            encode_overlap=OVERLAP_CHOICES[s.encode_overlap],
            measure_forward_curve=OVERLAP_CHOICES[s.forward_curve],
            denoiser_compile=s.denoiser_compile,
            lora_url=s.storage.lora_url or None,
            lora_mode=s.lora_mode,
            lora_cache_adapters=s.lora_cache_adapters,
            lora_cache_bytes=s.lora_cache_bytes,
            lora_max_bytes=s.storage.lora_max_bytes,
        )
        log.info("loading model %s (max_num_seqs=%d, policy=%s)", s.model, s.max_num_seqs, s.policy)
        # The engine reads file:// stores itself; other stores (S3) through this process's storage code.
        is_local = s.storage.lora_url.startswith("file:")
        fetcher = None
        if self.lora_store is not None and not is_local:
            fetcher = functools.partial(self.lora_store.get_at_most, max_bytes=s.storage.lora_max_bytes)
        return DiffusionEngine(config, lora_fetcher=fetcher)

    def resolve_lora(self, tenant: str, name: str) -> str | None:
        """The store key of adapter `name` as `tenant` may use it, or None (see storage.lora_store)."""
        return self.lora_store.resolve(tenant, name) if self.lora_store else None

    def load_engine(self) -> None:
        """Build the engine and run the warm-up job through it: a worker is ready only once warm."""
        self.warmed_up = warm_up(self.engine, self.settings.model)

    # -- admission ---------------------------------------------------------------------------

    def submit(
        self,
        job_id: str,
        params: GenerationParams,
        priority: str = "normal",
        *,
        tenant: str = "",
        complete_by: float | None = None,
        preview_every: int | None = None,
    ) -> ActiveJob | None:
        """Hand the job to the engine, or return None while admission is stopped. `preview_every`: the job's
        (None: this worker's default).

        The engine's submit decodes input images and may fetch a LoRA file from its store, so it runs outside
        the lock: a slow download holds up only its own job. The job is held (and so seen by a drain) before
        the engine has it; a stop asked meanwhile is passed to the engine once it does (`stop_job`)."""
        engine = self.engine
        active = ActiveJob(job_id, tenant)
        with self._lock:
            if not self.is_admitting:
                return None
            self._active[job_id] = active
            self._is_idle.clear()
        try:
            future = engine.submit(
                params,
                job_id=job_id,
                on_progress=active.on_progress,
                priority=priority,
                tenant=tenant,
                complete_by=complete_by,
                preview_every=self.settings.preview_every if preview_every is None else preview_every,
                on_preview=active.on_preview,
            )
        except EngineShutdownError:
            self.release_active(job_id)
            return None
        except BaseException:
            self.release_active(job_id)
            raise
        with self._lock:
            active.future = future
            is_stopped = active.stop_reason is not None
        if is_stopped:  # a drain, shutdown or lost lease while the engine took it
            engine.cancel(future)
        return active

    def release_active(self, job_id: str) -> None:
        with self._lock:
            self._active.pop(job_id, None)
            if not self._active:
                self._is_idle.set()
        self.room_changed.set()

    def may_take_jobs(self, num_held: int = 0) -> bool:
        """Whether this worker may take another job from its queue while it holds `num_held` (taken, not ended):
        it is admitting (not drained, not shutting down), its engine runs and has room (the batch full plus a few
        waiting, `STEPWISE_WORKER_CONCURRENCY`), and its spool has room (worker.spool). The one place that
        decides it (`worker.feeder` asks before each take)."""
        return (
            self.is_admitting
            and not self.is_shutting_down
            and num_held < self.settings.concurrency
            and self.spool.has_room
            and self.is_engine_running
        )

    def stop_job(self, active: ActiveJob, reason: StopReason) -> None:
        """Ask the engine to stop the job at its next step boundary (or, while `submit` is still handing it
        over, as soon as the engine has it)."""
        with self._lock:
            if active.stop_reason is None:
                active.stop_reason = reason
            future = active.future
        if future is not None:
            self.engine.cancel(future)

    def cancel_in_engine(self, active: ActiveJob) -> None:
        """Drop the job from the engine for a reason of the worker's own (its watch failed): it takes part in no
        forward after the one under way. Harmless for a job the engine already ended."""
        if active.future is not None:
            self.engine.cancel(active.future)

    def _on_lease_lost(self, job_id: str) -> None:
        with self._lock:
            active = self._active.get(job_id)
            if active is not None:
                active.stop_reason = StopReason.LEASE_LOST  # wins over a cancel: this worker must not end the job
        if active is not None:
            self.stop_job(active, StopReason.LEASE_LOST)

    def stop_admission(self) -> list[str]:
        """Stop admitting jobs; send back to the queue those that have not started denoising.

        Returns their ids. Jobs already denoising keep running to their end.
        """
        with self._lock:
            self.is_admitting = False
            if self._engine is not None:
                self._engine.pause()
            waiting = [active for active in self._active.values() if not active.has_started_denoising]
        for active in waiting:
            self.stop_job(active, StopReason.REQUEUE)
        return [active.job_id for active in waiting]

    def resume_admission(self) -> None:
        with self._lock:
            if self.is_shutting_down:
                return
            self.is_admitting = True
            if self._engine is not None:
                self._engine.resume()
        self.room_changed.set()

    def requeue_all(self) -> list[str]:
        """Send every job this worker holds back to the queue (end of the shutdown grace)."""
        with self._lock:
            held = list(self._active.values())
        for active in held:
            self.stop_job(active, StopReason.REQUEUE)
        return [active.job_id for active in held]

    def active_jobs(self) -> list[ActiveJob]:
        with self._lock:
            return list(self._active.values())

    # -- lifecycle ---------------------------------------------------------------------------

    def begin_shutdown(self, drain_seconds: float) -> None:
        """The first call (SIGTERM, Ctrl+C): drain (worker.drain) for at most `drain_seconds`; any later one: hand
        back every running job at its next step. Returns at once (it is called in a signal handler)."""
        if self.is_shutting_down:
            threading.Thread(target=self.requeue_all, name="stepwise-shutdown", daemon=True).start()
            return
        self.is_shutting_down = True
        Drain(self, drain_seconds).start()

    def wait_until_idle(self, timeout: float) -> bool:
        """Whether no job is in the engine, waiting up to `timeout` seconds for it."""
        return self._is_idle.wait(timeout)

    def stats(self) -> dict[str, Any]:
        engine_stats = self._engine.stats() if self._engine is not None else {}
        return {
            **engine_stats,
            "worker_id": self.worker_id,
            "is_admitting": self.is_admitting,
            "is_shutting_down": self.is_shutting_down,
            "warm_up": self.warmed_up.as_dict() if self.warmed_up is not None else None,
            "may_take_jobs": self.may_take_jobs(),
            "spool": self.spool.stats(),
            "held_jobs": {active.job_id: f"{active.step}/{active.total}" for active in self.active_jobs()},
        }

    @property
    def is_engine_running(self) -> bool:
        """False once the engine's loop thread stopped (`threads_failed`): this worker can run no job."""
        from batching.engine import LOOP_THREAD_NAME

        return self._engine is None or LOOP_THREAD_NAME not in self._engine.stats()["threads_failed"]

    def engine_stats_or_none(self) -> dict[str, Any] | None:
        return self._engine.stats() if self._engine is not None else None

    def close(self) -> None:
        self.leases.stop()
        if self._spool is not None:
            self._spool.close()  # what still waits there is taken over by the next worker that looks
        if self._engine is not None:
            self._engine.shutdown(abort=True)  # task threads are done by now; nothing should be left
        self.job_store.close()


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> WorkerRuntime:
    global _runtime
    with _runtime_lock:
        if _runtime is None:  # no worker start (a task run in-process): the app's settings, read once
            from worker.app import settings

            _runtime = WorkerRuntime(settings)
        return _runtime


def start_runtime(settings: WorkerSettings, nodename: str, *, runs_engine: bool) -> WorkerRuntime:
    global _runtime
    with _runtime_lock:
        assert _runtime is None, "the worker runtime is started once per process"
        _runtime = WorkerRuntime(settings, new_worker_id(nodename), runs_engine=runs_engine)
        return _runtime


def current_runtime() -> WorkerRuntime | None:
    return _runtime
