"""How to give tenants a fair share of a model's queue: three mechanisms measured on a real Redis.

    python -m benchmarks.fair_queue [--backlog 200] [--held 12] [--tenants 1,10,100,1000] [--out FILE]

- `fifo`: today's queue before fair share: one kombu list per priority step, messages naming their job,
  consumed in arrival order (a real kombu consumer over the Redis transport);
- `rotation`: one kombu queue per tenant, consumed together (kombu's Redis transport pops the queues
  round robin): the usual Celery answer;
- `sfq`: the project's own sorted sets in start-time fair queueing order (`storage.fair_share`), a
  message taking its queue's next job (`JobStore.take_next`).

For each: how many jobs are handed out after a tenant with a 200-job backlog (12 already held by a
worker) before a second tenant's 3 jobs, and the cost of handing out one job as the number of tenants
with queued jobs grows (one consumer, messages/takes per second). Each mechanism runs in this process
against its own redis-server; nothing here runs a model.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kombu import Connection, Consumer, Exchange, Queue

from benchmarks.worker_overhead import redis_server
from storage.job_store import JobStore
from storage.new_job import NewJobSpec
from storage.queue_names import generate_queue

PARAMS = {"prompt": "a red fox", "seed": 7, "num_inference_steps": 4}
QUEUE = generate_queue("builtin:tiny")


def kombu_order(url: str, batches: list[tuple[str, int]], *, per_tenant_queues: bool, held: int) -> list[str]:
    """Publish `batches` (tenant, count) as kombu messages, a consumer taking `held` of the first batch
    before the next ones arrive; the tenants of what is delivered after those, in order."""
    with Connection(url, transport_options={"priority_steps": [0, 3, 6, 9]}) as connection:
        names = sorted({tenant for tenant, _ in batches}) if per_tenant_queues else ["all"]
        queues = [Queue(name, Exchange(name), routing_key=name) for name in names]
        producer = connection.Producer()
        for queue in queues:
            queue(connection.default_channel).declare()
        delivered: list[str] = []

        def on_message(body, message) -> None:
            delivered.append(body["tenant"])
            message.ack()

        def publish(tenant: str, count: int) -> None:
            name = tenant if per_tenant_queues else "all"
            for _ in range(count):
                producer.publish({"tenant": tenant}, exchange=name, routing_key=name, serializer="json")

        total = sum(count for _, count in batches)
        with Consumer(connection, queues, callbacks=[on_message], prefetch_count=1):
            publish(*batches[0])
            while len(delivered) < held:
                connection.drain_events(timeout=10)
            for batch in batches[1:]:
                publish(*batch)
            while len(delivered) < total:
                connection.drain_events(timeout=10)
        return delivered[held:]


def sfq_order(url: str, batches: list[tuple[str, int]], *, take: int, held: int = 0) -> list[str]:
    with JobStore(url) as store:
        queued = 0
        for tenant, count in batches:
            store.create_many([NewJobSpec(tenant=tenant, params=PARAMS) for _ in range(count)])
            queued += count
            if queued == count:  # the first tenant's backlog: a worker took `held` of it meanwhile
                for _ in range(held):
                    store.take_next(QUEUE, "bench", 60)
        return [store.take_next(QUEUE, "bench", 60).tenant for _ in range(take)]


def jobs_before_interactive(order: list[str]) -> int:
    """Backlog jobs handed out before the interactive tenant's last job."""
    last = max(index for index, tenant in enumerate(order) if tenant == "alice")
    return sum(tenant == "bulk" for tenant in order[:last])


def handout_rate(take_one: Callable[[], object], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        take_one()
    return count / (time.perf_counter() - started)


def kombu_rate(url: str, num_tenants: int, count: int) -> float:
    """Messages per second one consumer takes from `num_tenants` queues with messages waiting in each."""
    with Connection(url) as connection:
        queues = [Queue(f"t{i}", Exchange(f"t{i}"), routing_key=f"t{i}") for i in range(num_tenants)]
        producer = connection.Producer()
        for queue in queues:
            queue(connection.default_channel).declare()
        per_queue = max(1, count // num_tenants) + 1
        for queue in queues:
            for _ in range(per_queue):
                producer.publish({}, exchange=queue.name, routing_key=queue.name, serializer="json")
        received = [0]

        def on_message(body, message) -> None:
            received[0] += 1
            message.ack()

        with Consumer(connection, queues, callbacks=[on_message], prefetch_count=1):
            connection.drain_events(timeout=10)  # the first delivery sets the consumer up
            started = time.perf_counter()
            target = received[0] + count
            while received[0] < target:
                connection.drain_events(timeout=10)
            return count / (time.perf_counter() - started)


def sfq_rate(url: str, num_tenants: int, count: int) -> float:
    with JobStore(url) as store:
        per_tenant = max(1, count // num_tenants) + 1
        for index in range(num_tenants):
            store.create_many([NewJobSpec(tenant=f"t{index}", params=PARAMS) for _ in range(per_tenant)])
        return handout_rate(lambda: store.take_next(QUEUE, "bench", 60), count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=200)
    parser.add_argument("--held", type=int, default=12, help="backlog jobs a worker holds when alice submits")
    parser.add_argument("--tenants", default="1,10,100,1000")
    parser.add_argument("--count", type=int, default=2000, help="hand-outs timed per point")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    batches = [("bulk", args.backlog), ("alice", 3)]
    take = args.backlog + 3 - args.held
    results: dict = {"backlog": args.backlog, "held": args.held, "wait_in_jobs": {}, "handouts_per_second": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name in ("fifo", "rotation", "sfq"):
            with redis_server(Path(folder)) as url:
                if name == "sfq":
                    order = sfq_order(url, batches, take=take, held=args.held)
                else:
                    order = kombu_order(url, batches, per_tenant_queues=name == "rotation", held=args.held)
                results["wait_in_jobs"][name] = jobs_before_interactive(order)
        for num_tenants in (int(n) for n in args.tenants.split(",")):
            for name, rate in (("rotation", kombu_rate), ("sfq", sfq_rate)):
                with redis_server(Path(folder)) as url:
                    results["handouts_per_second"].setdefault(name, {})[num_tenants] = round(
                        rate(url, num_tenants, args.count)
                    )
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
