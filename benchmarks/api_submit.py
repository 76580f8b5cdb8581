"""Submit throughput of `stepwise api`: POST /v1/jobs and POST /v1/jobs/batch, jobs per second.

    python -m benchmarks.api_submit [--clients 8] [--seconds 10] [--batch 100]
    python -m benchmarks.api_submit --compare 9e3133e        # today's tree and REF's, side by side
    python -m benchmarks.api_submit --url http://127.0.0.1:8000 --key KEY   # an API already running

Without --url it starts its own redis-server and `stepwise api` on free ports (no worker: the
jobs stay queued; the queue limit is raised so nothing answers 429, and jobs for a model no worker
serves are accepted). Client processes keep one HTTP/1.1 connection each (raw sockets and a
request built once: a light client, so more of the shared CPUs go to the server; each run reports
the clients' CPU per request) and submit back to back; the first second is a warm-up.
`--compare REF` also extracts REF with `git archive` and runs its API the same way, on its own
redis-server, alternating the two trees round by round so that load from other work on a
shared machine falls on both: the ratio is the number to trust, more than either rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests

from benchmarks.local_services import free_port, redis_server, stop_process, wait_until

BODY = {"prompt": "a lighthouse on a cliff at dusk", "num_inference_steps": 20, "height": 128, "width": 128}
WARM_UP_SECONDS = 1.0
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def local_api(
    num_workers: int | None,
    num_threads: int,
    tree: Path = ROOT,
):
    """redis-server + `stepwise api` of the source tree `tree` (its own default server) on free ports; yields
    (url, key). num_workers None leaves the number to that tree's default."""
    with local_api_processes(num_workers, num_threads, tree) as started:
        yield started.url, started.key


@dataclass(frozen=True)
class LocalApi:
    url: str
    key: str
    redis_url: str
    api_pid: int


@contextlib.contextmanager
def local_api_processes(
    num_workers: int | None,
    num_threads: int,
    tree: Path = ROOT,
    **env_overrides: str,
):
    """`local_api`, yielding a LocalApi; `env_overrides` are STEPWISE_* settings of the API."""
    temporary = tempfile.TemporaryDirectory(prefix="stepwise-bench-", ignore_cleanup_errors=True)
    with temporary as work, redis_server(work) as redis_url:
        folder = Path(work)
        api_port, key = free_port(), f"sk_bench_{secrets.token_hex(8)}"
        env = {name: value for name, value in os.environ.items() if not name.startswith("STEPWISE_")}
        env.update(
            STEPWISE_REDIS_URL=redis_url,
            STEPWISE_STORAGE_URL=(folder / "images").as_uri(),
            STEPWISE_VAR_DIR=str(folder / "var"),
            STEPWISE_API_KEYS=f"bench:{key}",
            STEPWISE_MAX_QUEUE_DEPTH=str(10**9),
            STEPWISE_ACCEPT_UNSERVED_MODELS="true",
            PYTHONPATH=str(tree),
            **env_overrides,
        )
        argv = [sys.executable, "-m", "stepwise_cli.main", "api", "--host", "127.0.0.1", "--port", str(api_port)]
        argv += [*(["--workers", str(num_workers)] if num_workers else []), "--threads", str(num_threads)]
        api = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{api_port}"
            wait_until(lambda: requests.get(f"{url}/readyz", timeout=1).ok, 30, "stepwise api")
            yield LocalApi(url, key, redis_url, api.pid)
        finally:
            stop_process(api, 15)


@contextlib.contextmanager
def source_tree(ref: str):
    """The project's files at git `ref`, extracted to a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="stepwise-ref-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def client(url: str, key: str, batch: int, start_at: float, stop_at: float, results) -> None:
    """Submit back to back until stop_at; report (latencies of measured requests, jobs accepted, statuses).

    The request's bytes are built once and sent over one keep-alive socket; a response is read by its
    Content-Length. A load generator this lean leaves more of the shared cores to the server (like wrk;
    http.client cost several times more CPU per request)."""
    parts = urlsplit(url)
    path, body = ("/v1/jobs/batch", {"jobs": [BODY] * batch}) if batch else ("/v1/jobs", BODY)
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    connection = socket.create_connection((parts.hostname, parts.port), timeout=60)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    latencies: list[float] = []
    num_jobs, statuses = 0, Counter[int]()
    pending = b""
    cpu_started = None
    while (now := time.perf_counter()) < stop_at:
        if cpu_started is None and now >= start_at:
            cpu_started = time.process_time()
        connection.sendall(request)
        status, answer, pending = read_response(connection, pending)
        if now >= start_at:
            latencies.append(time.perf_counter() - now)
            statuses[status] += 1
            if status == 202:
                num_jobs += 1
            elif status == 200 and batch:
                num_jobs += json.loads(answer)["num_accepted"]
    cpu_seconds = time.process_time() - cpu_started if cpu_started is not None else 0.0
    connection.close()
    results.put((latencies, num_jobs, dict(statuses), cpu_seconds))


def read_response(connection: socket.socket, pending: bytes) -> tuple[int, bytes, bytes]:
    """(status, body, bytes read past it) of one HTTP/1.1 response with a Content-Length."""
    while (end := pending.find(b"\r\n\r\n")) < 0:
        pending += receive(connection)
    head, pending = pending[:end].decode("latin-1"), pending[end + 4 :]
    lines = head.split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = dict(line.split(":", 1) for line in lines[1:])
    length = next((int(value) for name, value in fields.items() if name.strip().lower() == "content-length"), None)
    if length is None:
        raise RuntimeError(f"the server answered without a Content-Length: {head!r}")
    while len(pending) < length:
        pending += receive(connection)
    return status, pending[:length], pending[length:]


def receive(connection: socket.socket) -> bytes:
    chunk = connection.recv(1 << 16)
    if not chunk:
        raise ConnectionError("the server closed the connection")
    return chunk


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def measure(url: str, key: str, num_clients: int, seconds: float, batch: int = 0) -> dict:
    """`batch` 0: POST /v1/jobs; N: POST /v1/jobs/batch with N jobs per request."""
    results: multiprocessing.Queue = multiprocessing.Queue()
    start_at = time.perf_counter() + WARM_UP_SECONDS
    stop_at = start_at + seconds
    processes = [
        multiprocessing.Process(target=client, args=(url, key, batch, start_at, stop_at, results))
        for _ in range(num_clients)
    ]
    for process in processes:
        process.start()
    latencies: list[float] = []
    num_jobs, statuses, cpu_seconds = 0, Counter[int](), 0.0
    for _ in processes:
        client_latencies, client_jobs, client_statuses, client_cpu = results.get(timeout=seconds + 120)
        cpu_seconds += client_cpu
        latencies += client_latencies
        num_jobs += client_jobs
        statuses.update(client_statuses)
    for process in processes:
        process.join(30)
    latencies.sort()
    return {
        "batch": batch,
        "requests": len(latencies),
        "requests_per_second": len(latencies) / seconds,
        "jobs_per_second": num_jobs / seconds,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "statuses": {str(status): count for status, count in statuses.items()},
        "client_cpu_us_per_request": 1e6 * cpu_seconds / max(len(latencies), 1),
    }


def compare(ref: str, num_threads: int, num_clients: int, seconds: float, batch: int, rounds: int) -> dict:
    """REF's API and this tree's (each with its own default server and number of workers), both up at once and
    measured in turn, round after round."""
    names = [ref, "this tree"]
    runs: dict[str, dict[str, list[dict]]] = {name: {"single": [], "batch": []} for name in names}
    with contextlib.ExitStack() as stack:
        old_tree = stack.enter_context(source_tree(ref))
        targets = [stack.enter_context(local_api(None, num_threads, tree)) for tree in (old_tree, ROOT)]
        for _ in range(rounds):
            for name, (url, key) in zip(names, targets):
                runs[name]["single"].append(measure(url, key, num_clients, seconds))
                if batch:
                    runs[name]["batch"].append(measure(url, key, num_clients, seconds, batch))
    summary: dict = {
        "ref": ref,
        "rounds": rounds,
        "clients": num_clients,
        "seconds": seconds,
        "batch_size": batch,
        "threads": num_threads,
        "load_average": os.getloadavg(),
        "variants": {},
    }
    for name in names:
        summary["variants"][name] = {
            mode: {
                "jobs_per_second_median": statistics.median(run["jobs_per_second"] for run in mode_runs),
                "runs": mode_runs,
            }
            for mode, mode_runs in runs[name].items()
            if mode_runs
        }
    baseline = summary["variants"][names[0]]
    summary["ratios_to_ref"] = {
        name: {
            mode: variant[mode]["jobs_per_second_median"] / max(baseline[mode]["jobs_per_second_median"], 1e-9)
            for mode in variant
        }
        for name, variant in summary["variants"].items()
    }
    return summary


def print_comparison(summary: dict) -> None:
    print(
        f"{os.cpu_count()} CPUs shared by clients, servers and Redis; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in summary['load_average'])}"
    )
    print(
        f"{summary['clients']} client processes, {summary['seconds']:.0f}s per run, {summary['rounds']} rounds, "
        f"batches of {summary['batch_size']}; jobs/s, median of the rounds (each round's value), ratio to the ref"
    )
    for name, variant in summary["variants"].items():
        cells = []
        for mode, label in (("single", "POST /v1/jobs"), ("batch", "POST /v1/jobs/batch")):
            if mode in variant:
                runs = [round(run["jobs_per_second"]) for run in variant[mode]["runs"]]
                cells.append(
                    f"{label} {variant[mode]['jobs_per_second_median']:6.0f} {runs} "
                    f"{summary['ratios_to_ref'][name][mode]:.2f}x"
                )
        print(f"  {name:32s} " + "   ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="base URL of a running API (default: start redis-server and stepwise api)")
    parser.add_argument("--key", help="API key for --url")
    parser.add_argument("--clients", type=int, default=8, help="client processes, one connection each")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured duration of each run")
    parser.add_argument("--batch", type=int, default=100, help="jobs per POST /v1/jobs/batch (0: skip batches)")
    parser.add_argument("--workers", type=int, default=None, help="workers of the started API (default: its own)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker process of the started API")
    parser.add_argument(
        "--compare",
        metavar="REF",
        help="run git REF's API and this tree's in turn, and print ratios",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds with --compare")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()

    num_workers = args.workers  # None: the started `stepwise api` picks its default
    if args.compare:
        summary = compare(args.compare, args.threads, args.clients, args.seconds, args.batch, args.rounds)
        print_comparison(summary)
        if args.json:
            args.json.write_text(json.dumps(summary, indent=2))
        return
    if args.url:
        if not args.key:
            parser.error("--url needs --key")
        target: contextlib.AbstractContextManager[tuple[str, str]] = contextlib.nullcontext(
            (args.url.rstrip("/"), args.key)
        )
        where = args.url
    else:
        target = local_api(num_workers, args.threads)
        where = f"stepwise api --workers {num_workers or 'default'} --threads {args.threads} (started here)"
    with target as (url, key):
        results = [measure(url, key, args.clients, args.seconds)]
        if args.batch:
            results.append(measure(url, key, args.clients, args.seconds, args.batch))
    print(f"target:   {where}")
    print(f"machine:  {os.cpu_count()} CPUs, shared by the clients and the server")
    print(f"clients:  {args.clients} processes, {args.seconds:.0f}s measured after {WARM_UP_SECONDS:.0f}s warm-up")
    for result in results:
        what = f"batches of {result['batch']}" if result["batch"] else "single submits"
        print(
            f"{what}: {result['requests']} requests -> {result['jobs_per_second']:.0f} jobs/s; latency p50 "
            f"{result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms; "
            f"statuses {result['statuses']}; clients' CPU {result['client_cpu_us_per_request']:.0f} us per request"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
