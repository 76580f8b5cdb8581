"""Workers that die or race: every job ends `succeeded` exactly once, with one image, and a late
redelivery of an old message changes nothing."""

from __future__ import annotations

import re
import signal
import time

import pytest

from storage.job_record import JobState
from tests.support.cluster import FAST_RECOVERY, small_params
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

NUM_IN_FLIGHT = 20


def test_a_sigkilled_worker_with_twenty_jobs_in_flight_loses_none_and_runs_none_twice(folder_cluster):
    doomed = folder_cluster.start_worker("doomed", STEPWISE_MAX_NUM_SEQS=str(NUM_IN_FLIGHT), **FAST_RECOVERY)
    job_ids = [
        folder_cluster.submit(small_params(prompt=f"crash survivor {i}", seed=i, num_inference_steps=150))
        for i in range(NUM_IN_FLIGHT)
    ]
    wait_for(
        lambda: folder_cluster.store.counts_by_state()["running"] == NUM_IN_FLIGHT,
        120,
        lambda: f"all {NUM_IN_FLIGHT} jobs to be taken (now {folder_cluster.store.counts_by_state()})",
    )
    folder_cluster.wait_for_progress(job_ids[0], min_step=1)

    doomed.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    assert folder_cluster.num_unacked() == NUM_IN_FLIGHT  # Redis would hand these back only after 10 hours
    folder_cluster.start_worker("rescuer", **FAST_RECOVERY)

    records = [folder_cluster.wait_for_end(job_id) for job_id in job_ids]
    recovered_in = time.monotonic() - killed_at

    assert [r.state for r in records] == [JobState.SUCCEEDED] * NUM_IN_FLIGHT, [r.error_message for r in records]
    assert [r.attempts for r in records] == [2] * NUM_IN_FLIGHT
    assert {r.requeue_reason for r in records} <= {"lease_expired", "worker_lost"}  # the view says why
    assert folder_cluster.store.counts_by_state()["succeeded"] == NUM_IN_FLIGHT  # each reached it once
    assert folder_cluster.store.counts_by_state()["running"] == 0
    assert folder_cluster.stored_images() == sorted(r.image_keys[0] for r in records)
    assert recovered_in < 200, f"recovery took {recovered_in:.0f}s"

    # The dead worker's 20 messages come back from Redis some day; the same messages now stand in
    # for that redelivery, and must change nothing.
    for job_id in job_ids:
        folder_cluster.enqueue(job_id)
    wait_for(
        lambda: folder_cluster.queue_length() == 0 and folder_cluster.num_unacked() == NUM_IN_FLIGHT,
        60,
        "the redelivered messages to be consumed and acknowledged",
    )
    after = [folder_cluster.store.get(job_id) for job_id in job_ids]
    assert [(r.state, r.attempts, r.image_keys) for r in after] == [(r.state, 2, r.image_keys) for r in records]
    assert folder_cluster.store.counts_by_state()["succeeded"] == NUM_IN_FLIGHT
    assert len(folder_cluster.stored_images()) == NUM_IN_FLIGHT


def received_tasks(log_text: str) -> int:
    return len(re.findall(r"Task stepwise\.generate\[[^\]]+\] received", log_text))


def test_the_same_message_delivered_to_two_workers_at_once_runs_once_with_one_image(folder_cluster):
    workers = [folder_cluster.start_worker("twin-a"), folder_cluster.start_worker("twin-b")]
    job_ids = [folder_cluster.create_job(small_params(prompt=f"twin {i}", seed=i)).job_id for i in range(6)]
    for job_id in job_ids:
        folder_cluster.enqueue(job_id, task_id=job_id)
        folder_cluster.enqueue(job_id, task_id=job_id)

    records = [folder_cluster.wait_for_end(job_id) for job_id in job_ids]
    wait_for(folder_cluster.broker_is_idle, 60, "all twelve messages to be consumed and acknowledged")

    assert [(r.state, r.attempts) for r in records] == [(JobState.SUCCEEDED, 1)] * len(job_ids)
    assert folder_cluster.store.counts_by_state()["succeeded"] == len(job_ids)
    assert folder_cluster.stored_images() == sorted(r.image_keys[0] for r in records)
    logs = [worker.log_path.read_text(errors="replace") for worker in workers]
    assert all(received_tasks(text) > 0 for text in logs), "both workers should have taken messages"
    assert sum(received_tasks(text) for text in logs) == 2 * len(job_ids)
    skipped = sum(len(re.findall(r"no job of its queue is queued; nothing to do", text)) for text in logs)
    assert skipped == len(job_ids)


def test_a_job_whose_api_died_before_sending_its_message_is_sent_by_a_worker(folder_cluster):
    worker = folder_cluster.start_worker(**FAST_RECOVERY)
    orphan_id = folder_cluster.create_job(small_params(prompt="never sent")).job_id  # the record, no message
    sent_id = folder_cluster.submit(small_params(prompt="sent"))

    # A message is a ticket for its queue, not for its job: the sent job's message takes the queue's next
    # job, the orphan (queued first), and the message owed for the orphan, which the sweeper sends a lease
    # after the orphan was stored, takes the sent job. Between the two, no message waits in the broker while
    # the sent job is still queued: wait for both jobs' ends, not for the broker.
    orphan = folder_cluster.wait_for_end(orphan_id, timeout=120)
    sent = folder_cluster.wait_for_end(sent_id, timeout=120)
    wait_for(folder_cluster.broker_is_idle, 30, "every message to be consumed and acknowledged")

    assert (orphan.state, orphan.attempts) == (JobState.SUCCEEDED, 1)
    assert (sent.state, sent.attempts) == (JobState.SUCCEEDED, 1)
    assert folder_cluster.store.get(sent_id).attempts == 1
    assert worker.log_text().count("with no message sent; sent one") == 1
