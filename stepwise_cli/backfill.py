"""`stepwise backfill prompts.jsonl --out DIR --manifest results.jsonl`: many rows through the API.

Each valid row becomes one job. Submissions run on a bounded thread pool; a separate pool
polls the oldest unfinished jobs (jobs finish roughly in submission order, so a window of
the oldest is enough to notice completions without polling thousands of queued jobs).

Resuming: a row's `Idempotency-Key` is a hash of the run name (by default the input file's
name), the row's line number and the row's content. Re-running the same file after an
interruption therefore gets back the jobs created the first time instead of new ones,
wherever the file now lives; editing a row gives that row a new job; the same prompt on two
lines gives two jobs. `--run-name` starts a fresh set of jobs for an unchanged file.

A row that cannot be parsed, or that the API refuses with 422, is reported with its line
number in the manifest and the summary; the run goes on. The exit status is 1 when any row
did not end with an image.

Rows go in at `--priority` (default `low`) unless they name their own: a backfill is a polite
tenant, taken from the queue only when no normal job of its model waits, and fair share across
tenants (`storage.fair_share`) keeps it from delaying other tenants' low jobs by more than about a job.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from stepwise_cli.client import (
    TERMINAL_STATES,
    ApiClient,
    ApiResponseError,
    ApiTarget,
    ClientError,
    add_api_arguments,
    resolve_target,
)
from stepwise_cli.image_args import add_image_arguments, image_extension, image_fields
from stepwise_cli.log_progress import LogProgress
from stepwise_cli.submit import image_urls, job_error_message, num_images

POLL_INTERVAL_SECONDS = 0.5
MAX_FAILURES_LISTED = 20
INT_FIELDS = frozenset({"height", "width", "num_inference_steps", "seed", "num_images", "num_frames", "fps"})
FLOAT_FIELDS = frozenset({"guidance_scale", "guidance_scale_2", "lora_scale"})
FATAL_STATUSES = frozenset({401, 403})  # every other row would fail the same way


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line number in the input file
    body: dict[str, Any] | None  # the request body; None when the line could not be parsed
    parse_error: str | None = None


@dataclass
class RowResult:
    """One manifest line."""

    line: int
    job_id: str | None
    state: str  # a job state, or "invalid" (refused before a job existed) or "error" (not finished)
    images: list[str]  # one saved path per image with --out, else one URL per image; [] without an image
    error: str | None

    @property
    def is_ok(self) -> bool:
        return self.state == "succeeded" and self.error is None


@dataclass(slots=True)
class InFlight:
    row: Row
    job_id: str
    state: str  # last state seen


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", type=Path, help="prompts: JSONL (one params object a line) or CSV (header = param names)"
    )
    parser.add_argument("--format", choices=("jsonl", "csv"), help="input format (default: from the file name)")
    parser.add_argument("--out", type=Path, help="download each image into this folder as line-NNNNNN.png")
    parser.add_argument(
        "--manifest", type=Path, help="write one JSON line per row here (line, job_id, state, image, error)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    parser.add_argument(
        "--priority",
        choices=("high", "normal", "low"),
        default="low",
        help="queue priority of rows that name none (default low: interactive jobs go first)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="give up on unfinished rows after this many seconds"
    )
    parser.add_argument(
        "--retry-for",
        type=float,
        default=600.0,
        help="keep retrying an unreachable or overloaded API this long (default 600 s)",
    )
    add_image_arguments(parser, format_flag="--output-format")  # --format names the input file's format
    parser.add_argument("--run-name", help="identity of this run in the idempotency keys (default: the file name)")
    add_api_arguments(parser)


def read_rows(path: Path, fmt: str | None = None) -> list[Row]:
    fmt = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    with path.open(encoding="utf-8-sig", newline="") as f:
        return list(_read_csv(f) if fmt == "csv" else _read_jsonl(f))


def _read_jsonl(lines) -> list[Row]:
    rows = []
    for line_number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            body = json.loads(text)
        except ValueError as e:
            rows.append(Row(line_number, None, f"not valid JSON: {e}"))
            continue
        if not isinstance(body, dict):
            rows.append(Row(line_number, None, f"must be a JSON object (got {type(body).__name__})"))
            continue
        rows.append(Row(line_number, body))
    return rows


def _read_csv(f) -> list[Row]:
    reader = csv.DictReader(f)
    rows = []
    for record in reader:
        line_number = reader.line_num
        if None in record:
            rows.append(Row(line_number, None, "has more cells than the header has columns"))
            continue
        try:
            body = {name: _coerce(name, value) for name, value in record.items() if value not in (None, "")}
        except ValueError as e:
            rows.append(Row(line_number, None, str(e)))
            continue
        if body:
            rows.append(Row(line_number, body))
    return rows


def _coerce(name: str, value: str) -> Any:
    try:
        if name in INT_FIELDS:
            return int(value)
        if name in FLOAT_FIELDS:
            return float(value)
    except ValueError:
        kind = "an integer" if name in INT_FIELDS else "a number"
        raise ValueError(f"{name} must be {kind} (got {value!r})") from None
    return value


def idempotency_key(run_name: str, row: Row) -> str:
    content = json.dumps(row.body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(f"{run_name}\n{row.line}\n{content}".encode()).hexdigest()
    return f"backfill-{digest[:48]}"


class Manifest:
    def __init__(self, path: Path | None) -> None:
        self.file = path.open("w", encoding="utf-8") if path else None

    def write(self, result: RowResult) -> None:
        if self.file:
            self.file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


class FatalApiError(ClientError):
    """The API refuses every request (bad key, forbidden): stop the run."""


class Backfill:
    def __init__(
        self,
        target: ApiTarget,
        *,
        retry_seconds: float,
        run_name: str,
        out_dir: Path | None,
        concurrency: int,
        manifest: Manifest,
        bar: tqdm | LogProgress,
    ) -> None:
        self.client = ApiClient(
            target, retry_seconds=retry_seconds, max_connections=2 * concurrency, on_retry=self._count_retry
        )
        self.run_name = run_name
        self.out_dir = out_dir
        self.concurrency = concurrency
        self.poll_window = 2 * concurrency
        self.manifest = manifest
        self.bar = bar
        self.results: list[RowResult] = []
        self.num_retries = 0  # transient failures retried (full queue, API restarting)
        self.num_failed = 0  # finished rows without an image
        self._num_in_flight = 0  # submitted, not yet finished
        self._submitted: queue.Queue[tuple[Row, dict[str, Any] | ClientError]] = queue.Queue()

    def run(self, rows: list[Row], timeout: float | None) -> list[RowResult]:
        deadline = time.monotonic() + timeout if timeout else None
        submit_pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="backfill-submit")
        poll_pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="backfill-poll")
        awaiting_submit: dict[int, Row] = {}
        in_flight: dict[int, InFlight] = {}  # in the order the API accepted them
        try:
            for row in rows:
                if row.parse_error:
                    self._finish(RowResult(row.line, None, "invalid", [], row.parse_error))
                else:
                    awaiting_submit[row.line] = row
                    submit_pool.submit(self._submit, row)
            while awaiting_submit or in_flight:
                self._collect_submissions(awaiting_submit, in_flight, block=not in_flight)
                if deadline and time.monotonic() > deadline:
                    break
                window = list(in_flight.values())[: self.poll_window]
                num_finished = 0
                for flight, result in zip(window, poll_pool.map(self._check, window)):
                    if result is not None:
                        del in_flight[flight.row.line]
                        self._num_in_flight -= 1
                        self._finish(result)
                        num_finished += 1
                if window and not num_finished:
                    time.sleep(POLL_INTERVAL_SECONDS)
        finally:
            submit_pool.shutdown(wait=False, cancel_futures=True)
            poll_pool.shutdown(wait=False, cancel_futures=True)
        waited = f"not finished within --timeout {timeout:.0f}s" if timeout else "not finished"
        for line in sorted(awaiting_submit):
            self._finish(RowResult(line, None, "error", [], f"{waited} (never submitted)"))
        for flight in list(in_flight.values()):
            self._num_in_flight -= 1
            self._finish(
                RowResult(flight.row.line, flight.job_id, flight.state, [], f"{waited} (still {flight.state})")
            )
        return self.results

    def _submit(self, row: Row) -> None:
        assert row.body is not None  # a row without a body ended when it was read
        try:
            accepted = self.client.submit_job(row.body, idempotency_key=idempotency_key(self.run_name, row))
        except ClientError as e:
            self._submitted.put((row, e))
        except Exception as e:  # noqa: BLE001 - report it on the row rather than lose the thread's error
            self._submitted.put((row, ClientError(f"{e.__class__.__name__}: {e}")))
        else:
            self._submitted.put((row, accepted))

    def _collect_submissions(
        self, awaiting_submit: dict[int, Row], in_flight: dict[int, InFlight], *, block: bool
    ) -> None:
        timeout = POLL_INTERVAL_SECONDS if block else 0
        while awaiting_submit:
            try:
                row, outcome = self._submitted.get(timeout=timeout) if timeout else self._submitted.get_nowait()
            except queue.Empty:
                return
            timeout = 0
            del awaiting_submit[row.line]
            if isinstance(outcome, ApiResponseError) and outcome.status in FATAL_STATUSES:
                raise FatalApiError(f"the API refused the key: {outcome.message}") from outcome
            if isinstance(outcome, ApiResponseError) and outcome.status == 422:
                field = f" (field: {outcome.field})" if outcome.field else ""
                self._finish(RowResult(row.line, None, "invalid", [], f"{outcome.message}{field}"))
            elif isinstance(outcome, ClientError):
                self._finish(RowResult(row.line, None, "error", [], f"could not submit: {outcome}"))
            else:
                in_flight[row.line] = InFlight(row, outcome["job_id"], outcome.get("state", "queued"))
                self._num_in_flight += 1
                self._show_counts()

    def _check(self, flight: InFlight) -> RowResult | None:
        """Poll one job; the row's result once it is terminal (and its images are saved)."""
        line, job_id = flight.row.line, flight.job_id
        try:
            job = self.client.get_job(job_id)
        except ClientError as e:
            return RowResult(line, job_id, "error", [], f"could not poll the job: {e}")
        flight.state = job["state"]
        if flight.state not in TERMINAL_STATES:
            return None
        if flight.state != "succeeded":
            return RowResult(line, job_id, flight.state, [], job_error_message(job))
        if self.out_dir is None:
            return RowResult(line, job_id, "succeeded", image_urls(job), None)
        try:
            paths = self._download(job, line)
        except ClientError as e:
            return RowResult(line, job_id, "succeeded", [], f"could not download the image: {e}")
        return RowResult(line, job_id, "succeeded", paths, None)

    def _download(self, job: dict[str, Any], line: int) -> list[str]:
        assert self.out_dir is not None
        count = num_images(job)
        paths = []
        for index in range(count):
            suffix = "" if count == 1 else f"-{index}"
            dest = self.out_dir / f"line-{line:06d}{suffix}{image_extension(job)}"
            if not (dest.exists() and dest.stat().st_size > 0):  # saved by an earlier, interrupted run
                self.client.download_image(job["job_id"], dest, index=index)
            paths.append(str(dest))
        return paths

    def _finish(self, result: RowResult) -> None:
        self.results.append(result)
        if not result.is_ok:
            self.num_failed += 1
        self.manifest.write(result)
        self._show_counts()
        self.bar.update(1)

    def counts(self) -> dict[str, int]:
        """What the progress bar shows; equal to the summary's numbers once the run ends."""
        return {
            "ok": len(self.results) - self.num_failed,
            "failed": self.num_failed,
            "in_flight": self._num_in_flight,
            "retries": self.num_retries,
        }

    def _show_counts(self) -> None:
        self.bar.set_postfix(self.counts(), refresh=False)

    def _count_retry(self, error: ClientError, delay: float) -> None:
        self.num_retries += 1


def run(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        print("stepwise backfill: --concurrency must be at least 1", file=sys.stderr)
        return 2
    try:
        rows = read_rows(args.file, args.format)
        # inline: the same body on a rerun, so idempotency keys still match (a rerun passes the same flags)
        shared = {"priority": args.priority, **image_fields(args)}
        rows = [Row(row.line, {**shared, **row.body}, row.parse_error) if row.body is not None else row for row in rows]
        target = resolve_target(args)
    except (OSError, ClientError) as e:
        print(f"stepwise backfill: {e}", file=sys.stderr)
        return 2
    manifest = Manifest(args.manifest)
    started = time.monotonic()
    bar: tqdm | LogProgress
    if sys.stderr.isatty():
        bar = tqdm(total=len(rows), unit="row", desc="backfill", file=sys.stderr, dynamic_ncols=True)
    else:  # a log or a pipe (cron, CI): a plain line every few seconds instead of a redrawn bar
        bar = LogProgress(total=len(rows), desc="backfill", file=sys.stderr)
    backfill = Backfill(
        target,
        retry_seconds=args.retry_for,
        run_name=args.run_name or args.file.name,
        out_dir=args.out,
        concurrency=args.concurrency,
        manifest=manifest,
        bar=bar,
    )
    try:
        results = backfill.run(rows, args.timeout)
    except KeyboardInterrupt:
        bar.close()
        print(
            "\nstepwise backfill: interrupted; run the same command again to resume "
            "(submitted jobs are not duplicated)",
            file=sys.stderr,
        )
        return 130
    except FatalApiError as e:
        bar.close()
        print(f"stepwise backfill: {e}", file=sys.stderr)
        return 2
    finally:
        backfill.client.close()
        manifest.close()
    bar.close()
    print_summary(results, time.monotonic() - started, args.manifest)
    return 0 if all(r.is_ok for r in results) else 1


def print_summary(results: list[RowResult], elapsed: float, manifest_path: Path | None) -> None:
    failures = sorted((r for r in results if not r.is_ok), key=lambda r: r.line)
    num_ok = len(results) - len(failures)
    print(
        f"backfill: {len(results)} rows in {elapsed:.1f}s: {num_ok} succeeded, {len(failures)} failed", file=sys.stderr
    )
    for result in failures[:MAX_FAILURES_LISTED]:
        print(f"  line {result.line}: {result.state}: {result.error}", file=sys.stderr)
    if len(failures) > MAX_FAILURES_LISTED:
        print(f"  ... and {len(failures) - MAX_FAILURES_LISTED} more (see the manifest)", file=sys.stderr)
    if manifest_path:
        print(f"manifest: {manifest_path}", file=sys.stderr)
