"""`stepwise up` stopped with SIGTERM: its worker drains (worker.drain) and `up` waits for it, so a job that would
not finish in the drain goes back to the queue at a step boundary (not after its lease lapses) and `up` exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from storage.job_record import JobState
from tests.support.cluster import Cluster, long_params
from tests.support.servers import child_env, free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.workers]

STEPWISE = [sys.executable, "-m", "stepwise_cli.main"]


def test_sigterm_to_up_drains_its_worker_which_hands_a_long_job_back_before_up_exits_0(own_redis, tmp_path):
    images = tmp_path / "images"
    cluster = Cluster(own_redis, {"STEPWISE_STORAGE_URL": images.as_uri()}, tmp_path, images=images)
    log_path = tmp_path / "up.log"
    argv = [*STEPWISE, "up", "--port", str(free_port()), "--var-dir", str(tmp_path / "var"), "--api-workers", "1"]
    env = child_env(
        STEPWISE_REDIS_URL=own_redis.url,
        STEPWISE_STORAGE_URL=images.as_uri(),
        STEPWISE_MODEL="builtin:tiny",
        STEPWISE_DRAIN_SECONDS="3",  # the long job cannot finish in it
    )
    with log_path.open("wb") as log:
        up = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        job_id = cluster.submit(long_params(prompt="handed back by up's worker"))
        cluster.wait_for_progress(job_id, min_step=1)

        up.send_signal(signal.SIGTERM)

        assert up.wait(90) == 0, log_path.read_text()[-3000:]
        record = cluster.store.get(job_id)
        assert record.state is JobState.QUEUED and record.attempts == 1, cluster.describe(job_id)
        assert record.requeue_reason == "worker_shutdown"  # at a step boundary, by the drain: no lease lapsed
        assert "handing back 1 jobs that would not finish" in log_path.read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        cluster.stop_all()
