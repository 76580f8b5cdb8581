"""Backfill progress without a terminal: a plain line every few seconds with rows done, counts and rate."""

from __future__ import annotations

import io
import time

from stepwise_cli.log_progress import LogProgress
from tests.support.waiting import wait_for


def test_a_line_is_written_at_start_and_then_every_interval_without_carriage_returns():
    out = io.StringIO()
    progress = LogProgress(total=10, desc="backfill", file=out, interval=0.05)
    progress.update(3)
    progress.set_postfix({"ok": 2, "failed": 1, "in_flight": 4, "retries": 0})

    wait_for(lambda: "3/10 rows, 2 ok, 1 failed, 4 in flight, 0 retries" in out.getvalue(), 10, out.getvalue)
    progress.close()

    lines = out.getvalue().splitlines()
    assert lines[0].startswith("backfill: 0/10 rows") and "\r" not in out.getvalue()
    assert all("rows/s" in line for line in lines)
    num_lines = len(lines)
    time.sleep(0.2)
    assert len(out.getvalue().splitlines()) == num_lines  # closed: no more lines
