"""Deleting a job: its record, indexes and images go; a queued one is canceled first; a running one's
worker learns it from the missing record and the tombstone. Real Redis, real folders and S3 (SeaweedFS) over HTTP."""

from __future__ import annotations

import os
import time

from storage.job_store import JobState
from storage.local_image_store import LocalImageStore
from storage.s3_image_store import S3ImageStore
from tests.support.job_factories import make_job, take_job


def test_a_queued_job_is_canceled_then_removed_with_its_index_entries(store):
    record = make_job(store, idempotency_key="k1", request_hash="h")

    assert store.delete(record.job_id, tombstone_seconds=60) is JobState.QUEUED

    assert store.get(record.job_id) is None and store.queue_depth() == 0
    assert store.list_for_tenant("acme") == ([], None)
    assert store.counts_by_state()["canceled"] == 1
    again, created = store.create(tenant="acme", params={"prompt": "a red fox", "seed": 7}, idempotency_key="k1")
    assert created and again.job_id != record.job_id  # the idempotency key went with it
    assert store.delete("no-such-job", tombstone_seconds=60) is None


def test_a_running_jobs_worker_sees_it_deleted_and_canceled(store):
    record = make_job(store)
    holder = take_job(store, record.job_id).holder

    assert store.delete(record.job_id, tombstone_seconds=60) is JobState.RUNNING

    assert store.counts_by_state()["running"] == 0
    assert store.is_cancel_requested(record.job_id) and store.was_deleted(record.job_id)
    assert store.finish(record.job_id, JobState.SUCCEEDED, holder=holder) is False
    assert not store.was_deleted(make_job(store).job_id)


def test_the_local_store_deletes_a_jobs_images_in_every_format_and_sweeps_old_ones(tmp_path):
    store = LocalImageStore(tmp_path / "images")
    for job_id in ("old", "new", "gone"):
        for index, image_format in enumerate(("png", "webp")):
            store.put_image(store.key_for(job_id, index, image_format), b"x", {"job_id": job_id})
    day_ago = time.time() - 86400
    for path in (tmp_path / "images" / "old").iterdir():
        os.utime(path, (day_ago, day_ago))

    assert store.delete_job_images("gone") == 2 and store.delete_job_images("gone") == 0
    assert store.sweep_older_than(3600) == 1

    assert sorted(path.name for path in (tmp_path / "images").iterdir()) == ["new"]


def test_the_s3_store_deletes_every_image_of_a_job_and_only_those(seaweed_server, seaweed_bucket):
    store = S3ImageStore(bucket=seaweed_bucket, prefix="images", endpoint_url=seaweed_server.endpoint_url)
    for job_id in ("doomed", "kept"):
        for index in range(3):
            store.put_image(store.key_for(job_id, index), b"png", {})

    assert store.delete_job_images("doomed") == 3

    assert not store.exists(store.key_for("doomed", 0)) and store.exists(store.key_for("kept", 2))
    store.close()
