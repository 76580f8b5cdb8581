"""Dead workers, found from their heartbeats: the jobs they held go back to the queue in seconds.

Every engine worker writes a heartbeat each STEPWISE_HEARTBEAT_INTERVAL (`worker.heartbeat`). Every
worker process, webhook-only ones included, runs a `DeadWorkerWatch` (from the lease sweeper's
thread, every second): a worker whose heartbeat has not changed for STEPWISE_WORKER_TIMEOUT, as seen
by this watch, is dead, and each running job it holds is re-queued at once instead of when its lease
lapses (STEPWISE_JOB_LEASE_SECONDS, a minute).

The watch judges by what it saw itself, on its own monotonic clock, never by the heartbeat's age
alone: after a Redis outage every heartbeat is old, and after a failed read the watch forgets what it
saw, so no worker counts as dead before it stayed silent for a whole timeout while Redis answered.
Clocks of other hosts do not matter either. A job is released only from the attempt that holds it
(`JobStore.release` with its holder token), so two watches cannot both re-queue it; a worker wrongly judged dead
(frozen, not dead) finds its attempt's writes refused: it stops that attempt, or, if it took the job again itself,
the new attempt joins the one still running (`worker.held_jobs`), so the job never runs twice or ends twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import cast

from storage.job_record import holder_token, worker_of
from storage.job_store import JobStore

log = logging.getLogger(__name__)


class DeadWorkerWatch:
    def __init__(
        self,
        job_store: JobStore,
        *,
        timeout: float,
        own_worker_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_store = job_store
        self.timeout = timeout
        self.own_worker_id = own_worker_id
        self.clock = clock
        self._unchanged: dict[str, tuple[float, float]] = {}  # worker id -> (its seen_at, when this watch saw it first)
        # Dead workers whose jobs this watch has re-queued already: a worker stays dead (its heartbeat listed)
        # for the retention, an hour, and reading every running job's holder each second for that long, in
        # every worker, would cost Redis what the fleet's size squared times its running jobs does.
        self._swept: set[str] = set()

    def forget(self) -> None:
        """After a failed read: what was seen before may be stale, so start watching afresh."""
        self._unchanged.clear()
        self._swept.clear()

    def dead_worker_ids(self) -> set[str]:
        """Workers whose heartbeat this watch has seen unchanged for at least the timeout."""
        now = self.clock()
        beats = self.job_store.heartbeat_store.seen_at_by_worker(time.time())  # a few bytes each (storage.heartbeats)
        for worker_id in set(self._unchanged) - set(beats):
            del self._unchanged[worker_id]
        dead = set()
        for worker_id, seen_at in beats.items():
            previous = self._unchanged.get(worker_id)
            if previous is None or previous[0] != seen_at:
                self._unchanged[worker_id] = (seen_at, now)
            elif now - previous[1] >= self.timeout:
                dead.add(worker_id)
        return dead

    def sweep(self) -> list[str]:
        """Re-queue every running job whose holder is dead; returns their ids. Raises StorageError (after
        forgetting what it saw) when Redis cannot be read."""
        try:
            dead = self.dead_worker_ids() - {self.own_worker_id}
            self._swept &= dead  # one that beat again is alive: if it dies again, its jobs are looked at again
            holders = running_holders(self.job_store) if dead - self._swept else {}
            requeued = []
            for job_id, holder in holders.items():
                worker_id = worker_of(holder)
                if worker_id not in dead:
                    continue
                message = f"worker {worker_id} sent no heartbeat for {self.timeout:.0f}s"
                if self.job_store.release(job_id, holder, "worker_lost", message):  # wakes its queue's workers
                    requeued.append(job_id)
                    log.warning("job %s: re-queued: %s", job_id, message)
        except Exception:
            self.forget()
            raise
        self._swept |= dead
        return requeued


def running_holders(store: JobStore) -> dict[str, str]:
    """Running job id -> the attempt holding it, `worker_id#attempt` (one round trip for the ids, one for the
    holders): the watch re-queues the attempt it judged, never one taken since."""
    client = store.redis
    job_ids = cast(list[str], client.zrange(store.keys.leases, 0, -1))
    if not job_ids:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(store.job_key(job_id), "worker_id", "attempts")
        replies = pipe.execute()
    return {
        job_id: holder_token(worker_id, int(attempts or 0))
        for job_id, (worker_id, attempts) in zip(job_ids, replies)
        if worker_id
    }
