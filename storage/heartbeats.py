"""Worker heartbeats in Redis, and the fleet they describe (GET /v1/models, /readyz).

Every engine worker writes its heartbeat, a small JSON object, into one hash (`{ns}:workers`,
field = worker id) every few seconds: its model, the model's family, capacity, the family's
defaults and limits, and a snapshot of its engine's statistics. Its `seen_at` alone goes beside it
(`{ns}:workers-seen`), for the dead-worker watches, which read every worker's each second. Readers
group the heartbeats by model:

- a worker is *live* while its last heartbeat is younger than `worker_timeout` and it admits jobs
  (not draining, not shutting down, its engine's loop thread running); a model is *available* while it
  has a live worker; a worker
  silent for longer is dead, and its running jobs are re-queued (`worker.leases`);
- a model stays listed (unavailable) for `retention` seconds after its last heartbeat, so jobs
  for a model whose worker is restarting are still accepted; then its heartbeats are dropped.

Nothing here holds job ids or prompts: the hash is safe to show every tenant.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import redis

from storage.redis_keys import RedisKeys

# The engine statistics a heartbeat carries (the rest of engine.stats() stays in the worker).
ENGINE_FIELDS = (
    "num_running",
    "num_waiting",
    "jobs_per_forward",
    "steps_per_second",
    "images_per_second",
    "running_by_key",
    "waiting_by_key",
    "threads_failed",  # the engine's threads that stopped: thread name -> why (empty while all is well)
    "tokens_computed",  # denoiser sequence positions computed since the engine started, all rows, text included
    "tokens_padded",  # of those, positions of no job's own (docs/families.md, "Mixed sizes")
)
_SUMMED_NUMBERS = (
    "num_running",
    "num_waiting",
    "steps_per_second",
    "images_per_second",
    "tokens_computed",
    "tokens_padded",
)
_SUMMED_COUNTERS = ("jobs_per_forward", "running_by_key", "waiting_by_key")


@dataclass(frozen=True)
class Heartbeat:
    worker_id: str
    model: str
    queue: str
    family: str
    capacity: int  # the engine's max_num_seqs
    seen_at: float  # unix seconds
    is_admitting: bool = True  # False while drained or shutting down: it takes no new job
    is_draining: bool = False  # drained by an operator (`celery control drain`), not shutting down
    defaults: dict[str, Any] = field(default_factory=dict)  # the family's defaults for omitted fields
    limits: dict[str, Any] = field(default_factory=dict)  # what the family accepts (sizes, samplers, lora...)
    engine: dict[str, Any] = field(default_factory=dict)  # ENGINE_FIELDS of engine.stats()
    # its spool (worker.spool): num_jobs, num_bytes, max_bytes, is_full (it takes no job), storage_error
    spool: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Heartbeat | None:
        try:
            data = json.loads(text)
            return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})
        except (ValueError, TypeError):
            return None  # a malformed or foreign entry is ignored, never fatal


def engine_snapshot(stats: dict[str, Any]) -> dict[str, Any]:
    return {name: stats[name] for name in ENGINE_FIELDS if name in stats}


@dataclass
class ModelStatus:
    """One served model, as GET /v1/models shows it."""

    model: str
    queue: str
    family: str
    available: bool
    workers: int  # live workers
    draining: int  # workers heard from within the timeout that an operator drained (not live)
    capacity: int  # summed over live workers
    last_seen: float  # newest heartbeat of any of its workers
    defaults: dict[str, Any]
    limits: dict[str, Any]
    engine: dict[str, Any]  # summed over live workers
    # the engine threads that stopped (thread name -> why) in workers heard from within the timeout
    threads_failed: dict[str, str] = field(default_factory=dict)
    spooling: int = 0  # live workers holding images the image store could not take yet (their jobs run on)
    spool_full: int = 0  # of those, the ones whose spool is full: they take no job until storage is back
    # jobs queued for it, per priority (filled in by JobStore.models)
    queued_by_priority: dict[str, int] = field(default_factory=dict)

    @property
    def queue_depth(self) -> int:
        return sum(self.queued_by_priority.values())


def summed_engine_stats(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {name: 0 for name in _SUMMED_NUMBERS}
    for name in _SUMMED_COUNTERS:
        counter: Counter = Counter()
        for snapshot in snapshots:
            counter.update(snapshot.get(name) or {})
        total[name] = dict(sorted(counter.items()))
    for snapshot in snapshots:
        for name in _SUMMED_NUMBERS:
            total[name] += snapshot.get(name) or 0
    return total


class HeartbeatStore:
    def __init__(self, client: redis.Redis, keys: RedisKeys, *, worker_timeout: float, retention: float) -> None:
        self._redis = client
        self.key = keys.workers
        self.seen_key = keys.workers_seen
        self.worker_timeout = worker_timeout
        self.retention = retention

    def beat(self, heartbeat: Heartbeat) -> None:
        """The heartbeat, and its seen_at alone beside it (one round trip): every worker's dead-worker watch reads
        all workers' seen_at each second, so what it reads must stay a few bytes per worker, not a heartbeat
        (a fleet of N workers would read N heartbeats N times a second: benchmarks/fleet.py)."""
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, heartbeat.worker_id, heartbeat.to_json())
            pipe.hset(self.seen_key, heartbeat.worker_id, repr(heartbeat.seen_at))
            pipe.execute()

    def seen_at_by_worker(self, now: float) -> dict[str, float]:
        """Worker id -> its latest heartbeat's seen_at, for heartbeats younger than the retention (worker.dead_workers);
        older ones are deleted on the way, as `heartbeats` does."""
        stored = cast(dict[str, str], self._redis.hgetall(self.seen_key))  # decode_responses=True
        seen, expired = {}, []
        for worker_id, text in stored.items():
            try:
                seen_at = float(text)
            except ValueError:
                seen_at = float("-inf")  # a foreign entry is dropped, never fatal
            if now - seen_at > self.retention:
                expired.append(worker_id)
            else:
                seen[worker_id] = seen_at
        if expired:
            self._forget(expired)
        return seen

    def heartbeats(self, now: float) -> list[Heartbeat]:
        """Heartbeats younger than the retention; older ones are deleted on the way."""
        beats, expired = [], []
        stored = cast(dict[str, str], self._redis.hgetall(self.key))  # decode_responses=True
        for worker_id, text in stored.items():
            beat = Heartbeat.from_json(text)
            if beat is None or now - beat.seen_at > self.retention:
                expired.append(worker_id)
            else:
                beats.append(beat)
        if expired:
            self._forget(expired)
        return beats

    def _forget(self, worker_ids: list[str]) -> None:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hdel(self.key, *worker_ids)
            pipe.hdel(self.seen_key, *worker_ids)
            pipe.execute()

    def is_live(self, beat: Heartbeat, now: float) -> bool:
        return beat.is_admitting and now - beat.seen_at <= self.worker_timeout

    def models(self, now: float) -> list[ModelStatus]:
        """One entry per model with a heartbeat within the retention, sorted by name."""
        by_model: dict[str, list[Heartbeat]] = {}
        for beat in self.heartbeats(now):
            by_model.setdefault(beat.model, []).append(beat)
        statuses = []
        for model, beats in sorted(by_model.items()):
            live = [beat for beat in beats if self.is_live(beat, now)]
            newest = max(beats, key=lambda beat: beat.seen_at)
            statuses.append(
                ModelStatus(
                    model=model,
                    queue=newest.queue,
                    family=newest.family,
                    available=bool(live),
                    workers=len(live),
                    draining=sum(1 for beat in beats if beat.is_draining and now - beat.seen_at <= self.worker_timeout),
                    capacity=sum(beat.capacity for beat in live),
                    last_seen=newest.seen_at,
                    defaults=newest.defaults,
                    limits=newest.limits,
                    engine=summed_engine_stats([beat.engine for beat in live]),
                    threads_failed={
                        thread: why
                        for beat in beats
                        if now - beat.seen_at <= self.worker_timeout
                        for thread, why in (beat.engine.get("threads_failed") or {}).items()
                    },
                    spooling=sum(1 for beat in live if beat.spool.get("num_jobs")),
                    spool_full=sum(1 for beat in live if beat.spool.get("is_full")),
                )
            )
        return statuses
