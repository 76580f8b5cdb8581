"""How `stepwise api` answers health checks while hundreds of clients wait on jobs.

    python -m benchmarks.waiting_clients [--waits 500] [--streams 500] [--probes 300]

Starts its own redis-server and `stepwise api` on loopback (no worker: jobs stay queued), then
holds `--waits` `POST /v1/jobs` requests with `Prefer: wait=60` and `--streams` open
`GET /v1/jobs/{id}/events` streams (each has received its first event), and meanwhile probes
`GET /healthz` `--probes` times, each on a new connection. Prints the probes' latencies (p50, p99,
max) without and with the held clients, and what the API spent on them: its threads (all
processes) and its Redis client connections, before and while they wait.

`hold_waiting_clients` is also what tests/api/test_many_waiting_clients.py uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
import requests

from benchmarks.api_submit import local_api_processes

BODY: dict[str, Any] = {
    "prompt": "a lighthouse on a cliff at dusk",
    "num_inference_steps": 20,
    "height": 128,
    "width": 128,
}
MAX_BATCH = 100


def request_bytes(method: str, path: str, key: str, host: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {key}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class HeldClients:
    """Connections held open on an event loop thread; `close()` drops them all."""

    loop: asyncio.AbstractEventLoop
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    stream_job_ids: list[str] = field(default_factory=list)
    num_answered_early: int = 0  # waits that got a response while they should still be waiting

    def close(self) -> None:
        async def close_all() -> None:
            for writer in self.writers:
                writer.close()

        asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def create_jobs(url: str, key: str, count: int) -> list[str]:
    job_ids: list[str] = []
    with requests.Session() as session:
        while len(job_ids) < count:
            size = min(MAX_BATCH, count - len(job_ids))
            response = session.post(
                f"{url}/v1/jobs/batch",
                json={"jobs": [BODY] * size},
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
            response.raise_for_status()
            job_ids += [result["job"]["job_id"] for result in response.json()["results"]]
    return job_ids


@contextlib.contextmanager
def hold_waiting_clients(
    url: str, key: str, *, num_waits: int, num_streams: int, num_queued: Callable[[], int], timeout: float = 120
) -> Iterator[HeldClients]:
    """Hold `num_waits` waiting submits (each has created its job: `num_queued()` counts them) and
    `num_streams` event streams (each has received its first event) until the block ends."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stream_job_ids = create_jobs(url, key, num_streams)
    queued_before = num_queued()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="held-clients", daemon=True)
    thread.start()
    held = HeldClients(loop, stream_job_ids=stream_job_ids)
    body = json.dumps(BODY).encode()

    async def open_wait() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        held.writers.append(writer)
        writer.write(request_bytes("POST", "/v1/jobs", key, parts.netloc, body, Prefer="wait=60"))
        await writer.drain()
        if await reader.read(1):  # nothing may come back while the job is queued
            held.num_answered_early += 1

    async def open_stream(job_id: str, ready: asyncio.Future) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        held.writers.append(writer)
        writer.write(request_bytes("GET", f"/v1/jobs/{job_id}/events", key, parts.netloc))
        await writer.drain()
        seen = b""
        while b"event: queued" not in seen:
            chunk = await reader.read(4096)
            if not chunk:
                ready.set_result(f"the event stream of {job_id} closed: {seen[-300:]!r}")
                return
            seen += chunk
        ready.set_result(None)
        while await reader.read(4096):  # keep reading keep-alives until closed
            pass

    async def start_all() -> None:
        ready = [loop.create_future() for _ in stream_job_ids]
        for job_id, future in zip(stream_job_ids, ready):
            loop.create_task(open_stream(job_id, future))
        for _ in range(num_waits):
            loop.create_task(open_wait())
        failures = [failure for failure in await asyncio.wait_for(asyncio.gather(*ready), timeout) if failure]
        if failures:
            raise ConnectionError(f"{len(failures)} event streams failed; the first: {failures[0]}")

    try:
        asyncio.run_coroutine_threadsafe(start_all(), loop).result(timeout + 5)
        deadline = time.monotonic() + timeout
        while num_queued() < queued_before + num_waits:  # every waiting submit created its job
            if time.monotonic() > deadline:
                raise TimeoutError(f"{num_queued() - queued_before} of {num_waits} waiting submits were taken")
            time.sleep(0.1)
        yield held
    finally:
        held.close()
        thread.join(30)


def probe_healthz(url: str, count: int, timeout: float = 5.0) -> list[float | None]:
    """Seconds per GET /healthz on a new connection; None for a probe that failed or timed out."""
    latencies: list[float | None] = []
    for _ in range(count):
        started = time.perf_counter()
        try:
            response = requests.get(f"{url}/healthz", timeout=timeout, headers={"Connection": "close"})
            latencies.append(time.perf_counter() - started if response.status_code == 200 else None)
        except requests.RequestException:
            latencies.append(None)
        time.sleep(0.01)
    return latencies


def summary(latencies: list[float | None]) -> dict:
    answered = sorted(latency for latency in latencies if latency is not None)
    if not answered:
        return {"answered": f"0/{len(latencies)}"}
    p99 = answered[min(len(answered) - 1, round(0.99 * (len(answered) - 1)))]
    return {
        "answered": f"{len(answered)}/{len(latencies)}",
        "p50_ms": round(statistics.median(answered) * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "max_ms": round(answered[-1] * 1000, 1),
    }


def process_tree(pid: int) -> list[int]:
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            with open(f"/proc/{current}/task/{current}/children") as children:
                pending.extend(int(child) for child in children.read().split())
    return pids


def num_threads(pid: int) -> int:
    return sum(len(os.listdir(f"/proc/{p}/task")) for p in process_tree(pid) if os.path.exists(f"/proc/{p}/task"))


def measure(num_waits: int, num_streams: int, num_probes: int) -> dict:
    with local_api_processes(2, 4, STEPWISE_API_MAX_CONNECTIONS="4000") as started:
        url, key, api_pid = started.url, started.key, started.api_pid
        client = redis.Redis.from_url(started.redis_url)

        def num_queued() -> int:
            return client.zcard("stepwise:queued")

        def api_clients() -> int:
            return client.info("clients")["connected_clients"] - 1  # less this one

        requests.post(f"{url}/v1/jobs", json=BODY, headers={"Authorization": f"Bearer {key}", "Prefer": "wait=1"})
        idle = summary(probe_healthz(url, num_probes))
        threads_idle, connections_idle = num_threads(api_pid), api_clients()
        with hold_waiting_clients(
            url, key, num_waits=num_waits, num_streams=num_streams, num_queued=num_queued
        ) as held:
            busy = summary(probe_healthz(url, num_probes))
            threads_busy, connections_busy = num_threads(api_pid), api_clients()
            early = held.num_answered_early
        return {
            "api_workers": 2,
            "threads_per_worker": 4,
            "waits": num_waits,
            "streams": num_streams,
            "healthz_idle": idle,
            "healthz_while_held": busy,
            "waits_answered_early": early,
            "api_threads": {"idle": threads_idle, "while_held": threads_busy},
            "api_redis_connections": {"idle": connections_idle, "while_held": connections_busy},
            "load_average": os.getloadavg()[0],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waits", type=int, default=500)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--probes", type=int, default=300)
    args = parser.parse_args()
    print(json.dumps(measure(args.waits, args.streams, args.probes)), flush=True)


if __name__ == "__main__":
    main()
