"""`stepwise status JOB`: one job's state, progress, timings, and its image URLs or its error.

Exit status: 0 when the job succeeded or is still queued or running, 1 when it failed, was
canceled or expired, 2 when the API could not be asked.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stepwise_cli.client import ApiClient, ApiResponseError, ClientError, add_api_arguments, resolve_target
from stepwise_cli.job_progress import progress_text
from stepwise_cli.submit import image_urls, job_error_message
from storage.job_record import TERMINAL_STATE_NAMES

FAILED_STATES = TERMINAL_STATE_NAMES - {"succeeded"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", help="the job id `stepwise submit` printed")
    parser.add_argument("--json", action="store_true", help="print the job's whole view as JSON")
    add_api_arguments(parser)


def describe(job: dict[str, Any]) -> str:
    """A few lines for a human: what `GET /v1/jobs/{id}` says, without the noise."""
    lines = [f"{job['job_id']}  {job['state']}  {progress_text(job)}"]
    if job.get("queue_position") is not None:
        lines.append(f"  queue position: {job['queue_position']}")
    params = job.get("params") or {}
    if params:
        num_frames, fps = params.get("num_frames") or 1, params.get("fps")
        video = f", {num_frames} frames" + (f" at {fps} fps" if fps else "") if num_frames > 1 else ""
        lines.append(
            f"  {params.get('model')}: {params.get('prompt')!r}, {params.get('width')}x"
            f"{params.get('height')}{video}, {params.get('num_inference_steps')} steps, seed {params.get('seed')}"
        )
    lines += [f"  note: {warning}" for warning in job.get("warnings") or []]  # e.g. a prompt the model does not know
    if job.get("timings"):
        lines.append("  timings: " + ", ".join(f"{name} {value:.2f}s" for name, value in job["timings"].items()))
    if job["state"] in FAILED_STATES:
        lines.append(f"  error: {job_error_message(job)}")
    lines += [f"  image: {url}" for url in image_urls(job)]
    return "\n".join(lines)


def run_with_client(args: argparse.Namespace, command: str, action) -> int:
    """Shared by status, cancel and jobs: resolve the API, run `action(client)`, one-line errors."""
    try:
        client = ApiClient(resolve_target(args), retry_seconds=10.0, retries_refused=False)
    except ClientError as e:
        print(f"stepwise {command}: {e}", file=sys.stderr)
        return 2
    try:
        return action(client)
    except ApiResponseError as e:
        field = f" (field: {e.field})" if e.field else ""
        print(f"stepwise {command}: {e.message}{field}", file=sys.stderr)
        return 1 if e.status == 409 else 2
    except ClientError as e:
        print(f"stepwise {command}: {e}", file=sys.stderr)
        return 2
    finally:
        client.close()


def run(args: argparse.Namespace) -> int:
    def show(client: ApiClient) -> int:
        job = client.get_job(args.job_id)
        print(json.dumps(job, indent=2) if args.json else describe(job))
        return 1 if job["state"] in FAILED_STATES else 0

    return run_with_client(args, "status", show)
