"""One worker process's shared state: its engine, its stores and the book of the jobs it holds.

There is one `WorkerRuntime` per worker process. The model is loaded once, when the worker
starts (`worker.lifecycle`), and every job thread submits to the same engine, which is what
lets their jobs share forwards. The jobs it holds are in one book (`worker.held_jobs`). Admission (drain, resume,
the drain at SIGTERM: `worker.drain`) is decided here, under one lock, so a job is either in the engine or sent
back to the queue, never neither. No lock is held across I/O or the engine's submit (which decodes input images
and may download a LoRA file), and the engine's build has a lock of its own: the image store and the spool never
wait for a model to load.
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
from worker.drain import Drain
from worker.held_job import HeldJob, Stage, StopReason
from worker.held_jobs import HeldJobs
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
        self._engine_lock = threading.Lock()  # guards building the engine (a model load: minutes)
        self._stores_lock = threading.Lock()  # guards opening the image store and the spool
        self._lock = threading.Lock()  # guards admission
        self.is_admitting = True
        self.is_shutting_down = False
        self.room_changed = threading.Event()  # set when a held job leaves the engine or goes (worker.feeder)
        self.held = HeldJobs(on_change=self.room_changed.set)  # every job this worker holds (worker.held_jobs)
        self.warmed_up: WarmUp | None = None  # the warm-up job's outcome, once run (worker.warm_up)
        self.leases = LeaseKeeper(self.job_store, self.held, self.lease_seconds, self._on_lease_lost)

    @property
    def lease_seconds(self) -> int:
        return self.settings.storage.job_lease_seconds

    @property
    def image_store(self) -> ImageStore:
        with self._stores_lock:
            if self._image_store is None:
                self._image_store = open_image_store(self.settings.storage)
            return self._image_store

    @property
    def spool(self) -> ImageSpool:
        """Finished images the image store could not take yet (worker.spool)."""
        with self._stores_lock:
            if self._spool is None:
                self._spool = open_spool(self.settings.spool_dir, self.worker_id)
            return self._spool

    @property
    def engine(self) -> DiffusionEngine:
        with self._engine_lock:
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
        held: HeldJob,
        params: GenerationParams,
        priority: str = "normal",
        *,
        complete_by: float | None = None,
        preview_every: int | None = None,
    ) -> bool:
        """Hand the job to the engine; False if it was stopped first or admission is stopped (its `stop_reason`
        says which, None for the latter). `preview_every`: the job's (None: this worker's default).

        The engine's submit decodes input images and may fetch a LoRA file from its store, so it runs outside
        the lock: a slow download holds up only its own job. The job is held (and so seen by a drain) before
        the engine has it; a stop asked meanwhile is passed to the engine once it does (`stop_job`)."""
        self.held.wait_for_predecessor(held)
        engine = self.engine
        with self._lock:
            if not self.is_admitting or not self.held.enter_engine(held):
                return False
        try:
            future = engine.submit(
                params,
                job_id=held.job_id,
                on_progress=held.on_progress,
                priority=priority,
                tenant=held.tenant,
                complete_by=complete_by,
                preview_every=self.settings.preview_every if preview_every is None else preview_every,
                on_preview=held.on_preview,
            )
        except EngineShutdownError:
            self.held.leave_engine(held)
            return False
        except BaseException:
            self.held.leave_engine(held)
            raise
        if self.held.set_future(held, future):  # a drain, shutdown or lost lease while the engine took it
            engine.cancel(future)
        return True

    def may_take_jobs(self) -> bool:
        """Whether this worker may take another job from its queue: it is admitting (not drained, not shutting
        down), its engine runs, it runs fewer jobs than `STEPWISE_WORKER_CONCURRENCY` (the batch full plus a few
        waiting in the engine), and its spool has room (worker.spool). The one place that decides it
        (`worker.feeder` asks before each take)."""
        return (
            self.is_admitting
            and not self.is_shutting_down
            and self.held.num_running < self.settings.concurrency
            and self.has_spool_room
            and self.is_engine_running
        )

    @property
    def has_spool_room(self) -> bool:
        """The spool holds less than `STEPWISE_SPOOL_MAX_BYTES`. Jobs already running still finish into it, so it
        can exceed the bound by their images."""
        return self.held.spooled_bytes() < self.settings.spool_max_bytes

    def spool_stats(self) -> dict[str, object]:
        """What engine_stats, the heartbeat and the metrics say of the spool."""
        spooled = self.held.spooled()
        num_bytes = sum(held.spooled.num_bytes for held in spooled if held.spooled is not None)
        return {
            "num_jobs": len(spooled),
            "num_bytes": num_bytes,
            "max_bytes": self.settings.spool_max_bytes,
            "is_full": num_bytes >= self.settings.spool_max_bytes,
            "storage_error": self.spool.last_error if spooled else None,
        }

    def stop_job(self, held: HeldJob, reason: StopReason) -> None:
        """Ask the engine to stop the job at its next step boundary (or, while `submit` is still handing it
        over, as soon as the engine has it)."""
        future = self.held.stop(held, reason)
        if future is not None:
            self.engine.cancel(future)

    def cancel_in_engine(self, held: HeldJob) -> None:
        """Drop the job from the engine for a reason of the worker's own (its watch failed): it takes part in no
        forward after the one under way. Harmless for a job the engine already ended."""
        if held.future is not None:
            self.engine.cancel(held.future)

    def _on_lease_lost(self, job_id: str, holder: str) -> None:
        held = self.held.lose(job_id, holder)
        if held is None:  # taken again here meanwhile (its new attempt renews), or let go
            return
        log.warning("job %s: attempt %d no longer holds it; stopping it here", job_id, held.attempt)
        if held.future is not None:
            self.engine.cancel(held.future)

    def stop_admission(self) -> list[str]:
        """Stop admitting jobs; send back to the queue those that have not started denoising.

        Returns their ids. Jobs already denoising keep running to their end.
        """
        with self._lock:
            self.is_admitting = False
            if self._engine is not None:
                self._engine.pause()
            waiting = [held for held in self.held.before_or_in_engine() if not held.has_started_denoising]
        for held in waiting:
            self.stop_job(held, StopReason.REQUEUE)
        return [held.job_id for held in waiting]

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
        held_jobs = self.held.before_or_in_engine()
        for held in held_jobs:
            self.stop_job(held, StopReason.REQUEUE)
        return [held.job_id for held in held_jobs]

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
        """Whether no job is before or in the engine, waiting up to `timeout` seconds for it."""
        return self.held.wait_until_idle(timeout)

    def stats(self) -> dict[str, Any]:
        engine_stats = self._engine.stats() if self._engine is not None else {}
        return {
            **engine_stats,
            "worker_id": self.worker_id,
            "is_admitting": self.is_admitting,
            "is_shutting_down": self.is_shutting_down,
            "warm_up": self.warmed_up.as_dict() if self.warmed_up is not None else None,
            "may_take_jobs": self.may_take_jobs(),
            "spool": self.spool_stats(),
            "held_jobs": {held.job_id: held_progress(held) for held in self.held.all()},
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
            self._engine.shutdown(abort=True)  # job threads are done by now; nothing should be left
        self.job_store.close()


def held_progress(held: HeldJob) -> str:
    """`step/total`, and the stage when the engine is done with it: `20/20 (spooled)`."""
    if held.spooled is not None:
        return f"{held.spooled.steps}/{held.spooled.steps} ({held.stage.value})"
    progress = f"{held.step}/{held.total}"
    return progress if held.stage in (Stage.TAKEN, Stage.IN_ENGINE) else f"{progress} ({held.stage.value})"


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
