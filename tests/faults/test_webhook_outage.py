"""Webhook receivers that are down, never come back, or redirect: generation never waits for
them, retries keep the event's `webhook-id`, every attempt is recorded on the job, and a redirect
to an address the policy refuses is never followed.

Receivers answering 5xx are covered by `tests/worker/test_webhook_delivery.py`; these are down
(connection refused)."""

from __future__ import annotations

import pytest

from storage.job_record import JobState
from tests.support.cluster import small_params
from tests.support.servers import free_port
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]

# Retries after 0.5, 1, 2, 4 and 8 s: room to bring a receiver back between two of them.
PATIENT_WEBHOOKS = {"STEPWISE_WEBHOOK_MAX_ATTEMPTS": "6", "STEPWISE_WEBHOOK_BACKOFF": "0.5"}


def attempts(cluster, job_id: str) -> list[dict]:
    return sorted(cluster.store.get(job_id).webhook_attempts, key=lambda a: a["attempt"])


def test_a_receiver_that_comes_back_gets_the_event_with_its_webhook_id_and_a_dead_one_changes_nothing(folder_cluster):
    folder_cluster.start_worker(**PATIENT_WEBHOOKS)
    late_port, dead_port = free_port(), free_port()  # nothing listens on either yet
    late_id = folder_cluster.submit(
        small_params(seed=1), webhook_url=f"http://127.0.0.1:{late_port}/hooks", webhook_events=["completed"]
    )
    dead_id = folder_cluster.submit(
        small_params(seed=2), webhook_url=f"http://127.0.0.1:{dead_port}/hooks", webhook_events=["completed"]
    )

    dead_job = folder_cluster.wait_for_end(dead_id)
    assert dead_job.state is JobState.SUCCEEDED and dead_job.finished_at - dead_job.started_at < 60
    wait_for(lambda: len(attempts(folder_cluster, late_id)) >= 2, 60, "two failed deliveries")
    with WebhookReceiver(port=late_port) as receiver:
        delivered = receiver.wait_for("/hooks", lambda got: len(got) == 1, timeout=60)
        late = wait_for(
            lambda: (lambda a: a if a[-1]["delivered"] else None)(attempts(folder_cluster, late_id)),
            30,
            "the delivery to be recorded",
        )

    assert {a["webhook_id"] for a in late} == {delivered[0].headers["webhook-id"]}
    assert [a["delivered"] for a in late] == [False] * (len(late) - 1) + [True]
    assert all(a["error"].startswith("ConnectionRefusedError") for a in late[:-1])  # nothing listened yet
    data = delivered[0].payload["data"]
    assert (data["job_id"], data["state"]) == (late_id, "succeeded")
    assert len(data["image_urls"]) == 1 and data["image_urls"][0].endswith(f"/v1/jobs/{late_id}/image")

    dead = wait_for(
        lambda: (lambda a: a if len(a) == 6 else None)(attempts(folder_cluster, dead_id)), 60, "six recorded attempts"
    )
    wait_for(folder_cluster.broker_is_idle, 30, "the last attempt to be acknowledged")
    assert [a["delivered"] for a in dead] == [False] * 6 and len({a["webhook_id"] for a in dead}) == 1
    assert folder_cluster.store.get(dead_id).state is JobState.SUCCEEDED


def test_a_redirect_to_an_address_the_policy_refuses_is_not_followed(folder_cluster):
    folder_cluster.start_worker()  # the allow list is 127.0.0.1 only; 127.0.0.2 is loopback too
    with WebhookReceiver(host="127.0.0.2") as internal:
        with WebhookReceiver(redirect_to=internal.url("/internal")) as public:
            job_id = folder_cluster.submit(
                small_params(), webhook_url=public.url("/redirect"), webhook_events=["completed"]
            )
            assert folder_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED
            recorded = wait_for(
                lambda: (lambda a: a if len(a) == 3 else None)(attempts(folder_cluster, job_id)),
                60,
                "three recorded attempts (STEPWISE_WEBHOOK_MAX_ATTEMPTS=3)",
            )
            wait_for(folder_cluster.broker_is_idle, 30, "the last attempt to be acknowledged")

            assert len(public.received("/redirect")) == 3
            assert internal.deliveries == []
    assert [(a["status_code"], a["delivered"]) for a in recorded] == [(302, False)] * 3
