"""`stepwise api` on SIGTERM (issue 48 E3): its own drain, over real HTTP against a real process.

It used to stop listening at once but stay up for as long as any event stream was open (over 150 s seen),
sending the stream only keep-alives, so clients never reconnected to another replica. Now an open stream
gets a `reconnect` event with `retry:` and ends, a `Prefer: wait` submit answers with the job as it is
(an OpenAI images call with 503 and where its job goes on), and the process exits within
STEPWISE_API_DRAIN_SECONDS even while a request is still arriving.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import httpx
import pytest
import requests
from httpx_sse import connect_sse

from storage.job_store import JobStore
from tests.support.calls import auth
from tests.support.processes import ApiProcess
from tests.support.servers import RedisServer
from tests.support.waiting import wait_for

DRAIN_SECONDS = 3
JOB = {"prompt": "a lighthouse", "num_inference_steps": 20}

pytestmark = [pytest.mark.timeout(120), pytest.mark.e2e]


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture
def api(tmp_path, redis_server):
    """A `stepwise api` of its own (the test stops it) and no worker: jobs stay queued, so waits wait."""
    redis = redis_server
    server = ApiProcess(
        tmp_path,
        redis.url,
        (tmp_path / "images").as_uri(),
        STEPWISE_API_DRAIN_SECONDS=str(DRAIN_SECONDS),
        STEPWISE_API_REQUEST_TIMEOUT="60",  # the trickling upload below would outlive the drain by far
        STEPWISE_EVENTS_KEEPALIVE_SECONDS="1",
        STEPWISE_IMAGES_WAIT_SECONDS="60",
    ).start()
    yield server
    server.stop(signal.SIGKILL)


def test_sigterm_ends_streams_with_a_reconnect_event_and_waits_with_the_job_and_exits_within_the_drain(
    api, redis_server
):
    job_id = requests.post(f"{api.url}/v1/jobs", json=JOB, headers=auth(), timeout=10).json()["job_id"]
    stream_events: list = []
    stream_opened, answers = threading.Event(), {}

    def follow_stream() -> None:
        with httpx.Client(timeout=30) as client:
            with connect_sse(client, "GET", f"{api.url}/v1/jobs/{job_id}/events", headers=auth()) as source:
                for event in source.iter_sse():
                    stream_events.append((time.monotonic(), event))
                    stream_opened.set()
        answers["stream_closed_at"] = time.monotonic()

    def wait_on_a_job() -> None:
        headers = {**auth(), "Prefer": "wait=60"}
        answers["wait"] = requests.post(f"{api.url}/v1/jobs", json=JOB, headers=headers, timeout=60)
        answers["wait_answered_at"] = time.monotonic()

    def wait_on_an_image() -> None:
        body = {"prompt": "a lighthouse", "size": "64x64"}
        answers["image"] = requests.post(f"{api.url}/v1/images/generations", json=body, headers=auth(), timeout=60)
        answers["image_answered_at"] = time.monotonic()

    slow_upload = socket.create_connection(("127.0.0.1", api.port))  # a request in flight past the drain
    slow_upload.sendall(
        b"POST /v1/uploads HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
        + f"Authorization: {auth()['Authorization']}\r\n".encode()
        + b"Content-Length: 2000000\r\n\r\n\x89PNG"
    )
    threads = [threading.Thread(target=work) for work in (follow_stream, wait_on_a_job, wait_on_an_image)]
    for thread in threads:
        thread.start()
    assert stream_opened.wait(10), "the event stream did not open"
    with JobStore(redis_server.url) as store:  # the two waits are in: each created its job
        wait_for(lambda: store.queue_depth() == 3, 10, "the waiting requests to create their jobs")

    terminated_at = time.monotonic()
    os.killpg(api.process.pid, signal.SIGTERM)
    exit_code = api.process.wait(DRAIN_SECONDS + 10)
    exit_seconds = time.monotonic() - terminated_at
    for thread in threads:
        thread.join(10)
    slow_upload.close()

    last_at, last = stream_events[-1]
    assert [event.event for _, event in stream_events] == ["queued", "reconnect"]
    assert last.retry == 500 and last.json()["job_id"] == job_id and "shutting down" in last.json()["reason"]
    assert last_at - terminated_at < 1.0 and answers["stream_closed_at"] - terminated_at < 1.0
    wait = answers["wait"]
    assert wait.status_code == 202 and wait.json()["state"] == "queued", wait.text
    assert wait.headers["Location"].endswith(f"/v1/jobs/{wait.json()['job_id']}")
    assert answers["wait_answered_at"] - terminated_at < 1.0
    image = answers["image"]  # OpenAI's shape; the job goes on, where Location says
    assert image.status_code == 503 and image.json()["error"]["code"] == "shutting_down", image.text
    assert "/v1/jobs/" in image.headers["Location"] and answers["image_answered_at"] - terminated_at < 1.0
    # the upload still arriving held the worker process only until the drain's bound (and granian's kill after)
    assert exit_seconds < DRAIN_SECONDS + 3, f"exited after {exit_seconds:.1f}s:\n{api.log_tail()}"
    assert exit_code == 0, api.log_tail()


def child_pids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


def has_exited(pid: int) -> bool:
    """Gone, or a zombie its stopped parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_stop_sent_to_the_process_group_exits_0_when_the_workers_finish_before_granians_main_process(
    tmp_path, redis_server
):
    """`kill -- -PGID`, a terminal's Ctrl-C and `stepwise up`'s stop reach granian's workers and its main process
    at once. An idle worker's drain takes milliseconds; under load it used to exit before the main process had
    marked it as stopped by it, which granian counted as a worker failure: exit 1 (a flake of the test above).
    Here the main process is held (SIGSTOP) until its workers have gone, the widest form of that race."""
    workers = 4  # each a watcher thread in the main process racing its signal handler: the race is likelier
    server = ApiProcess(
        tmp_path,
        redis_server.url,
        (tmp_path / "images").as_uri(),
        workers=workers,
        STEPWISE_API_DRAIN_SECONDS=str(DRAIN_SECONDS),  # a worker granian respawned in the race is killed after it
    ).start()
    try:
        main_pid = server.process.pid
        worker_pids = child_pids(main_pid)
        assert len(worker_pids) == workers, worker_pids
        # /healthz answered from one worker; a signal that reaches a worker still starting is not heard by it
        wait_for(lambda: server.log_text().count(" runtime-1") == workers, 30, "both workers to start serving")
        os.kill(main_pid, signal.SIGSTOP)
        os.killpg(main_pid, signal.SIGTERM)  # pending in the stopped main process; the workers hear it now
        wait_for(lambda: all(map(has_exited, worker_pids)), 10, "the workers to finish their drain and exit")
        os.kill(main_pid, signal.SIGCONT)
        exit_code = server.process.wait(DRAIN_SECONDS + 10)
        # granian logs "Unexpected exit from worker-N" when its watcher thread wins the race (most runs)
        assert exit_code == 0, server.log_tail()
    finally:
        server.stop(signal.SIGKILL)
