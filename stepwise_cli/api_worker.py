"""The gunicorn worker `stepwise api --server gunicorn` runs: gevent, with read deadlines and JSON errors.

Why gevent: with gthread, a connection whose request head or body trickles in holds one of
the worker's few threads until it completes, so a few dozen slow unauthenticated sockets left
/healthz unanswered (docs/scaling.md has the measurement). Under gevent each
connection costs a greenlet, not a thread, and these bounds hold:

- request head (request line and headers): read within `STEPWISE_API_HEADER_TIMEOUT` seconds,
  measured over the whole head, not per read (gunicorn's gevent worker bounds `next(parser)`
  with `keepalive`, which this worker sets from that setting), or the connection is closed;
- a request (its body included) must be read and answered within `STEPWISE_API_REQUEST_TIMEOUT`
  seconds, or the connection is closed; a response that waits on a job (`api.live`: `Prefer: wait`,
  the OpenAI images routes, event streams) lifts that bound once its request is read, and waits in
  its greenlet;
- at most `STEPWISE_API_MAX_CONNECTIONS` connections per worker process; more wait in the
  listen backlog.

gunicorn answers some malformed requests itself (request line over 8190 bytes, a bad
Content-Length, Content-Length with chunked encoding, a NUL in a header) before the Flask app
sees them; in this worker those answers use the API's JSON error shape instead of HTML.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable
from typing import Any

import gevent
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from api.live import LIFT_REQUEST_TIMEOUT

STATUS_CODES = {400: "bad_request", 403: "forbidden", 431: "headers_too_large", 500: "internal", 501: "not_implemented"}


def write_json_error(sock, status_int: int, reason: str, mesg: str) -> None:
    """Stands in for gunicorn.util.write_error: the same status, the API's JSON error body."""
    code = STATUS_CODES.get(status_int, "http_error")
    message = f"{reason}: {mesg}" if mesg else reason
    body = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    util.write_nonblock(sock, head + body)


class ApiWorker(GeventWorker):
    request_timeout: float = 30.0  # set by `stepwise api` through the `STEPWISE_API_REQUEST_TIMEOUT` env

    def init_process(self) -> None:
        util.write_error = write_json_error  # this process serves only the API
        self.request_timeouts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # greenlet -> its Timeout
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app: Callable[..., Any] = self.wsgi  # type: ignore[has-type]  # gunicorn sets it untyped

        def wsgi(environ, start_response):
            environ[LIFT_REQUEST_TIMEOUT] = self.lift_request_timeout
            return app(environ, start_response)

        self.wsgi = wsgi

    def lift_request_timeout(self) -> None:
        timeout = self.request_timeouts.pop(gevent.getcurrent(), None)
        if timeout is not None:
            timeout.cancel()

    def handle_request(self, listener_name, req, sock, addr):
        with gevent.Timeout(self.request_timeout, False) as timeout:
            self.request_timeouts[gevent.getcurrent()] = timeout
            try:
                return super().handle_request(listener_name, req, sock, addr)
            finally:
                self.request_timeouts.pop(gevent.getcurrent(), None)
        self.log.info("a request was not read and answered within %.0fs; connection closed", self.request_timeout)
        raise StopIteration  # gunicorn's way to end a connection: the caller closes it
