"""The spool (worker.spool): what a live worker holds is its own; what a stopped one left is adopted by
the next worker that looks, once, with its images; the bound says when to stop taking jobs; a job deleted
while it waits leaves it. End to end (real workers, S3 and the local folder down):
tests/faults/test_storage_outage.py."""

from __future__ import annotations

import time

from storage.settings import StorageSettings
from tests.support.cluster import small_params
from worker.output_images import OutputImage
from worker.runtime import WorkerRuntime
from worker.settings import WorkerSettings
from worker.spool import ImageSpool, SpooledJob
from worker.spool_uploader import SpoolUploader


def spool_one(spool: ImageSpool, job_id: str, data: bytes = b"\x89PNG fake") -> SpooledJob:
    image = OutputImage(f"images/{job_id}/0.png", data, {"job_id": job_id, "index": "0", "seed": "7"})
    job = SpooledJob(job_id, [image.key], [image.metadata], steps=4, timings={"denoise": 0.1}, spooled_at=time.time())
    spool.add(job, [image], "S3 is down")
    return job


def test_a_live_workers_spool_is_left_alone_and_a_stopped_ones_is_adopted_once_with_its_images(tmp_path):
    first = ImageSpool(tmp_path, "host:1:aaaaaa", max_bytes=10**6)
    spool_one(first, "job-1", b"the image")
    other = ImageSpool(tmp_path, "host:2:bbbbbb", max_bytes=10**6)
    third = ImageSpool(tmp_path, "host:3:cccccc", max_bytes=10**6)

    assert list(other.adopt_orphans()) == []  # its worker lives (holds its lock)
    first.close()  # as a killed process's lock goes with it
    adopted = list(other.adopt_orphans())

    assert [(worker_id, job.job_id) for worker_id, job in adopted] == [("host:1:aaaaaa", "job-1")]
    assert [image.data for image in other.images_of(adopted[0][1])] == [b"the image"]
    assert other.holds("job-1") and other.num_bytes == len(b"the image")
    assert list(third.adopt_orphans()) == []  # moved, not copied: nobody else gets it
    assert not (tmp_path / "host:1:aaaaaa").exists()


def test_a_job_cut_short_before_its_description_was_written_is_dropped_not_adopted(tmp_path):
    first = ImageSpool(tmp_path, "host:1:aaaaaa", max_bytes=10**6)
    (first.folder / "job-torn").mkdir()
    (first.folder / "job-torn" / "0.png").write_bytes(b"half")
    first.close()

    assert list(ImageSpool(tmp_path, "host:2:bbbbbb", max_bytes=10**6).adopt_orphans()) == []


def test_the_spool_has_room_until_it_holds_its_bound_and_again_once_a_job_is_stored(tmp_path):
    spool = ImageSpool(tmp_path, "host:1:aaaaaa", max_bytes=10)
    spool_one(spool, "job-1", b"12345")
    assert spool.has_room and spool.stats()["storage_error"] == "S3 is down"
    spool_one(spool, "job-2", b"67890")

    assert not spool.has_room and spool.stats()["is_full"] and not spool.wait_for_room(0)
    spool.remove("job-1")
    assert spool.has_room and spool.num_jobs == 1 and not (spool.folder / "job-1").exists()
    spool.remove("job-2")
    assert spool.stats() == {"num_jobs": 0, "num_bytes": 0, "max_bytes": 10, "is_full": False, "storage_error": None}


def test_a_job_deleted_while_its_images_wait_for_storage_leaves_the_spool_at_the_next_look(redis_url, tmp_path):
    storage = StorageSettings(redis_url=redis_url, storage_url=(tmp_path / "images").as_uri())
    runtime = WorkerRuntime(WorkerSettings(storage=storage, spool_dir=str(tmp_path / "spool")), "host:1:aaaaaa")
    store = runtime.job_store
    try:
        job_ids = [store.create(tenant="tests", params=small_params(seed=seed))[0].job_id for seed in (1, 2)]
        for job_id in job_ids:
            store.take(job_id, runtime.worker_id, 60)
            spool_one(runtime.spool, job_id)
        kept, deleted = job_ids
        store.delete(deleted, tombstone_seconds=60)

        assert SpoolUploader(runtime, lambda *_: "not called").drop_ended() == [deleted]
        assert runtime.spool.holds(kept) and not runtime.spool.holds(deleted)
        assert not (runtime.spool.folder / deleted).exists()
    finally:
        runtime.close()
