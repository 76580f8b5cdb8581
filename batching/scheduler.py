"""The step scheduler: which jobs run in the next denoise iteration, grouped by key.

Torch-free; the engine loop thread owns it (it is not thread-safe). Jobs enter the
waiting queue in arrival order, are admitted into the running set, take one denoise
step per iteration in the forward of their compatibility key, and leave by finishing,
failing or being aborted.

Guarantees of both policies:
- At most `max_num_seqs` jobs run at once; nobody is admitted while admission is paused.
- Each plan lists every running job exactly once, in the group of its key; jobs with
  different step counts or at different current steps share a group.
- A job that left the running set (finished, failed, aborted) is never in a later plan's
  groups, and its id is in `freed_job_ids` of exactly one plan: the next one.
- Once every job has finished, failed or been aborted and that plan was taken, no
  per-job state remains.

Policy "fifo" (the reference behaviour, kept for comparison): jobs are admitted in
strict arrival order and the running set holds one key (the wave). As in the reference,
that key also holds the guidance scale. When the head of the queue has another key than
the wave, nothing is admitted until the running set drains; then the head's key becomes
the wave.

Policy "default": the running set holds up to `max_num_groups` keys, one forward each
per iteration. Each iteration walks the queue in arrival order and admits every job
that fits (capacity left, and its key already runs or another group is allowed); a job
that does not fit is passed over and does not block those behind it. Starvation bound:
a waiting job is overtaken (a later arrival admitted before it) in at most
`max_wait_iterations` iterations. After that, nothing that arrived after it is admitted
before it, so it is admitted at the latest once every job that was running or queued
ahead of it at that moment has left the running set. `max_wait_iterations=0` gives
arrival-order admission with several groups.

Priority (default policy only; fifo is the reference and ignores it): each iteration walks
the waiting jobs that reached the starvation bound first, in arrival order, then the others
by priority (high, normal, low) and arrival within a priority. A job admitted ahead of an
earlier arrival overtakes it, whichever the reason (key or priority), so the bound above
holds for low-priority jobs too: a low job is passed over by higher ones for at most
`max_wait_iterations` iterations.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from batching.params import PRIORITIES, CompatibilityKey
from batching.plan import NewJob, RunnerOutput, SchedulerPlan

POLICIES = ("default", "fifo")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8  # running capacity in jobs; 1 = step-wise path without batching
    policy: str = "default"  # "default" or "fifo"
    max_num_groups: int = 2  # default policy: distinct keys running at once (one forward each per iteration)
    max_wait_iterations: int = 50  # default policy: iterations a waiting job may be overtaken before it blocks those behind it

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)} (got {self.policy!r})")
        for name, low in (("max_num_seqs", 1), ("max_num_groups", 1), ("max_wait_iterations", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low} (got {value!r})")


@dataclass(slots=True)
class ScheduledJob:
    """One job's scheduling state, from arrival until it leaves the running set."""

    new_job: NewJob  # sent to the runner once, in the plan that admits the job
    num_steps: int
    num_rows: int  # rows in its group's forward: 2 with guidance, 1 without
    num_steps_done: int = 0
    num_iterations_overtaken: int = 0  # waiting iterations in which a later arrival was admitted
    priority_rank: int = 1  # index in PRIORITIES: 0 high, 1 normal, 2 low

    @property
    def job_id(self) -> str:
        return self.new_job.job_id

    @property
    def key(self) -> CompatibilityKey:
        return self.new_job.key

    @property
    def reference_key(self) -> tuple[CompatibilityKey, float]:
        """The reference design's key, which also holds the guidance setting (fifo policy)."""
        return self.new_job.key, self.new_job.params.guidance_scale


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._waiting: dict[str, ScheduledJob] = {}  # job_id -> job, in arrival order
        self._running: dict[str, ScheduledJob] = {}  # job_id -> job, in admission order
        self._freed_job_ids: list[str] = []  # left the running set since the last plan
        self._is_admission_paused = False

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def is_admission_paused(self) -> bool:
        return self._is_admission_paused

    def add(self, job: NewJob, priority: str = "normal") -> None:
        """Queue a job behind every job already waiting (of its priority, for the default policy)."""
        if job.job_id in self._waiting or job.job_id in self._running:
            raise ValueError(f"job {job.job_id!r} is already scheduled")
        assert job.params.num_images == 1, "split multi-image requests into one job per image"
        self._waiting[job.job_id] = ScheduledJob(
            new_job=job, num_steps=job.params.num_inference_steps, num_rows=job.params.num_rows,
            priority_rank=PRIORITIES.index(priority),
        )

    def abort(self, job_id: str) -> bool:
        """Remove a waiting or running job; False when the job is unknown or already gone."""
        if self._waiting.pop(job_id, None) is not None:
            return True
        if self._running.pop(job_id, None) is not None:
            self._freed_job_ids.append(job_id)
            return True
        return False

    def pause_admission(self) -> None:
        """Admit nobody until resumed; running jobs keep stepping (engine drain)."""
        self._is_admission_paused = True

    def resume_admission(self) -> None:
        self._is_admission_paused = False

    def has_unfinished(self) -> bool:
        """True while a job waits or runs, or freed ids still have to reach the runner."""
        return bool(self._waiting or self._running or self._freed_job_ids)

    def progress(self, job_id: str) -> tuple[int, int] | None:
        """(steps done, total steps) of a waiting or running job; None otherwise."""
        job = self._running.get(job_id) or self._waiting.get(job_id)
        return None if job is None else (job.num_steps_done, job.num_steps)

    def snapshot(self) -> dict[str, Any]:
        """Counts for stats(): jobs waiting and running, in total and per key."""
        return {
            "policy": self.config.policy,
            "is_admission_paused": self._is_admission_paused,
            "num_waiting": len(self._waiting),
            "num_running": len(self._running),
            "waiting_by_key": dict(Counter(str(job.key) for job in self._waiting.values())),
            "running_by_key": dict(Counter(str(job.key) for job in self._running.values())),
        }

    def schedule(self) -> SchedulerPlan:
        """Admit what the policy allows and plan one step for every running job."""
        admitted = [] if self._is_admission_paused else self._admit()
        plan = SchedulerPlan(new_jobs=[job.new_job for job in admitted], freed_job_ids=self._freed_job_ids)
        self._freed_job_ids = []
        for job in self._running.values():
            plan.groups.setdefault(job.key, []).append(job.job_id)
            plan.num_rows_by_key[job.key] = plan.num_rows_by_key.get(job.key, 0) + job.num_rows
        max_num_groups = 1 if self.config.policy == "fifo" else self.config.max_num_groups
        assert len(plan.groups) <= max_num_groups and len(self._running) <= self.config.max_num_seqs
        return plan

    def update_from_output(self, plan: SchedulerPlan, output: RunnerOutput) -> list[str]:
        """Apply the runner's result for `plan`; return the ids that left the running set.

        A job that ran its last step is in both `stepped_job_ids` and `finished_job_ids`.
        Failed and finished jobs leave (their ids go to the next plan's freed_job_ids).
        Ids of jobs aborted after `plan` was made are ignored.
        """
        planned_job_ids = {job_id for job_ids in plan.groups.values() for job_id in job_ids}
        left_job_ids = []
        for job_id in output.failed:
            if self._running.pop(job_id, None) is not None:
                left_job_ids.append(job_id)
        for job_id in output.stepped_job_ids:
            assert job_id in planned_job_ids, f"runner stepped {job_id!r}, which was not planned"
            job = self._running.get(job_id)
            if job is not None:
                job.num_steps_done += 1
                assert job.num_steps_done <= job.num_steps, f"job {job_id!r} stepped past its last step"
        for job_id in output.finished_job_ids:
            job = self._running.pop(job_id, None)
            if job is not None:
                assert job.num_steps_done == job.num_steps, f"job {job_id!r} finished before its last step"
                left_job_ids.append(job_id)
        self._freed_job_ids.extend(left_job_ids)
        return left_job_ids

    def _admit(self) -> list[ScheduledJob]:
        if self.config.policy == "fifo":
            admitted = self._admit_fifo()
        else:
            admitted = self._admit_default()
        for job in admitted:
            del self._waiting[job.job_id]
            self._running[job.job_id] = job
        return admitted

    def _admit_fifo(self) -> list[ScheduledJob]:
        wave_key = next(iter(self._running.values())).reference_key if self._running else None
        num_free = self.config.max_num_seqs - len(self._running)
        admitted = []
        for job in self._waiting.values():
            if len(admitted) == num_free:
                break
            if wave_key is None:
                wave_key = job.reference_key
            if job.reference_key != wave_key:
                break
            admitted.append(job)
        return admitted

    def _admit_default(self) -> list[ScheduledJob]:
        running_keys = {job.key for job in self._running.values()}
        num_free = self.config.max_num_seqs - len(self._running)
        arrival = {job_id: index for index, job_id in enumerate(self._waiting)}
        bound = self.config.max_wait_iterations

        def walk_order(job: ScheduledJob) -> tuple[int, int, int]:
            if job.num_iterations_overtaken >= bound:
                return (0, 0, arrival[job.job_id])  # at the bound: first, in arrival order
            return (1, job.priority_rank, arrival[job.job_id])

        admitted: list[ScheduledJob] = []
        for job in sorted(self._waiting.values(), key=walk_order):
            if len(admitted) == num_free:
                break
            if job.key in running_keys or len(running_keys) < self.config.max_num_groups:
                running_keys.add(job.key)
                admitted.append(job)
                continue
            if job.num_iterations_overtaken >= bound:
                break  # starvation bound: hold every later arrival back until this job is admitted
        if admitted:  # each waiting job that arrived before an admitted one was overtaken, once per iteration
            latest = max(arrival[job.job_id] for job in admitted)
            admitted_ids = {job.job_id for job in admitted}
            for job_id, job in self._waiting.items():
                if arrival[job_id] < latest and job_id not in admitted_ids:
                    job.num_iterations_overtaken += 1
        return admitted
