"""What `GET /v1/jobs/{id}/events` sends, decided without I/O (api.live does the reads and writes).

Events, each `event: NAME` with one line of JSON `data` (docs/api.md#event-stream):

    queued    {"job_id", "state": "queued", "queue_position"}   when queued, and as the position moves
    started   {"job_id", "state": "running"}
    progress  {"job_id", "step", "total"}                        at most once per STEPWISE_PROGRESS_INTERVAL;
              the job's own steps of its step count (not summed over its images), and "current_image"
              (1-based) while it runs its images one after another
    preview   {"job_id", "step", "total", "image"}               a data URI, when the job asked for previews
    storing   {"job_id", "reason"}                               its images are made but image storage failed:
              they wait in its worker's spool, and the job succeeds once they are stored
    <state>   the job's view, as GET /v1/jobs/{id} gives it      succeeded, failed, canceled or expired; last
    error     {"error": {"code", "message"}}                      instead, when the job is gone (deleted:
                                                                  not_found) or the stream's API key was
                                                                  revoked (unauthorized); last
    reconnect {"job_id", "reason"}, with `retry:`                 instead, when this API process shuts down
                                                                  (SIGTERM): the client reconnects (to another
                                                                  replica) with Last-Event-ID; last

Events from the job's stream (storage.job_events) carry its entry id as `id`, so a client that
reconnects with `Last-Event-ID` gets exactly what it missed. A fresh connection first gets the
job as it is now (its state, and its progress if running); queue position updates have no id
(a resumed stream asks for the position again). A comment line keeps an idle connection open.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from api.auth import revoked_key_error
from api.errors import ApiError
from storage.job_events import EVENT_ID, JobEvent
from storage.job_record import TERMINAL_STATE_NAMES, JobRecord, JobState

SSE_HEADERS = [
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),  # proxies such as nginx: pass each event on at once
]
RETRY_MS = 2000  # how long a disconnected EventSource waits before reconnecting
SHUTDOWN_RETRY_MS = 500  # the same, when the stream ended because this API process shuts down
EVENT_NAMES = (
    "queued",
    "started",
    "progress",
    "preview",
    "storing",
    *sorted(TERMINAL_STATE_NAMES),
    "error",
    "reconnect",
)
# One event of the stream, as the OpenAPI document shows it (schemathesis and other tools read text/event-stream
# as its events' fields).
EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": list(EVENT_NAMES)},
        "data": {"type": "string", "description": "JSON: the job's view, the event's details, or an error."},
        "id": {"type": "string", "pattern": f"^{EVENT_ID.pattern}$"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
RECHECK_SECONDS = 5.0  # re-read the stream (and the record) this often without a wake-up


@dataclass(frozen=True)
class EndOut:
    """The end state event, whose data (the job's view) the caller renders."""

    name: str
    event_id: str | None
    retry_ms: int | None = None


Out = bytes | EndOut


def with_retry(outs: list[Out]) -> list[Out]:
    """The first event also tells the client how long to wait before reconnecting (`retry:`)."""
    if not outs:
        return outs
    first = outs[0]
    if isinstance(first, EndOut):
        return [dataclasses.replace(first, retry_ms=RETRY_MS), *outs[1:]]
    return [b"retry: %d\n" % RETRY_MS + first, *outs[1:]]


def encode(name: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_event(error: ApiError) -> bytes:
    """The stream's last event when it ends without the job's end state; data as the API's error bodies."""
    return encode("error", error.body())


def encode_end(end: EndOut, view: bytes) -> bytes:
    """`view` is the job view's compact JSON (one line)."""
    head = f"retry: {end.retry_ms}\n" if end.retry_ms else ""
    head += f"id: {end.event_id}\n" if end.event_id else ""
    return f"{head}event: {end.name}\ndata: ".encode() + view.strip() + b"\n\n"


class EventStreamState:
    def __init__(
        self,
        record: JobRecord,
        last_id: str | None,
        *,
        queue_position: int | None,
        keepalive_seconds: float,
        now: float,
    ) -> None:
        self.record = record
        self.job_id = record.job_id
        self.last_id = last_id  # the stream entry last sent (or the snapshot's)
        self.state = record.state.value
        self.position = queue_position
        self.keepalive_seconds = keepalive_seconds
        self.is_done = False
        self.last_write = now
        self.last_recheck = now

    # what to send

    def opening(self) -> list[Out]:
        """A fresh connection: the job as it is now, the last event carrying the snapshot's entry id."""
        record = self.record
        if record.state is JobState.QUEUED:
            return with_retry([self.queued(self.last_id)])
        if record.state is JobState.RUNNING:
            events: list[tuple[str, dict[str, Any]]] = [("started", self.started_data())]
            if record.progress_step > 0:
                events.append(("progress", {"job_id": self.job_id, **record.progress_view()}))
            if record.storing_since is not None:
                events.append(("storing", {"job_id": self.job_id, "reason": record.storing_reason or ""}))
            *before, (last_name, last_data) = events
            outs = [encode(name, data) for name, data in before]
            return with_retry([*outs, encode(last_name, last_data, self.last_id)])
        self.is_done = True
        return with_retry([EndOut(self.state, self.last_id)])

    def resumed(self, events: list[JobEvent]) -> list[Out]:
        """A reconnection after `Last-Event-ID`: what the job's stream holds after it."""
        outs = self.on_events(events)
        if not self.is_done and self.state in TERMINAL_STATE_NAMES:  # its stream expired since: the record says
            self.is_done = True
            outs.append(EndOut(self.state, None))
        return with_retry(outs)

    def on_events(self, events: list[JobEvent]) -> list[Out]:
        outs: list[Out] = []
        for event in events:
            if self.is_done:
                break
            self.last_id = event.event_id
            if event.is_end:
                self.state = event.kind
                self.is_done = True
                outs.append(EndOut(event.kind, event.event_id))
            elif event.kind == "started":
                self.state = "running"
                outs.append(encode("started", self.started_data(), event.event_id))
            elif event.kind == "queued":  # back in the queue (drain, shutdown, a lost worker)
                self.state = "queued"
                self.position = None  # the feed reads it again
                outs.append(self.queued(event.event_id))
            elif event.kind == "storing":
                storing = {"job_id": self.job_id, "reason": event.fields.get("reason", "")}
                outs.append(encode("storing", storing, event.event_id))
            elif event.kind in ("progress", "preview"):
                data: dict[str, Any] = {
                    "job_id": self.job_id,
                    "step": int(event.fields.get("step", 0)),
                    "total": int(event.fields.get("total", 0)),
                }
                if event.kind == "preview":
                    data["image"] = event.fields.get("image", "")
                elif current_image := int(event.fields.get("current_image", 0)):
                    data["current_image"] = current_image
                outs.append(encode(event.kind, data, event.event_id))
        return outs

    @property
    def is_queued(self) -> bool:
        return self.state == "queued"

    def on_position(self, position: int | None) -> list[Out]:
        """The queue position the feed read last (storage.job_events.Watch)."""
        if not self.is_queued or position is None or position == self.position:
            return []
        self.position = position
        return [self.queued(None)]

    def on_state(self, state: str | None, now: float, *, has_events: bool = False) -> list[Out]:
        """A recheck: the record's state, read when its stream had nothing new (`has_events` False)."""
        self.last_recheck = now
        if has_events or self.is_done:
            return []
        if state is None:  # the record is gone (deleted, or past its retention): nothing more will come
            self.is_done = True
            return [error_event(ApiError(404, "not_found", "the job no longer exists (deleted, or past retention)"))]
        if state in TERMINAL_STATE_NAMES:  # ended, and its stream lost the end entry (expired)
            self.state = state
            self.is_done = True
            return [EndOut(state, None)]
        return []

    def on_revoked(self) -> list[Out]:
        """The key that opened the stream was revoked: it ends, saying why (a reconnection gets 401)."""
        self.is_done = True
        return [error_event(revoked_key_error())]

    def on_shutdown(self) -> list[Out]:
        """This API process is shutting down: the stream ends, telling the client to reconnect soon. No `id`, so
        a client's Last-Event-ID stays the last event it got, and the stream it reconnects to resumes there."""
        self.is_done = True
        reason = "this API process is shutting down: reconnect (with Last-Event-ID) to follow the job on"
        event = encode("reconnect", {"job_id": self.job_id, "reason": reason})
        return [b"retry: %d\n" % SHUTDOWN_RETRY_MS + event]

    def keepalive(self) -> bytes:
        return b": keep-alive\n\n"

    def queued(self, event_id: str | None) -> bytes:
        data = {"job_id": self.job_id, "state": "queued", "queue_position": self.position}
        return encode("queued", data, event_id)

    def started_data(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": "running"}

    # when to look again

    def wrote(self, now: float) -> None:
        self.last_write = now

    def is_keepalive_due(self, now: float) -> bool:
        return now - self.last_write >= self.keepalive_seconds

    def is_recheck_due(self, now: float) -> bool:
        return now - self.last_recheck >= RECHECK_SECONDS

    def timeout(self, now: float) -> float:
        due = min(self.last_write + self.keepalive_seconds, self.last_recheck + RECHECK_SECONDS)
        return max(0.01, due - now)
