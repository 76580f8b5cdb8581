"""The worker's heartbeat: who serves which model, with what capacity, how busy (storage.heartbeats).

A thread writes one heartbeat every STEPWISE_HEARTBEAT_INTERVAL seconds from worker start to
shutdown; the last one, at shutdown, says the worker admits nothing more, so its model shows
unavailable at once instead of after STEPWISE_WORKER_TIMEOUT. A failed write is logged and retried
at the next beat: the heartbeat never stops the worker.
"""

from __future__ import annotations

import logging
import threading
import time

from core.families import FAMILIES
from core.params import MAX_FPS, MAX_NUM_IMAGES, MAX_SIZE, MAX_STEPS
from storage.errors import StorageError
from storage.heartbeats import Heartbeat, engine_snapshot
from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def engine_family(runtime: WorkerRuntime) -> str:
    """The family of the model the engine loaded (a folder model's is known only once loaded)."""
    return runtime.engine.family


def family_defaults(family: str) -> dict:
    """What an omitted field becomes for this family (core.families, as GenerationParams fills them)."""
    spec = FAMILIES[family]
    return {**spec.field_defaults(), "output_format": spec.default_output_format}


def family_limits(family: str) -> dict:
    """What the served family accepts; the API refuses a job outside it naming the field. The pixel limits are
    the API's (api.limits adds them to GET /v1/models), not the worker's."""
    spec = FAMILIES[family]
    return {
        "max_size": MAX_SIZE,
        "size_multiple": spec.size_multiple,
        "max_steps": MAX_STEPS,
        "max_guidance": spec.max_guidance,
        "max_num_images": MAX_NUM_IMAGES,
        "samplers": list(spec.samplers),
        "max_num_frames": spec.max_num_frames,
        "frames_per_latent": spec.frames_per_latent,  # num_frames is a multiple of it plus one
        "max_fps": MAX_FPS if spec.is_video else None,
        "output_formats": list(spec.output_formats()),
        "supports_lora": spec.supports_lora,
        "negative_prompt": spec.guidance_kind == "cfg",  # families with embedded guidance refuse one
        "init_image": spec.init_image_role,  # start (img2img/inpainting), edit, reference or none
        "max_reference_images": spec.max_reference_images,  # 0: the family takes no reference_images
    }


def current_heartbeat(runtime: WorkerRuntime) -> Heartbeat:
    settings = runtime.settings
    family = engine_family(runtime)
    return Heartbeat(
        worker_id=runtime.worker_id,
        model=settings.model,
        queue=settings.queue,
        family=family,
        capacity=settings.max_num_seqs,
        seen_at=time.time(),
        is_admitting=runtime.is_admitting and not runtime.is_shutting_down and runtime.is_engine_running,
        is_draining=not runtime.is_admitting and not runtime.is_shutting_down,
        defaults=family_defaults(family),
        limits={
            **family_limits(family),
            "needs_init_image": runtime.engine.needs_init_image,
            "unusable_fields": sorted(runtime.engine.unusable_fields),
        },
        engine=engine_snapshot(runtime.engine_stats_or_none() or {}),
        spool=runtime.spool_stats(),
    )


class HeartbeatThread:
    def __init__(self, runtime: WorkerRuntime, interval: float) -> None:
        self.runtime = runtime
        self.interval = interval
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepwise-heartbeat", daemon=True)

    def start(self) -> HeartbeatThread:
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        try:
            self.runtime.job_store.beat(current_heartbeat(self.runtime))
        except StorageError as e:
            log.warning("heartbeat not written (%s); trying again in %.0fs", e, self.interval)
        except Exception:  # a silent worker counts as dead and loses its jobs: the thread must go on
            log.exception("heartbeat not written; trying again in %.0fs", self.interval)

    def wake(self) -> None:
        """Beat now (admission changed)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._stopped.is_set():
                self.beat()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.beat()  # the last one: the runtime admits nothing any more


_thread: HeartbeatThread | None = None


def start_heartbeat(runtime: WorkerRuntime, interval: float) -> None:
    global _thread
    _thread = HeartbeatThread(runtime, interval).start()


def beat_now() -> None:
    if _thread is not None:
        _thread.wake()


def stop_heartbeat() -> None:
    if _thread is not None:
        _thread.stop()
