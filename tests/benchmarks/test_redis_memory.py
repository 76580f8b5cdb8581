"""`benchmarks.redis_memory` at a small size: it runs against its own redis-server and reports both stages' bytes
per job (their values depend on the Redis version and are quoted in docs/scaling.md, not checked here)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.servers import child_env


def test_the_redis_memory_benchmark_reports_bytes_per_queued_and_finished_job():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.redis_memory", "--jobs", "200"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(", 200 jobs")
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["queued", "finished"]
    assert all("bytes per job" in line and "MiB per 10,000 jobs" in line for line in lines[1:])
