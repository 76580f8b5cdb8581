"""Slow unauthenticated clients cannot make `stepwise api` unresponsive, and the requests gunicorn
answers itself get the API's JSON error shape. A real `stepwise api` on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from tests.api.calls import auth
from tests.api.processes import ApiProcess
from tests.servers import RedisServer

HEADER_TIMEOUT = 2
REQUEST_TIMEOUT = 4
NUM_SLOW = 60  # far more than the 8 threads a gthread `stepwise api` of 2 workers x 4 threads has

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def guarded_api(tmp_path_factory):
    """`stepwise api` as `stepwise up` runs it (2 workers), with short read deadlines."""
    root = tmp_path_factory.mktemp("slow-clients")
    redis = RedisServer(root / "redis", appendonly=False).start()
    server = ApiProcess(
        root,
        redis.url,
        (root / "images").as_uri(),
        STEPWISE_API_HEADER_TIMEOUT=str(HEADER_TIMEOUT),
        STEPWISE_API_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT),
    ).start()
    yield server
    server.stop()
    redis.stop()


def trickle(port: int, mode: str, stop: threading.Event, closed_after: list[float]) -> None:
    """Send a request head (or a body) one line (or byte) every 0.5 s until the server hangs up."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if mode == "headers":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            chunk = b"X-Slow: 1\r\n"
        else:
            sock.sendall(
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            )
            chunk = b" "
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                sock.sendall(chunk)
                if sock.recv(1024) == b"":
                    break  # the server closed the connection
            except TimeoutError:
                continue
            except OSError:
                break
        else:
            return
    closed_after.append(time.monotonic() - started)


def test_slow_headers_and_bodies_do_not_starve_health_checks_or_authenticated_clients(guarded_api, http):
    stop = threading.Event()
    closed_after: dict[str, list[float]] = {"headers": [], "body": []}
    slow = [
        threading.Thread(target=trickle, args=(guarded_api.port, mode, stop, closed_after[mode]), daemon=True)
        for mode in ("headers", "body")
        for _ in range(NUM_SLOW // 2)
    ]
    for thread in slow:
        thread.start()
    try:
        time.sleep(0.5)  # every slow socket is connected and trickling
        probes = []
        deadline = time.monotonic() + REQUEST_TIMEOUT + 2
        while time.monotonic() < deadline:
            for url, headers in ((f"{guarded_api.url}/healthz", {}), (f"{guarded_api.url}/v1/jobs", auth())):
                started = time.monotonic()
                try:
                    status = http.get(url, headers=headers, timeout=2).status_code
                except requests.RequestException as e:
                    status = type(e).__name__
                probes.append((url.rsplit("/", 1)[1], status, round(time.monotonic() - started, 2)))
            time.sleep(0.2)
        for thread in slow:
            thread.join(REQUEST_TIMEOUT + 5)
    finally:
        stop.set()

    assert all(status == 200 for _, status, _ in probes), [p for p in probes if p[1] != 200]
    # The server hung up on every slow client, each within its deadline (plus slack for a busy machine).
    assert len(closed_after["headers"]) == NUM_SLOW // 2 and max(closed_after["headers"]) < HEADER_TIMEOUT + 2
    assert len(closed_after["body"]) == NUM_SLOW // 2 and max(closed_after["body"]) < REQUEST_TIMEOUT + 2


MALFORMED = {
    "a request line over 8190 bytes": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "Content-Length: -1": b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "Content-Length with chunked": (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    ),
    "a NUL in a header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
}


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_requests_the_server_refuses_before_the_app_get_the_json_error_shape(guarded_api, raw):
    with socket.create_connection(("127.0.0.1", guarded_api.port), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")

    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and error["message"]
