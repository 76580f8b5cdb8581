"""Waking the API's waiters when a job's event stream grows, on an asyncio event loop (redis.asyncio).

What `stepwise api`'s granian bridge (stepwise_cli.api_rsgi) runs, so a waiting request or an open
event stream costs a coroutine, not a thread: one `JobEventFeed` per event loop, that is one pub/sub
subscription on `{ns}:job-events` per API process however many requests wait, and a small pool of
connections for the reads they do then. Messages are only wake-ups: a waiter always re-reads the
job's stream (storage.job_events), so a message lost while the subscription reconnects costs
latency, never an event (waiters also re-read on a timer).

The same subscription hears API key revocations (storage.api_keys): a waiter that names the key it
came with (`watch(job_id, key_id)`) is marked revoked and woken, so an open stream or wait ends
within moments of `stepwise keys revoke`, at no cost while idle. A revocation missed while the
subscription was down is found when it is back (every watched key is looked up then), and one just
before a watch began by the lookup `check_key` makes at its start.

A waiter that cares about its job's queue position sets `queue_key` (the sorted set the job waits
in): the feed reads the positions of all such waiters together, once per POSITION_SECONDS, and
wakes those whose `position` moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any, cast

import redis

from storage.job_events import JobEvent, events_from_entries, is_last_stream_id
from storage.redis_clients import aclose_redis, open_async_redis
from storage.redis_keys import RedisKeys

log = logging.getLogger(__name__)

READ_CONNECTIONS = 16  # reads are one short round trip each; more waiters queue for a connection
RECONNECT_SECONDS = 1.0
POSITION_SECONDS = 1.0  # how often the feed reads the queue positions its waiters follow
LISTEN_SECONDS = 1.0  # the subscription looks up from its messages this often (to notice a close)
CLOSE_SECONDS = 2.0  # a cancel can be swallowed inside a connect: close waits for its tasks this long at most


class Watch:
    """One waiter's view of a job's notifications; `wait` returns True once news came (then re-read)."""

    def __init__(self, job_id: str, key_id: str | None = None) -> None:
        self.job_id = job_id
        self.key_id = key_id  # a revocable key's id; None for a key from the environment
        self.news = asyncio.Event()
        self.queue_key: str | None = None
        self.position: int | None = None
        self.is_revoked = False
        self.is_closing = False  # this API process is shutting down: end now (JobEventFeed.end_watches)

    def revoke(self) -> None:
        self.is_revoked = True
        self.news.set()

    def close(self) -> None:
        self.is_closing = True
        self.news.set()

    def set_position(self, position: int | None) -> None:
        if position != self.position:
            self.position = position
            self.news.set()

    async def wait(self, timeout: float) -> bool:
        """True once news came (then re-read the stream), False after `timeout` seconds without."""
        try:
            await asyncio.wait_for(self.news.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            self.news.clear()
        return True


class JobEventFeed:
    def __init__(self, redis_url: str, keys: RedisKeys) -> None:
        self.keys = keys
        self.client = open_async_redis(
            redis_url,
            decode_responses=True,
            max_connections=READ_CONNECTIONS,
            pool_timeout=10,
            socket_connect_timeout=2,
        )
        self._watches: dict[str, set[Watch]] = {}
        self._tasks: list[asyncio.Task] = []
        self._is_closed = False
        self._is_ending_watches = False

    @contextlib.contextmanager
    def watch(self, job_id: str, key_id: str | None = None) -> Iterator[Watch]:
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._listen()), loop.create_task(self._read_positions())]
        watch = Watch(job_id, key_id)
        if self._is_ending_watches:
            watch.close()
        self._watches.setdefault(job_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(job_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[job_id]

    def _wake(self, job_id: str | None) -> None:
        if job_id is None:
            for watches in self._watches.values():
                for watch in watches:
                    watch.news.set()
        else:
            for watch in self._watches.get(job_id, ()):
                watch.news.set()

    def _revoke(self, key_id: str) -> None:
        for watches in self._watches.values():
            for watch in watches:
                if watch.key_id == key_id:
                    watch.revoke()

    async def _revoked_among(self, key_ids: list[str]) -> set[str]:
        """storage.api_keys.ApiKeyStore.revoked_among on this loop's client."""
        if not key_ids:
            return set()
        found = await self.client.hmget(self.keys.api_key_ids, key_ids)
        return {key_id for key_id, digest in zip(key_ids, found) if digest is None}

    async def check_key(self, watch: Watch) -> None:
        """Marks `watch` revoked if its key is gone already (revoked before the watch began to listen)."""
        if watch.key_id is not None and await self._revoked_among([watch.key_id]):
            watch.revoke()

    async def _listen(self) -> None:
        while not self._is_closed:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.job_events_channel, self.keys.api_key_revocations)
                self._wake(None)  # anything published while not subscribed: everyone re-reads
                key_ids = {w.key_id for ws in self._watches.values() for w in ws if w.key_id is not None}
                for key_id in await self._revoked_among(sorted(key_ids)):  # revoked while not subscribed
                    self._revoke(key_id)
                while not self._is_closed:
                    message: Any = await pubsub.get_message(timeout=LISTEN_SECONDS)
                    if message is None or message.get("type") != "message":
                        continue
                    if message["channel"] == self.keys.api_key_revocations:
                        self._revoke(message["data"])
                    else:
                        self._wake(message["data"])
            except asyncio.CancelledError:
                raise
            except (redis.RedisError, OSError) as e:  # OSError: a cancel during a connect can come out as a timeout
                if self._is_closed:
                    break
                log.warning("job events: subscription lost (%s); reconnecting", e)
                await asyncio.sleep(RECONNECT_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _read_positions(self) -> None:
        while not self._is_closed:
            await asyncio.sleep(POSITION_SECONDS)
            following = [w for ws in self._watches.values() for w in ws if w.queue_key is not None]
            if not following:
                continue
            try:
                async with self.client.pipeline(transaction=False) as pipe:
                    for watch in following:
                        pipe.zrank(cast(str, watch.queue_key), watch.job_id)
                    positions = await pipe.execute()
            except (redis.RedisError, OSError) as e:
                log.warning("job events: cannot read queue positions (%s)", e)
                continue
            for watch, position in zip(following, positions):
                watch.set_position(position)

    async def read_after(self, job_id: str, after: str | None) -> list[JobEvent]:
        if after is not None and is_last_stream_id(after):
            return []
        start = f"({after}" if after else "-"
        entries = await self.client.xrange(self.keys.job_events(job_id), min=start, max="+")
        return events_from_entries(cast(list, entries))

    async def state_of(self, job_id: str) -> str | None:
        return cast(str | None, await self.client.hget(self.keys.job(job_id), "state"))

    def end_watches(self) -> None:
        """The process is shutting down: mark every watch, and every one begun from now on, closing, and wake it."""
        self._is_ending_watches = True
        for watches in self._watches.values():
            for watch in watches:
                watch.close()

    async def close(self) -> None:
        """Stop listening and close the connections, within about CLOSE_SECONDS."""
        self._is_closed = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_SECONDS)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(aclose_redis(self.client), CLOSE_SECONDS)
