"""A real stepwise deployment for worker tests: its own redis-server, image storage and
`celery -A worker worker` processes, plus the client side (job store, Celery producer)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Celery

from batching.params import GenerationParams
from storage.job_record import JobRecord, JobState
from storage.job_store import JobStore
from storage.queue_names import BROKER_PRIORITY, GENERATE_TASK, WEBHOOK_QUEUE, broker_queue_keys, generate_queue
from tests.servers import RedisServer, child_env, free_port

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))
STEPWISE = str(Path(sys.executable).with_name("stepwise"))
BOOT_TIMEOUT = 180.0
JOB_TIMEOUT = 240.0  # a busy shared 2-core machine runs these jobs 30 times slower than an idle one
T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str | Callable[[], str], interval: float = 0.1) -> T:
    """Poll until `condition()` is truthy; return its value or fail saying what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {described}")
        time.sleep(interval)


def small_params(**overrides: Any) -> dict[str, Any]:
    """A cheap builtin:tiny job: 64x64, few steps, no guidance (one row per job)."""
    values = {
        "prompt": "a red fox",
        "height": 64,
        "width": 64,
        "num_inference_steps": 4,
        "guidance_scale": 1.0,
        "seed": 7,
    }
    values.update(overrides)
    return GenerationParams(**values).to_dict()


def long_params(**overrides: Any) -> dict[str, Any]:
    """A job that runs for seconds even on an idle machine (200 guided steps at 128x128: about
    3 s alone there, a minute or more on a busy 2-core one), so a test can act while it runs."""
    return small_params(
        **{
            "prompt": "a long job",
            "height": 128,
            "width": 128,
            "num_inference_steps": 200,
            "guidance_scale": 7.5,
            **overrides,
        }
    )


@dataclass
class WorkerProcess:
    name: str  # Celery node name, e.g. "w1@stepwise-tests"
    process: subprocess.Popen
    log_path: Path
    metrics_port: int

    def log_tail(self, num_lines: int = 80) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send `sig` and wait for the process to exit; returns its exit code."""
        if self.is_alive():
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"worker {self.name} did not exit within {timeout:.0f}s of {sig!r}:\n{self.log_tail()}"
            ) from None

    def kill(self) -> None:
        if self.is_alive():
            self.process.kill()
            self.process.wait()


@dataclass
class Cluster:
    redis: RedisServer
    storage_env: dict[str, str]  # STEPWISE_STORAGE_URL (and S3 settings)
    log_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    bucket: str | None = None  # S3 deployments
    s3: Any = None  # boto3 client for the bucket
    images: Path | None = None  # local-folder deployments
    main: WorkerProcess | None = None  # the shared worker, where there is one
    workers: list[WorkerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = JobStore(self.redis.url)
        self.celery = Celery("stepwise-tests", broker=self.redis.url, set_as_current=False)

    @property
    def env(self) -> dict[str, str]:
        return {"STEPWISE_REDIS_URL": self.redis.url, **self.storage_env, **self.extra_env}

    # -- processes ----------------------------------------------------------------------------

    def start_worker(
        self,
        label: str | None = None,
        *,
        via_stepwise: bool = False,
        wait: bool = True,
        stepwise_args: tuple[str, ...] = (),
        **env: str,
    ) -> WorkerProcess:
        """`celery -A worker worker` with no pool, concurrency or prefetch flags (the app's defaults
        must be right), or `stepwise worker` (with `stepwise_args`)."""
        label = label or f"w{len(self.workers) + 1}"
        name = f"{label}-{uuid.uuid4().hex[:6]}@stepwise-tests"
        metrics_port = free_port()
        log_path = self.log_dir / f"worker-{label}.log"
        child = child_env(**{**self.env, "STEPWISE_WORKER_METRICS_PORT": str(metrics_port), **env})  # env wins
        if via_stepwise:
            command = [STEPWISE, "worker", "--hostname", name, *stepwise_args]
        else:
            command = [
                CELERY,
                "-A",
                "worker",
                "worker",
                "-Q",
                "stepwise.generate,stepwise.webhooks",
                "-n",
                name,
                "--loglevel",
                "INFO",
            ]
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(command, cwd=ROOT, env=child, stdout=log_file, stderr=subprocess.STDOUT)
        worker = WorkerProcess(name, process, log_path, metrics_port)
        self.workers.append(worker)
        if wait:
            self.wait_until_ready(worker)
        return worker

    def wait_until_ready(self, worker: WorkerProcess, timeout: float = BOOT_TIMEOUT) -> None:
        """A worker answers ping once its consumer runs, which is after its model loaded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.is_alive():
                raise AssertionError(f"worker {worker.name} exited while starting:\n{worker.log_tail()}")
            if self.celery.control.ping(destination=[worker.name], timeout=1.0):
                return
        raise AssertionError(f"worker {worker.name} did not answer ping within {timeout:.0f}s:\n{worker.log_tail()}")

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.workers.clear()
        self.store.close()
        self.celery.close()

    # -- jobs ---------------------------------------------------------------------------------

    def create_job(self, params: dict[str, Any] | None = None, **fields: Any) -> JobRecord:
        record, _ = self.store.create(tenant="tests", params=params or small_params(), **fields)
        return record

    def enqueue(self, job_id: str, *, task_id: str | None = None) -> None:
        """Send the job's message to its queue at its priority, and say so, as the API does."""
        record = self.store.get(job_id)
        self.celery.send_task(
            GENERATE_TASK, args=[job_id], queue=record.queue, task_id=task_id, priority=BROKER_PRIORITY[record.priority]
        )
        self.store.mark_sent(job_id)

    def submit(self, params: dict[str, Any] | None = None, **fields: Any) -> str:
        record = self.create_job(params, **fields)
        self.enqueue(record.job_id)
        return record.job_id

    def wait_for_end(self, job_id: str, timeout: float = JOB_TIMEOUT) -> JobRecord:
        def ended() -> JobRecord | None:
            record = self.store.get(job_id)
            return record if record is not None and record.state.is_terminal else None

        return wait_for(ended, timeout, lambda: f"job {job_id} to end (now {self.describe(job_id)})", interval=0.2)

    def wait_for_progress(self, job_id: str, min_step: int = 1, timeout: float = JOB_TIMEOUT) -> JobRecord:
        def progressed() -> JobRecord | None:
            record = self.store.get(job_id)
            is_running = record is not None and record.state is JobState.RUNNING
            return record if is_running and record.progress_step >= min_step else None

        return wait_for(
            progressed,
            timeout,
            lambda: f"job {job_id} to be running at step {min_step} (now {self.describe(job_id)})",
            interval=0.05,
        )

    def describe(self, job_id: str) -> str:
        record = self.store.get(job_id)
        if record is None:
            return "no record"
        return f"{record.state.value}, step {record.progress_step}/{record.progress_total}, attempts {record.attempts}"

    def broker_is_idle(self, models: tuple[str, ...] = ("builtin:tiny",)) -> bool:
        """No message waits in a stepwise queue and none is delivered but unacknowledged."""
        with redis.Redis.from_url(self.redis.url) as client:
            return (
                all(self.queue_length(generate_queue(model)) == 0 for model in models)
                and self.queue_length(WEBHOOK_QUEUE) == 0
                and client.hlen("unacked") == 0
            )

    def num_unacked(self) -> int:
        """Messages delivered to some worker and not acknowledged (kombu's `unacked` hash)."""
        with redis.Redis.from_url(self.redis.url) as client:
            return client.hlen("unacked")

    def queue_length(self, queue: str = generate_queue("builtin:tiny")) -> int:
        """Messages waiting in `queue`, over its priority lists."""
        with redis.Redis.from_url(self.redis.url) as client:
            return sum(client.llen(key) for key in broker_queue_keys(queue))

    # -- Celery's tools -----------------------------------------------------------------------

    def celery_cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """`celery -A worker <args>` as an operator would type it."""
        return subprocess.run(
            [CELERY, "-A", "worker", *args],
            cwd=ROOT,
            env=child_env(**self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def command(self, worker: WorkerProcess, name: str) -> Any:
        """One worker's reply to a remote command (inspect or control), through Celery's client."""
        replies = self.celery.control.broadcast(name, destination=[worker.name], reply=True, timeout=10.0)
        for reply in replies:
            if worker.name in reply:
                return reply[worker.name]
        raise AssertionError(f"{worker.name} did not answer {name}:\n{worker.log_tail()}")


def engine_stats_from_cli(cluster: Cluster, worker: WorkerProcess) -> dict[str, Any]:
    result = cluster.celery_cli("inspect", "engine_stats", "-d", worker.name, "--json", "-t", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    replies = json.loads(result.stdout.strip().splitlines()[-1])
    return replies[worker.name]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
