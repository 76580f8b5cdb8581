"""Redis memory per job, measured: the real job store writes N jobs into a redis-server of its own (loopback, a free
port, no persistence), and `INFO memory`'s used_memory is read before and after each stage:

1. N jobs queued (what a backlog costs), as the API creates them (full params, a webhook, an idempotency key);
2. the same N taken and finished `succeeded` with one image key and timings (what the job TTL keeps).

    python -m benchmarks.redis_memory --jobs 10000

Prints bytes per job and MiB per 10,000 jobs for each stage (docs/scaling.md and deploy/kubernetes/README.md
quote them). The figure depends on the prompt's length (a 60-character prompt here) and the Redis version.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile

import redis

from benchmarks.local_services import redis_server
from core.params import GenerationParams
from storage.job_record import JobState
from storage.job_store import JobStore
from storage.settings import StorageSettings

PROMPT = "a yellow triangle on a purple background, seen from above"  # 60 characters


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(num_jobs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as data_dir, redis_server(data_dir) as url:
        client = redis.Redis.from_url(url)
        store = JobStore.from_settings(StorageSettings(redis_url=url, storage_url="file:///tmp/unused"))
        before = used_memory(client)
        job_ids = []
        for index in range(num_jobs):
            params = GenerationParams(prompt=PROMPT, model="builtin:shapes", seed=index, height=128, width=128)
            record, _ = store.create(
                tenant=f"tenant-{index % 10}",
                params=params.to_dict(),
                webhook_url="https://hooks.example.com/stepwise",
                idempotency_key=f"key-{index:08d}",
                request_hash=f"{index:064x}",
            )
            job_ids.append(record.job_id)
        queued = used_memory(client)
        queue = store.get(job_ids[0]).queue
        for _ in job_ids:  # the fair order takes them all, each once
            taken = store.take_next(queue, "worker-1", 60)
            assert taken is not None
            store.finish(
                taken.job_id,
                JobState.SUCCEEDED,
                holder=taken.holder,
                image_keys=[f"{taken.job_id}/0.png"],
                timings={"queued": 0.5, "denoise": 1.2, "decode": 0.1, "store": 0.05},
            )
        finished = used_memory(client)
        store.close()
        client.close()
    return {
        "queued_bytes_per_job": (queued - before) / num_jobs,
        "finished_bytes_per_job": (finished - before) / num_jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10000)
    args = parser.parse_args()
    figures = measure(args.jobs)
    version = (
        subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        .stdout.split()[2]
        .removeprefix("v=")
    )
    print(f"{version}, {args.jobs} jobs")
    for stage in ("queued", "finished"):
        per_job = figures[f"{stage}_bytes_per_job"]
        print(f"  {stage:>8}: {per_job:,.0f} bytes per job, {per_job * 10000 / 2**20:.1f} MiB per 10,000 jobs")


if __name__ == "__main__":
    main()
