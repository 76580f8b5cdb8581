"""Per-job overhead of the worker path (job record I/O, input and hand-off, PNG encode, put) next to engine time.

    python -m benchmarks.worker_overhead [--jobs 16] [--steps 20] [--size 128] [--storage file|s3]

Runs the worker's own code for a job (`worker.tasks.run_job`: take, hold, run, end) for each job on a pool of
threads in this process, as the feeder's job threads do, against a redis-server it starts and a local folder or
moto's S3 server over HTTP, with one engine (builtin:tiny on the CPU unless STEPWISE_DEVICE says otherwise). Every
JobStore call is timed and charged to its job; the rest comes from the timings the worker
itself stamps on the record (`start`, `engine`, `encode`, `upload`), so it measures the
code that runs, not a copy of it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.local_services import free_port, redis_server, stop_process, wait_until


@contextlib.contextmanager
def storage_env(kind: str, folder: Path):
    if kind == "file":
        yield {"STEPWISE_STORAGE_URL": (folder / "images").as_uri()}
        return
    import boto3

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(credentials)
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.5), 30, "moto server")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="stepwise-bench")
        yield {"STEPWISE_STORAGE_URL": "s3://stepwise-bench/images", "STEPWISE_S3_ENDPOINT_URL": endpoint}
    finally:
        stop_process(process)


class TimedJobStore:
    """Forwards to a JobStore and charges each call's wall time to the job it names."""

    def __init__(self, store) -> None:
        self._store = store
        self.seconds: defaultdict[str, float] = defaultdict(float)  # job_id -> seconds in JobStore calls
        # job_id -> method -> calls, and -> seconds
        self.calls: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.method_seconds: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))

    def __getattr__(self, name: str):
        method = getattr(self._store, name)
        if not callable(method):
            return method

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if args and isinstance(args[0], str):
                    seconds = time.perf_counter() - started
                    self.seconds[args[0]] += seconds
                    self.calls[args[0]][name] += 1
                    self.method_seconds[args[0]][name] += seconds

        return timed


def summarize(label: str, values: list[float]) -> str:
    return (
        f"  {label:<40} median {statistics.median(values) * 1000:8.1f} ms"
        f"   mean {statistics.fmean(values) * 1000:8.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--storage", choices=("file", "s3"), default="file")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="stepwise-worker-bench-"))
    with redis_server(folder) as redis_url, storage_env(args.storage, folder) as storage:
        os.environ.update({"STEPWISE_REDIS_URL": redis_url, "STEPWISE_WORKER_METRICS_PORT": "0", **storage})
        os.environ.setdefault("STEPWISE_DEVICE", "cpu")
        from core.params import GenerationParams
        from worker import tasks
        from worker.runtime import WorkerRuntime
        from worker.settings import WorkerSettings

        settings = WorkerSettings.from_env()
        runtime = WorkerRuntime(settings)
        runtime.load_engine()
        real_store = runtime.job_store
        store = TimedJobStore(real_store)
        runtime.job_store = store  # type: ignore[assignment]  # forwards every call, timed

        def params(index: int) -> dict:
            return GenerationParams(
                prompt=f"a lighthouse, take {index}",
                seed=index,
                num_inference_steps=args.steps,
                height=args.size,
                width=args.size,
            ).to_dict()

        real_store.create(tenant="bench", params=params(-1 + 2**31))
        tasks.run_job(runtime)
        job_ids = [real_store.create(tenant="bench", params=params(i))[0].job_id for i in range(args.jobs)]
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
            outcomes = list(pool.map(lambda _: tasks.run_job(runtime), job_ids))
        wall = time.perf_counter() - started
        records = [real_store.get(job_id) for job_id in job_ids]
        stats = runtime.engine.stats()
        runtime.close()

    assert outcomes == ["succeeded"] * args.jobs, outcomes
    timings = [r.timings for r in records]
    engine = [t["denoise"] + t["decode"] for t in timings]
    record_io = [store.seconds[r.job_id] for r in records]
    # From taken to the end state written: the record's total less its broker wait and the engine's wall time,
    # plus the end-state write itself (after `total` was stamped).
    overhead = [
        t["total"] - (r.started_at - r.created_at) - t["engine"] + store.method_seconds[r.job_id]["finish"]
        for r, t in zip(records, timings, strict=True)
    ]
    num_calls = [sum(store.calls[r.job_id].values()) for r in records]
    print(
        f"{args.jobs} jobs, {args.steps} steps, {args.size}x{args.size}, storage={args.storage}, "
        f"model {stats['model']} on {stats['device']}, max_num_seqs {settings.max_num_seqs}, "
        f"jobs held at once {settings.concurrency}"
    )
    print(
        f"wall {wall:.2f} s for all jobs; engine: {stats['steps_per_second']:.1f} steps/s, "
        f"rows per forward {stats['rows_per_forward']}"
    )
    print("per job:")
    print(summarize("engine (denoise + decode)", engine))
    print(summarize("engine wall (submit -> result in hand)", [t["engine"] for t in timings]))
    print(summarize(f"record I/O ({statistics.median(num_calls):.0f} JobStore calls)", record_io))
    print(summarize("start (taken -> handed to the engine)", [t["start"] for t in timings]))
    print(summarize("PNG encode", [t["encode"] for t in timings]))
    print(summarize("put", [t["upload"] - t["encode"] for t in timings]))
    print(summarize("worker overhead (taken -> ended, less engine wall)", overhead))
    ratios = [o / e for o, e in zip(overhead, engine, strict=True)]
    print(f"  {'overhead / engine time':<40} median {statistics.median(ratios) * 100:8.1f} %")
    print("JobStore calls of one job:", dict(store.calls[records[0].job_id]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
