"""Image storage (S3 through moto's server, or the local image folder) going away while jobs run and wait.

A short outage is ridden out by the upload's retries. A longer one, past every retry, keeps each
finished image in the worker's spool (worker.spool): the job stays running, saying it is storing and
why, and succeeds once, with its image stored, when storage is back. Nothing fails. A full spool stops
the worker taking jobs (they wait in the queue); a worker killed with images in its spool stores them
and ends those jobs when one starts again on the same spool.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from storage.job_record import JobRecord, JobState
from tests.support.cluster import TEST_WORKER_ENV, Cluster, s3_client, small_params
from tests.support.servers import MotoS3Server, RedisServer, s3_env
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]


class LocalFolderOutage:
    """The image folder fails as a disk does: it is moved away and a file stands at its path."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.away = folder.with_name(folder.name + ".away")

    def stop(self) -> None:
        self.folder.rename(self.away)
        self.folder.write_text("not a folder")

    def start(self) -> None:
        self.folder.unlink()
        self.away.rename(self.folder)


@pytest.fixture
def outage_cluster(tmp_path):
    """A deployment whose S3 server the test stops and restarts (the bucket exists again at once)."""
    bucket = f"stepwise-outage-{os.urandom(3).hex()}"
    s3 = MotoS3Server(buckets=(bucket,)).start()
    cluster = Cluster(
        RedisServer(tmp_path / "redis").start(),
        s3_env(s3.endpoint_url, bucket),
        tmp_path,
        extra_env={**TEST_WORKER_ENV, "STEPWISE_SPOOL_DIR": str(tmp_path / "spool")},
        bucket=bucket,
        s3=s3_client(s3.endpoint_url),
    )
    cluster.outage = s3
    yield cluster
    cluster.stop_all()
    cluster.redis.stop()
    s3.stop()


@pytest.fixture
def folder_outage_cluster(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    cluster = Cluster(
        RedisServer(tmp_path / "redis").start(),
        {"STEPWISE_STORAGE_URL": f"file://{images}"},
        tmp_path,
        extra_env={**TEST_WORKER_ENV, "STEPWISE_SPOOL_DIR": str(tmp_path / "spool")},
        images=images,
    )
    cluster.outage = LocalFolderOutage(images)
    yield cluster
    cluster.stop_all()
    cluster.redis.stop()


def bucket_keys(cluster: Cluster) -> list[str]:
    return sorted(item["Key"] for item in cluster.s3.list_objects_v2(Bucket=cluster.bucket).get("Contents", []))


def upload_retries(cluster: Cluster) -> int:
    return sum(worker.log_text().count("as it raised EndpointConnectionError") for worker in cluster.workers)


def storing(cluster: Cluster, job_id: str) -> JobRecord | None:
    """The job's record while it runs with its images in the spool."""
    record = cluster.store.get(job_id)
    return record if record is not None and record.state is JobState.RUNNING and record.storing_reason else None


def test_uploads_ride_out_a_short_storage_outage_and_every_job_succeeds(outage_cluster):
    # 8 tries wait about 16 s in all: more than the outage below.
    outage_cluster.start_worker(STEPWISE_STORAGE_MAX_ATTEMPTS="8")
    outage_cluster.outage.stop()
    job_ids = [outage_cluster.submit(small_params(prompt=f"patient upload {i}", seed=i)) for i in range(4)]
    wait_for(lambda: upload_retries(outage_cluster) >= 4, 120, "the uploads to fail and be retried")
    time.sleep(2)
    outage_cluster.outage.start()

    records = [outage_cluster.wait_for_end(job_id) for job_id in job_ids]

    assert [(r.state, r.attempts) for r in records] == [(JobState.SUCCEEDED, 1)] * 4, [
        (r.state.value, r.error_message) for r in records
    ]
    assert bucket_keys(outage_cluster) == sorted(r.image_keys[0] for r in records)


@pytest.mark.parametrize("store", ["s3", "local folder"])
def test_jobs_outlive_a_storage_outage_past_every_retry_and_each_succeeds_once_it_is_back(store, request):
    cluster = request.getfixturevalue("outage_cluster" if store == "s3" else "folder_outage_cluster")
    # Two running at a time: while storage is away some jobs finish into the spool and others wait to start.
    cluster.start_worker(STEPWISE_STORAGE_MAX_ATTEMPTS="2", STEPWISE_MAX_NUM_SEQS="2", STEPWISE_WORKER_CONCURRENCY="3")
    cluster.outage.stop()
    job_ids = [cluster.submit(small_params(prompt=f"outage {i}", seed=i)) for i in range(4)]

    waiting = [wait_for(lambda job_id=job_id: storing(cluster, job_id), 180, "the job to wait") for job_id in job_ids]
    # Each says why: the store's error naming its image, or the spooled jobs it waits behind.
    assert any(f"{record.job_id}/0.png" in record.storing_reason for record in waiting), waiting
    assert all(record.image_keys == [] and record.attempts == 1 for record in waiting)
    cluster.outage.start()
    records = [cluster.wait_for_end(job_id) for job_id in job_ids]

    assert [(r.state, r.attempts) for r in records] == [(JobState.SUCCEEDED, 1)] * 4, [
        (r.state.value, r.error_message) for r in records
    ]
    assert all(r.storing_reason is None and r.timings["storing"] > 0 for r in records)
    assert cluster.store.counts_by_state()["succeeded"] == 4  # each ended once
    keys = sorted(r.image_keys[0] for r in records)
    assert (bucket_keys(cluster) if store == "s3" else cluster.stored_images()) == keys


def test_a_full_spool_stops_the_worker_taking_jobs_until_storage_is_back(outage_cluster):
    worker = outage_cluster.start_worker(STEPWISE_STORAGE_MAX_ATTEMPTS="2", STEPWISE_SPOOL_MAX_BYTES="1")
    outage_cluster.outage.stop()
    first = outage_cluster.submit(small_params(prompt="fills the spool"))
    wait_for(lambda: storing(outage_cluster, first), 180, "the first job to wait in the spool")
    later = [outage_cluster.submit(small_params(prompt=f"waits in the queue {i}", seed=i)) for i in range(2)]
    # Their wake-ups reached a worker that may not take them (its feeder asks before each take).
    stats = wait_for(
        lambda: (stats := outage_cluster.command(worker, "engine_stats"))["may_take_jobs"] is False and stats,
        60,
        "the worker to say it takes no job",
    )

    assert [outage_cluster.store.get(job_id).state for job_id in later] == [JobState.QUEUED] * 2
    assert stats["spool"]["is_full"] and stats["spool"]["num_jobs"] == 1
    outage_cluster.outage.start()
    records = [outage_cluster.wait_for_end(job_id) for job_id in [first, *later]]

    assert [r.state for r in records] == [JobState.SUCCEEDED] * 3
    assert outage_cluster.command(worker, "engine_stats")["may_take_jobs"] is True


def test_a_worker_killed_with_an_image_in_its_spool_stores_it_and_ends_the_job_when_it_starts_again(outage_cluster):
    first = outage_cluster.start_worker("before", STEPWISE_STORAGE_MAX_ATTEMPTS="2")
    outage_cluster.outage.stop()
    job_id = outage_cluster.submit(small_params(prompt="spooled, then killed"))
    wait_for(lambda: storing(outage_cluster, job_id), 180, "the job to wait in the spool")
    first.kill()
    outage_cluster.outage.start()

    outage_cluster.start_worker("after")
    record = outage_cluster.wait_for_end(job_id)

    assert (record.state, record.attempts) == (JobState.SUCCEEDED, 1)  # stored from the spool, not run again
    assert bucket_keys(outage_cluster) == record.image_keys
