"""Accepted means kept: a write a client is told succeeded waits until a replica has it.

Redis replicates asynchronously: a master that acknowledges a write and dies before its replica has it loses
the write when the replica takes over (Sentinel, or a managed Redis's own failover). For stepwise that would be
a job answered 202 that never runs, or a cancel, delete or key revocation answered done that comes undone. So,
while the master has replicas, those writes are followed by `WAIT 1 <timeout>` on the same connection (Redis
counts the connection's own writes, so it must be the same one: one pipeline), and a write no replica
confirmed in time raises `ReplicaUnconfirmedError` (the API answers 503; the write may still be on the master).

Whether the master has replicas is `INFO replication`'s online replicas, read at most once per
REPLICAS_CACHE_SECONDS per store: a Redis without replicas (one server, or a new master whose old one is gone)
waits for nothing. A wait that times out, or a write that failed, reads it again at the next write.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis.commands.core import Script

from storage.errors import RedisUnavailableError

REPLICAS_CACHE_SECONDS = 2.0


class ReplicaUnconfirmedError(RedisUnavailableError):
    """No replica confirmed the write in time: it may be lost in a failover, so it is not acknowledged."""


class ReplicaWait:
    def __init__(
        self, client: redis.Redis, timeout_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._redis = client
        self.timeout_seconds = timeout_seconds  # 0: never wait
        self.clock = clock
        self._lock = threading.Lock()
        self._replicas: tuple[float, int] | None = None  # (read at, online replicas)

    def online_replicas(self) -> int:
        """The master's replicas in sync (state online), as read at most REPLICAS_CACHE_SECONDS ago."""
        with self._lock:
            if self._replicas is not None and self.clock() - self._replicas[0] < REPLICAS_CACHE_SECONDS:
                return self._replicas[1]
        info = self._redis.info("replication")
        online = sum(
            1 for key, value in info.items() if key.startswith("slave") and isinstance(value, dict)
            and value.get("state") == "online"
        )  # fmt: skip
        with self._lock:
            self._replicas = (self.clock(), online)
        return online

    def should_wait(self) -> bool:
        return self.timeout_seconds > 0 and self.online_replicas() > 0

    def queue_wait(self, pipe: redis.client.Pipeline) -> bool:
        """Add `WAIT 1 <timeout>` to the end of `pipe` (its writes come before it) if this write should wait;
        then pass the pipeline's last reply to `check`."""
        if not self.should_wait():
            return False
        pipe.execute_command("WAIT", 1, int(self.timeout_seconds * 1000))
        return True

    def forget(self) -> None:
        """Read the replicas again at the next write: one may have gone, or the master changed (a failover)."""
        with self._lock:
            self._replicas = None

    def check(self, num_confirmed: int) -> None:
        if int(num_confirmed) >= 1:
            return
        self.forget()
        raise ReplicaUnconfirmedError(
            f"Redis: no replica confirmed the write within {self.timeout_seconds:g}s (STEPWISE_REDIS_REPLICA_WAIT); "
            "it is not acknowledged, since a failover now could lose it"
        )

    @contextlib.contextmanager
    def forgetting_on_error(self) -> Iterator[None]:
        """Around a write: a Redis error (a connection lost in a failover, say) makes the next write read the
        replicas again, so that a new master without replicas is not asked to WAIT for one."""
        try:
            yield
        except redis.exceptions.RedisError:
            self.forget()
            raise

    def run_script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """`script(keys, args)`, then WAIT on the same connection when it should: the script's reply. A NOSCRIPT
        (after a restart or a failover: scripts are not replicated) loads the script and runs it once more."""
        for attempt in range(2):
            with self._redis.pipeline(transaction=False) as pipe, self.forgetting_on_error():
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                waits = self.queue_wait(pipe)
                replies = pipe.execute(raise_on_error=False)
            if isinstance(replies[0], redis.exceptions.NoScriptError) and attempt == 0:
                self._redis.script_load(script.script)
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            if waits:
                self.check(replies[1])
            return replies[0]
        raise AssertionError("unreachable")
