"""A real worker process generating jobs end to end: Redis records, the worker's feeder, images in
S3 (moto's server over HTTP) or a local folder."""

from __future__ import annotations

import pytest

from storage.image_store import open_image_store
from storage.job_record import JobState
from storage.settings import StorageSettings
from tests.support.cluster import Cluster, engine_stats_from_cli, long_params, png_size, small_params

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("s3-cluster")]  # one `s3_cluster` for these files


def key_for(cluster: Cluster, job_id: str, index: int = 0) -> str:
    """The deterministic key the image store gives this image."""
    settings = StorageSettings(
        storage_url=cluster.storage_env["STEPWISE_STORAGE_URL"],
        s3_endpoint_url=cluster.storage_env.get("STEPWISE_S3_ENDPOINT_URL"),
    )
    return open_image_store(settings).key_for(job_id, index)


def bucket_objects(cluster: Cluster, job_id: str) -> dict[str, bytes]:
    """Every object in the bucket whose key mentions the job, read over HTTP with boto3."""
    listing = cluster.s3.list_objects_v2(Bucket=cluster.bucket)
    return {
        item["Key"]: cluster.s3.get_object(Bucket=cluster.bucket, Key=item["Key"])["Body"].read()
        for item in listing.get("Contents", [])
        if job_id in item["Key"]
    }


def shared_forwards(stats: dict) -> int:
    """Forwards that carried more than one job (JSON makes the histogram's keys strings)."""
    return sum(count for num_jobs, count in stats["jobs_per_forward"].items() if int(num_jobs) > 1)


def assert_timings_add_up(record) -> None:
    """A succeeded job's timings mean what docs/api.md says: its parts fit inside the spans that hold them."""
    timings, span = record.timings, record.finished_at - record.created_at
    engine_parts = timings["engine_wait"] + timings["denoise"] + timings["decode"]
    assert 0 < timings["denoise"] and 0 < timings["decode"] and 0 < timings["encode"] <= timings["upload"]
    # The decode starts on its worker as the last step's iteration ends, a moment before the loop stamps `denoise`.
    assert engine_parts <= timings["engine"] + 0.05, "the engine's own stamps fit in its wall time"
    broker_wait = record.started_at - record.created_at
    assert abs(timings["queue_wait"] - timings["engine_wait"] - broker_wait) < 1e-3, "queue_wait: broker + engine"
    worker = timings["start"] + timings["engine"] + timings["upload"]
    assert broker_wait + worker <= timings["total"] + 1e-3, timings  # one after the other
    assert timings["total"] <= span, timings


def test_eight_jobs_enqueued_together_succeed_with_their_pngs_in_the_bucket_and_share_forwards(s3_cluster, main_worker):
    params = [small_params(prompt=f"fox number {i}", seed=100 + i, height=64, width=96) for i in range(8)]
    job_ids = [s3_cluster.submit(p) for p in params]

    records = [s3_cluster.wait_for_end(job_id) for job_id in job_ids]

    assert [r.state for r in records] == [JobState.SUCCEEDED] * 8, [(r.state, r.error_message) for r in records]
    for record in records:
        key = key_for(s3_cluster, record.job_id)
        assert record.image_keys == [key]
        assert png_size(bucket_objects(s3_cluster, record.job_id)[key]) == (96, 64)
        assert record.progress_step == record.progress_total == 4
        assert_timings_add_up(record)
    stats = engine_stats_from_cli(s3_cluster, main_worker)
    assert shared_forwards(stats) > 0, stats["jobs_per_forward"]
    assert stats["model"] == "builtin:tiny"


def test_eight_jobs_succeed_with_their_pngs_in_a_local_folder_under_stepwise_worker(folder_cluster):
    worker = folder_cluster.start_worker(via_stepwise=True)
    job_ids = [folder_cluster.submit(small_params(prompt=f"owl {i}", seed=i)) for i in range(8)]

    records = [folder_cluster.wait_for_end(job_id) for job_id in job_ids]

    assert [r.state for r in records] == [JobState.SUCCEEDED] * 8, [(r.state, r.error_message) for r in records]
    for record in records:
        assert record.image_keys == [key_for(folder_cluster, record.job_id)]
        assert png_size((folder_cluster.images / record.image_keys[0]).read_bytes()) == (64, 64)
    assert shared_forwards(folder_cluster.command(worker, "engine_stats")) > 0


def test_a_job_canceled_while_running_stops_at_a_step_boundary_and_its_batch_mates_finish(s3_cluster, main_worker):
    long_id = s3_cluster.submit(long_params())
    mate_ids = [
        s3_cluster.submit(small_params(prompt=f"batch mate {i}", height=128, width=128, num_inference_steps=30))
        for i in range(3)
    ]
    s3_cluster.wait_for_progress(long_id, min_step=2)

    assert s3_cluster.store.request_cancel(long_id) is JobState.RUNNING

    canceled = s3_cluster.wait_for_end(long_id)
    assert canceled.state is JobState.CANCELED
    assert 2 <= canceled.progress_step < 200
    assert canceled.image_keys == []
    assert [s3_cluster.wait_for_end(job_id).state for job_id in mate_ids] == [JobState.SUCCEEDED] * 3


def test_a_queued_job_canceled_before_any_worker_takes_it_never_runs(s3_cluster, main_worker):
    s3_cluster.command(main_worker, "drain")  # so that it cannot take the job before the cancel
    try:
        record = s3_cluster.create_job()
        assert s3_cluster.store.request_cancel(record.job_id) is JobState.CANCELED
    finally:
        s3_cluster.command(main_worker, "resume")

    assert s3_cluster.wait_for_end(s3_cluster.submit(small_params())).state is JobState.SUCCEEDED  # it took the next

    after = s3_cluster.store.get(record.job_id)
    assert after.state is JobState.CANCELED and after.attempts == 0 and after.started_at is None


def test_a_job_whose_deadline_passed_before_it_started_ends_expired(s3_cluster, main_worker):
    job_id = s3_cluster.submit(small_params(), deadline=1.0)

    record = s3_cluster.wait_for_end(job_id)

    assert record.state is JobState.EXPIRED
    assert record.error_code == "deadline_exceeded"
    assert record.image_keys == []


def test_a_job_for_another_model_stays_in_its_own_queue_untouched_by_this_worker(s3_cluster, main_worker):
    other_id = s3_cluster.submit(small_params(model="builtin:not-this-one"))
    good_id = s3_cluster.submit(small_params())

    assert s3_cluster.wait_for_end(good_id).state is JobState.SUCCEEDED
    assert s3_cluster.store.get(other_id).state is JobState.QUEUED


def test_a_job_the_worker_cannot_serve_fails_readably_and_another_models_job_stays_queued(s3_cluster, main_worker):
    other = s3_cluster.create_job(small_params(model="builtin:not-this-one"))
    bad_id = s3_cluster.submit(small_params(lora="no-such-adapter"))  # this deployment has no LoRA store
    good_id = s3_cluster.submit(small_params())

    bad = s3_cluster.wait_for_end(bad_id)

    assert bad.state is JobState.FAILED and bad.error_code == "invalid_params"
    assert "no-such-adapter" in bad.error_message
    assert s3_cluster.wait_for_end(good_id).state is JobState.SUCCEEDED
    assert s3_cluster.store.get(other.job_id).state is JobState.QUEUED
