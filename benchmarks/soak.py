"""A soak with faults: N minutes of Poisson traffic from two tenants through `stepwise up`, with a
worker SIGKILL, a Redis restart, an API restart and the S3 server stopped for 30 s injected at random
times; then every accepted job is accounted for.

    nice -n 10 python -m benchmarks.soak --minutes 30 --out benchmarks/results/soak

With `--storage-outage-minutes M` the S3 server is instead stopped once, for M minutes, from
LONG_OUTAGE_START seconds in (traffic goes on throughout): finished images wait in the worker's spool
(worker.spool), and the report says how each job accepted before storage came back ended, and how
long after it came back (the goal: every one succeeded, within a minute):

    nice -n 10 python -m benchmarks.soak --minutes 36 --rate 0.3 --faults-per-kind 0 \
        --storage-outage-minutes 30 --out benchmarks/results/soak-storage-outage

Traffic (each arrival one of): a single submit, a batch of 2-4 jobs, a submit asking to wait for the
job (`Prefer: wait=10`; an API without waiting submits answers 202 at once), a submit canceled a
moment later. Every submit carries an Idempotency-Key and is retried through connection errors,
5xx and 429 for up to two minutes, as `stepwise submit` does; a job counts as accepted once the API
answered 202 (or 200) with its id. Images go to a SeaweedFS S3 server this script runs, so it can
stop it. Everything listens on loopback.

Accounting, once traffic stops and every accepted job had time to end: each job succeeded (with
each image readable through the API), was canceled, or failed or expired with a reason; none is
lost (404) or stuck (not ended); each tenant's listing holds exactly its accepted jobs (no duplicate
created by a retry) and Redis counts as many successes as there are succeeded jobs (none finished
twice). The report (benchmarks/soak_report.py) adds latency percentiles before and after each fault.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from benchmarks.local_services import TEST_CREDENTIALS, SeaweedS3Server, free_port, stop_process, wait_until
from benchmarks.soak_report import account, write_report

TENANTS = {"alice": "sk_soak_alice_0123456789", "bob": "sk_soak_bob_0123456789"}
FAULTS = ("worker_sigkill", "redis_restart", "api_restart", "s3_stopped")
S3_OUTAGE_SECONDS = 30.0
LONG_OUTAGE_START = 120.0  # seconds into the soak
RETRY_SECONDS = 120.0
BUCKET = "soak"


@dataclass
class Accepted:
    job_id: str
    tenant: str
    kind: str  # single, batch, wait, cancel
    submitted_at: float  # unix seconds, when the API accepted it


@dataclass
class Fault:
    kind: str
    at: float  # unix seconds
    seconds: float  # how long the fault lasted (until the service was back, as seen from here)
    note: str = ""
    storage_back_at: float | None = None  # unix seconds, when a stopped S3 server answered again


@dataclass
class Ledger:
    accepted: list[Accepted] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)  # why a submit was never accepted -> count
    faults: list[Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accept(self, entry: Accepted) -> None:
        with self.lock:
            self.accepted.append(entry)

    def refuse(self, why: str) -> None:
        with self.lock:
            self.refused[why] = self.refused.get(why, 0) + 1


class Service:
    """SeaweedFS, then `stepwise up` with its images in it; the faults act on up's children."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.s3 = SeaweedS3Server(workdir / "s3", buckets=(BUCKET,))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.var_dir = workdir / "var"
        self.log_path = workdir / "up.log"
        self.up: subprocess.Popen | None = None

    def start(self) -> None:
        self.s3.start()
        access_key, secret = TEST_CREDENTIALS
        env = {
            **{name: value for name, value in os.environ.items() if not name.startswith("STEPWISE_")},
            "STEPWISE_API_KEYS": ",".join(f"{tenant}:{key}" for tenant, key in TENANTS.items()),
            "STEPWISE_MODEL": "builtin:tiny",
            "STEPWISE_MAX_NUM_SEQS": "8",
            "STEPWISE_SHUTDOWN_GRACE": "5",
            "STEPWISE_SPOOL_DIR": str(self.workdir / "spool"),
            "STEPWISE_STORAGE_URL": f"s3://{BUCKET}/images",
            "STEPWISE_S3_ENDPOINT_URL": self.s3.endpoint_url,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "OMP_NUM_THREADS": "1",  # one torch thread: the machine is shared
        }
        argv = [sys.executable, "-m", "stepwise_cli.main", "up", "--port", str(self.port)]
        argv += ["--var-dir", str(self.var_dir), "--api-workers", "1"]
        with self.log_path.open("ab") as log:
            self.up = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        wait_until(lambda: (self.var_dir / "stepwise.json").exists(), 300, "stepwise up")

    @property
    def redis_url(self) -> str:
        return json.loads((self.var_dir / "stepwise.json").read_text())["redis_url"]

    def child(self, name: str) -> psutil.Process:
        assert self.up is not None
        for process in psutil.Process(self.up.pid).children():
            argv = process.cmdline()
            if name == "redis" and "redis-server" in argv[0]:
                return process
            if name == "worker" and "worker" in argv and "--queues" not in argv:
                return process
            if name == "api" and "api" in argv:
                return process
        raise LookupError(f"no {name} child of stepwise up")

    def is_ready(self, *, with_worker: bool = False) -> bool:
        """/readyz answers 200 (Redis and S3 reachable), and with `with_worker` a live worker serves the model."""
        try:
            response = requests.get(f"{self.url}/readyz", timeout=2)
        except requests.RequestException:
            return False
        if response.status_code != 200:
            return False
        return not with_worker or any(model["available"] for model in response.json().get("models", []))

    def inject(self, kind: str, outage_seconds: float = S3_OUTAGE_SECONDS) -> Fault:
        started = time.time()
        storage_back_at = None
        if kind == "worker_sigkill":
            self.child("worker").send_signal(signal.SIGKILL)
            note = "the generating worker, SIGKILL; up restarts it"
        elif kind == "redis_restart":
            self.child("redis").send_signal(signal.SIGTERM)
            note = "redis-server, SIGTERM (append-only file); up restarts it on its port"
        elif kind == "api_restart":
            self.child("api").send_signal(signal.SIGTERM)
            note = "the API, SIGTERM; up restarts it"
        else:
            self.s3.stop()
            time.sleep(outage_seconds)
            self.s3.start()
            storage_back_at = time.time()
            note = f"the S3 server stopped for {outage_seconds:.0f}s"
        with_worker = kind == "worker_sigkill"
        with contextlib.suppress(TimeoutError):  # the fault takes effect (a stopping process answers a while)
            wait_until(lambda: not self.is_ready(with_worker=with_worker), 15, kind, interval=0.1)
        wait_until(lambda: self.is_ready(with_worker=True), 240, f"the service after {kind}", interval=0.25)
        return Fault(kind, started, time.time() - started, note, storage_back_at)

    def stop(self) -> None:
        stop_process(self.up, 120)  # SIGTERM: up drains its worker first
        self.s3.stop()


def with_retries(call, deadline_seconds: float = RETRY_SECONDS) -> requests.Response | str:
    """The response, once it is not a connection error, 5xx or 429; else why it never was."""
    deadline = time.monotonic() + deadline_seconds
    why = "no answer"
    while time.monotonic() < deadline:
        try:
            response = call()
            if response.status_code < 500 and response.status_code != 429:
                return response
            why = f"HTTP {response.status_code}"
        except requests.RequestException as e:
            why = type(e).__name__
        time.sleep(1.0)
    return why


class Traffic:
    def __init__(self, service: Service, ledger: Ledger, rng: random.Random) -> None:
        self.service = service
        self.ledger = ledger
        self.rng = rng
        self.lock = threading.Lock()  # the generator is shared by the worker threads

    def body(self) -> dict:
        with self.lock:
            return {
                "prompt": f"soak {self.rng.randrange(10**6)}",
                "height": 64,
                "width": 64,
                "num_inference_steps": self.rng.randint(4, 12),
                "guidance_scale": self.rng.choice([1.0, 5.0]),
                "seed": self.rng.randrange(2**31),
            }

    def post(self, tenant: str, path: str, body: dict, **headers: str) -> requests.Response | str:
        headers = {"Authorization": f"Bearer {TENANTS[tenant]}", "Idempotency-Key": uuid.uuid4().hex, **headers}
        url = f"{self.service.url}{path}"
        return with_retries(lambda: requests.post(url, json=body, headers=headers, timeout=30))

    def one(self, kind: str, tenant: str) -> None:
        if kind == "batch":
            with self.lock:
                size = self.rng.randint(2, 4)
            response = self.post(tenant, "/v1/jobs/batch", {"jobs": [self.body() for _ in range(size)]})
            if isinstance(response, str) or response.status_code != 200:
                self.ledger.refuse(response if isinstance(response, str) else f"HTTP {response.status_code}")
                return
            for result in response.json()["results"]:
                if result["status"] == 202:
                    self.ledger.accept(Accepted(result["job"]["job_id"], tenant, kind, time.time()))
                else:
                    self.ledger.refuse(f"batch item {result['status']}")
            return
        headers = {"Prefer": "wait=10"} if kind == "wait" else {}
        response = self.post(tenant, "/v1/jobs", self.body(), **headers)
        if isinstance(response, str) or response.status_code not in (200, 202):
            self.ledger.refuse(response if isinstance(response, str) else f"HTTP {response.status_code}")
            return
        job_id = response.json()["job_id"]
        self.ledger.accept(Accepted(job_id, tenant, kind, time.time()))
        if kind == "cancel":
            with self.lock:
                delay = self.rng.uniform(0, 3)
            time.sleep(delay)
            url = f"{self.service.url}/v1/jobs/{job_id}/cancel"
            auth = {"Authorization": f"Bearer {TENANTS[tenant]}"}
            with_retries(lambda: requests.post(url, headers=auth, timeout=30))

    def run(self, seconds: float, rate: float) -> None:
        """Poisson arrivals at `rate` per second for `seconds`; each arrival on a thread of its own."""
        kinds = ["single"] * 6 + ["batch"] * 2 + ["wait"] * 1 + ["cancel"] * 1
        deadline = time.monotonic() + seconds
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="soak") as pool:
            while True:
                with self.lock:
                    gap = self.rng.expovariate(rate)
                    kind, tenant = self.rng.choice(kinds), self.rng.choice(sorted(TENANTS))
                if time.monotonic() + gap >= deadline:
                    break
                time.sleep(gap)
                pool.submit(self.one, kind, tenant)


def fault_times(rng: random.Random, seconds: float, num_faults: int) -> list[float]:
    """Random offsets in [60 s, end - 120 s]: one in each of `num_faults` equal slots, in the slot's first
    half, so consecutive faults are at least half a slot apart and each recovery can be seen."""
    start, span = 60.0, seconds - 180.0
    if span <= 0:
        raise ValueError("a soak with faults needs more than 3 minutes")
    slot = span / num_faults
    return [start + index * slot + rng.uniform(0, slot / 2) for index in range(num_faults)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.6, help="arrivals per second (a batch is one)")
    parser.add_argument("--faults-per-kind", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--storage-outage-minutes",
        type=float,
        default=0.0,
        help="stop S3 once for this long (from LONG_OUTAGE_START s in) instead of the 30 s stops",
    )
    parser.add_argument("--workdir", type=Path, default=Path("var/soak"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/soak"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    seconds = args.minutes * 60
    long_outage = args.storage_outage_minutes * 60
    faults = [kind for kind in FAULTS if not (long_outage and kind == "s3_stopped")]
    kinds = [kind for kind in faults for _ in range(args.faults_per_kind)]
    rng.shuffle(kinds)
    schedule = list(zip(fault_times(rng, seconds, len(kinds)), kinds)) if kinds else []
    if long_outage:
        if LONG_OUTAGE_START + long_outage + 60 > seconds:
            parser.error("--minutes must leave a minute of traffic after the storage outage")
        schedule = sorted([*schedule, (LONG_OUTAGE_START, "s3_stopped")])

    args.workdir.mkdir(parents=True, exist_ok=True)
    service, ledger = Service(args.workdir.resolve()), Ledger()
    service.start()
    started = time.time()
    print(f"soak: stepwise up at {service.url}; {args.minutes:g} min, faults at {schedule}", flush=True)
    traffic = threading.Thread(target=Traffic(service, ledger, rng).run, args=(seconds, args.rate), daemon=True)
    traffic.start()
    try:
        for offset, kind in schedule:
            time.sleep(max(0.0, started + offset - time.time()))
            is_long = long_outage and kind == "s3_stopped"
            fault = service.inject(kind, long_outage) if is_long else service.inject(kind)
            ledger.faults.append(fault)
            print(f"soak: {kind} at +{fault.at - started:.0f}s, back after {fault.seconds:.1f}s", flush=True)
        traffic.join()
        print(f"soak: traffic done: {len(ledger.accepted)} jobs accepted; accounting", flush=True)
        outcome = account(service.url, service.redis_url, TENANTS, ledger, service.s3)
    finally:
        service.stop()
    report = write_report(args.out, started, args, ledger, outcome)
    print(report.read_text(), flush=True)
    return 0 if outcome["problems"] == [] else 1


if __name__ == "__main__":
    sys.exit(main())
