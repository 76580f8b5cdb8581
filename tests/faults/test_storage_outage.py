"""Image storage (S3 through moto's server) going away while jobs upload.

A short outage is ridden out by the upload's retries and the jobs succeed. A longer one fails the
job, saying so (`storage_unavailable`, with the object that could not be written): the PNG is not
kept anywhere and the job is not marked succeeded without its image. Resubmitting runs it again.
"""

from __future__ import annotations

import os
import time

import pytest

from storage.job_record import JobState
from tests.support.cluster import TEST_WORKER_ENV, Cluster, s3_client, small_params
from tests.support.servers import MotoS3Server, RedisServer, s3_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def outage_cluster(tmp_path):
    """A deployment whose S3 server the test stops and restarts (the bucket exists again at once)."""
    bucket = f"stepwise-outage-{os.urandom(3).hex()}"
    s3 = MotoS3Server(buckets=(bucket,)).start()
    cluster = Cluster(
        RedisServer(tmp_path / "redis").start(),
        s3_env(s3.endpoint_url, bucket),
        tmp_path,
        extra_env=dict(TEST_WORKER_ENV),
        bucket=bucket,
        s3=s3_client(s3.endpoint_url),
    )
    cluster.s3_server = s3
    yield cluster
    cluster.stop_all()
    cluster.redis.stop()
    s3.stop()


def bucket_keys(cluster: Cluster) -> list[str]:
    return sorted(item["Key"] for item in cluster.s3.list_objects_v2(Bucket=cluster.bucket).get("Contents", []))


def upload_retries(cluster: Cluster) -> int:
    return sum(worker.log_text().count("as it raised EndpointConnectionError") for worker in cluster.workers)


def test_uploads_ride_out_a_short_storage_outage_and_every_job_succeeds(outage_cluster):
    # 8 tries wait about 16 s in all: more than the outage below.
    outage_cluster.start_worker(STEPWISE_STORAGE_MAX_ATTEMPTS="8")
    outage_cluster.s3_server.stop()
    job_ids = [outage_cluster.submit(small_params(prompt=f"patient upload {i}", seed=i)) for i in range(4)]
    wait_for(lambda: upload_retries(outage_cluster) >= 4, 120, "the uploads to fail and be retried")
    time.sleep(2)
    outage_cluster.s3_server.start()

    records = [outage_cluster.wait_for_end(job_id) for job_id in job_ids]

    assert [(r.state, r.attempts) for r in records] == [(JobState.SUCCEEDED, 1)] * 4, [
        (r.state.value, r.error_message) for r in records
    ]
    assert bucket_keys(outage_cluster) == sorted(r.image_keys[0] for r in records)


def test_a_long_storage_outage_fails_the_job_saying_what_could_not_be_stored(outage_cluster):
    outage_cluster.start_worker(STEPWISE_STORAGE_MAX_ATTEMPTS="3")
    outage_cluster.s3_server.stop()
    job_id = outage_cluster.submit(small_params(prompt="nowhere to go"))

    record = outage_cluster.wait_for_end(job_id)

    assert record.state is JobState.FAILED and record.image_keys == []
    assert record.error_code == "storage_unavailable"
    expected = f"upload of s3://{outage_cluster.bucket}/images/{job_id}/0.png failed after 3 attempts"
    assert expected in record.error_message
    assert record.finished_at - record.started_at < 60
    outage_cluster.s3_server.start()
    assert bucket_keys(outage_cluster) == []  # no image half-stored, none claimed
    assert outage_cluster.wait_for_end(outage_cluster.submit(small_params())).state is JobState.SUCCEEDED
