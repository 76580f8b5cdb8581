"""Jobs canceled right after submit: do they still run? (issue 33's probe)

    python -m benchmarks.cancel_probe [--model builtin:tiny] [--jobs 40] [--steps 25] [--threads 2]

While one job runs, `--jobs` jobs are submitted to the engine and each is canceled at once
(`engine.cancel(future)`), as a worker drain cancels the jobs it has just submitted. Prints
the denoise steps the engine ran for the canceled jobs (its `job_steps` minus the running
job's own steps; 0 when a cancel keeps a job from ever reaching a forward), how many futures
ended canceled, and what `stats()["jobs_canceled"]` counts.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from batching import DiffusionEngine, EngineConfig, GenerationParams, JobCanceledError


def probe(model: str, num_jobs: int, num_steps: int, num_threads: int) -> dict:
    config = EngineConfig(model=model, device="cpu", max_num_seqs=8, num_threads=num_threads)
    with DiffusionEngine(config) as engine:
        has_started = threading.Event()
        running_steps = 4 * num_steps
        running = engine.submit(
            GenerationParams(prompt="the running job", seed=1, num_inference_steps=running_steps, model=model),
            on_progress=lambda done, total: has_started.set(),
        )
        assert has_started.wait(120), "the running job did not start"
        before = engine.stats()
        start = time.perf_counter()
        futures = []
        for index in range(num_jobs):
            params = GenerationParams(prompt=f"job {index}", seed=index, num_inference_steps=num_steps, model=model)
            future = engine.submit(params)
            engine.cancel(future)
            futures.append(future)
        num_canceled = 0
        for future in futures:
            try:
                future.result(timeout=600)
            except JobCanceledError:
                num_canceled += 1
        running.result(timeout=600)
        seconds = time.perf_counter() - start
        after = engine.stats()
    return {
        "jobs": num_jobs,
        "steps_each": num_steps,
        "extra_steps": after["job_steps"] - running_steps,  # a fresh engine: every other step was a canceled job's
        "futures_canceled": num_canceled,
        "stats_jobs_canceled": after["jobs_canceled"] - before["jobs_canceled"],
        "seconds": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(probe(args.model, args.jobs, args.steps, args.threads)))


if __name__ == "__main__":
    main()
