"""The app `stepwise api --server granian` serves: the WSGI app behind a body-buffering RSGI adapter.

Why not granian's own WSGI interface: it calls the app as soon as the request head is in, and
the app then reads the body from one of the process's few Python threads. A client that sends
its head with a valid key and then trickles the body holds that thread for as long as it
likes, and fifty such clients left even /healthz unanswered (the README's production notes
have the measurement). Here each request's body is read on granian's event loop, which costs
no thread, and the WSGI app runs on a thread only once the whole body is in memory, so
threads wait on Redis, never on a client. The bounds (docs/api.md):

- request head: granian closes a connection whose head has not arrived within
  `STEPWISE_API_HEADER_TIMEOUT` seconds (its HTTP/1 header read timeout, set by `stepwise api`);
- request body: it must arrive within `STEPWISE_API_REQUEST_TIMEOUT` seconds of the head, or
  the request gets a JSON `408` and the connection is closed;
- body size: a `Content-Length` over `STEPWISE_MAX_BODY_BYTES` is not read (the app answers
  413); a chunked body is read up to one byte over the limit, then refused by the app the same
  way, so a buffered body never exceeds the limit by more than a byte;
- at most `STEPWISE_API_MAX_CONNECTIONS` requests in progress per worker process (granian's
  backpressure); more wait until one finishes.

Responses are buffered too (the app's answers are JSON and small images). The app threads per
process come from `STEPWISE_API_THREADS`, which `stepwise api --threads` sets.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from granian.rsgi import HTTPProtocol, Scope

from api.wsgi import app as wsgi_app
from storage.settings import env_float

Headers = list[tuple[str, str]]
# Header names a WSGI environ keeps without the HTTP_ prefix.
UNPREFIXED = {"content-type": "CONTENT_TYPE", "content-length": "CONTENT_LENGTH"}


def json_error(status: int, code: str, message: str) -> tuple[int, Headers, bytes]:
    body = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    return status, [("content-type", "application/json"), ("connection", "close")], body


class BodyTooLarge(Exception):
    pass


class BufferedWsgi:
    """RSGI app: reads the whole body on the event loop, then runs `wsgi` on a thread pool."""

    def __init__(
        self, wsgi: Callable[..., Iterable[bytes]], *, threads: int, request_timeout: float, max_body: int | None
    ) -> None:
        self.wsgi = wsgi
        self.threads = threads
        self.request_timeout = request_timeout
        self.max_body = max_body
        self.pool: ThreadPoolExecutor | None = None

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="stepwise-api")

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        if scope.proto != "http":  # websockets: the API has none
            return
        declared = scope.headers.get("content-length")
        try:
            # With Transfer-Encoding, hyper reads the body as chunked whatever Content-Length says.
            length = None if declared is None or "transfer-encoding" in scope.headers else int(declared)
            if length == 0 or (length is not None and self.max_body is not None and length > self.max_body):
                body = b""  # nothing to read, or left unread: the app answers 413 from the declared length
            elif length is None and scope.method in ("GET", "HEAD", "DELETE", "OPTIONS"):
                body = b""  # no body
            else:
                body = await asyncio.wait_for(self.read_body(protocol, length), self.request_timeout)
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
        loop = asyncio.get_running_loop()
        status, headers, content = await loop.run_in_executor(self.pool, self.call, environ)
        protocol.response_bytes(status, headers, content)

    async def read_body(self, protocol: HTTPProtocol, length: int | None) -> bytes:
        if length is not None or self.max_body is None:  # hyper stops at Content-Length: read it at once
            return await protocol()
        chunks, size = [], 0
        async for chunk in protocol:
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body:  # enough for the app to answer 413; the rest is never read
                break
        return b"".join(chunks)[: self.max_body + 1]

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
        for name, value in scope.headers.items():
            key = UNPREFIXED.get(name) or "HTTP_" + name.upper().replace("-", "_")
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        if body:  # buffered and de-chunked: its length is known (a body left unread keeps the declared one)
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            environ["CONTENT_LENGTH"] = str(len(body))
        return environ

    def call(self, environ: dict[str, Any]) -> tuple[int, Headers, bytes]:
        started: list[Any] = []

        def start_response(status: str, headers: Headers, exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return written.append

        written: list[bytes] = []
        result = self.wsgi(environ, start_response)
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
    threads=int(os.environ.get("STEPWISE_API_THREADS", "4")),
    request_timeout=env_float("STEPWISE_API_REQUEST_TIMEOUT", 30.0),
    max_body=wsgi_app.config.get("MAX_CONTENT_LENGTH"),
)
