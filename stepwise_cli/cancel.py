"""`stepwise cancel JOB`: a queued job is canceled at once; a running one stops at its next step.

Exit status 0 when the cancel was accepted, 1 when the job had already finished (its state is
printed), 2 when the API could not be asked.
"""

from __future__ import annotations

import argparse
import json

from stepwise_cli.client import ApiClient, add_api_arguments
from stepwise_cli.status import run_with_client


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", help="the job to cancel")
    parser.add_argument("--json", action="store_true", help="print the job's view after the cancel as JSON")
    add_api_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def cancel(client: ApiClient) -> int:
        job = client.cancel_job(args.job_id)
        if args.json:
            print(json.dumps(job, indent=2))
        elif job["state"] == "canceled":
            print(f"{job['job_id']} canceled")
        else:
            print(f"{job['job_id']} {job['state']}: cancel requested; it stops at its next denoise step")
        return 0

    return run_with_client(args, "cancel", cancel)
