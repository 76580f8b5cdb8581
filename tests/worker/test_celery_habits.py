"""Celery users' habits on jobs: `celery -A worker inspect active` lists the jobs each worker runs, and
`celery -A worker control revoke JOB_ID` cancels that job at its next step, wherever it runs."""

from __future__ import annotations

import json

import pytest

from storage.job_record import JobState
from tests.support.cluster import long_params

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("s3-cluster")]  # one `s3_cluster` for these files


def cli_replies(result) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_inspect_active_lists_a_running_job_and_revoke_cancels_it_at_its_next_step(s3_cluster, main_worker):
    # 256 px: four times long_params' work per step, so it still runs after the two Celery commands start up
    job_id = s3_cluster.submit(long_params(height=256, width=256), tenant="alice")
    s3_cluster.wait_for_progress(job_id)

    replies = cli_replies(s3_cluster.celery_cli("inspect", "active", "-d", main_worker.name, "--json", "-t", "10"))
    (listed,) = [job for job in replies[main_worker.name] if job["id"] == job_id]
    assert (listed["name"], listed["tenant"], listed["stage"], listed["attempt"]) == (
        "stepwise.job",
        "alice",
        "in_engine",
        1,
    )
    step, total = map(int, listed["progress"].split("/"))
    assert 0 < step < total == 200

    s3_cluster.celery_cli("control", "revoke", job_id, "-t", "5")  # to every worker, as users type it

    ended = s3_cluster.wait_for_end(job_id)
    assert ended.state is JobState.CANCELED and ended.progress_step < 200, s3_cluster.describe(job_id)
    replies = cli_replies(s3_cluster.celery_cli("inspect", "active", "-d", main_worker.name, "--json", "-t", "10"))
    assert job_id not in [job["id"] for job in replies[main_worker.name]]


def test_revoke_cancels_a_queued_job_before_it_runs(s3_cluster, main_worker):
    queued = s3_cluster.create_job(long_params(model="builtin:not-served-here"))  # no worker takes it

    revoked = s3_cluster.celery_cli("control", "revoke", queued.job_id, "-t", "5")

    assert f"jobs ['{queued.job_id}'] canceled" in revoked.stdout, revoked.stdout + revoked.stderr
    ended = s3_cluster.wait_for_end(queued.job_id)
    assert ended.state is JobState.CANCELED and ended.started_at is None
