"""Real network troubles for retry tests: a port that starts listening late, and a throttling server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support.servers import free_port


class LateProxy:
    """Refuses connections (nothing listens) for `delay` seconds, then forwards TCP to `target_port`."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = free_port()
        self.listening_at: float | None = None
        self._stopped = threading.Event()
        self._listener: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LateProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._listener:
            with contextlib.suppress(OSError):
                self._listener.close()
        self._thread.join(5)

    def _serve(self) -> None:
        if self._stopped.wait(self.delay):
            return
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self.listening_at = time.monotonic()
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class ThrottlingS3:
    """An HTTP server that answers every request as an overloaded S3 does: 503 SlowDown."""

    def __init__(self) -> None:
        self.num_requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers `Expect: 100-continue` as S3 does

            def _throttle(self) -> None:
                stub.num_requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_HEAD = do_POST = _throttle

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ThrottlingS3:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
