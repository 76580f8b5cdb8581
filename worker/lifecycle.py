"""Worker process start and stop, hooked to Celery's worker signals.

- `worker_init` (once, in the worker's main process, before it consumes anything): check the
  pool; take `-Q stepwise.generate` (or no `-Q`) as the engine role, which consumes no Celery queue;
  for an engine worker: load the model into this process's engine, start the
  metrics exporter, the heartbeat and the lapsed lease sweeper (which also re-queues dead
  workers' jobs, `worker.dead_workers`), and for a local image folder the image retention sweeper
  (`worker.image_retention`), and the spool's uploader, which first takes over what a stopped worker
  left in the spool (`worker.spool`). A worker that consumes only the webhook queue loads no model and
  sends no heartbeat, but sweeps too.
- `worker_ready`: an engine worker starts its feeder, which takes jobs from its model's queue
  (`worker.feeder`).
- `worker_shutting_down` (SIGTERM, Ctrl+C): the drain (`worker.drain`): stop admitting (the feeder
  takes nothing more); re-queue waiting jobs; let the running jobs that will finish within
  `STEPWISE_DRAIN_SECONDS` (at most `STEPWISE_SHUTDOWN_GRACE`; none on a cold shutdown) finish and
  hand the rest back at their next step; a second signal hands back everything at once.
- `worker_shutdown`: wait for the feeder's jobs to end, then stop the sweeper, the heartbeat (its
  last beat says the model lost this worker) and the engine; the process exits 0.
"""

from __future__ import annotations

import logging
import sys
import traceback

from celery import signals
from celery.exceptions import ImproperlyConfigured

from storage.queue_names import ENGINE_ROLE, WEBHOOK_QUEUE
from worker import metrics
from worker.app import settings
from worker.dead_workers import DeadWorkerWatch
from worker.feeder import Feeder
from worker.heartbeat import beat_now, start_heartbeat, stop_heartbeat
from worker.image_retention import ImageRetentionSweeper
from worker.job_ends import end_spooled_job
from worker.leases import LapsedLeaseSweeper
from worker.runtime import current_runtime, start_runtime
from worker.spool_uploader import SpoolUploader

log = logging.getLogger(__name__)

_sweeper: LapsedLeaseSweeper | None = None
_image_sweeper: ImageRetentionSweeper | None = None
_feeder: Feeder | None = None
_spool_uploader: SpoolUploader | None = None


def _pool_name(pool_cls: object) -> str:
    return pool_cls if isinstance(pool_cls, str) else f"{getattr(pool_cls, '__module__', '')}"


def take_engine_role(queues) -> bool:
    """Whether this worker runs an engine (`-Q` named `stepwise.generate`, or no `-Q`): its jobs come from its
    model's queue through its feeder, not from Celery, so the role's name is consumed as no queue."""
    if ENGINE_ROLE not in queues.consume_from:
        return False
    queues.deselect([ENGINE_ROLE])
    return True


@signals.worker_init.connect
def on_worker_init(sender, **_) -> None:
    try:
        start(sender)
    except Exception as e:
        # Celery logs and ignores a signal handler's exception (and its logging is not set up
        # yet): say why here and exit, so a worker without its engine never takes a job.
        traceback.print_exc()
        sys.stderr.write(f"stepwise worker: cannot start: {e}\n")
        raise SystemExit(1) from e


def start(sender) -> None:
    global _sweeper, _image_sweeper, _spool_uploader
    log_from_the_start(sender)
    pool = _pool_name(sender.pool_cls)
    if "thread" not in pool:
        raise ImproperlyConfigured(
            f"stepwise workers need the threads pool (got {pool!r}): every job of a process must share "
            "its one engine to batch. Drop -P/--pool, or pass --pool threads."
        )
    runs_engine = take_engine_role(sender.app.amqp.queues)
    if runs_engine and WEBHOOK_QUEUE in sender.app.amqp.queues.consume_from:
        log.warning(
            "this worker delivers webhooks in the process that generates: many slow receivers take CPU and "
            "connections from it. Deliver them from a worker of their own: stepwise worker --queues %s",
            WEBHOOK_QUEUE,
        )
    runtime = start_runtime(settings, sender.hostname, runs_engine=runs_engine)
    if runs_engine:
        # Before anything is consumed: what a stopped worker left in the spool is taken over, not run again.
        _spool_uploader = SpoolUploader(runtime, end_spooled_job).start()
        metrics.watch_spool(runtime.spool_stats)
        runtime.load_engine()
        start_heartbeat(runtime, settings.storage.heartbeat_interval)
    metrics.start_exporter(settings.metrics_host, settings.metrics_port, runtime.engine_stats_or_none)
    dead_workers = DeadWorkerWatch(
        runtime.job_store, timeout=settings.storage.worker_timeout, own_worker_id=runtime.worker_id
    )
    _sweeper = LapsedLeaseSweeper(
        runtime.job_store,
        settings.lease_sweep_interval,
        dead_workers=dead_workers,
        is_held_here=runtime.held.holds,
    ).start()
    _image_sweeper = ImageRetentionSweeper.for_store(runtime.image_store, settings.storage.image_ttl_seconds)


def log_from_the_start(sender) -> None:
    """Celery sets up its logging only after `worker_init`; set it up now (Celery's own setup, which then does
    nothing the second time), so what the start does is logged: the spool's adoptions, the model's load."""
    setup_logging = getattr(sender, "setup_logging", None)  # celery.apps.worker.Worker's, under the command line
    if setup_logging is not None:
        setup_logging()


@signals.worker_ready.connect
def on_worker_ready(**_) -> None:
    global _feeder
    runtime = current_runtime()
    if runtime is not None and runtime.runs_engine:
        from worker.tasks import run_held_job

        _feeder = Feeder(runtime, run_held_job).start()
    if runtime is not None:
        engine = (
            f"model {settings.model}, queue {settings.queue}, max_num_seqs {settings.max_num_seqs}, "
            f"{settings.concurrency} jobs held at once"
            if runtime.runs_engine
            else "no engine"
        )
        log.info(
            "stepwise worker %s ready (%s, metrics port %s)", runtime.worker_id, engine, settings.metrics_port or "off"
        )


@signals.worker_shutting_down.connect
def on_worker_shutting_down(how: str = "Warm", **_) -> None:
    runtime = current_runtime()
    if runtime is not None:
        runtime.begin_shutdown(drain_seconds(how))
        beat_now()  # the fleet sees at once that this worker takes no job


def drain_seconds(how: str) -> float:
    """How long a stopping worker lets running jobs finish: STEPWISE_DRAIN_SECONDS, at most
    STEPWISE_SHUTDOWN_GRACE; none on a cold shutdown."""
    if how != "Warm":
        return 0.0
    cap = settings.shutdown_grace
    return settings.drain_seconds if cap is None else min(settings.drain_seconds, cap)


@signals.worker_shutdown.connect
def on_worker_shutdown(**_) -> None:
    if _feeder is not None:  # its jobs finish, or are handed back, within the drain (begin_shutdown)
        _feeder.stop(timeout=drain_seconds("Warm") + 30)
    if _sweeper is not None:
        _sweeper.stop()
    if _image_sweeper is not None:
        _image_sweeper.stop()
    if _spool_uploader is not None:
        _spool_uploader.stop()
    stop_heartbeat()
    runtime = current_runtime()
    if runtime is not None:
        runtime.close()
