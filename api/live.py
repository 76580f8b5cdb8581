"""Responses that wait on a job: `Prefer: wait` submits, the OpenAI images routes, and the event stream.

A route that must wait returns a `LiveResponse`, whose WSGI body is a `LiveBody`. How it waits
depends on the server:

- `stepwise api` (granian, `stepwise_cli.api_rsgi`): the bridge sees the LiveBody and runs its
  `serve_rsgi` on granian's event loop. Waiting costs a coroutine, not a thread; only the short
  render of the final answer (a record read and a view) borrows one of the app threads.
- any WSGI server: the body is an ordinary iterable whose first iteration waits. Under gunicorn's
  gevent workers (`stepwise api --server gunicorn`) that is a greenlet; under gthread it would
  hold a thread per waiting request.

Either way one pub/sub subscription per process wakes the waiters of a job when its event stream
grows (`storage.job_events`); a waiter then re-reads the stream, and re-reads on a timer too, so a
lost wake-up costs latency, never an event. The same subscription says when the API key a request
came with is revoked: a wait then answers 401, a stream sends an `error` event and ends, as a new
request with the key would be refused.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any, NoReturn, Protocol

from flask import Flask, Response, current_app, g

from api.auth import revoked_key_error
from api.errors import to_api_error
from api.event_stream import RECHECK_SECONDS, SSE_HEADERS, EventStreamState, Out, encode_end
from storage.job_events import JobEventFeed, JobEventLog
from storage.job_events_async import AsyncJobEventFeed
from storage.job_record import TERMINAL_STATE_NAMES

log = logging.getLogger(__name__)

Headers = list[tuple[str, str]]
Rendered = tuple[int, Headers, bytes]
StartResponse = Callable[..., Any]
Offload = Callable[..., Awaitable[Any]]  # offload(fn, *args): run fn(*args) on an app thread
LIFT_REQUEST_TIMEOUT = "stepwise.lift_request_timeout"  # environ: a server's per-request deadline, to lift


class RsgiProtocol(Protocol):
    """What the bridge's RSGI protocol object offers (granian's HTTPProtocol)."""

    def response_bytes(self, status: int, headers: Headers, body: bytes) -> None: ...

    def response_stream(self, status: int, headers: Headers) -> Any: ...

    def client_disconnect(self) -> Awaitable[None]: ...


def status_line(status: int) -> str:
    return f"{status} {HTTPStatus(status).phrase}"


class WaitEnd(enum.Enum):
    ENDED = "ended"  # the job ended (or its record is gone)
    TIMED_OUT = "timed_out"  # the wait ran out first (or Redis failed: the answer says what the record says)
    REVOKED = "revoked"  # the request's API key was revoked


def refuse_revoked() -> NoReturn:
    raise revoked_key_error()


def async_feed(app: Flask) -> AsyncJobEventFeed:
    """The event feed for an asyncio loop serving `app` (one per loop: the RSGI bridge makes it)."""
    store = app.extensions["stepwise.job_store"]
    return AsyncJobEventFeed(app.extensions["stepwise.settings"].storage.redis_url, store.keys)


class LiveBody:
    """A WSGI response body that waits on one job (see the module docstring)."""

    def __init__(self, job_id: str, environ: dict[str, Any], start_response: StartResponse, extra: Headers) -> None:
        self.job_id = job_id
        self.app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        self.environ = environ
        self.start_response = start_response
        self.extra_headers = extra  # what after_request hooks set on the LiveResponse
        self.log: JobEventLog = self.app.extensions["stepwise.job_events"]
        self.feed: JobEventFeed = self.app.extensions["stepwise.job_event_feed"]
        self.key_id: str | None = g.get("key_id")  # the request's revocable API key (api.auth)
        self.started = time.monotonic()
        self._body: Iterator[bytes] | None = None

    def in_request(self, render: Callable[..., Rendered], *args: Any) -> Rendered:
        """`render(*args)` in a request context of the original request (any thread); an error is answered by
        the app's error handlers, as the route's own errors are (the OpenAI routes' in OpenAI's shape)."""
        with self.app.request_context(self.environ):
            try:
                return render(*args)
            except Exception as e:
                try:
                    response = self.app.make_response(self.app.handle_user_exception(e))
                except Exception:
                    if self.app.testing:
                        raise  # TESTING: the test sees an unexpected error itself (api.errors)
                    error = to_api_error(e)
                    body = self.app.json.dumps(error.body()).encode()
                    return error.status, [("Content-Type", "application/json"), *error.headers.items()], body
                return response.status_code, list(response.headers.items()), response.get_data()

    def __iter__(self) -> Iterator[bytes]:
        # The request is read: under stepwise api's gevent worker, its whole-request deadline no longer applies.
        self.environ.get(LIFT_REQUEST_TIMEOUT, lambda: None)()
        self._body = self.generate()
        return self._body

    def generate(self) -> Iterator[bytes]:
        raise NotImplementedError

    def close(self) -> None:
        """WSGI servers call this when the body is done or the client is gone: stop waiting."""
        body = self._body
        if body is not None and hasattr(body, "close"):
            body.close()

    async def serve_rsgi(self, protocol: RsgiProtocol, feed: AsyncJobEventFeed, offload: Offload) -> None:
        raise NotImplementedError


class JobWait(LiveBody):
    """Waits until the job ends or `seconds` pass, then answers `render(has_ended)`; 401 once its key is revoked."""

    def __init__(self, job_id: str, seconds: float, render: Callable[[bool], Rendered], **kwargs: Any) -> None:
        super().__init__(job_id, **kwargs)
        self.deadline = self.started + seconds
        self.render = render

    def answer(self, end: WaitEnd) -> Rendered:
        if end is WaitEnd.REVOKED:
            return self.in_request(refuse_revoked)
        return self.in_request(self.render, end is WaitEnd.ENDED)

    def generate(self) -> Iterator[bytes]:
        status, headers, body = self.answer(self.wait_sync())
        self.start_response(status_line(status), [*headers, *self.extra_headers])
        yield body

    def wait_sync(self) -> WaitEnd:
        try:
            with self.feed.watch(self.job_id, self.key_id) as watch:
                self.feed.check_key(watch)
                while not watch.is_revoked:
                    state = self.log.state_of(self.job_id)
                    if state is None or state in TERMINAL_STATE_NAMES:
                        return WaitEnd.ENDED
                    left = self.deadline - time.monotonic()
                    if left <= 0:
                        return WaitEnd.TIMED_OUT
                    watch.wait(min(left, RECHECK_SECONDS))
                return WaitEnd.REVOKED
        except Exception as e:  # Redis trouble: answer what the record says now (render reports an outage)
            log.warning("waiting for job %s: %s", self.job_id, e)
            return WaitEnd.TIMED_OUT

    async def serve_rsgi(self, protocol: RsgiProtocol, feed: AsyncJobEventFeed, offload: Offload) -> None:
        end = await self.wait_async(protocol, feed)
        if end is None:
            return  # the client left: nobody to answer
        status, headers, body = await offload(self.answer, end)
        protocol.response_bytes(status, [*headers, *self.extra_headers], body)

    async def wait_async(self, protocol: RsgiProtocol, feed: AsyncJobEventFeed) -> WaitEnd | None:
        gone = asyncio.ensure_future(protocol.client_disconnect())
        try:
            with feed.watch(self.job_id, self.key_id) as watch:
                gone.add_done_callback(lambda _: watch.news.set())
                await feed.check_key(watch)
                while not gone.done():
                    if watch.is_revoked:
                        return WaitEnd.REVOKED
                    state = await feed.state_of(self.job_id)
                    if state is None or state in TERMINAL_STATE_NAMES:
                        return WaitEnd.ENDED
                    left = self.deadline - time.monotonic()
                    if left <= 0:
                        return WaitEnd.TIMED_OUT
                    await watch.wait(min(left, RECHECK_SECONDS))
                return None
        except Exception as e:
            log.warning("waiting for job %s: %s", self.job_id, e)
            return WaitEnd.TIMED_OUT
        finally:
            gone.cancel()


class JobEventStream(LiveBody):
    """`text/event-stream` of one job until its end state, or an `error` event once the job is gone or its
    key is revoked (api.event_stream says what is sent)."""

    def __init__(
        self, state: EventStreamState, resume_after: str | None, render_end: Callable[[], Rendered], **kwargs: Any
    ) -> None:
        super().__init__(state.job_id, **kwargs)
        self.state = state
        self.resume_after = resume_after
        self.render_end = render_end

    def end_chunk(self, out: Out) -> bytes:
        if isinstance(out, bytes):
            return out
        _, _, view = self.in_request(self.render_end)
        return encode_end(out, view)

    def generate(self) -> Iterator[bytes]:
        state, log_ = self.state, self.log
        queue_key = log_.keys.queue_of(state.record)
        self.start_response("200 OK", [*SSE_HEADERS, *self.extra_headers])
        with self.feed.watch(self.job_id, self.key_id) as watch:
            self.feed.check_key(watch)
            if watch.is_revoked:
                opening = state.on_revoked()
            elif self.resume_after is None:
                opening = state.opening()
            else:
                opening = state.resumed(self.read_sync(self.resume_after))
            yield from self.chunks(opening)
            while not state.is_done:
                watch.queue_key = queue_key if state.is_queued else None
                has_news = watch.wait(state.timeout(time.monotonic()))
                if watch.is_revoked:
                    yield from self.chunks(state.on_revoked())
                    break
                now = time.monotonic()
                is_recheck = state.is_recheck_due(now)
                outs = state.on_events(self.read_sync(state.last_id)) if has_news or is_recheck else []
                if is_recheck or (has_news and not outs):  # news without events: it may be gone (deleted)
                    outs += state.on_state(None if outs else log_.state_of(self.job_id), now, has_events=bool(outs))
                outs += state.on_position(watch.position)
                if not outs and state.is_keepalive_due(now):
                    outs = [state.keepalive()]
                yield from self.chunks(outs)

    def read_sync(self, after: str | None) -> list:
        return self.log.read_after(self.job_id, after)

    def chunks(self, outs: Iterable[Out]) -> Iterator[bytes]:
        for out in outs:
            self.state.wrote(time.monotonic())
            yield self.end_chunk(out)

    async def serve_rsgi(self, protocol: RsgiProtocol, feed: AsyncJobEventFeed, offload: Offload) -> None:
        state = self.state
        transport = protocol.response_stream(200, [*SSE_HEADERS, *self.extra_headers])
        gone = asyncio.ensure_future(protocol.client_disconnect())

        async def send(outs: Iterable[Out]) -> None:
            for out in outs:
                state.wrote(time.monotonic())
                chunk = out if isinstance(out, bytes) else await offload(self.end_chunk, out)
                await transport.send_bytes(chunk)

        queue_key = feed.keys.queue_of(state.record)
        try:
            with feed.watch(self.job_id, self.key_id) as watch:
                gone.add_done_callback(lambda _: watch.news.set())
                await feed.check_key(watch)
                if watch.is_revoked:
                    await send(state.on_revoked())
                elif self.resume_after is None:
                    await send(state.opening())
                else:
                    await send(state.resumed(await feed.read_after(self.job_id, self.resume_after)))
                while not state.is_done and not gone.done():
                    watch.queue_key = queue_key if state.is_queued else None
                    has_news = await watch.wait(state.timeout(time.monotonic()))
                    if gone.done():
                        break
                    if watch.is_revoked:
                        await send(state.on_revoked())
                        break
                    now = time.monotonic()
                    is_recheck = state.is_recheck_due(now)
                    outs: list[Out] = []
                    if has_news or is_recheck:
                        outs = state.on_events(await feed.read_after(self.job_id, state.last_id))
                    if is_recheck or (has_news and not outs):  # news without events: it may be gone (deleted)
                        record_state = None if outs else await feed.state_of(self.job_id)
                        outs += state.on_state(record_state, now, has_events=bool(outs))
                    outs += state.on_position(watch.position)
                    if not outs and state.is_keepalive_due(now):
                        outs = [state.keepalive()]
                    await send(outs)
        except Exception as e:  # the client left mid-write, or Redis failed: the stream ends; a client resumes
            log.info("event stream of job %s ended early: %s", self.job_id, e)
        finally:
            gone.cancel()


class LiveResponse(Response):
    """A response whose body waits: `make_body(environ, start_response, extra_headers)` builds it."""

    is_live = True

    def __init__(self, make_body: Callable[[dict[str, Any], StartResponse, Headers], LiveBody]) -> None:
        super().__init__()
        self.make_body = make_body

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        extra = [(name, value) for name, value in self.headers.items() if name.lower() != "content-type"]
        extra = [(name, value) for name, value in extra if name.lower() != "content-length"]
        return self.make_body(environ, start_response, extra)
