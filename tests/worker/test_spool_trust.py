"""A spool that trusts nothing it did not write (issue 48, E1), probed against a real worker and spool.

Files planted in the spool folder used to be taken as a stopped worker's own: a job.json with a symlink finished
another tenant's job with the contents of a root-only file, a planted folder replaced a tenant's stored image, and a
`job_id` of `../../..` or an absolute path removed folders outside the spool. Here every probe is planted at once
beside one real stopped worker's spooled job, and one real worker starts on that spool (its adoption pass runs at
its start); each test checks what became of one probe. The tests run as root, so "another user" is uid 65534.
A spool folder the worker must refuse to start on: tests/worker/test_spool_refused.py."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from storage.job_record import JobState, new_job_id
from tests.support.cluster import FAST_RECOVERY, Cluster, local_folder_cluster, small_params
from tests.support.job_factories import take_job
from worker.output_images import OutputImage
from worker.spool import JOB_FILE, ImageSpool, SpooledJob

pytestmark = [pytest.mark.timeout(600), pytest.mark.workers]

STOPPED = "host:1:stopped"  # the stopped worker whose spool folder the probes are planted in
ANOTHER_USER = 65534  # nobody
SECRET = b"a root-only secret"
PNG = b"\x89PNG\r\n\x1a\n"  # the stored images here are real PNGs; the planted ones start so too


@dataclass
class Planted:
    cluster: Cluster
    spool: Path
    secret: Path
    outside: Path  # a folder outside the spool that a traversal would have removed
    job_ids: dict[str, str] = field(default_factory=dict)  # probe -> the job it names
    folders: dict[str, Path] = field(default_factory=dict)  # probe -> what was planted

    def image(self, job_id: str) -> bytes:
        assert self.cluster.images is not None
        return (self.cluster.images / job_id / "0.png").read_bytes()


def write_job_folder(folder: Path, job_id: str, holder: str, files: dict[str, bytes], keys: list[str]) -> None:
    """A job folder as a worker writes one (or as someone planting one would), with `job.json` last."""
    folder.mkdir(mode=0o700)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    metadata = [{"job_id": job_id, "index": str(index)} for index in range(len(keys))]
    job = SpooledJob(job_id, holder, keys, metadata, steps=4, timings={"denoise": 0.1}, spooled_at=time.time())
    (folder / JOB_FILE).write_text(job.to_json())


def held_by_the_stopped_worker(cluster: Cluster, **params) -> str:
    """A job the stopped worker took (its attempt 1 holds it; a short lease, so it runs again here once refused)."""
    job_id = cluster.submit(small_params(**params))
    take_job(cluster.store, job_id, STOPPED, lease_seconds=3)
    return job_id


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Iterator[Planted]:
    root = tmp_path_factory.mktemp("spool-trust")
    images = root / "images"
    cluster = local_folder_cluster(root, **FAST_RECOVERY)
    spool = root / "spool"
    secret = root / "secret.txt"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    outside = root / "outside"
    (outside / "kept").mkdir(parents=True)
    (outside / "kept" / "file.txt").write_text("still here")
    probe = Planted(cluster, spool, secret, outside)

    stopped = ImageSpool(spool, STOPPED)  # a real worker's spool: one job it spooled, then it stopped
    legit = held_by_the_stopped_worker(cluster, prompt="spooled by a worker that stopped")
    image = OutputImage(f"{legit}/0.png", PNG + b"the stopped worker's image", {"job_id": legit, "index": "0"})
    stopped.add(SpooledJob(legit, f"{STOPPED}#1", [image.key], [image.metadata], 4, {}, time.time()), [image])
    stopped.close()
    probe.job_ids["legit"] = legit

    symlinked = held_by_the_stopped_worker(cluster, prompt="its planted image is a symlink")
    folder = stopped.folder / symlinked
    write_job_folder(folder, symlinked, f"{STOPPED}#1", {}, [f"{symlinked}/0.png"])
    (folder / "0.png").symlink_to(secret)
    probe.job_ids["symlink"], probe.folders["symlink"] = symlinked, folder

    finished = cluster.submit(small_params(prompt="a tenant's finished job"), tenant="bob")
    holder = take_job(cluster.store, finished, "host:2:another").holder
    (images / finished).mkdir(parents=True)
    (images / finished / "0.png").write_bytes(PNG + b"the tenant's stored image")
    cluster.store.finish(finished, JobState.SUCCEEDED, holder=holder, image_keys=[f"{finished}/0.png"])
    folder = stopped.folder / finished
    write_job_folder(folder, finished, f"{STOPPED}#1", {"0.png": PNG + b"planted"}, [f"{finished}/0.png"])
    probe.job_ids["finished"], probe.folders["finished"] = finished, folder

    borrowing = held_by_the_stopped_worker(cluster, prompt="its job.json names another job's image")
    folder = stopped.folder / borrowing
    write_job_folder(folder, borrowing, f"{STOPPED}#1", {"0.png": PNG + b"planted"}, [f"{finished}/0.png"])
    probe.job_ids["keys"], probe.folders["keys"] = borrowing, folder

    others = cluster.submit(small_params(prompt="another tenant's queued job"), tenant="bob")  # queued last
    folder = stopped.folder / others
    write_job_folder(folder, others, f"{STOPPED}#1", {"0.png": PNG + b"planted"}, [f"{others}/0.png"])
    probe.job_ids["queued"], probe.folders["queued"] = others, folder

    for probe_name, named in (("dot-dot", "../../.."), ("absolute", str(outside))):
        folder = stopped.folder / new_job_id()
        write_job_folder(folder, named, f"{STOPPED}#1", {"0.png": PNG}, [f"{named}/0.png"])
        probe.folders[probe_name] = folder
    linked_job = stopped.folder / new_job_id()  # a "job folder" that is a link out of the spool
    linked_job.symlink_to(outside, target_is_directory=True)
    probe.folders["linked-job"] = linked_job
    linked_worker = spool / "host:3:linked"  # a "worker folder" that is one
    linked_worker.symlink_to(outside, target_is_directory=True)
    probe.folders["linked-worker"] = linked_worker
    foreign = spool / "host:4:someone-else"
    foreign.mkdir(mode=0o700)
    foreign_job = new_job_id()
    write_job_folder(
        foreign / foreign_job, foreign_job, "host:4:someone-else#1", {"0.png": PNG}, [f"{foreign_job}/0.png"]
    )
    os.chown(foreign, ANOTHER_USER, ANOTHER_USER)
    probe.folders["another-user"] = foreign

    try:
        cluster.main = cluster.start_worker("trusting", STEPWISE_SPOOL_DIR=str(spool))
        for name in ("legit", "symlink", "queued", "keys"):
            cluster.wait_for_end(probe.job_ids[name])
        yield probe
    finally:
        cluster.stop_all()
        cluster.redis.stop()


def test_a_stopped_workers_own_spooled_job_is_still_adopted_stored_once_and_the_adoption_logged(planted):
    job_id = planted.job_ids["legit"]
    ended = planted.cluster.store.get(job_id)

    assert (ended.state, ended.attempts) == (JobState.SUCCEEDED, 1)  # stored from the spool, not run again
    assert planted.image(job_id) == PNG + b"the stopped worker's image"
    assert re.search(rf"job {job_id}: adopted from stopped worker {STOPPED}'s spool", planted.cluster.main.log_text())


def test_a_planted_job_json_with_a_symlink_to_a_root_only_file_is_refused_and_the_file_never_stored(planted):
    job_id = planted.job_ids["symlink"]
    ended = planted.cluster.store.get(job_id)

    assert ended.state is JobState.SUCCEEDED and ended.attempts == 2  # refused, then run for real once its lease lapsed
    assert planted.image(job_id).startswith(PNG) and SECRET not in planted.image(job_id)
    assert all(SECRET not in path.read_bytes() for path in planted.cluster.images.rglob("*") if path.is_file())
    assert planted.secret.read_bytes() == SECRET and not planted.folders["symlink"].exists()
    assert f"removing {planted.folders['symlink']}" in planted.cluster.main.log_text()


def test_a_planted_folder_for_another_tenants_queued_job_is_refused_and_that_job_runs_as_usual(planted):
    job_id = planted.job_ids["queued"]
    ended = planted.cluster.store.get(job_id)

    assert (ended.state, ended.attempts, ended.tenant) == (JobState.SUCCEEDED, 1, "bob")
    assert b"planted" not in planted.image(job_id)
    assert not planted.folders["queued"].exists()


def test_a_planted_folder_for_a_finished_job_leaves_its_stored_image_alone(planted):
    job_id = planted.job_ids["finished"]

    assert planted.cluster.store.get(job_id).state is JobState.SUCCEEDED
    assert planted.image(job_id) == PNG + b"the tenant's stored image"
    assert not planted.folders["finished"].exists()


def test_a_planted_job_whose_images_name_another_jobs_key_is_refused_and_replaces_nothing(planted):
    job_id = planted.job_ids["keys"]
    ended = planted.cluster.store.get(job_id)

    assert ended.state is JobState.SUCCEEDED and ended.attempts == 2 and ended.image_keys == [f"{job_id}/0.png"]
    assert planted.image(planted.job_ids["finished"]) == PNG + b"the tenant's stored image"


def test_job_ids_of_dot_dot_and_an_absolute_path_and_links_remove_nothing_outside_the_spool(planted):
    log = planted.cluster.main.log_text()

    assert (planted.outside / "kept" / "file.txt").read_text() == "still here"
    assert sorted(path.name for path in planted.outside.iterdir()) == ["kept"]  # not even a lock file made there
    assert planted.spool.parent.is_dir() and (planted.spool.parent / "images").is_dir()
    for probe in ("dot-dot", "absolute"):
        assert not planted.folders[probe].exists()
        assert f"removing {planted.folders[probe]}, not a job a stopped worker left: its job.json names job" in log
    assert not os.path.lexists(planted.folders["linked-job"])  # the link removed, not what it pointed to
    assert planted.folders["linked-worker"].is_symlink()  # a link in the spool is not followed, nor removed
    assert f"not looking into {planted.folders['linked-worker']}: it is a symbolic link" in log


def test_a_folder_of_another_user_in_the_spool_is_left_alone(planted):
    foreign = planted.folders["another-user"]

    assert [path.name for path in foreign.iterdir()]  # its job folder is still there: not adopted, not removed
    assert f"not looking into {foreign}: it belongs to uid {ANOTHER_USER}" in planted.cluster.main.log_text()
