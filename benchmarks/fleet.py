"""What a fleet of workers costs one Redis: N simulated workers on one real redis-server.

    python -m benchmarks.fleet [--workers 10,50,100] [--queued 10000] [--seconds 30] [--out benchmarks/results/fleet]

For each N: a fresh redis-server (append-only file on, fsync every second, as in production) gets `--queued` jobs
from four tenants (4,000, 3,000, 2,000 and 1,000 queued), then N simulated workers (`benchmarks.fleet_worker`:
the worker's own feeder, lease keeper, lease sweeper with its dead-worker watch, heartbeat and end script around
a TIMED STAND-IN FOR THE ENGINE, which runs no model) take and run them, spread over a few processes. After a
warm-up, one window of `--seconds` is measured:

- Redis commands per job ended and per worker-second (INFO commandstats before and after), by command;
- Redis CPU (INFO cpu: the server's user + system seconds over the window), per job and per worker-second;
- take latency p50/p99 (`JobStore.take_next`, as the feeder calls it);
- fairness: each tenant's share of the jobs taken in the window (all four have jobs queued throughout);
- where one Redis core would be busy: the CPU fitted against jobs per second over the runs (`project`).

The machine is shared and has two cores: Redis and the simulated workers compete for them, so latencies are
upper bounds; Redis's own CPU seconds and command counts do not depend on that.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import redis

from benchmarks.local_services import redis_server
from storage.job_store import JobStore
from storage.new_job import NewJobSpec
from storage.queue_names import generate_queue

TENANTS = {"tenant-a": 0.4, "tenant-b": 0.3, "tenant-c": 0.2, "tenant-d": 0.1}  # their shares of the queued jobs
WORKERS_PER_PROCESS = 25
WARM_UP_SECONDS = 25.0  # every worker has taken its first jobs, and every watch has met the departed workers
# (a watch judges a worker dead after STEPWISE_WORKER_TIMEOUT: one sweep of the running jobs each, then no more)
STAND_IN = (
    "THE ENGINE IS A TIMED STAND-IN: a job 'runs' for its drawn seconds while its thread does the job's Redis I/O "
    "(cancel checks, progress); no model runs and no image is made or stored"
)


def queue_jobs(url: str, num_jobs: int) -> dict[str, int]:
    """`num_jobs` jobs of builtin:tiny from the tenants, interleaved as they would arrive; returns how many each."""
    counts = {tenant: round(share * num_jobs) for tenant, share in TENANTS.items()}
    order = [tenant for tenant, count in counts.items() for _ in range(count)]
    random.Random(7).shuffle(order)  # mixed, not one tenant's block after another
    params = {"prompt": "a red fox", "model": "builtin:tiny"}
    with JobStore(url) as store:
        for start in range(0, len(order), 500):
            store.create_many([NewJobSpec(tenant=tenant, params=params) for tenant in order[start : start + 500]])
    return counts


def leave_departed_workers(url: str, num_departed: int) -> None:
    """The last heartbeats of workers that stopped a little while ago (an autoscaler scaled down): they stay
    listed for STEPWISE_MODEL_RETENTION, and every dead-worker watch meets them."""
    from benchmarks.fleet_worker import departed_heartbeat

    with JobStore(url) as store:
        for index in range(num_departed):
            store.beat(departed_heartbeat(f"departed-{index:03d}", generate_queue("builtin:tiny"), time.time() - 30))


def run_workers(url: str, worker_ids: list[str], timing: dict[str, Any], stop: Any, results: Any) -> None:
    """A process of simulated workers (started by `multiprocessing`): run until `stop` is set, then report."""
    os.environ["STEPWISE_REDIS_URL"] = url  # what worker.app (imported with the worker's pieces) reads
    from benchmarks.fleet_worker import FleetTiming, SimulatedWorker

    queue = generate_queue("builtin:tiny")
    workers = [SimulatedWorker(url, worker_id, queue, FleetTiming(**timing)).start() for worker_id in worker_ids]
    stop.wait()
    for worker in workers:
        worker.stopping.set()
    for worker in workers:
        worker.stop()
    results.put([worker.log for worker in workers])


def redis_snapshot(url: str) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
        return {
            "at": time.time(),
            "cpu": cpu["used_cpu_sys"] + cpu["used_cpu_user"],
            "calls": {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()},
            "usec": {name.removeprefix("cmdstat_"): value["usec"] for name, value in stats.items()},
        }
    finally:
        client.close()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def measure(
    num_workers: int,
    num_queued: int,
    num_departed: int,
    seconds: float,
    timing: dict[str, Any],
    folder: Path,
    warm_up: float = WARM_UP_SECONDS,
) -> dict[str, Any]:
    with redis_server(folder, "--appendonly", "yes", "--appendfsync", "everysec", "--maxclients", "10000") as url:
        queued = queue_jobs(url, num_queued)
        leave_departed_workers(url, num_departed)
        context = multiprocessing.get_context("spawn")
        stop, results = context.Event(), context.Queue()
        ids = [f"sim-{index:03d}" for index in range(num_workers)]
        groups = [ids[start : start + WORKERS_PER_PROCESS] for start in range(0, num_workers, WORKERS_PER_PROCESS)]
        processes = [context.Process(target=run_workers, args=(url, group, timing, stop, results)) for group in groups]
        for process in processes:
            process.start()
        time.sleep(warm_up)
        before = redis_snapshot(url)
        time.sleep(seconds)
        after = redis_snapshot(url)
        stop.set()
        logs = [log for _ in processes for log in results.get(timeout=120)]
        for process in processes:
            process.join(timeout=30)
        with JobStore(url) as store:
            left = store.counts_by_state()
    return summarise(num_workers, queued, before, after, logs, left)


def summarise(num_workers, queued, before, after, logs, left) -> dict[str, Any]:
    start, end = before["at"], after["at"]
    window = end - start

    def inside(at: float) -> bool:
        return start <= at < end

    ended = sum(1 for log in logs for at in log.ends if inside(at))
    takes = [(seconds, tenant) for log in logs for at, seconds, tenant in log.takes if inside(at)]
    calls = {name: after["calls"][name] - before["calls"].get(name, 0) for name in after["calls"]}
    calls = {name: count for name, count in sorted(calls.items(), key=lambda item: -item[1]) if count > 0}
    calls.pop("info", None)  # this benchmark's own two snapshots
    usec = {name: after["usec"][name] - before["usec"].get(name, 0) for name in calls}
    client_calls = Counter({name: sum(1 for log in logs for at in log.calls.get(name, []) if inside(at))
                            for log in logs for name in log.calls})  # fmt: skip
    total = sum(calls.values())
    cpu = after["cpu"] - before["cpu"]
    worker_seconds = num_workers * window
    by_tenant = Counter(tenant for _, tenant in takes)
    shares = {tenant: by_tenant[tenant] / max(1, len(takes)) for tenant in TENANTS}
    latencies = [seconds * 1000 for seconds, _ in takes]
    return {
        "workers": num_workers,
        "queued_at_start": sum(queued.values()),
        "queued_by_tenant_at_start": queued,
        "window_seconds": round(window, 2),
        "jobs_ended": ended,
        "jobs_per_second": round(ended / window, 2),
        "redis_commands": total,
        "commands_per_job": round(total / max(1, ended), 2),
        "commands_per_worker_second": round(total / worker_seconds, 2),
        "commands_per_second": round(total / window, 1),
        "commands_by_name": calls,
        "commands_per_job_by_name": {name: round(count / max(1, ended), 2) for name, count in calls.items()},
        "redis_usec_by_name": usec,
        "worker_calls_per_job": {name: round(count / max(1, ended), 2) for name, count in client_calls.most_common()},
        "redis_cpu_seconds": round(cpu, 3),
        "redis_cpu_core_fraction": round(cpu / window, 4),
        "redis_cpu_ms_per_job": round(1000 * cpu / max(1, ended), 4),
        "take_ms": {
            "p50": round(percentile(latencies, 50), 2),
            "p99": round(percentile(latencies, 99), 2),
            "count": len(latencies),
        },  # fmt: skip
        "tenant_shares": {tenant: round(share, 4) for tenant, share in shares.items()},
        "fair_share_max_deviation": round(max(abs(share - 1 / len(TENANTS)) for share in shares.values()), 4),
        "left_by_state": left,
    }


def project(runs: list[dict[str, Any]], timing: dict[str, Any]) -> dict[str, Any]:
    """Where one Redis core would be busy, for this job profile: Redis CPU (core fraction) fitted as
    idle + per_job * jobs_per_second over the runs (least squares). The workers' own periodic commands ride on
    the per-job slope here (each worker ends jobs at a fixed rate); the one that grows faster, every watch
    reading every worker's seen_at each second (N^2 small reads), is given apart from its commandstats time."""
    jobs = np.array([r["jobs_per_second"] for r in runs], dtype=float)
    load = np.array([r["redis_cpu_core_fraction"] for r in runs])
    per_job, idle = np.polyfit(jobs, load, 1)
    jobs_per_worker_second = timing["capacity"] / timing["job_seconds"]
    largest = max(runs, key=lambda r: r["workers"])
    hgetall_calls = max(1, largest["commands_by_name"].get("hgetall", 1))  # the watches' and the take script's
    watch_calls = min(hgetall_calls, largest["workers"] * largest["window_seconds"])  # one a watch a second
    watch_usec = largest["redis_usec_by_name"].get("hgetall", 0) * watch_calls / hgetall_calls
    watch_fraction = watch_usec / 1e6 / largest["window_seconds"]
    at_core = (1 - idle) / per_job
    return {
        "idle_core_fraction": round(float(idle), 4),
        "cpu_ms_per_job": round(1000 * float(per_job), 3),
        "jobs_per_second_at_one_core": round(float(at_core)),
        "workers_at_one_core": round(float(at_core) / jobs_per_worker_second),
        "jobs_per_second_at_70_percent": round(float((0.7 - idle) / per_job)),
        "workers_at_70_percent": round(float((0.7 - idle) / per_job) / jobs_per_worker_second),
        "watch_core_fraction_at_largest": round(watch_fraction, 5),
        "watch_core_fraction_at_workers_at_one_core": round(
            float(watch_fraction * (at_core / jobs_per_worker_second / largest["workers"]) ** 2), 4
        ),
    }


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "redis": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| workers | jobs/s | commands/job | commands/worker-s | Redis CPU (core) | Redis CPU ms/job "
        "| take p50 / p99 ms | tenant shares (a/b/c/d) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        shares = "/".join(f"{100 * share:.0f}%" for share in r["tenant_shares"].values())
        lines.append(
            f"| {r['workers']} | {r['jobs_per_second']} | {r['commands_per_job']} "
            f"| {r['commands_per_worker_second']} | "
            f"{100 * r['redis_cpu_core_fraction']:.1f}% | {r['redis_cpu_ms_per_job']:.3f} | "
            f"{r['take_ms']['p50']:.1f} / {r['take_ms']['p99']:.1f} | {shares} |"
        )
    return "\n".join(lines)


def by_command(runs: list[dict[str, Any]]) -> str:
    """Redis commands per job ended, by command (Lua's inner calls counted as commandstats counts them)."""
    names = sorted(
        {n for r in runs for n in r["commands_per_job_by_name"]},
        key=lambda n: -runs[-1]["commands_per_job_by_name"].get(n, 0),
    )
    lines = [
        "| command | " + " | ".join(f"{r['workers']} workers" for r in runs) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(str(r["commands_per_job_by_name"].get(name, 0)) for r in runs) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="10,50,100", help="fleet sizes, comma-separated")
    parser.add_argument("--queued", type=int, default=10_000, help="jobs queued before the workers start")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window of each run")
    parser.add_argument("--job-seconds", type=float, default=6.0, help="the stand-in's mean run time of a job")
    parser.add_argument("--capacity", type=int, default=4, help="jobs one worker runs at once (max_num_seqs)")
    parser.add_argument("--departed", type=int, default=5, help="workers that stopped shortly before (heartbeats)")
    parser.add_argument("--warm-up", type=float, default=WARM_UP_SECONDS, help="seconds before the window")
    parser.add_argument("--out", type=Path, help="a folder for fleet.json and fleet.md")
    args = parser.parse_args()
    print(STAND_IN, flush=True)
    timing = {"capacity": args.capacity, "job_seconds": args.job_seconds}
    settings = {**timing, "departed_workers": args.departed, "queued": args.queued, "window_seconds": args.seconds}
    runs = []
    for num_workers in [int(n) for n in args.workers.split(",")]:
        with tempfile.TemporaryDirectory() as folder:
            run = measure(num_workers, args.queued, args.departed, args.seconds, timing, Path(folder), args.warm_up)
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if not k.startswith(("commands_by", "redis_usec"))}), flush=True)
    projection = project(runs, timing) if len(runs) >= 3 else {}
    report = {"stand_in": STAND_IN, "machine": machine(), "settings": settings, "runs": runs, "projection": projection}
    text = "\n\n".join([f"{STAND_IN}.", table(runs), by_command(runs), f"projection: {json.dumps(projection)}"]) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fleet.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "fleet.md").write_text(text)


if __name__ == "__main__":
    main()
