"""How an API process learns that a job it waits on moved: three mechanisms, side by side.

    python -m benchmarks.wakeup_mechanisms [--waiters 500] [--seconds 10] [--events-per-second 1]

`--waiters` coroutines in one process each wait on their own job's event stream (storage.job_events)
while another process appends one entry per job `--events-per-second` times a second, through the
job store's real SET_PROGRESS script (pipelined). Each mechanism runs in its own waiting process
against its own redis-server, one after another:

- `pubsub`: what stepwise uses (storage.job_event_feed): one subscription per process wakes the
  waiter of the job named in the message, which then reads its stream (XRANGE after its last id);
- `poll`: each waiter reads its stream every 250 ms, no subscription;
- `xread`: each waiter blocks in XREAD on its own connection.

Prints per mechanism: wake-up latency (entry written -> waiter has read it: p50, p99), the waiting
process's CPU seconds per second, redis-server's CPU seconds per second, and Redis connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from benchmarks.local_services import redis_server
from storage.job_event_feed import JobEventFeed
from storage.job_store import JobStore

POLL_SECONDS = 0.25


def write_events(store: JobStore, job_ids: list[str], rate: float, stop: threading.Event) -> None:
    step = 0
    while not stop.wait(1 / rate):
        step += 1
        for job_id in job_ids:  # the worker's own write (it once pipelined the script by hand, and broke with it)
            store.set_progress(job_id, step, 10_000)


async def waiter(mechanism: str, feed: JobEventFeed, client: aioredis.Redis, job_id: str, latencies, stop):
    key = feed.keys.job_events(job_id)
    last = "0-0"
    with feed.watch(job_id) as watch:
        while not stop.is_set():
            entries: list[Any]  # events from the feed, or bare stream ids from XREAD
            if mechanism == "pubsub":
                await watch.wait(5.0)
                entries = await feed.read_after(job_id, last)
            elif mechanism == "poll":
                await asyncio.sleep(POLL_SECONDS)
                entries = await feed.read_after(job_id, last)
            else:
                reply: Any = await client.xread({key: last}, block=5000)  # RESP2: [[stream, [(id, fields)]]]
                entries = [event_id for _, items in reply for event_id, _ in items]
            now_ms = time.time() * 1000
            for entry in entries:
                event_id = entry if isinstance(entry, str) else entry.event_id
                latencies.append(now_ms - int(event_id.split("-")[0]))
                last = event_id


def run_mechanism(mechanism: str, redis_url: str, job_ids: list[str], seconds: float, ready, out) -> None:
    async def main() -> dict:
        store = JobStore(redis_url)
        feed = JobEventFeed(redis_url, store.keys)
        client = aioredis.Redis.from_url(redis_url, decode_responses=True, max_connections=len(job_ids) + 10)
        latencies: list[float] = []
        stop = asyncio.Event()
        tasks = [asyncio.create_task(waiter(mechanism, feed, client, job_id, latencies, stop)) for job_id in job_ids]
        await asyncio.sleep(1.0)  # every waiter waiting
        ready.set()  # the writer starts
        await asyncio.sleep(0.5)
        cpu_before, redis_before = time.process_time(), redis_cpu(redis_url)
        latencies.clear()
        await asyncio.sleep(seconds)
        cpu_seconds, redis_seconds = time.process_time() - cpu_before, redis_cpu(redis_url) - redis_before
        connections = redis.Redis.from_url(redis_url).info("clients")["connected_clients"] - 2  # less writer, probe
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ordered = sorted(latencies)
        return {
            "mechanism": mechanism,
            "waiters": len(job_ids),
            "events_read": len(ordered),
            "latency_ms_p50": round(statistics.median(ordered), 1) if ordered else None,
            "latency_ms_p99": round(ordered[int(0.99 * (len(ordered) - 1))], 1) if ordered else None,
            "waiting_process_cpu_per_s": round(cpu_seconds / seconds, 3),
            "redis_cpu_per_s": round(redis_seconds / seconds, 3),  # the writer's scripts included
            "redis_connections": connections,
        }

    out.put(asyncio.run(main()))


def redis_cpu(redis_url: str) -> float:
    info = redis.Redis.from_url(redis_url).info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def measure(mechanism: str, num_waiters: int, seconds: float, rate: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="stepwise-wakeup-") as folder, redis_server(folder) as redis_url:
        store = JobStore(redis_url)
        job_ids = []
        for index in range(num_waiters):
            record, _ = store.create(tenant="bench", params={"prompt": f"job {index}", "model": "builtin:tiny"})
            store.take_next(record.queue, "bench-worker", 3600)  # the one queued job: this one
            job_ids.append(record.job_id)
        results: multiprocessing.Queue = multiprocessing.Queue()
        ready = multiprocessing.Event()
        child = multiprocessing.Process(
            target=run_mechanism, args=(mechanism, redis_url, job_ids, seconds, ready, results)
        )
        child.start()
        ready.wait(120)
        writer_stop = threading.Event()
        writer = threading.Thread(target=write_events, args=(store, job_ids, rate, writer_stop), daemon=True)
        writer.start()
        result = results.get(timeout=seconds + 120)
        writer_stop.set()
        child.join(30)
        return {**result, "events_per_second_per_job": rate, "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--events-per-second", type=float, default=1.0)
    parser.add_argument("--mechanisms", default="pubsub,poll,xread")
    args = parser.parse_args()
    for mechanism in args.mechanisms.split(","):
        print(json.dumps(measure(mechanism, args.waiters, args.seconds, args.events_per_second)), flush=True)


if __name__ == "__main__":
    main()
