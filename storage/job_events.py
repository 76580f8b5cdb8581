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

`storage.job_event_feed` wakes the API's waiters when a stream grows (one pub/sub subscription per
API process); `JobEventLog` here reads the streams.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import cast

import redis

from storage.job_record import TERMINAL_STATE_NAMES, JobRecord, record_from_hash
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
