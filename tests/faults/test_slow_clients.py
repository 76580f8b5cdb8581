"""Slow clients cannot make `stepwise api` unresponsive, and the malformed requests the server answers
itself are refused. A real `stepwise api` (granian) on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from tests.support.calls import auth
from tests.support.processes import ApiProcess
from tests.support.servers import RedisServer

HEADER_TIMEOUT = 2
REQUEST_TIMEOUT = 4
NUM_SLOW = 60  # far more than the 8 app threads a `stepwise api` of 2 workers x 4 threads has
MODES = ("headers", "body", "auth-body", "auth-upload")

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]


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
    """Send a request head (or a body) one line (or byte) every 0.5 s until the server hangs up.
    `body` comes without an API key (the app refuses it unread), `auth-body` with one, so
    the app needs the whole body; `auth-upload` is an image upload over the JSON routes' body
    limit, which the app reads itself."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if mode == "headers":
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            chunk = b"X-Slow: 1\r\n"
        elif mode == "auth-upload":
            sock.sendall(
                b"POST /v1/uploads HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                + f"Authorization: {auth()['Authorization']}\r\n".encode()
                + b"Content-Length: 2000000\r\n\r\n"
            )
            chunk = b"\0"
        else:
            key = f"Authorization: {auth()['Authorization']}\r\n".encode() if mode == "auth-body" else b""
            sock.sendall(
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + key
                + b"Content-Length: 100000\r\n\r\n"
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
    closed_after: dict[str, list[float]] = {mode: [] for mode in MODES}
    slow = [
        threading.Thread(target=trickle, args=(guarded_api.port, mode, stop, closed_after[mode]), daemon=True)
        for mode in MODES
        for _ in range(NUM_SLOW // len(MODES))
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
    each = NUM_SLOW // len(MODES)
    assert len(closed_after["headers"]) == each and max(closed_after["headers"]) < HEADER_TIMEOUT + 2
    for mode in ("body", "auth-body", "auth-upload"):
        assert len(closed_after[mode]) == each and max(closed_after[mode]) < REQUEST_TIMEOUT + 2, mode


# What the server answers: (status, JSON error code or None for an empty body). granian's HTTP parser
# (hyper) refuses a bad Content-Length and a NUL with an empty 400 it writes itself; it lets a long request
# line through to the app (its head limit is 400 KiB), and takes Transfer-Encoding over
# Content-Length (RFC 9112), so that body never completes and the request deadline answers.
MALFORMED = {
    "a request line over 8190 bytes": (
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        (404, "not_found"),
    ),
    "Content-Length: -1": (b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", (400, None)),
    "Content-Length with chunked": (
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        (408, "request_timeout"),
    ),
    "a NUL in a header": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", (400, None)),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_requests_are_refused_and_the_connection_closed(guarded_api, case):
    raw, (status, code) = case
    with socket.create_connection(("127.0.0.1", guarded_api.port), timeout=REQUEST_TIMEOUT + 6) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(4096):  # until the server closes the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")

    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    if code is None:
        assert body == b"", body
    else:
        assert b"content-type: application/json" in head.lower()
        error = json.loads(body)["error"]
        assert error["code"] == code and error["message"]
