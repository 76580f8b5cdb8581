"""The app `stepwise api` serves with granian: the WSGI app behind a body-buffering RSGI adapter.

Why not granian's own WSGI interface: it calls the app as soon as the request head is in, and
the app then reads the body from one of the process's few Python threads. A client that sends
its head with a valid key and then trickles the body holds that thread for as long as it
likes, and fifty such clients left even /healthz unanswered (docs/scaling.md's production notes
have the measurement). Here each request's body is read on granian's event loop, which costs
no thread, and the WSGI app runs on a thread only once the whole body is in memory, so
threads wait on Redis, never on a client. The bounds (docs/api.md):

- request head: granian closes a connection whose head has not arrived within
  `STEPWISE_API_HEADER_TIMEOUT` seconds (its HTTP/1 header read timeout, set by `stepwise api`);
- request body: it must arrive within `STEPWISE_API_REQUEST_TIMEOUT` seconds of the head, or
  the request gets a JSON `408` and the connection is closed;
- body size: a body of up to `STEPWISE_MAX_BODY_BYTES` (the JSON routes' limit) is read whole
  before the app runs. A larger one is streamed to the app's thread instead (the upload
  routes take images up to 10 MiB and LoRA files up to `STEPWISE_LORA_MAX_BYTES`): the app
  refuses it unread (no key: 401; over the route's limit: 413), or reads it chunk by chunk
  until the request deadline, then 408. Such requests run on a second pool of as many threads,
  so slow uploads can delay only other large uploads. A chunked JSON body over the limit gets
  413 here, as werkzeug would hand the app a truncated body;
- at most `STEPWISE_API_MAX_CONNECTIONS` requests in progress per worker process (granian's
  backpressure); more wait until one finishes.

Responses are buffered too (the app's answers are JSON and small images), except those that wait
on a job (`Prefer: wait`, the OpenAI images routes, event streams: `api.live`): the app returns a
LiveBody, whose wait runs here on the event loop, woken by one Redis subscription per process, so
hundreds of waiting clients cost coroutines, not threads; only the final render borrows a thread.
The app threads per process come from `STEPWISE_API_THREADS`, which `stepwise api --threads` sets.

On SIGTERM granian stops accepting connections and calls `__rsgi_del__`, which drains (`drain`): waits
and event streams end at once, each with an answer a client can act on, the other requests in flight
get `STEPWISE_API_DRAIN_SECONDS`, and the process exits within that bound (docs/api.md#shutdown).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from granian.rsgi import HTTPProtocol, Scope
from werkzeug.exceptions import ClientDisconnected, RequestTimeout

from api.live import LiveBody, new_feed
from api.request_body import is_json_type
from api.wsgi import app as wsgi_app
from settings import read
from storage.job_event_feed import JobEventFeed

log = logging.getLogger(__name__)

Headers = list[tuple[str, str]]
# Header names a WSGI environ keeps without the HTTP_ prefix.
UNPREFIXED = {"content-type": "CONTENT_TYPE", "content-length": "CONTENT_LENGTH"}
UNREADABLE_DROPPED = {"host"}  # without a Host, werkzeug falls back to SERVER_NAME; an empty one would name no host
TOO_LARGE = "request body is larger than the limit (STEPWISE_MAX_BODY_BYTES)"  # as api.errors words it


def json_error(status: int, code: str, message: str) -> tuple[int, Headers, bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    return status, [("content-type", "application/json"), ("connection", "close")], body


class BodyTooLarge(Exception):
    pass


async def next_chunk(chunks: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


class StreamedBody(io.RawIOBase):
    """`wsgi.input` for a body over the buffered size: the app's thread reads it from the event
    loop, chunk by chunk, until the request's deadline (then the read raises a 408)."""

    def __init__(
        self,
        prefix: bytes,
        chunks: AsyncIterator[bytes],
        loop: asyncio.AbstractEventLoop,
        deadline: float,
        request_timeout: float,
    ) -> None:
        self.pending = memoryview(prefix)
        self.chunks: AsyncIterator[bytes] | None = chunks
        self.loop = loop
        self.deadline = deadline
        self.request_timeout = request_timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.pending:
            if self.chunks is None:
                return 0
            future = asyncio.run_coroutine_threadsafe(next_chunk(self.chunks), self.loop)
            try:
                chunk = future.result(timeout=max(self.deadline - time.monotonic(), 0.0))
            except concurrent.futures.TimeoutError:
                future.cancel()
                self.chunks = None
                raise RequestTimeout(
                    f"the request body did not arrive within {self.request_timeout:g}s (STEPWISE_API_REQUEST_TIMEOUT)"
                ) from None
            except Exception as e:  # the client went away
                self.chunks = None
                raise ClientDisconnected() from e
            if chunk is None:
                self.chunks = None
                return 0
            self.pending = memoryview(chunk)
        size = min(len(buffer), len(self.pending))
        buffer[:size] = self.pending[:size]
        self.pending = self.pending[size:]
        return size


class BufferedWsgi:
    """RSGI app: reads the body on the event loop (up to `max_body`), then runs `wsgi` on a thread pool."""

    def __init__(
        self,
        wsgi: Callable[..., Iterable[bytes]],
        *,
        threads: int,
        request_timeout: float,
        max_body: int | None,
        feed_factory: Callable[[], JobEventFeed],
        drain_seconds: float,
    ) -> None:
        self.wsgi = wsgi
        self.threads = threads
        self.request_timeout = request_timeout
        self.max_body = max_body
        self.feed_factory = feed_factory
        self.drain_seconds = drain_seconds
        self.feed: JobEventFeed | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.streaming_pool: ThreadPoolExecutor | None = None
        self.num_in_flight = 0  # requests between their start and their answer (drain waits for them)
        self.draining: asyncio.Future[None] | None = None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stepwise-api")
        # Requests whose body the app reads itself wait on their clients: their own threads, so
        # a slow upload can hold up only other large uploads, never health checks or submits.
        self.streaming_pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stepwise-api-upload")
        # granian tells its app of a SIGTERM only once every connection has closed (__rsgi_del__), and an open
        # event stream never closes by itself: hear the signal too. granian's own handler still runs (asyncio
        # dispatches it from the wakeup fd the C-level handler writes to; this is the Python-level handler).
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: loop.call_soon_threadsafe(self.begin_drain))

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        """granian calls this once its connections have closed after a SIGTERM (or SIGINT): finish the drain, then
        let go of everything."""
        self.begin_drain()
        assert self.draining is not None
        loop.run_until_complete(self.draining)
        for pool in (self.pool, self.streaming_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    def begin_drain(self) -> None:
        if self.draining is None:
            self.draining = asyncio.ensure_future(self.drain())

    async def drain(self) -> None:
        """The API's own drain: every request that waits on a job ends now (an event stream with a `reconnect`
        event, a wait with the job as it is now), and the other requests in flight get until
        STEPWISE_API_DRAIN_SECONDS to be answered; then the feed closes. granian kills a worker still up a
        second later (`stepwise api` sets its workers_kill_timeout)."""
        deadline = time.monotonic() + self.drain_seconds
        if self.feed is not None:
            self.feed.end_watches()
        while self.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.num_in_flight:
            log.warning("stepwise api: %d requests still in flight after the drain; leaving them", self.num_in_flight)
        if self.feed is not None:
            await self.feed.close()

    async def offload(self, call: Callable[..., Any], *args: Any) -> Any:
        """Run `call(*args)` on an app thread (a LiveBody's final render)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, call, *args)

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        if scope.proto != "http":  # websockets: the API has none
            return
        self.num_in_flight += 1
        try:
            await self.answer(scope, protocol)
        finally:
            self.num_in_flight -= 1

    async def answer(self, scope: Scope, protocol: HTTPProtocol) -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.request_timeout
        declared = scope.headers.get("content-length")
        rest: AsyncIterator[bytes] | None = None  # the body past what was buffered, for the app to read
        try:
            # With Transfer-Encoding, hyper reads the body as chunked whatever Content-Length says.
            length = None if declared is None or "transfer-encoding" in scope.headers else int(declared)
            if length == 0 or (length is None and scope.method in ("GET", "HEAD", "DELETE", "OPTIONS")):
                body = b""
            elif length is not None and (self.max_body is None or length <= self.max_body):
                body = await asyncio.wait_for(protocol(), self.request_timeout)  # hyper stops at Content-Length
            elif length is not None:  # over the JSON routes' limit: the app refuses it, or reads it itself
                body, rest = b"", protocol.__aiter__()
            else:
                body, rest = await asyncio.wait_for(self.read_prefix(protocol), self.request_timeout)
                mimetype = scope.headers.get("content-type", "").split(";")[0].strip().lower()
                if rest is not None and is_json_type(mimetype):
                    # A chunked JSON body over the limit: werkzeug, reading a body of no declared
                    # length, would stop at the limit and hand the app a truncated body, not a 413.
                    protocol.response_bytes(*json_error(413, "payload_too_large", TOO_LARGE))
                    return
        except TimeoutError:
            protocol.response_bytes(
                *json_error(
                    408,
                    "request_timeout",
                    f"the request body did not arrive within {self.request_timeout:g}s (STEPWISE_API_REQUEST_TIMEOUT)",
                )
            )
            return
        except ValueError:  # a Content-Length that is not a number; hyper refuses most before this
            protocol.response_bytes(*json_error(400, "bad_request", "Content-Length is not a number"))
            return
        environ = self.environ(scope, body)
        if rest is not None:
            environ["wsgi.input"] = io.BufferedReader(StreamedBody(body, rest, loop, deadline, self.request_timeout))
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            if length is not None:
                environ["CONTENT_LENGTH"] = str(length)
            else:
                environ.pop("CONTENT_LENGTH", None)  # read to its end (wsgi.input_terminated)
        pool = self.pool if rest is None else self.streaming_pool
        answer = await loop.run_in_executor(pool, self.call, environ)
        if isinstance(answer, LiveBody):  # it waits on a job: here, on the loop, not on the thread
            if self.feed is None:
                self.feed = self.feed_factory()
            await answer.serve(protocol, self.feed, self.offload)
            return
        status, headers, content = answer
        protocol.response_bytes(status, headers, content)

    async def read_prefix(self, protocol: HTTPProtocol) -> tuple[bytes, AsyncIterator[bytes] | None]:
        """A chunked body, whole if it fits in `max_body`; else its first chunks and the rest to come."""
        chunks, size = [], 0
        rest = protocol.__aiter__()  # granian's body iterator: iterated once, by hand, so the app can go on
        while (chunk := await next_chunk(rest)) is not None:
            chunks.append(chunk)
            size += len(chunk)
            if size > (self.max_body or 0):
                return b"".join(chunks), rest
        return b"".join(chunks), None

    def environ(self, scope: Scope, body: bytes) -> dict[str, Any]:
        server_host, _, server_port = scope.server.rpartition(":")
        client_host, _, client_port = scope.client.rpartition(":")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": scope.method,
            "SCRIPT_NAME": "",
            # RSGI gives the path percent-decoded as text; WSGI wants its UTF-8 bytes as latin-1.
            "PATH_INFO": scope.path.encode("utf-8", "surrogateescape").decode("latin-1"),
            "QUERY_STRING": scope.query_string,
            "SERVER_NAME": server_host.strip("[]"),
            "SERVER_PORT": server_port,
            "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
            "REMOTE_ADDR": client_host.strip("[]"),
            "REMOTE_PORT": client_port,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": scope.scheme,
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,  # the whole body is buffered: read to its end
        }
        items = scope.headers.items()
        for name, value in items:
            key = UNPREFIXED.get(name) or "HTTP_" + name.upper().replace("-", "_")
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        # granian keeps the name of a header whose value is not visible ASCII (UTF-8, say) but drops the value.
        # Such a header reaches the app empty, as sent but unreadable, rather than not at all: an Idempotency-Key
        # that vanished would let a retry create a second job (the app answers 422 for an empty one).
        for name in set(scope.headers.keys()).difference(name for name, _ in items).difference(UNREADABLE_DROPPED):
            environ.setdefault(UNPREFIXED.get(name) or "HTTP_" + name.upper().replace("-", "_"), "")
        if body:  # buffered and de-chunked: its length is known (a body left unread keeps the declared one)
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            environ["CONTENT_LENGTH"] = str(len(body))
        return environ

    def call(self, environ: dict[str, Any]) -> tuple[int, Headers, bytes] | LiveBody:
        started: list[Any] = []

        def start_response(status: str, headers: Headers, exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return written.append

        written: list[bytes] = []
        result = self.wsgi(environ, start_response)
        if isinstance(result, LiveBody):
            return result
        try:
            written.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = started
        return int(status.split(" ", 1)[0]), [(name, value) for name, value in headers], b"".join(written)


app = BufferedWsgi(
    wsgi_app,
    threads=read("STEPWISE_API_THREADS"),
    request_timeout=read("STEPWISE_API_REQUEST_TIMEOUT"),
    max_body=wsgi_app.config.get("MAX_CONTENT_LENGTH"),
    feed_factory=lambda: new_feed(wsgi_app),
    drain_seconds=read("STEPWISE_API_DRAIN_SECONDS"),
)
