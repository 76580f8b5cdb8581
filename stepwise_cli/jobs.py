"""`stepwise jobs`: your jobs, newest first, one line each (`--state`, `--limit`, `--all` pages on)."""

from __future__ import annotations

import argparse
import json

from stepwise_cli.client import ApiClient, add_api_arguments
from stepwise_cli.status import run_with_client
from storage.job_record import JOB_STATE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=JOB_STATE_NAMES, help="only jobs in this state")
    parser.add_argument("--limit", type=int, default=20, help="jobs to show (default 20; pages of at most 100)")
    parser.add_argument("--all", action="store_true", help="every job, page after page")
    parser.add_argument("--json", action="store_true", help="one JSON job view per line")
    add_api_arguments(parser)


def line(job: dict) -> str:
    progress = job.get("progress") or {}
    prompt = (job.get("params") or {}).get("prompt", "")
    return (
        f"{job['job_id']}  {job['state']:<9}  {progress.get('step', 0):>4}/{progress.get('total', 0):<4}  "
        f"{job.get('created_at', '')}  {prompt[:40]!r}"
    )


def run(args: argparse.Namespace) -> int:
    def list_jobs(client: ApiClient) -> int:
        shown, cursor = 0, None
        while True:
            page_size = 100 if args.all else max(1, min(args.limit - shown, 100))
            page = client.list_jobs(state=args.state, limit=page_size, cursor=cursor)
            for job in page["jobs"]:
                print(json.dumps(job) if args.json else line(job))
            shown += len(page["jobs"])
            cursor = page.get("next_cursor")
            if cursor is None or (not args.all and shown >= args.limit):
                return 0

    return run_with_client(args, "jobs", list_jobs)
