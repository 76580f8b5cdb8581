"""A real stepwise deployment for worker tests: its own redis-server, image storage and
`celery -A worker worker` processes, plus the client side (job store, Celery producer)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import redis
from celery import Celery

from core.params import GenerationParams
from storage.job_record import JobRecord, JobState
from storage.job_store import JobStore
from storage.queue_names import WEBHOOK_QUEUE
from tests.support.processes import WEBHOOK_SECRET, WorkerProcess
from tests.support.servers import S3_TEST_ENV, RedisServer, child_env
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))
BOOT_TIMEOUT = 180.0

# Fast retries and a local receiver for webhook tests; short leases so recovery tests are quick.
TEST_WORKER_ENV = {
    "STEPWISE_WEBHOOK_SECRET": WEBHOOK_SECRET,
    "STEPWISE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "STEPWISE_WEBHOOK_BACKOFF": "0.2",
    "STEPWISE_WEBHOOK_MAX_ATTEMPTS": "3",
    "STEPWISE_PROGRESS_INTERVAL": "0.1",
    "STEPWISE_MAX_NUM_SEQS": "8",
}


def s3_client(endpoint_url: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=S3_TEST_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_TEST_ENV["AWS_SECRET_ACCESS_KEY"],
    )


# Leases of a few seconds so a dead worker's jobs come back quickly.
FAST_RECOVERY = {
    "STEPWISE_JOB_LEASE_SECONDS": "3",
    "STEPWISE_LEASE_SWEEP_INTERVAL": "0.5",
}

JOB_TIMEOUT = 240.0  # a busy shared 2-core machine runs these jobs 30 times slower than an idle one


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
        queues: str = "stepwise.generate,stepwise.webhooks",
        **env: str,
    ) -> WorkerProcess:
        """`celery -A worker worker` with no pool, concurrency or prefetch flags (the app's defaults
        must be right), or `stepwise worker` (with `stepwise_args`)."""
        worker = WorkerProcess(
            self.log_dir,
            self.redis.url,
            self.storage_env["STEPWISE_STORAGE_URL"],
            label=f"worker-{label or f'w{len(self.workers) + 1}'}",
            queues=queues,
            pool=None,
            via_stepwise=via_stepwise,
            stepwise_args=stepwise_args,
            **{**self.storage_env, **self.extra_env, **env},  # the test's settings win
        ).launch()
        self.workers.append(worker)
        if wait:
            self.wait_until_ready(worker)
        return worker

    def wait_until_ready(self, worker: WorkerProcess, timeout: float = BOOT_TIMEOUT) -> None:
        """A worker answers ping once its consumer runs, which is after its model loaded."""

        def answers_ping() -> bool:
            if not worker.is_alive():
                raise AssertionError(f"worker {worker.name} exited while starting:\n{worker.log_tail()}")
            return bool(self.celery.control.ping(destination=[worker.name], timeout=1.0))

        wait_for(answers_ping, timeout, lambda: f"worker {worker.name} to answer ping:\n{worker.log_tail()}", 0.0)

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.workers.clear()
        self.store.close()
        self.celery.close()

    # -- jobs ---------------------------------------------------------------------------------

    def create_job(self, params: dict[str, Any] | None = None, tenant: str = "tests", **fields: Any) -> JobRecord:
        record, _ = self.store.create(tenant=tenant, params=params or small_params(), **fields)
        return record

    def submit(self, params: dict[str, Any] | None = None, **fields: Any) -> str:
        """Queue a job as the API does (its model's workers are woken by the same script)."""
        return self.create_job(params, **fields).job_id

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

    def broker_is_idle(self) -> bool:
        """No webhook delivery waits in its queue and none is delivered but unacknowledged (the only Celery
        messages: jobs are not)."""
        with redis.Redis.from_url(self.redis.url) as client:
            return client.llen(WEBHOOK_QUEUE) == 0 and client.hlen("unacked") == 0

    def stored_images(self) -> list[str]:
        """Every image in the deployment's image folder, as keys relative to it (local-folder deployments)."""
        assert self.images is not None
        return sorted(str(path.relative_to(self.images)) for path in self.images.rglob("*.png"))

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


def local_folder_cluster(root: Path, **env: str) -> Cluster:
    """A deployment in `root`: its own redis-server, images in `root/images`, the test workers' settings plus
    `env`. The caller stops it (`stop_all`, then `redis.stop()`)."""
    images = root / "images"
    return Cluster(
        RedisServer(root / "redis").start(),
        {"STEPWISE_STORAGE_URL": images.resolve().as_uri()},
        root,
        extra_env={**TEST_WORKER_ENV, **env},
        images=images,
    )


def engine_stats_from_cli(cluster: Cluster, worker: WorkerProcess) -> dict[str, Any]:
    result = cluster.celery_cli("inspect", "engine_stats", "-d", worker.name, "--json", "-t", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    replies = json.loads(result.stdout.strip().splitlines()[-1])
    return replies[worker.name]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
