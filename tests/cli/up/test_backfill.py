"""`stepwise backfill` against a running `stepwise up`: killed half way, it resumes without duplicate jobs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from storage.job_store import JobStore
from tests.support.servers import child_env
from tests.support.up_process import (
    STEPWISE,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.workers, pytest.mark.xdist_group("stepwise-up")]  # the folder's one `up`

INVALID_LINES = {
    5: "{not json",
    12: {"prompt": "odd size", "height": 65},
    23: {"prompt": "typo", "num_steps": 4},
    34: {"prompt": "  "},
    45: {"prompt": "no steps", "num_inference_steps": 0},
}


def write_prompts(path: Path) -> int:
    lines = []
    for line in range(1, 51):
        row = INVALID_LINES.get(line) or {
            "prompt": f"prompt number {line}",
            "seed": line,
            "height": 64,
            "width": 64,
            "num_inference_steps": 8,
            "guidance_scale": 1.0,
        }
        lines.append(row if isinstance(row, str) else json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return 50 - len(INVALID_LINES)


def count_jobs(redis_url: str, tenant: str = "local") -> int:
    store = JobStore(redis_url)
    try:
        total, cursor = 0, None
        while True:
            records, cursor = store.list_for_tenant(tenant, limit=100, cursor=cursor)
            total += len(records)
            if cursor is None:
                return total
    finally:
        store.close()


def test_backfill_killed_half_way_resumes_without_duplicate_jobs(up, tmp_path):
    num_jobs_before = count_jobs(up.redis_url)
    prompts = tmp_path / "prompts.jsonl"
    num_valid = write_prompts(prompts)
    out, manifest = tmp_path / "images", tmp_path / "results.jsonl"
    argv = [
        *STEPWISE,
        "backfill",
        str(prompts),
        "--out",
        str(out),
        "--manifest",
        str(manifest),
        "--concurrency",
        "4",
        "--var-dir",
        str(up.var_dir),
        "--timeout",
        "240",
    ]

    first = subprocess.Popen(argv, cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def half_submitted() -> bool:
            assert first.poll() is None, "the first backfill ended before it was interrupted"
            return count_jobs(up.redis_url) - num_jobs_before >= num_valid // 2

        wait_for(half_submitted, 120, "the first backfill to submit half its rows", interval=0.02)
        assert first.poll() is None
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first.wait()

    second = subprocess.run(argv, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 1, second.stderr  # the invalid rows fail the run
    assert count_jobs(up.redis_url) - num_jobs_before == num_valid

    results = {entry["line"]: entry for entry in map(json.loads, manifest.read_text().splitlines())}
    assert sorted(results) == list(range(1, 51))
    for line, entry in results.items():
        if line in INVALID_LINES:
            assert entry["state"] == "invalid" and entry["job_id"] is None and entry["error"]
            assert f"line {line}: invalid" in second.stderr
        else:
            assert entry["state"] == "succeeded", entry
            assert len(entry["images"]) == 1 and Path(entry["images"][0]).is_file()
    assert len({entry["job_id"] for entry in results.values() if entry["job_id"]}) == num_valid
    assert "45 succeeded, 5 failed" in second.stderr
    assert re.search(r"^backfill: \d+/50 rows, .* rows/s", second.stderr, re.M)  # progress in a log, not a bar
    store = JobStore(up.redis_url)
    priorities = {store.get(entry["job_id"]).priority for entry in results.values() if entry["job_id"]}
    store.close()
    assert priorities == {"low"}, "a backfill's rows go in at --priority, low by default"
