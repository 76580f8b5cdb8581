"""End-to-end runs through `stepwise up`: API, Redis, Celery worker and the local image store.

`stepwise up` starts on a free port with a temporary var folder; the worker serves
builtin:tiny with the suite's engine capacity and the default policy, its torch threads
set through OMP_NUM_THREADS. The same burst as the engine-level runs, then one Poisson
run at the measured serial capacity, go through `POST /v1/jobs`; a poller lists the
jobs (`GET /v1/jobs`) until every one has ended. Latency and its parts come from the record, all stamped by
the service itself:

    latency     = finished_at - created_at  (API accepted the job -> record says succeeded)
    engine time = engine queue wait + denoise + decode  (engine.submit -> future resolved)
    overhead    = latency - engine time: broker delivery and waiting for a free task
                  thread, PNG encoding, upload, record writes
    broker wait = started_at - created_at: delivery, plus waiting for a free job thread
                  when more jobs are in flight than the worker has threads (a burst)
    worker overhead = overhead - broker wait: the job thread's own work around the engine,
                  in parts (`PARTS`): start (taken -> handed to the engine: lease, input
                  images, params), collect (the engine's wall time beyond its own
                  stamps: the decoded image waiting for the loop to resolve the job's
                  future), encode, put, finish (the end-state record write), and the rest

Last, the API's submit throughput is measured against the same stack with
`benchmarks.api_submit` (client processes posting back to back, the worker busy).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from benchmarks import workloads
from benchmarks.metrics import percentiles
from benchmarks.variants import sleep_until
from storage.job_record import TERMINAL_STATE_NAMES

RUN_SCHEMA = "stepwise-bench-e2e-run/1"
STARTUP_TIMEOUT = 300.0
POLL_INTERVAL = 0.25
LIST_LIMIT = 100  # newest jobs per listing: more than one workload's jobs
SUBMIT_CLIENTS = 4
SUBMIT_SECONDS = 5.0
TERMINAL_STATES = TERMINAL_STATE_NAMES


class UpStack:
    """`stepwise up` as a child process in its own session; stopped with SIGTERM, then killed."""

    def __init__(
        self,
        folder: Path,
        *,
        max_num_seqs: int,
        num_threads: int,
        device: str,
        tree: Path | None = None,
        model: str = "builtin:tiny",
    ) -> None:
        """`tree`: run the project's code from this folder (another commit's files) instead of this checkout."""
        self.folder = folder
        self.model = model
        self.tree = tree
        self.var_dir = folder / "var"
        self.log_path = folder / "up.log"
        self.port = _free_port()
        self.max_num_seqs = max_num_seqs
        self.num_threads = num_threads
        self.device = device
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.key = ""

    def __enter__(self) -> UpStack:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("STEPWISE_") or name == "STEPWISE_CACHE_DIR"
        }
        env.update(
            OMP_NUM_THREADS=str(self.num_threads),
            STEPWISE_SHUTDOWN_GRACE="3",
            STEPWISE_MAX_QUEUE_DEPTH=str(10**9),
            STEPWISE_WORKER_METRICS_PORT="0",
        )
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        argv = [
            sys.executable,
            "-m",
            "stepwise_cli.main",
            "up",
            "--port",
            str(self.port),
            "--var-dir",
            str(self.var_dir),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--device",
            self.device,
            "--model",
            self.model,
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                env=env,
                cwd=self.tree,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        state_file = self.var_dir / "stepwise.json"
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not state_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"stepwise up did not come up:\n{self.log_tail()}")
            time.sleep(0.2)
        state = json.loads(state_file.read_text())
        self.url, self.key = state["api_url"], state["api_key"]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


def run_e2e(
    options, machine: dict, runs_dir: Path, *, serial_capacity: float | None, engine_burst: dict | None
) -> dict:
    size = options.size
    shape = workloads.JobShape(
        model="builtin:tiny", num_steps=size.num_steps, size=size.size, second_size=size.second_size
    )
    suite = [workloads.burst(shape, size.e2e_num_jobs)]
    if serial_capacity:
        suite.append(workloads.poisson(shape, size.e2e_num_jobs, serial_capacity, 1.0))
    config = {
        "model": "builtin:tiny",
        "device": options.device,
        "num_threads": options.num_threads,
        "max_num_seqs": size.max_num_seqs,
        "policy": "default",
    }
    result: dict[str, Any] = {
        "description": (
            f"`stepwise up` with builtin:tiny, max_num_seqs {size.max_num_seqs}, default policy, "
            f"{options.num_threads} torch thread(s) in the worker; the engine-level default burst "
            f"ran at {_fmt((engine_burst or {}).get('metrics', {}).get('throughput_images_per_second'))} "
            "images/s for comparison."
        ),
        "config": config,
        "runs": {},
        "api_submit": None,
    }
    with tempfile.TemporaryDirectory(prefix="stepwise-bench-e2e-") as tmp:
        try:
            with UpStack(
                Path(tmp), max_num_seqs=size.max_num_seqs, num_threads=options.num_threads, device=options.device
            ) as stack:
                session = requests.Session()
                session.headers["Authorization"] = f"Bearer {stack.key}"
                _run_workload(session, stack.url, workloads.burst(shape, 1))  # warm-up, not recorded
                for workload in suite:
                    result["runs"][workload.name] = _measure(session, stack.url, workload, config, machine, runs_dir)
                result["api_submit"] = _submit_throughput(stack.url, stack.key)
        except Exception as e:  # the engine-level results stand on their own
            result["error"] = f"{type(e).__name__}: {e}"
    return result


def _measure(
    session: requests.Session, url: str, workload: workloads.Workload, config: dict, machine: dict, runs_dir: Path
) -> dict:
    load_start = os.getloadavg()
    jobs = _run_workload(session, url, workload)
    ok = [job for job in jobs if job["state"] == "succeeded"]
    metrics: dict[str, Any] = {"num_jobs": len(jobs), "num_succeeded": len(ok)}
    if ok:
        span = max(job["finished_at"] for job in ok) - min(job["created_at"] for job in ok)
        metrics.update(
            throughput_images_per_second=len(ok) / span if span > 0 else None,
            latency_seconds=percentiles([job["latency"] for job in ok]),
            client_latency_seconds=percentiles([job["client_latency"] for job in ok]),
            engine_seconds=percentiles([job["engine_seconds"] for job in ok]),
            overhead_seconds=percentiles([job["overhead"] for job in ok]),
            broker_wait_seconds=percentiles([job["broker_wait"] for job in ok]),
            worker_overhead_seconds=percentiles([job["overhead"] - job["broker_wait"] for job in ok]),
            upload_seconds=percentiles([job["timings"].get("upload", 0.0) for job in ok]),
            submit_request_seconds=percentiles([job["submit_seconds"] for job in ok]),
            overhead_parts_seconds=parts_percentiles(ok),
        )
    else:
        metrics["error"] = "no job succeeded"
    path = runs_dir / f"e2e__{workload.name}.json"
    metrics["file"] = f"runs/{path.name}"
    document = {
        "schema": RUN_SCHEMA,
        "kind": "end_to_end",
        "workload": {
            "name": workload.name,
            "kind": workload.kind,
            "description": workload.description,
            "num_jobs": workload.num_jobs,
            "rate_per_second": workload.rate_per_second,
            "arrivals_at_seconds": [a.at_seconds for a in workload.arrivals],
        },
        "config": config,
        "machine": machine,
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "metrics": metrics,
        "jobs": jobs,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return metrics


def _run_workload(session: requests.Session, url: str, workload: workloads.Workload) -> list[dict]:
    """Submit on schedule while a poller thread follows every job to its end; one dict per job."""
    jobs: list[dict] = []
    lock = threading.Lock()
    submitting_done = threading.Event()
    poller = threading.Thread(target=_poll, args=(session, url, jobs, lock, submitting_done), daemon=True)
    poller.start()
    t0 = time.perf_counter()
    for arrival in workload.arrivals:
        sleep_until(t0 + arrival.at_seconds)
        body = {name: value for name, value in arrival.params.to_dict().items() if value is not None}
        sent = time.perf_counter()
        response = session.post(f"{url}/v1/jobs", json=body, timeout=60)
        response.raise_for_status()
        with lock:
            jobs.append(
                {
                    "job_id": response.json()["job_id"],
                    "sent": sent,
                    "submit_seconds": time.perf_counter() - sent,
                    "state": "queued",
                }
            )
    submitting_done.set()
    poller.join()
    return [{key: value for key, value in job.items() if key != "sent"} for job in jobs]


def _poll(
    session: requests.Session, url: str, jobs: list[dict], lock: threading.Lock, submitting_done: threading.Event
) -> None:
    """One `GET /v1/jobs` listing per round (not one GET per job), so the poller's own load on
    the shared cores stays small; latencies come from the records' timestamps, not from when
    the poller noticed. A pending job missing from the page is fetched on its own."""
    while True:
        with lock:
            pending = [job for job in jobs if job["state"] not in TERMINAL_STATES]
            is_last_round = submitting_done.is_set()
        if pending:
            page = session.get(f"{url}/v1/jobs", params={"limit": LIST_LIMIT}, timeout=60).json()["jobs"]
            views = {view["job_id"]: view for view in page}
            for job in pending:
                view = views.get(job["job_id"]) or session.get(f"{url}/v1/jobs/{job['job_id']}", timeout=60).json()
                if view["state"] in TERMINAL_STATES:
                    _complete(job, view)
        elif is_last_round:
            return
        time.sleep(POLL_INTERVAL)


def _complete(job: dict, view: dict) -> None:
    timings = view["timings"]
    created, finished = _unix(view["created_at"]), _unix(view["finished_at"])
    engine_seconds = sum(timings.get(name, 0.0) for name in ("engine_wait", "denoise", "decode"))
    job.update(
        state=view["state"],
        created_at=created,
        started_at=_unix(view["started_at"]) if view["started_at"] else None,
        finished_at=finished,
        timings=timings,
        latency=finished - created,
        client_latency=time.perf_counter() - job["sent"],  # includes up to one poll interval
        engine_seconds=engine_seconds,
        overhead=finished - created - engine_seconds,
        broker_wait=(_unix(view["started_at"]) - created) if view["started_at"] else None,
    )
    job["parts"] = overhead_parts(job)


PARTS = ("broker_wait", "start", "collect", "encode", "put", "finish", "rest")


def overhead_parts(job: dict) -> dict[str, float] | None:
    """A succeeded job's overhead (latency - engine time) in PARTS, from its record; None for a record that does
    not stamp them (a tree from before the worker's `start`/`engine`/`encode` timings)."""
    timings = job["timings"]
    if job["state"] != "succeeded" or not {"start", "engine", "encode", "upload", "total"} <= timings.keys():
        return None
    parts = {
        "broker_wait": job["broker_wait"],
        "start": timings["start"],
        "collect": timings["engine"] - job["engine_seconds"],
        "encode": timings["encode"],
        "put": timings["upload"] - timings["encode"],
        "finish": job["latency"] - timings["total"],
    }
    parts["rest"] = job["overhead"] - sum(parts.values())
    return parts


def parts_percentiles(jobs: list[dict]) -> dict[str, dict] | None:
    """Each overhead part's percentiles over the jobs that stamp them."""
    with_parts = [job["parts"] for job in jobs if job.get("parts")]
    if not with_parts:
        return None
    return {name: percentiles([parts[name] for parts in with_parts]) for name in PARTS}


def _submit_throughput(url: str, key: str) -> dict:
    from benchmarks.api_submit import measure

    result = measure(url, key, SUBMIT_CLIENTS, SUBMIT_SECONDS)
    return {**result, "clients": SUBMIT_CLIENTS, "seconds": SUBMIT_SECONDS}


def _unix(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp).timestamp()


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
