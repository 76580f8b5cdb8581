"""Responses that wait on a job: `Prefer: wait` submits, the OpenAI images routes, and the event stream.

A route that must wait returns a `LiveResponse`, whose body is a `LiveBody`: one coroutine, `serve`,
that waits and answers through an RSGI protocol object. `stepwise api` (granian, through
`stepwise_cli.api_rsgi`) runs it on granian's event loop, so waiting costs a coroutine, not a
thread; only the short render of the final answer (a record read and a view) borrows one of the app
threads. Under a plain WSGI server (Flask's test client, httpx's WSGITransport) the same coroutine
runs on an event loop of its own (api.live_wsgi): one code path, served two ways.

One pub/sub subscription per process wakes the waiters of a job when its event stream grows
(`storage.job_event_feed`); a waiter then re-reads the stream, and re-reads on a timer too, so a
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
from typing import Any, NoReturn, Protocol

from flask import Flask, Response, current_app, g

from api.auth import revoked_key_error
from api.errors import to_api_error
from api.event_stream import RECHECK_SECONDS, SSE_HEADERS, EventStreamState, Out, encode_end
from storage.job_event_feed import JobEventFeed
from storage.job_record import TERMINAL_STATE_NAMES

log = logging.getLogger(__name__)

Headers = list[tuple[str, str]]
Rendered = tuple[int, Headers, bytes]
StartResponse = Callable[..., Any]
Offload = Callable[..., Awaitable[Any]]  # offload(fn, *args): run fn(*args) on an app thread


class RsgiProtocol(Protocol):
    """What a LiveBody answers through: granian's HTTPProtocol (or api.live_wsgi's stand-in for it)."""

    def response_bytes(self, status: int, headers: Headers, body: bytes) -> None: ...

    def response_stream(self, status: int, headers: Headers) -> Any: ...

    def client_disconnect(self) -> Awaitable[None]: ...


class WaitEnd(enum.Enum):
    ENDED = "ended"  # the job ended (or its record is gone)
    TIMED_OUT = "timed_out"  # the wait ran out first (or Redis failed: the answer says what the record says)
    REVOKED = "revoked"  # the request's API key was revoked
    CLOSING = "closing"  # this API process is shutting down: answer with the job as it is now


def refuse_revoked() -> NoReturn:
    raise revoked_key_error()


def new_feed(app: Flask) -> JobEventFeed:
    """The event feed for an asyncio loop serving `app` (one per loop: the RSGI bridge makes it)."""
    store = app.extensions["stepwise.job_store"]
    return JobEventFeed(app.extensions["stepwise.settings"].storage.redis_url, store.keys)


class LiveBody:
    """A response body that waits on one job (see the module docstring)."""

    def __init__(self, job_id: str, environ: dict[str, Any], start_response: StartResponse, extra: Headers) -> None:
        self.job_id = job_id
        self.app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        self.environ = environ
        self.start_response = start_response  # used only under a plain WSGI server (api.live_wsgi)
        self.extra_headers = extra  # what after_request hooks set on the LiveResponse
        self.key_id: str | None = g.get("key_id")  # the request's revocable API key (api.auth)
        self.started = time.monotonic()

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
        """Under a plain WSGI server: `serve` on an event loop of its own (api.live_wsgi)."""
        from api.live_wsgi import serve_wsgi

        return serve_wsgi(self, new_feed(self.app))

    async def serve(self, protocol: RsgiProtocol, feed: JobEventFeed, offload: Offload) -> None:
        raise NotImplementedError


class JobWait(LiveBody):
    """Waits until the job ends, `seconds` pass or the process shuts down, then answers `render(how it ended)`;
    401 once its key is revoked."""

    def __init__(self, job_id: str, seconds: float, render: Callable[[WaitEnd], Rendered], **kwargs: Any) -> None:
        super().__init__(job_id, **kwargs)
        self.deadline = self.started + seconds
        self.render = render

    def answer(self, end: WaitEnd) -> Rendered:
        if end is WaitEnd.REVOKED:
            return self.in_request(refuse_revoked)
        return self.in_request(self.render, end)

    async def serve(self, protocol: RsgiProtocol, feed: JobEventFeed, offload: Offload) -> None:
        end = await self.wait(protocol, feed)
        if end is None:
            return  # the client left: nobody to answer
        status, headers, body = await offload(self.answer, end)
        protocol.response_bytes(status, [*headers, *self.extra_headers], body)

    async def wait(self, protocol: RsgiProtocol, feed: JobEventFeed) -> WaitEnd | None:
        gone = asyncio.ensure_future(protocol.client_disconnect())
        try:
            with feed.watch(self.job_id, self.key_id) as watch:
                gone.add_done_callback(lambda _: watch.news.set())
                await feed.check_key(watch)
                while not gone.done():
                    if watch.is_revoked:
                        return WaitEnd.REVOKED
                    if watch.is_closing:
                        return WaitEnd.CLOSING
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
    key is revoked, or a `reconnect` event when this process shuts down (api.event_stream says what is sent)."""

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

    async def serve(self, protocol: RsgiProtocol, feed: JobEventFeed, offload: Offload) -> None:
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
                    if watch.is_closing:
                        await send(state.on_shutdown())
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
