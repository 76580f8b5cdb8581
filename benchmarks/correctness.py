"""Whether the engine draws what it is asked, beside how fast: builtin:shapes' fixed cases, judged by pixels.

The cases (batching.shapes.accuracy) run once alone on a one-job engine and once
co-batched at staggered steps with mixed guidance on an engine of the suite's
capacity. A change that speeds the engine up but mixes up rows shows as a lower
co-batched accuracy here, next to the throughput numbers.
"""

from __future__ import annotations

import logging

from batching.shapes.accuracy import MODEL, AccuracyReport, fixed_cases, measure

log = logging.getLogger("benchmarks")


def run_correctness(num_cases: int, max_num_seqs: int, device: str, num_threads: int) -> dict:
    from batching import DiffusionEngine, EngineConfig

    cases = fixed_cases(num_cases)
    results = {"model": MODEL, "num_cases": num_cases, "max_num_seqs": max_num_seqs}
    for mode, capacity in (("alone", 1), ("co_batched", max_num_seqs)):
        engine = DiffusionEngine(
            EngineConfig(model=MODEL, device=device, max_num_seqs=capacity, num_threads=num_threads)
        )
        try:
            report = measure(engine, cases, co_batched=mode == "co_batched")
        finally:
            engine.shutdown()
        log.info(
            "shapes %-10s %d/%d drawn as asked  %5.2f images/s",
            mode,
            report.num_passed,
            report.num_cases,
            report.images_per_second,
        )
        results[mode] = _as_dict(report)
    return results


def _as_dict(report: AccuracyReport) -> dict:
    return {
        "num_passed": report.num_passed,
        "accuracy": report.accuracy,
        "images_per_second": report.images_per_second,
        "failures": report.failures,
    }
