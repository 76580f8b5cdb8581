"""Worker heartbeats -> the served models (GET /v1/models reads JobStore.models)."""

from __future__ import annotations

from storage.heartbeats import Heartbeat, engine_snapshot
from storage.queue_names import generate_queue


def beat(clock, worker_id: str, model: str = "builtin:tiny", **fields) -> Heartbeat:
    values = dict(
        worker_id=worker_id,
        model=model,
        queue=generate_queue(model),
        family="sd",
        capacity=4,
        seen_at=clock.now,
        engine={"num_running": 1, "images_per_second": 0.5, "jobs_per_forward": {"1": 2}, "tokens_computed": 100},
    )
    values.update(fields)
    return Heartbeat(**values)


def test_models_sum_their_live_workers_and_count_their_queued_jobs(store, clock):
    store.beat(beat(clock, "a"))
    engine = {
        "num_running": 2,
        "images_per_second": 1.0,
        "jobs_per_forward": {"1": 1, "2": 3},
        "tokens_computed": 250,
        "tokens_padded": 50,
    }
    store.beat(beat(clock, "b", engine=engine))
    store.beat(beat(clock, "c", model="builtin:small"))
    store.create(tenant="t", params={"prompt": "x", "model": "builtin:small"}, priority="low")

    small, tiny = store.models()  # sorted by name

    assert (tiny.model, tiny.available, tiny.workers, tiny.capacity) == ("builtin:tiny", True, 2, 8)
    assert tiny.engine["num_running"] == 3 and tiny.engine["images_per_second"] == 1.5
    assert tiny.engine["jobs_per_forward"] == {"1": 3, "2": 3}
    assert (tiny.engine["tokens_computed"], tiny.engine["tokens_padded"]) == (350, 50)
    assert (small.queue_depth, small.queued_by_priority["low"], tiny.queue_depth) == (1, 1, 0)


def test_a_silent_or_stopping_worker_makes_its_model_unavailable_and_an_old_one_is_forgotten(store, clock):
    store.beat(beat(clock, "a"))
    store.beat(beat(clock, "b", model="builtin:small", is_admitting=False))
    assert [(m.model, m.available) for m in store.models()] == [("builtin:small", False), ("builtin:tiny", True)]

    clock.advance(16)  # past the worker timeout (15 s)
    assert [m.available for m in store.models()] == [False, False]

    clock.advance(3600)  # past the retention
    assert store.models() == []


def test_a_malformed_heartbeat_is_ignored(store, clock, redis_url):
    import redis

    redis.Redis.from_url(redis_url).hset("stepwise:workers", "junk", "not json")
    store.beat(beat(clock, "a"))
    assert [m.model for m in store.models()] == ["builtin:tiny"]


def test_a_heartbeat_carries_the_engines_token_counts():
    stats = {"tokens_computed": 4096, "tokens_padded": 0, "rows_per_forward": {4: 2}, "model": "builtin:tiny-flux"}

    assert engine_snapshot(stats) == {"tokens_computed": 4096, "tokens_padded": 0}
