"""Interactive jobs beside a bulk backfill on one worker: latency, deadlines and backfill throughput per policy.

    python -m benchmarks.mixed_traffic [--baseline COMMIT] [--seconds 60] [--out DIR]

An interactive tenant submits Poisson arrivals at 30% of the worker's serial capacity, each with
`complete_by` = its submission + 3x its latency alone, while a backfill tenant has 10x the
capacity's worth of jobs queued for the whole run. Variants, each in its own process with its own
redis-server and a real Celery worker (`celery -A worker worker`) of the code it names:

- `alone`: the interactive stream on an idle worker (the latency reference);
- `backfill-solo`: the backfill alone (the throughput reference);
- `baseline`: today's behaviour, the worker of the baseline commit, both tenants at normal priority;
- `fair-share`: this tree, both at normal, no preemption and no finish-by deadlines;
- `fair-share+preemption+deadlines`: this tree, the backfill at `low` (as `stepwise backfill` sends
  it), interactive jobs with `complete_by`, preemption on.

Jobs are stored the way the API does (`JobStore.create_many`, which wakes the worker in the same
script). Latency is the record's `finished_at - created_at`; an interactive job not
finished 30 s after the stream ends counts as missing its deadline. Backfill images/s counts
backfill jobs finished while the stream ran. Writes `results.json`, `results.md` and
`latency_cdf.png` into `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {"prompt": "a red fox", "height": 64, "width": 64, "num_inference_steps": 30, "guidance_scale": 1.0}
MAX_NUM_SEQS = 4
VARIANTS = ("alone", "backfill-solo", "baseline", "fair-share", "fair-share+preemption+deadlines")
DRAIN_SECONDS = 30.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class Deployment:
    """A redis-server and one worker of the code at `code`, in `folder`."""

    def __init__(self, folder: Path, code: Path, preemption: bool) -> None:
        self.folder = folder
        self.code = code
        self.url = ""  # the redis-server's, once started
        self.preemption = preemption
        self.processes: list[subprocess.Popen] = []
        self.services = contextlib.ExitStack()

    def __enter__(self) -> Deployment:
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> Deployment:
        import redis

        from benchmarks.local_services import redis_server, wait_until

        self.url = self.services.enter_context(redis_server(self.folder))
        env = {name: value for name, value in os.environ.items() if not name.startswith("STEPWISE_")}
        env.update(
            PYTHONPATH=str(self.code),
            OMP_NUM_THREADS="1",
            STEPWISE_REDIS_URL=self.url,
            STEPWISE_STORAGE_URL=(self.folder / "images").as_uri(),
            STEPWISE_MODEL="builtin:tiny",
            STEPWISE_MAX_NUM_SEQS=str(MAX_NUM_SEQS),
            STEPWISE_WORKER_METRICS_PORT="0",
            STEPWISE_HEARTBEAT_INTERVAL="1",
            STEPWISE_PREEMPTION="on" if self.preemption else "off",
        )
        celery = str(Path(sys.executable).with_name("celery"))
        log = open(self.folder / "worker.log", "wb")  # noqa: SIM115 (closed with the process)
        self.processes.append(
            subprocess.Popen(
                [celery, "-A", "worker", "worker", "-Q", "stepwise.generate", "-n", "bench@mixed", "-l", "WARNING"],
                cwd=self.code,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: client.hlen("stepwise:workers") > 0, 900, "the worker's first heartbeat", interval=0.2)
        return self

    def __exit__(self, *exc_info: object) -> None:
        from benchmarks.local_services import stop_process

        for process in reversed(self.processes):
            stop_process(process, 30)
        self.services.close()


def run_variant(name: str, code: Path, alone_latency: float, seconds: float, seed: int) -> dict:
    """One variant in this process; its numbers as a dict."""
    from storage.job_record import JobState
    from storage.job_store import JobStore
    from storage.new_job import NewJobSpec

    has_backfill = name != "alone"
    has_interactive = name != "backfill-solo"
    uses_deadlines = name in ("alone", "fair-share+preemption+deadlines")
    backfill_priority = "low" if name == "fair-share+preemption+deadlines" else "normal"
    with tempfile.TemporaryDirectory() as folder, Deployment(Path(folder), code, preemption="preemption" in name) as up:
        store = JobStore(up.url)
        create = store.create_many
        warm = create([NewJobSpec(tenant="warm-up", params={**PARAMS, "seed": 0})])[0].record.job_id
        while not store.get(warm).state.is_terminal:
            time.sleep(0.1)
        capacity = 1.0 / alone_latency  # serial capacity, jobs per second
        backfill_ids: list[str] = []
        if has_backfill:
            count = int(10 * capacity * seconds * MAX_NUM_SEQS)
            specs = [
                NewJobSpec(tenant="bulk", params={**PARAMS, "seed": i}, priority=backfill_priority)
                for i in range(count)
            ]
            for start in range(0, count, 500):
                backfill_ids += [outcome.record.job_id for outcome in create(specs[start : start + 500])]
            time.sleep(min(5.0, seconds / 4))  # the worker full of backfill before the stream starts
        rng = random.Random(seed)
        interactive: list[tuple[str, float]] = []  # (job id, complete_by target)
        started = time.time()
        next_at = started
        while has_interactive and next_at < started + seconds:
            time.sleep(max(0.0, next_at - time.time()))
            now = time.time()
            target = now + 3 * alone_latency
            spec = NewJobSpec(
                tenant="alice",
                params={**PARAMS, "seed": rng.randrange(2**31)},
                complete_by=target if uses_deadlines else None,
            )
            interactive.append((create([spec])[0].record.job_id, target))
            next_at += rng.expovariate(0.3 * capacity)
        if not has_interactive:
            time.sleep(seconds)
        ended = time.time()
        while time.time() < ended + DRAIN_SECONDS and not all(
            store.get(job_id).state.is_terminal for job_id, _ in interactive
        ):
            time.sleep(0.2)
        latencies, met = [], 0
        for job_id, target in interactive:
            record = store.get(job_id)
            done = record.state is JobState.SUCCEEDED
            latencies.append(record.finished_at - record.created_at if done else float("inf"))
            met += done and record.finished_at <= target
        finished = [store.get(job_id).finished_at for job_id in backfill_ids]
        in_window = sum(1 for at in finished if at is not None and started <= at <= ended)
        store.close()
    finite = [value for value in latencies if value != float("inf")]
    return {
        "variant": name,
        "num_interactive": len(interactive),
        "num_interactive_unfinished": len(latencies) - len(finite),
        "interactive_p50": percentile(latencies, 0.5) if latencies else None,
        "interactive_p95": percentile(latencies, 0.95) if latencies else None,
        "deadline_attainment": met / len(interactive) if interactive else None,
        "backfill_images_per_second": in_window / (ended - started) if has_backfill else None,
        "latencies": [round(value, 4) if value != float("inf") else None for value in latencies],
    }


def calibrate(code: Path) -> float:
    """The interactive job's latency alone on an idle worker: median of 5, one at a time."""
    from storage.job_store import JobStore
    from storage.new_job import NewJobSpec

    with tempfile.TemporaryDirectory() as folder, Deployment(Path(folder), code, preemption=True) as up:
        store = JobStore(up.url)
        latencies = []
        for seed in range(6):
            spec = NewJobSpec(tenant="alice", params={**PARAMS, "seed": seed})
            job_id = store.create_many([spec])[0].record.job_id
            while not (record := store.get(job_id)).state.is_terminal:
                time.sleep(0.02)
            latencies.append(record.finished_at - record.created_at)
        return statistics.median(latencies[1:])


def child(argv: list[str]) -> dict:
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.mixed_traffic", *argv], cwd=ROOT, capture_output=True, text=True
    )
    if output.returncode != 0:
        raise SystemExit(f"variant {argv} failed:\n{output.stderr[-4000:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])


def markdown(results: dict) -> str:
    runs = {run["variant"]: run for run in results["runs"]}
    alone_p95 = runs["alone"]["interactive_p95"]
    solo = runs["backfill-solo"]["backfill_images_per_second"]
    lines = [
        f"Interactive alone latency {results['alone_latency']:.3f} s (serial capacity "
        f"{1 / results['alone_latency']:.2f} jobs/s); Poisson at 30% of it for {results['seconds']:.0f} s; "
        f"builtin:tiny 64x64, {PARAMS['num_inference_steps']} steps, max_num_seqs {MAX_NUM_SEQS}, one torch thread; "
        f"baseline {results['baseline']}; load average before {results['load_before']}, after {results['load_after']}.",
        "",
        "| policy | interactive p50 (s) | p95 (s) | p95 / alone | deadlines met | unfinished | "
        "backfill images/s | / solo |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        p95 = run["interactive_p95"]
        ips = run["backfill_images_per_second"]
        cells = [
            run["variant"],
            _num(run["interactive_p50"]),
            _num(p95),
            _num(p95 / alone_p95 if p95 is not None and alone_p95 else None, "x"),
            "-" if run["deadline_attainment"] is None else f"{run['deadline_attainment']:.0%}",
            str(run["num_interactive_unfinished"]),
            _num(ips),
            _num(ips / solo if ips is not None and solo else None, "x"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _num(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "never"
    return f"{value:.2f}{suffix}"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for run in results["runs"]:
        if not run["latencies"]:
            continue
        finite = sorted(value for value in run["latencies"] if value is not None)
        total = len(run["latencies"])
        label = run["variant"] if finite else f"{run['variant']} (none finished)"
        axes.step(finite, [(index + 1) / total for index in range(len(finite))], where="post", label=label)
    axes.axvline(3 * results["alone_latency"], color="grey", linestyle=":", label="complete_by (3x alone)")
    axes.set_xscale("log")
    axes.set_xlabel("interactive latency (s, log)")
    axes.set_ylabel("fraction of interactive jobs finished")
    axes.set_title("Interactive latency beside a backfill, per policy")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="14ccb28", help="commit of today's behaviour")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the interactive stream")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mixed_traffic")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--alone-latency", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant == "calibrate":
        print(json.dumps({"alone_latency": calibrate(args.code)}))
        return
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.code, args.alone_latency, args.seconds, args.seed)))
        return
    results = {"baseline": args.baseline, "seconds": args.seconds, "load_before": os.getloadavg()[0], "runs": []}
    with tempfile.TemporaryDirectory() as folder:
        baseline = Path(folder) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(baseline), args.baseline], cwd=ROOT, check=True)
        try:
            alone_latency = child(["--variant", "calibrate"])["alone_latency"]
            results["alone_latency"] = alone_latency
            for variant in VARIANTS:
                code = baseline if variant == "baseline" else ROOT
                argv = ["--variant", variant, "--code", str(code), "--alone-latency", str(alone_latency)]
                run = child([*argv, "--seconds", str(args.seconds), "--seed", str(args.seed)])
                results["runs"].append(run)
                print(f"{variant}: {json.dumps({k: v for k, v in run.items() if k != 'latencies'})}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=False)
    results["load_after"] = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(results))
    plot(results, args.out / "latency_cdf.png")
    print(markdown(results))


if __name__ == "__main__":
    main()
