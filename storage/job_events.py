"""A job's events: a Redis stream per job, written by the job store's transition scripts.

Every transition script that changes what a watcher of the job sees appends one entry to
`{ns}:job-events:{job_id}` in the same atomic step (storage.lua) and publishes the job id on
`{ns}:job-events`, so the stream cannot disagree with the record:

    started                               TAKE (queued -> running)
    progress  step, total, current_image  SET_PROGRESS (at most once per STEPWISE_PROGRESS_INTERVAL)
    preview   step, total, image          ADD_PREVIEW (a data URI; only while running)
    storing   reason                      SET_STORING (its images wait in its worker's spool: worker.spool)
    queued                                RELEASE (running -> queued again: drain, shutdown, a lapsed lease)
    <end state>                           FINISH, REQUEST_CANCEL, RELEASE: succeeded, failed, canceled, expired

DELETE publishes the job id too (without an entry): its watchers read the record again and find it gone.

Entry ids (Redis stream ids, `ms-seq`) are the ids the API's event stream gives its events, so
`Last-Event-ID` resumes exactly after the last entry a client saw. The stream keeps at most
about EVENT_LOG_MAX_ENTRIES entries while the job is active; at the end state only that last
entry is kept, for EVENT_LOG_SECONDS_AFTER_END (a resumed stream needs nothing before it).

`JobEventFeed` wakes the API's waiters: one pub/sub subscription per process, on a thread (a
greenlet under gevent), however many requests wait; `storage.job_events_async` is the same for
an asyncio event loop. The same subscription hears API key revocations (storage.api_keys): a
waiter that names the key it came with (`watch(job_id, key_id)`) is marked revoked and woken, so
an open stream or wait ends within moments of `stepwise keys revoke`, at no cost while idle. A
revocation missed while the subscription was down is found when it is back (every watched key is
looked up then), and one just before a watch began by the lookup `check_key` makes at its start.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from storage.api_keys import ApiKeyStore
from storage.job_record import TERMINAL_STATE_NAMES, JobRecord, record_from_hash
from storage.redis_clients import close_redis, open_redis
from storage.redis_keys import RedisKeys

log = logging.getLogger(__name__)

EVENT_LOG_MAX_ENTRIES = 500  # approximate (XADD MAXLEN ~): progress and previews of a long job
EVENT_LOG_SECONDS = 24 * 3600  # an active job's stream, renewed by each entry
EVENT_LOG_SECONDS_AFTER_END = 3600  # the end entry, for clients resuming after the end


def digits_at_most(limit: int) -> str:
    """A regex for 1 to len(str(limit)) ASCII digits whose value is at most `limit` (leading zeros allowed)."""
    digits = str(limit)
    width = len(digits)
    options = [f"[0-9]{{1,{width - 1}}}"] if width > 1 else []
    for i, digit in enumerate(digits):
        if digit != "0":  # the first i digits as in `limit`, then a smaller one, then any
            rest = f"[0-9]{{{width - i - 1}}}" if i < width - 1 else ""
            options.append(f"{digits[:i]}[0-{int(digit) - 1}]{rest}")
    options.append(digits)
    return "(?:" + "|".join(options) + ")"


STREAM_ID_PART_MAX = 2**64 - 1  # each part of a Redis stream id (milliseconds-sequence) is an unsigned 64-bit number
_PART = digits_at_most(STREAM_ID_PART_MAX)
EVENT_ID = re.compile(f"{_PART}-{_PART}")  # what Redis can take as a stream id: the ids events carry
LAST_STREAM_ID = f"{STREAM_ID_PART_MAX}-{STREAM_ID_PART_MAX}"  # nothing can come after it
RECONNECT_SECONDS = 1.0
POSITION_SECONDS = 1.0  # how often the feed reads the queue positions its waiters follow
IDLE_SECONDS = 30.0  # a feed nobody used for this long ends its threads


@dataclass(frozen=True)
class JobEvent:
    event_id: str  # the stream entry's id
    kind: str  # started, progress, preview, queued, or an end state's name
    fields: dict[str, str] = field(default_factory=dict)  # step, total, image

    @property
    def is_end(self) -> bool:
        return self.kind in TERMINAL_STATE_NAMES


def events_from_entries(entries: list[tuple[str, dict[str, str]]]) -> list[JobEvent]:
    """XRANGE's reply (decoded) -> events."""
    events = []
    for event_id, values in entries:
        kind = values.get("event", "")
        events.append(JobEvent(event_id, kind, {name: value for name, value in values.items() if name != "event"}))
    return events


def is_last_stream_id(event_id: str) -> bool:
    """True for the largest id a stream can hold (with leading zeros too): Redis refuses a range after it."""
    ms, _, seq = event_id.partition("-")
    return int(ms) == int(seq) == STREAM_ID_PART_MAX


class JobEventLog:
    """Reads of the job event streams over a synchronous client (decode_responses=True)."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    def snapshot(self, job_id: str) -> tuple[JobRecord | None, str | None]:
        """The record and the id of its stream's last entry, read together (one transaction)."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.job(job_id))
            pipe.xrevrange(self.keys.job_events(job_id), count=1)
            mapping, last = pipe.execute()
        record = record_from_hash(mapping) if mapping else None
        return record, (last[0][0] if last else None)

    def read_after(self, job_id: str, after: str | None) -> list[JobEvent]:
        """The entries after `after` (all of them for None), oldest first."""
        if after is not None and is_last_stream_id(after):
            return []
        start = f"({after}" if after else "-"
        entries = cast(list, self.client.xrange(self.keys.job_events(job_id), min=start, max="+"))
        return events_from_entries(entries)

    def state_of(self, job_id: str) -> str | None:
        return cast(str | None, self.client.hget(self.keys.job(job_id), "state"))


class Watch:
    """One waiter's view of a job's notifications; `wait` returns True once news came (then re-read).

    A waiter that cares about its job's queue position sets `queue_key` (the sorted set the job waits
    in): the feed reads the positions of all such waiters together, once per POSITION_SECONDS, and
    wakes those whose `position` moved. `is_revoked` turns true (with news) once the API key the
    waiter came with (`key_id`) is revoked."""

    def __init__(self, job_id: str, key_id: str | None = None) -> None:
        self.job_id = job_id
        self.key_id = key_id  # a revocable key's id; None for a key from the environment
        self.news = threading.Event()
        self.queue_key: str | None = None
        self.position: int | None = None
        self.is_revoked = False

    def revoke(self) -> None:
        self.is_revoked = True
        self.news.set()

    def wait(self, timeout: float) -> bool:
        has_news = self.news.wait(timeout)
        self.news.clear()  # cleared before the caller re-reads: news after this sets it again
        return has_news

    def set_position(self, position: int | None) -> None:
        if position != self.position:
            self.position = position
            self.news.set()


class JobEventFeed:
    """Wakes the waiters of a job when its event stream grows (pub/sub on `{ns}:job-events`).

    Messages are only wake-ups: a waiter always re-reads the stream, so a message lost while the
    subscription reconnects costs latency, never an event (waiters also re-read on a timer)."""

    def __init__(self, redis_url: str, keys: RedisKeys) -> None:
        self.redis_url = redis_url
        self.channel = keys.job_events_channel
        self.revocations_channel = keys.api_key_revocations
        self._reads = open_redis(redis_url, decode_responses=True, socket_connect_timeout=2, socket_timeout=5)
        self.key_store = ApiKeyStore(self._reads, keys)
        self._watches: dict[str, set[Watch]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle_since = time.monotonic()
        self._is_stopping = threading.Event()

    @contextmanager
    def watch(self, job_id: str, key_id: str | None = None) -> Iterator[Watch]:
        watch = Watch(job_id, key_id)
        with self._lock:
            self._watches.setdefault(job_id, set()).add(watch)
            if not self._threads:  # started on first use (after any fork), gone again when idle
                self._threads = [
                    threading.Thread(target=self._listen, name="stepwise-job-events", daemon=True),
                    threading.Thread(target=self._read_positions, name="stepwise-queue-positions", daemon=True),
                ]
                for thread in self._threads:
                    thread.start()
        try:
            yield watch
        finally:
            with self._lock:
                watches = self._watches.get(job_id)
                if watches is not None:
                    watches.discard(watch)
                    if not watches:
                        del self._watches[job_id]
                if not self._watches:
                    self._idle_since = time.monotonic()

    def _is_idle(self) -> bool:
        """True once nobody has waited for IDLE_SECONDS: the threads end (the next watch starts them again)."""
        with self._lock:
            if self._is_stopping.is_set() or (not self._watches and time.monotonic() - self._idle_since > IDLE_SECONDS):
                self._threads = []
                return True
            return False

    def _wake(self, job_id: str | None) -> None:
        with self._lock:
            watches = [w for ws in self._watches.values() for w in ws] if job_id is None else self._watches.get(job_id)
            for watch in list(watches or ()):
                watch.news.set()

    def _revoke(self, key_id: str) -> None:
        with self._lock:
            for watch in [w for ws in self._watches.values() for w in ws if w.key_id == key_id]:
                watch.revoke()

    def check_key(self, watch: Watch) -> None:
        """Marks `watch` revoked if its key is gone already (revoked before the watch began to listen)."""
        if watch.key_id is not None and self.key_store.revoked_among([watch.key_id]):
            watch.revoke()

    def _check_keys(self) -> None:
        """After (re)subscribing: revocations published while the subscription was down."""
        with self._lock:
            watches = [w for ws in self._watches.values() for w in ws if w.key_id is not None]
        for key_id in self.key_store.revoked_among(sorted({cast(str, w.key_id) for w in watches})):
            self._revoke(key_id)

    def _listen(self) -> None:
        client = open_redis(self.redis_url, decode_responses=True, socket_connect_timeout=2)
        is_idle = is_failing = False
        while not is_idle:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel, self.revocations_channel)
                is_failing = False
                self._wake(None)  # anything published while not subscribed: everyone re-reads
                self._check_keys()
                while not (is_idle := self._is_idle()):
                    message: Any = pubsub.get_message(timeout=1.0)
                    if message is None or message.get("type") != "message":
                        continue
                    if message["channel"] == self.revocations_channel:
                        self._revoke(message["data"])
                    else:
                        self._wake(message["data"])
            except redis.RedisError as e:
                (log.debug if is_failing else log.warning)("job events: subscription lost (%s); reconnecting", e)
                is_failing = True  # said once per outage, not every second
                self._is_stopping.wait(RECONNECT_SECONDS)
                is_idle = self._is_idle()
            finally:
                pubsub.close()
        close_redis(client)

    def _read_positions(self) -> None:
        client = open_redis(self.redis_url, decode_responses=True, socket_connect_timeout=2, socket_timeout=5)
        while not self._is_stopping.wait(POSITION_SECONDS) and not self._is_idle():
            with self._lock:
                following = [w for ws in self._watches.values() for w in ws if w.queue_key is not None]
            if not following:
                continue
            try:
                with client.pipeline(transaction=False) as pipe:
                    for watch in following:
                        pipe.zrank(cast(str, watch.queue_key), watch.job_id)
                    positions = pipe.execute()
            except redis.RedisError as e:
                log.warning("job events: cannot read queue positions (%s)", e)
                continue
            for watch, position in zip(following, positions):
                watch.set_position(position)
        close_redis(client)

    def close(self) -> None:
        self._is_stopping.set()
        close_redis(self._reads)
