"""Counters the engine loop keeps for `DiffusionEngine.stats()`; plain numbers only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from batching.plan import RunnerOutput, SchedulerPlan


@dataclass(slots=True)
class EngineStats:
    num_iterations: int = 0  # engine steps that ran at least one forward or freed state
    num_forwards: int = 0
    rows_per_forward: Counter = field(default_factory=Counter)  # rows (padding excluded) -> forwards
    jobs_per_forward: Counter = field(default_factory=Counter)  # jobs -> forwards
    num_job_steps: int = 0  # denoise steps taken, summed over jobs
    num_jobs_finished: int = 0
    num_jobs_failed: int = 0
    num_jobs_canceled: int = 0
    busy_seconds: float = 0.0  # wall time spent inside iterations that did work

    def record(self, plan: SchedulerPlan, output: RunnerOutput, seconds: float) -> None:
        self.num_iterations += 1
        self.busy_seconds += seconds
        self.num_forwards += len(output.rows_per_forward)
        self.rows_per_forward.update(output.rows_per_forward)
        for job_ids in plan.groups.values():
            # RunnerOutput has no per-forward job count; a group whose jobs all failed ran no forward.
            num_jobs = sum(1 for job_id in job_ids if job_id not in output.failed)
            if num_jobs:
                self.jobs_per_forward[num_jobs] += 1
        self.num_job_steps += len(output.stepped_job_ids)
        self.num_jobs_finished += len(output.finished_job_ids)
        self.num_jobs_failed += len(output.failed)

    def as_dict(self) -> dict:
        return {
            "iterations": self.num_iterations,
            "forwards": self.num_forwards,
            "rows_per_forward": dict(sorted(self.rows_per_forward.items())),
            "jobs_per_forward": dict(sorted(self.jobs_per_forward.items())),
            "job_steps": self.num_job_steps,
            "jobs_finished": self.num_jobs_finished,
            "jobs_failed": self.num_jobs_failed,
            "jobs_canceled": self.num_jobs_canceled,
            "busy_seconds": round(self.busy_seconds, 6),
            "steps_per_second": self.num_job_steps / self.busy_seconds if self.busy_seconds else 0.0,
            "images_per_second": self.num_jobs_finished / self.busy_seconds if self.busy_seconds else 0.0,
        }
