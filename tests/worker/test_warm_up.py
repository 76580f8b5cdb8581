"""`ready` means warm: a worker runs one generation through its engine before it answers ping."""

from __future__ import annotations

import pytest

from storage.job_record import JobState
from tests.support.cluster import small_params

pytestmark = pytest.mark.workers


def test_a_worker_answers_ping_only_after_a_warm_up_job_ran_through_its_engine(folder_cluster):
    worker = folder_cluster.start_worker()  # returns once the worker answers `celery inspect ping`

    stats = folder_cluster.command(worker, "engine_stats")

    assert stats["warm_up"]["error"] is None, stats["warm_up"]
    assert stats["warm_up"]["forwards"] >= 1 and stats["forwards"] >= 1, "denoiser forwards ran before ready"
    assert stats["jobs_finished"] == 1 and stats["held_jobs"] == {}, "the warm-up job, and no job of a user's"
    assert folder_cluster.stored_images() == [], "the warm-up stores nothing"
    job_id = folder_cluster.submit(small_params())
    assert folder_cluster.wait_for_end(job_id).state is JobState.SUCCEEDED
