"""Submit throughput of `stepwise api`: POST /v1/jobs requests per second, with latency percentiles.

    python -m benchmarks.api_submit [--clients 8] [--seconds 10] [--workers N] [--worker-class gevent|gthread]
    python -m benchmarks.api_submit --url http://127.0.0.1:8000 --key KEY   # an API already running

Without --url it starts its own redis-server and `stepwise api` on free ports (no worker: the
jobs stay queued; the queue limit is raised so nothing answers 429). Client processes keep
one connection each and submit small jobs back to back; the first second is a warm-up.
Clients and server share this machine's CPUs, so the number is a floor for the server.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import requests

from benchmarks.local_services import free_port, wait_until

BODY = {"prompt": "a lighthouse on a cliff at dusk", "num_inference_steps": 20, "height": 128, "width": 128}
WARM_UP_SECONDS = 1.0


@contextlib.contextmanager
def local_api(num_workers: int, num_threads: int, worker_class: str = "gevent"):
    """redis-server + `stepwise api` on free ports; yields (url, key)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (or pass --url and --key of a running API)")
    folder = Path(tempfile.mkdtemp(prefix="stepwise-bench-"))
    redis_port, api_port, key = free_port(), free_port(), f"sk_bench_{secrets.token_hex(8)}"
    env = {name: value for name, value in os.environ.items() if not name.startswith("STEPWISE_")}
    env.update(STEPWISE_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
               STEPWISE_STORAGE_URL=(folder / "images").as_uri(),
               STEPWISE_API_KEYS=f"bench:{key}", STEPWISE_MAX_QUEUE_DEPTH=str(10**9))
    children = []
    try:
        children.append(subprocess.Popen([binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                                          "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL))
        children.append(subprocess.Popen(
            [sys.executable, "-m", "stepwise_cli.main", "api", "--host", "127.0.0.1", "--port", str(api_port),
             "--workers", str(num_workers), "--threads", str(num_threads), "--worker-class", worker_class],
            env=env, stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{api_port}"
        wait_until(lambda: requests.get(f"{url}/readyz", timeout=1).ok, 30, "stepwise api")
        yield url, key
    finally:
        for child in reversed(children):
            child.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(15)
        shutil.rmtree(folder, ignore_errors=True)


def client(url: str, key: str, start_at: float, stop_at: float, results) -> None:
    """Submit back to back until stop_at; report (latencies of measured requests, status counts)."""
    latencies, statuses = [], Counter()
    with requests.Session() as session:
        session.headers["Authorization"] = f"Bearer {key}"
        while (now := time.perf_counter()) < stop_at:
            response = session.post(f"{url}/v1/jobs", json=BODY, timeout=30)
            if now >= start_at:
                latencies.append(time.perf_counter() - now)
                statuses[response.status_code] += 1
    results.put((latencies, dict(statuses)))


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def measure(url: str, key: str, num_clients: int, seconds: float) -> dict:
    results = multiprocessing.Queue()
    start_at = time.perf_counter() + WARM_UP_SECONDS
    stop_at = start_at + seconds
    processes = [multiprocessing.Process(target=client, args=(url, key, start_at, stop_at, results))
                 for _ in range(num_clients)]
    for process in processes:
        process.start()
    latencies, statuses = [], Counter()
    for _ in processes:
        client_latencies, client_statuses = results.get(timeout=seconds + 120)
        latencies += client_latencies
        statuses.update(client_statuses)
    for process in processes:
        process.join(30)
    latencies.sort()
    return {
        "requests": len(latencies),
        "requests_per_second": len(latencies) / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "statuses": dict(statuses),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="base URL of a running API (default: start redis-server and stepwise api)")
    parser.add_argument("--key", help="API key for --url")
    parser.add_argument("--clients", type=int, default=8, help="client processes, one connection each")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured duration")
    parser.add_argument("--workers", type=int, default=None, help="gunicorn workers of the started API")
    parser.add_argument("--threads", type=int, default=4, help="threads per gthread worker of the started API")
    parser.add_argument("--worker-class", choices=("gevent", "gthread"), default="gevent",
                        help="gunicorn worker class of the started API (default: gevent, as `stepwise api`)")
    args = parser.parse_args()

    from stepwise_cli.api_cmd import default_workers

    num_workers = args.workers or default_workers()
    if args.url:
        if not args.key:
            parser.error("--url needs --key")
        target = contextlib.nullcontext((args.url.rstrip("/"), args.key))
        where = args.url
    else:
        target = local_api(num_workers, args.threads, args.worker_class)
        where = f"stepwise api --workers {num_workers} --threads {args.threads} (started here)"
    with target as (url, key):
        result = measure(url, key, args.clients, args.seconds)
    print(f"target:   {where}")
    print(f"machine:  {os.cpu_count()} CPUs, shared by the clients and the server")
    print(f"clients:  {args.clients} processes, {args.seconds:.0f}s measured after {WARM_UP_SECONDS:.0f}s warm-up")
    print(f"submits:  {result['requests']} -> {result['requests_per_second']:.0f} requests/s")
    print(f"latency:  p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms")
    print(f"statuses: {result['statuses']}")


if __name__ == "__main__":
    main()
