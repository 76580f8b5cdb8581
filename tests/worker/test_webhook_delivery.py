"""Webhook events from a real worker to a real HTTP receiver on this machine."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from storage.job_record import JobState
from storage.webhooks import secret_bytes, verify
from tests.support.cluster import small_params
from tests.support.processes import WEBHOOK_SECRET
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("s3-cluster")]  # one `s3_cluster` for these files


class Receiver:
    """Records every POST; answers with the queued status codes first, then 200."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], str]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"])).decode()
                receiver.deliveries.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        return [json.loads(body)["type"] for _, body in self.deliveries]


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()


def test_started_and_completed_events_are_signed_delivered_and_recorded_on_the_job(s3_cluster, main_worker, receiver):
    job_id = s3_cluster.submit(small_params(), webhook_url=receiver.url, webhook_events=["started", "completed"])

    assert s3_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED
    wait_for(lambda: len(receiver.deliveries) >= 2, 30, "two webhook deliveries")
    wait_for(s3_cluster.broker_is_idle, 30, "the deliveries to be acknowledged")

    assert sorted(receiver.events()) == ["job.completed", "job.started"]
    for headers, body in receiver.deliveries:
        verify(secret_bytes(WEBHOOK_SECRET), headers, body)
        assert json.loads(body)["data"]["job_id"] == job_id
    completed = next(json.loads(body) for _, body in receiver.deliveries if "completed" in body)
    assert completed["data"]["state"] == "succeeded" and len(completed["data"]["image_urls"]) == 1
    assert completed["data"]["image_urls"][0].startswith("http")  # presigned from S3, not a storage key
    attempts = s3_cluster.store.get(job_id).webhook_attempts
    assert all(attempt["at"].endswith("Z") for attempt in attempts)  # RFC 3339, like every other time
    assert sorted((a["event"], a["status_code"], a["delivered"]) for a in attempts) == [
        ("completed", 200, True),
        ("started", 200, True),
    ]


def test_a_failing_receiver_is_retried_under_the_same_webhook_id_and_the_job_still_succeeds(
    s3_cluster, main_worker, receiver
):
    receiver.statuses = [500, 503]
    job_id = s3_cluster.submit(small_params(), webhook_url=receiver.url, webhook_events=["completed"])

    assert s3_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED
    wait_for(lambda: len(receiver.deliveries) >= 3, 60, "a third delivery attempt")

    assert len({headers["webhook-id"] for headers, _ in receiver.deliveries}) == 1
    wait_for(lambda: len(s3_cluster.store.get(job_id).webhook_attempts) == 3, 30, "three recorded attempts")
    attempts = sorted(s3_cluster.store.get(job_id).webhook_attempts, key=lambda a: a["attempt"])
    assert [(a["attempt"], a["status_code"]) for a in attempts] == [(1, 500), (2, 503), (3, 200)]


def test_delivery_gives_up_after_the_configured_attempts(s3_cluster, main_worker, receiver):
    receiver.statuses = [502] * 10
    job_id = s3_cluster.submit(small_params(), webhook_url=receiver.url, webhook_events=["completed"])

    assert s3_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED
    wait_for(lambda: len(receiver.deliveries) >= 3, 60, "three delivery attempts")
    wait_for(s3_cluster.broker_is_idle, 30, "the last attempt to be acknowledged")

    assert len(receiver.deliveries) == 3  # STEPWISE_WEBHOOK_MAX_ATTEMPTS=3 in these tests
    assert [a["delivered"] for a in s3_cluster.store.get(job_id).webhook_attempts] == [False] * 3


def test_no_webhook_is_sent_for_events_the_job_did_not_ask_for(s3_cluster, main_worker, receiver):
    job_id = s3_cluster.submit(small_params(), webhook_url=receiver.url, webhook_events=["failed"])

    assert s3_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED
    wait_for(s3_cluster.broker_is_idle, 30, "the job's message to be acknowledged")

    assert receiver.deliveries == []
