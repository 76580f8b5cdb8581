"""A receiver that answers one byte at a time: each attempt ends at its deadline, and generation
never waits for it. The receiver runs on loopback and trickles for a bounded time."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from storage.job_record import JobState
from storage.url_policy import AllowList
from tests.support.cluster import small_params
from tests.support.waiting import wait_for

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class TricklingReceiver:
    """Reads each request head, then answers one byte every `interval` seconds (at most
    `max_seconds` per connection). Records when each connection opened and closed."""

    def __init__(self, interval: float, max_seconds: float) -> None:
        self.interval = interval
        self.max_seconds = max_seconds
        self.connections: list[list[float]] = []  # [opened, closed] monotonic times; closed 0 while open
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.is_stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.is_stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(client,), daemon=True).start()

    def _trickle(self, client: socket.socket) -> None:
        times = [time.monotonic(), 0.0]
        self.connections.append(times)
        with client:
            try:
                client.settimeout(5)
                client.recv(65536)
                for byte in ANSWER:
                    if self.is_stopped.wait(self.interval) or time.monotonic() - times[0] > self.max_seconds:
                        break
                    client.sendall(bytes([byte]))
            except OSError:
                pass
        times[1] = time.monotonic()

    def num_open(self) -> int:
        return sum(1 for _, closed in self.connections if not closed)

    def close(self) -> None:
        self.is_stopped.set()
        self.listener.close()


@pytest.fixture
def trickling_receiver():
    receiver = TricklingReceiver(interval=0.5, max_seconds=120)
    yield receiver
    receiver.close()


def test_an_attempt_ends_at_its_deadline_however_slowly_the_receiver_answers(trickling_receiver):
    from worker.webhooks import post_once

    started = time.monotonic()
    outcome = post_once(
        trickling_receiver.url,
        "msg_deadline",
        {"type": "job.started"},
        timeout=1.5,
        allow=AllowList.parse("127.0.0.1"),
        secret=None,
    )
    elapsed = time.monotonic() - started

    assert not outcome.is_delivered and not outcome.is_final
    assert "AttemptDeadlineError" in outcome.error and "1.5s" in outcome.error
    assert elapsed < 2.5, f"the attempt took {elapsed:.1f}s with a 1.5s deadline"


@pytest.mark.timeout(400)
@pytest.mark.workers
def test_slow_receivers_never_hold_the_threads_generation_needs(folder_cluster, trickling_receiver):
    """`stepwise worker` as `stepwise up` starts it, holding 3 jobs at once, beside a webhook worker."""
    settings = {"STEPWISE_MAX_NUM_SEQS": "1", "STEPWISE_WEBHOOK_TIMEOUT": "2", "STEPWISE_WEBHOOK_MAX_ATTEMPTS": "1"}
    workers = [
        folder_cluster.start_worker("generate", via_stepwise=True, wait=False, **settings),
        folder_cluster.start_worker(
            "webhooks",
            via_stepwise=True,
            wait=False,
            **settings,
            stepwise_args=("--queues", "stepwise.webhooks", "--concurrency", "4"),
        ),
    ]
    for worker in workers:  # booted side by side
        folder_cluster.wait_until_ready(worker)
    hooked = [
        folder_cluster.submit(
            small_params(prompt=f"hooked {i}"), webhook_url=trickling_receiver.url, webhook_events=["started"]
        )
        for i in range(3)
    ]
    wait_for(lambda: len(trickling_receiver.connections) >= 3, 120, "three deliveries to the slow receiver")

    plain = folder_cluster.submit(small_params(prompt="plain"))
    assert folder_cluster.wait_for_end(plain, timeout=90).state is JobState.SUCCEEDED
    assert [folder_cluster.wait_for_end(job_id).state for job_id in hooked] == [JobState.SUCCEEDED] * 3

    wait_for(
        lambda: all(folder_cluster.store.get(job_id).webhook_attempts for job_id in hooked),
        60,
        "the attempt of every hooked job to be recorded",
    )
    wait_for(lambda: trickling_receiver.num_open() == 0, 10, "every delivery connection to close")
    durations = [closed - opened for opened, closed in trickling_receiver.connections]
    assert len(durations) == 3 and max(durations) < 2 + 1.5, durations  # each cut at its 2 s deadline
    for job_id in hooked:
        [attempt] = folder_cluster.store.get(job_id).webhook_attempts
        assert attempt["error"] == "AttemptDeadlineError: no answer within 2s" and not attempt["delivered"]
    assert "stepwise.deliver_webhook[" in workers[1].log_path.read_text()  # Celery logs each task it receives
    assert "stepwise.deliver_webhook[" not in workers[0].log_path.read_text()  # generation's worker took none
