"""Waiting for a job over HTTP: `Prefer: wait` on submits (RFC 7240) and the job's event stream.

Both answer with an `api.live.LiveResponse`, so a waiting client costs this API no request thread
under its servers (api.live).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from flask import current_app, request

from api.errors import ApiError, invalid
from api.event_stream import EventStreamState
from api.live import Headers, JobEventStream, JobWait, LiveResponse, Rendered, WaitEnd
from api.resources import get_job_events, get_settings
from storage.job_events import EVENT_ID
from storage.job_record import JobRecord, JobState

MAX_WAIT_SECONDS = 60
PREFER_WAIT = re.compile(r"wait(?:\s*=\s*(\S*))?")

# The headers as the OpenAPI document shows them. What prefer_wait takes: preferences separated by commas, each a
# token and its ;parameters; the first `wait` token must be bare or `wait=N` with N a positive integer (quotes
# allowed), and every other preference is ignored (RFC 7240).
_S = r"\s*"
_NOT_WAIT = rf"(?!{_S}wait{_S}(?:={_S}[^\s,;]*{_S})?(?:;|,|$))[^,]*"
_WAIT = rf'{_S}wait{_S}(?:={_S}"*0*[1-9][0-9]*"*)?{_S}(?:;[^,]*)?'
PREFER = {
    "name": "Prefer",
    "in": "header",
    "required": False,
    "description": "`wait` or `wait=N` (RFC 7240): hold the answer until the job ends, at most N "
    f"(1-{MAX_WAIT_SECONDS}; more is {MAX_WAIT_SECONDS}) seconds; 200 with the ended job, or 202 with it as it "
    "is then. Other preferences are ignored; a malformed wait value gets 422.",
    "schema": {"type": "string", "pattern": rf"^(?:{_NOT_WAIT},)*(?:{_NOT_WAIT}|{_WAIT}(?:,.*)?)$"},
}
LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "required": False,
    "description": "Resume after this event (its `id`); what a reconnecting EventSource sends.",
    "schema": {"type": "string", "maxLength": 41, "pattern": rf"^\s*{EVENT_ID.pattern}\s*$"},
}
PREFERENCE_APPLIED = {"Preference-Applied": {"description": "wait=N: the wait applied.", "schema": {"type": "string"}}}


def prefer_wait(values: list[str]) -> int | None:
    """Seconds a `Prefer` header asks to wait: `wait` is MAX_WAIT_SECONDS, `wait=N` is N (1 to 60; more is
    60); None without a wait preference. Other preferences (respond-async, return=...) are ignored."""
    for value in values:
        for preference in value.split(","):
            token = preference.split(";")[0].strip()
            match = PREFER_WAIT.fullmatch(token)
            if match is None:
                continue
            raw = match.group(1)
            if raw is None:
                return MAX_WAIT_SECONDS
            raw = raw.strip('"')
            if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
                raise invalid(
                    "Prefer",
                    f"Prefer: wait=N takes whole seconds from 1 to {MAX_WAIT_SECONDS} (got wait={raw!r})",
                )
            return min(int(raw), MAX_WAIT_SECONDS)
    return None


def json_rendered(status: int, body: object, headers: Headers) -> Rendered:
    data = current_app.json.dumps(body, separators=(",", ":")).encode()
    return status, [("Content-Type", "application/json"), *headers], data


def waited(job_id: str, seconds: float, render: Callable[[WaitEnd], Rendered]) -> LiveResponse:
    """Wait up to `seconds` for the job to end (or this process to shut down), then answer `render(how the wait
    ended)` in this request's context."""
    return LiveResponse(
        lambda environ, start_response, extra: JobWait(
            job_id, seconds, render, environ=environ, start_response=start_response, extra=extra
        )
    )


def last_event_id() -> str | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    # An empty value is no id either: an EventSource sends none then, and granian empties a value beyond ASCII.
    if not EVENT_ID.fullmatch(raw.strip()):
        raise invalid("Last-Event-ID", "Last-Event-ID must be the id of an event this stream sent (like 1700000-0)")
    return raw


def event_stream(record: JobRecord, render_view: Callable[[JobRecord], dict]) -> LiveResponse:
    """The job's events from now on (or after Last-Event-ID) until its end state (api.event_stream)."""
    resume_after = last_event_id()
    job_id = record.job_id
    snapshot, last_id = get_job_events().snapshot(job_id)
    if snapshot is None:
        raise ApiError(404, "not_found", "no such job")
    state = EventStreamState(
        snapshot,
        last_id,
        queue_position=render_view(snapshot).get("queue_position") if snapshot.state is JobState.QUEUED else None,
        keepalive_seconds=get_settings().events_keepalive_seconds,
        now=time.monotonic(),
    )

    def render_end() -> Rendered:
        current = get_job_events().snapshot(job_id)[0]
        return json_rendered(200, render_view(current or snapshot), [])

    return LiveResponse(
        lambda environ, start_response, extra: JobEventStream(
            state, resume_after, render_end, environ=environ, start_response=start_response, extra=extra
        )
    )
