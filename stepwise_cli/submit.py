"""`stepwise submit "a red fox" --wait --out DIR`: one job through the HTTP API.

Without `--wait` it prints the job id and its status URL. With `--wait` (implied by `--out`)
it polls the job with a progress bar, saves the images, and exits 1 with the job's error
message if the job does not succeed.

When no worker serving the job's model has been seen recently (GET /v1/models), it says so at
once; with `--wait` it gives up, exit 1, once the job has stayed queued that way for
`--no-worker-timeout` seconds (the job itself stays queued and runs when a worker starts).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tqdm import tqdm

from stepwise_cli.client import (
    TERMINAL_STATES,
    ApiClient,
    ApiResponseError,
    ClientError,
    add_api_arguments,
    resolve_target,
)
from stepwise_cli.image_args import add_image_arguments, image_extension, image_fields
from stepwise_cli.job_progress import image_text
from storage.webhooks import EVENTS as WEBHOOK_EVENTS

POLL_INTERVAL_SECONDS = 0.25
WORKER_CHECK_SECONDS = 2.0


def parse_size(text: str) -> tuple[int, int]:
    """`128` -> (128, 128); `WIDTHxHEIGHT` -> (width, height)."""
    parts = text.lower().split("x")
    try:
        if len(parts) == 1:
            return int(parts[0]), int(parts[0])
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"size must be N or WIDTHxHEIGHT (got {text!r})")


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_deadline(text: str) -> str:
    """An RFC 3339 time with offset, or a duration from now (`90s`, `10m`, `2h`): RFC 3339 for the API."""
    moment: datetime | None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if match:
        moment = datetime.now(UTC) + timedelta(seconds=float(match.group(1)) * DURATION_UNITS[match.group(2)])
        return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"must be a duration such as 10m or an RFC 3339 time with offset, e.g. 2030-01-01T12:00:00Z (got {text!r})"
        )
    return moment.isoformat()


def parse_events(text: str) -> list[str]:
    events = [event.strip() for event in text.split(",") if event.strip()]
    unknown = [event for event in events if event not in WEBHOOK_EVENTS]
    if not events or unknown:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of {', '.join(WEBHOOK_EVENTS)}")
    return events


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="what to draw")
    parser.add_argument("--negative-prompt", help="what not to draw")
    parser.add_argument("--seed", type=int, help="random seed (default: drawn by the service)")
    parser.add_argument("--steps", type=int, dest="num_inference_steps", help="denoise steps")
    parser.add_argument("--height", type=int, help="image height in pixels, a multiple of 8")
    parser.add_argument("--width", type=int, help="image width in pixels, a multiple of 8")
    parser.add_argument(
        "--size", type=parse_size, help="N or WIDTHxHEIGHT in pixels, e.g. 128 or 192x128 (instead of --height/--width)"
    )
    parser.add_argument("--guidance", type=float, dest="guidance_scale", help="classifier-free guidance scale")
    parser.add_argument("--sampler", help="ddim, euler, euler_ancestral or dpmpp_2m")
    parser.add_argument(
        "--num-images", type=int, dest="num_images", help="images from this prompt (seeds seed..seed+N-1)"
    )
    parser.add_argument("--model", help="model name (default: the one the service serves, its STEPWISE_MODEL)")
    parser.add_argument("--webhook-url", help="URL the service calls on the job's events (signed, retried)")
    parser.add_argument(
        "--webhook-events",
        type=parse_events,
        help="comma-separated: started, completed, failed, canceled (default: all)",
    )
    parser.add_argument(
        "--deadline",
        type=parse_deadline,
        help="a job not started by then ends `expired`: a duration (10m, 2h) or RFC 3339 time",
    )
    add_image_arguments(parser, format_flag="--format")
    parser.add_argument("--wait", action="store_true", help="wait for the job, showing its progress")
    parser.add_argument("--out", type=Path, help="save the images in this folder (implies --wait)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the job (default 600)")
    parser.add_argument(
        "--no-worker-timeout",
        type=float,
        default=30.0,
        help="with --wait: give up once the job has stayed queued this long with no worker serving "
        "its model (default 30)",
    )
    parser.add_argument("--priority", choices=("high", "normal", "low"), help="queue priority (default normal)")
    parser.add_argument("--json", action="store_true", help="print the final job record as JSON")
    add_api_arguments(parser)


def request_body(args: argparse.Namespace, upload: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": args.prompt}
    for name in (
        "negative_prompt",
        "seed",
        "num_inference_steps",
        "guidance_scale",
        "sampler",
        "num_images",
        "model",
        "height",
        "width",
        "webhook_url",
        "webhook_events",
        "deadline",
        "priority",
    ):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    if args.size is not None:
        body["width"], body["height"] = args.size
    body.update(image_fields(args, upload))
    return body


def run(args: argparse.Namespace) -> int:
    if args.size is not None and (args.height is not None or args.width is not None):
        print("stepwise submit: give --size or --height/--width, not both", file=sys.stderr)
        return 2
    try:
        client = ApiClient(resolve_target(args), on_retry=_say_retrying)
    except ClientError as e:
        print(f"stepwise submit: {e}", file=sys.stderr)
        return 2
    try:
        return _submit(client, args)
    except ApiResponseError as e:
        field = f" (field: {e.field})" if e.field else ""
        print(f"stepwise submit: the API refused the request: {e.message}{field}", file=sys.stderr)
        return 1
    except ClientError as e:
        print(f"stepwise submit: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _say_retrying(error: ClientError, delay: float) -> None:
    print(f"stepwise submit: {error}; retrying in {delay:.1f}s", file=sys.stderr)


def _submit(client: ApiClient, args: argparse.Namespace) -> int:
    try:
        body = request_body(args, client.upload_image)
    except OSError as e:
        raise ClientError(f"could not read an image file: {e}") from e
    accepted = client.submit_job(body)
    job_id = accepted["job_id"]
    model = (accepted.get("params") or {}).get("model", "")
    for warning in accepted.get("warnings") or []:  # e.g. a prompt outside what the model knows
        print(f"stepwise submit: note: {warning}", file=sys.stderr)
    if accepted.get("state") == "queued":
        reason = unserved_reason(client.model_status(model), model)
        if reason:
            print(f"stepwise submit: warning: {reason}", file=sys.stderr)
    if not (args.wait or args.out):
        if args.json:
            print(json.dumps(accepted, indent=2))
        else:
            print(f"{job_id} {accepted.get('state', 'queued')} {client.target.url}/v1/jobs/{job_id}")
        return 0
    print(f"job {job_id} submitted", file=sys.stderr)
    job = wait_for_job(client, job_id, timeout=args.timeout, no_worker_timeout=args.no_worker_timeout)
    if args.json:
        print(json.dumps(job, indent=2))
    if job["state"] != "succeeded":
        print(f"stepwise submit: job {job_id} {job['state']}: {job_error_message(job)}", file=sys.stderr)
        return 1
    if args.out:
        for path in save_images(client, job, args.out):
            print(path)
    elif not args.json:
        for url in image_urls(job):
            print(url)
    return 0


def is_served(client: ApiClient, model: str) -> bool:
    status = client.model_status(model)
    return bool(status and status.get("available"))


def unserved_reason(status: dict[str, Any] | None, model: str) -> str | None:
    """Why a job for `model` waits in the queue, from its entry of GET /v1/models (heartbeats); None when a
    worker serves it."""
    if status and status.get("available"):
        return None
    if status and status.get("draining"):
        workers = "its worker is" if status["draining"] == 1 else f"its {status['draining']} workers are"
        return (
            f"{workers} draining ({model!r}: an operator drained it, `celery -A worker control resume` undoes "
            "it); the job waits in the queue until a worker takes jobs again"
        )
    return (
        f"no worker serving {model!r} has been seen recently; the job waits in the queue until one starts "
        "(stepwise worker, or `stepwise up`)"
    )


def wait_for_job(
    client: ApiClient, job_id: str, *, timeout: float, no_worker_timeout: float | None = None
) -> dict[str, Any]:
    """Poll until the job is terminal, drawing its step progress; raise ClientError on timeout, or once
    the job has stayed queued for `no_worker_timeout` seconds while no worker served its model."""
    deadline = time.monotonic() + timeout
    unserved_since: float | None = None
    next_worker_check = time.monotonic()
    with tqdm(desc=job_id[:12], unit="step", total=None, file=sys.stderr, leave=False, disable=None) as bar:
        while True:
            job = client.get_job(job_id)
            progress = job.get("progress") or {}
            total, step = progress.get("total") or 0, progress.get("step") or 0
            if total and bar.total != total:
                bar.reset(total=total)
            bar.n = step
            bar.set_postfix_str(", ".join(filter(None, (job["state"], image_text(job)))), refresh=False)
            bar.refresh()
            if job["state"] in TERMINAL_STATES:
                return job
            now = time.monotonic()
            if no_worker_timeout is not None and job["state"] == "queued" and now >= next_worker_check:
                next_worker_check = now + WORKER_CHECK_SECONDS
                model = job["params"].get("model", "")
                unserved_since = None if is_served(client, model) else (unserved_since or now)
                if unserved_since is not None and now - unserved_since >= no_worker_timeout:
                    raise ClientError(
                        f"job {job_id} is still queued: no worker serving {model!r} has been seen for "
                        f"{now - unserved_since:.0f}s (the job stays queued and runs once one starts; "
                        f"check {client.target.url}/v1/jobs/{job_id})"
                    )
            if time.monotonic() > deadline:
                raise ClientError(
                    f"job {job_id} is still {job['state']} after {timeout:.0f}s "
                    f"(it keeps running; check {client.target.url}/v1/jobs/{job_id})"
                )
            time.sleep(POLL_INTERVAL_SECONDS)


def job_error_message(job: dict[str, Any]) -> str:
    error = job.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("code") or "no error message")
    return str(error or job.get("error_message") or "no error message")


def image_urls(job: dict[str, Any]) -> list[str]:
    urls = job.get("image_urls")
    if urls:
        return list(urls)
    return [job["image_url"]] if job.get("image_url") else []


def num_images(job: dict[str, Any]) -> int:
    return max(len(image_urls(job)), 1)


def save_images(client: ApiClient, job: dict[str, Any], out_dir: Path, stem: str | None = None) -> list[Path]:
    stem = stem or job["job_id"]
    count = num_images(job)
    paths = []
    for index in range(count):
        extension = image_extension(job)
        name = f"{stem}{extension}" if count == 1 else f"{stem}-{index}{extension}"
        paths.append(client.download_image(job["job_id"], out_dir / name, index=index))
    return paths
