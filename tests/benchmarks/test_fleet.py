"""`benchmarks/fleet.py` at its smallest size, against the worker's pieces as they are now (the feeder, the lease
keeper, the lease sweeper and its dead-worker watch, heartbeats, the end script): it still runs jobs to their
end and reports what docs/scaling.md quotes. The measured values are not checked: they depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.servers import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_two_simulated_workers_run_jobs_of_every_tenant_and_report_redis_costs(tmp_path):
    # The window opens after a fixed warm-up: long enough for the simulated workers' processes to start and take
    # jobs on a busy machine (with 1 s, under a parallel run's load, none had ended a job within the window), with
    # jobs enough queued that some are still left to end in it.
    argv = [sys.executable, "-m", "benchmarks.fleet", "--workers", "2", "--queued", "400", "--seconds", "2"]
    argv += ["--warm-up", "4", "--job-seconds", "0.4", "--departed", "1", "--out", str(tmp_path)]
    done = subprocess.run(argv, env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    report = json.loads((tmp_path / "fleet.json").read_text())
    (run,) = report["runs"]
    assert "TIMED STAND-IN" in report["stand_in"] and "TIMED STAND-IN" in done.stdout
    assert run["workers"] == 2 and run["jobs_ended"] > 0 and run["left_by_state"]["failed"] == 0
    assert run["commands_per_job"] > 0 and run["redis_cpu_seconds"] >= 0 and run["take_ms"]["count"] > 0
    assert set(run["tenant_shares"]) == {"tenant-a", "tenant-b", "tenant-c", "tenant-d"}
    assert {"take_next", "finish", "set_progress", "is_cancel_requested"} <= set(run["worker_calls_per_job"])
    assert "| workers | jobs/s | commands/job |" in (tmp_path / "fleet.md").read_text()


def test_the_committed_fleet_results_are_the_ones_docs_scaling_quotes():
    report = json.loads((ROOT / "benchmarks/results/fleet/fleet.json").read_text())
    scaling = (ROOT / "docs/scaling.md").read_text()

    assert [run["workers"] for run in report["runs"]] == [10, 50, 100]
    assert all(run["queued_at_start"] == 10_000 for run in report["runs"])
    for run in report["runs"]:
        assert f"| {run['workers']} | {run['jobs_per_second']} | {run['commands_per_job']} |" in scaling
    assert f"{report['projection']['workers_at_one_core']} workers" in scaling
