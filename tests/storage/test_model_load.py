"""A model's load (queued + running jobs), the autoscaler's signal: per model, every priority, zero when idle."""

from __future__ import annotations

from storage.job_store import JobState
from storage.queue_names import generate_queue

TINY, SMALL = generate_queue("builtin:tiny"), generate_queue("builtin:small")


def create(store, model: str, count: int, **fields) -> list[str]:
    params = {"prompt": "a red fox", "seed": 7, "model": model}
    return [store.create(tenant="acme", params=params, **fields)[0].job_id for _ in range(count)]


def load(store, queue: str) -> tuple[int, int]:
    found = store.model_load(queue)
    assert found.num_jobs == found.num_queued + found.num_running
    return found.num_queued, found.num_running


def test_queued_and_running_jobs_are_counted_per_model_over_every_priority(store):
    create(store, "builtin:tiny", 3, priority="high")
    create(store, "builtin:tiny", 2, priority="low")
    create(store, "builtin:small", 4)
    taken = [store.take_next(TINY, "w1", 60) for _ in range(2)] + [store.take_next(SMALL, "w2", 60)]

    assert all(record is not None for record in taken)
    assert load(store, TINY) == (3, 2)
    assert load(store, SMALL) == (3, 1)
    assert load(store, generate_queue("builtin:never-used")) == (0, 0)


def test_the_load_falls_to_zero_as_jobs_end_whichever_way_they_end(store):
    job_ids = create(store, "builtin:tiny", 4)
    running = store.take_next(TINY, "w1", 60)
    requeued = store.take_next(TINY, "w1", 60)
    assert load(store, TINY) == (2, 2)

    store.finish(running.job_id, JobState.SUCCEEDED, holder=running.holder)
    store.release(requeued.job_id, requeued.holder)  # back in the queue: counted as queued again
    assert load(store, TINY) == (3, 0)
    for job_id in job_ids:
        if job_id != running.job_id:
            store.request_cancel(job_id)

    assert load(store, TINY) == (0, 0)
