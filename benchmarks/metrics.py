"""Per-run metrics, from a `RunRecord` (and, for engine variants, the raw forward timings).

- throughput: images / (last result - first submit);
- latency: result - submit, per job; p50/p95/p99 by linear interpolation (with 16 jobs,
  p99 is close to the maximum);
- queue wait: submit -> first denoise step (engine) or group start (static);
- mean rows per forward: denoiser rows per forward (2 per guided job, 1 otherwise);
- engine efficiency: ideal seconds (bare UNet at the shapes that ran + in-run encode and
  decode) / wall seconds; also / busy seconds (the engine's time inside iterations,
  which leaves out idle gaps between Poisson arrivals).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.component_times import ideal_seconds
from benchmarks.variants import RunRecord


def percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {
        "mean": float(array.mean()),
        "p50": float(np.percentile(array, 50)),
        "p95": float(np.percentile(array, 95)),
        "p99": float(np.percentile(array, 99)),
        "max": float(array.max()),
    }


def summarize(record: RunRecord) -> dict:
    jobs = record.jobs
    metrics: dict[str, Any] = {
        "num_jobs": len(jobs),
        "wall_seconds": record.wall_seconds,
        "throughput_images_per_second": len(jobs) / record.wall_seconds if record.wall_seconds > 0 else None,
        "latency_seconds": percentiles([job.finished - job.submitted for job in jobs]),
        "queue_wait_seconds": percentiles([job.queue_wait for job in jobs]),
        "mean_rows_per_forward": _mean_rows(record),
        "efficiency": None,
    }
    if record.variant.kind == "engine" and record.trace is not None and record.trace["is_complete"]:
        ideal = ideal_seconds(record.trace, record.forward_times)
        busy = record.engine_stats["busy_seconds"]
        metrics["efficiency"] = {
            "ideal_seconds": ideal,
            "engine_busy_seconds": busy,
            "in_run_forward_seconds": record.trace["forward_seconds"],
            "ideal_over_wall": ideal["total"] / record.wall_seconds,
            "ideal_over_busy": ideal["total"] / busy if busy else None,
        }
    return metrics


def _mean_rows(record: RunRecord) -> float | None:
    if record.variant.kind == "engine":
        counts = record.engine_stats["rows_per_forward"]
    else:
        counts = record.static_forwards
    num_forwards = sum(counts.values())
    return sum(int(rows) * n for rows, n in counts.items()) / num_forwards if num_forwards else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def headline_ratios(models: list[dict], end_to_end: dict | None) -> dict:
    """The ratios the report leads with. Throughput ratios: default / other (above 1: default
    serves more images per second). Latency ratios: other / default (above 1: default is faster)."""
    headlines: dict = {}
    for model in models:
        runs = {(r["workload"], r["variant"]): r["metrics"] for r in model["runs"]}

        def throughput(workload: str, variant: str, runs: dict = runs) -> float | None:
            metrics = runs.get((workload, variant))
            return metrics["throughput_images_per_second"] if metrics else None

        def p95(workload: str, variant: str, runs: dict = runs) -> float | None:
            metrics = runs.get((workload, variant))
            return metrics["latency_seconds"]["p95"] if metrics else None

        default_burst = runs.get(("burst", "default"))
        efficiency = default_burst["efficiency"] if default_burst else None
        per_workload = {}
        for workload in dict.fromkeys(w for w, _ in runs):
            per_workload[workload] = {
                f"throughput_default_over_{other}": ratio(throughput(workload, "default"), throughput(workload, other))
                for other in ("serial", "static", "fifo")
            } | {
                f"p95_latency_{other}_over_default": ratio(p95(workload, other), p95(workload, "default"))
                for other in ("serial", "static", "fifo")
            }
        headlines[model["model"]] = {
            "throughput_default_over_serial_burst": per_workload["burst"]["throughput_default_over_serial"],
            "throughput_default_over_static_burst": per_workload["burst"]["throughput_default_over_static"],
            "throughput_default_over_fifo_two_resolution": per_workload.get("two_resolution", {}).get(
                "throughput_default_over_fifo"
            ),
            "p95_latency_fifo_over_default_two_resolution": per_workload.get("two_resolution", {}).get(
                "p95_latency_fifo_over_default"
            ),
            "engine_efficiency_default_burst": efficiency["ideal_over_wall"] if efficiency else None,
            "throughput_mixed_over_uniform_equal_tokens": {
                variant: _tokens_ratio(model, runs, variant, "mixed_size", "mixed_size_uniform")
                for variant in ("serial", "static", "fifo", "default")
            },
            "per_workload": per_workload,
        }
    if end_to_end:
        e2e: dict = {}
        for name, run in end_to_end["runs"].items():
            if run.get("overhead_seconds"):
                e2e[f"overhead_p50_seconds_{name}"] = run["overhead_seconds"]["p50"]
                e2e[f"worker_overhead_p50_seconds_{name}"] = run["worker_overhead_seconds"]["p50"]
                e2e[f"throughput_images_per_second_{name}"] = run["throughput_images_per_second"]
        e2e["api_submit_requests_per_second"] = (end_to_end.get("api_submit") or {}).get("requests_per_second")
        headlines["e2e"] = e2e
    return headlines


def _tokens_ratio(model: dict, runs: dict, variant: str, workload: str, reference: str) -> float | None:
    """Latent tokens per second of `workload` over those of `reference` (images/s x tokens per image)."""
    tokens = {w["name"]: w.get("total_tokens", 0) / w["num_jobs"] for w in model.get("workloads", []) if w["num_jobs"]}
    mine, theirs = runs.get((workload, variant)), runs.get((reference, variant))
    if not (mine and theirs and tokens.get(workload) and tokens.get(reference)):
        return None
    return ratio(
        mine["throughput_images_per_second"] * tokens[workload],
        theirs["throughput_images_per_second"] * tokens[reference],
    )
