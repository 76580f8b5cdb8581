"""Scheduler tests' factories without a model: samples, schedulers, and a fake runner that steps every
planned sample once per plan, as the model runner would."""

from __future__ import annotations

import itertools

from batching.plan import RunnerOutput, SchedulerPlan
from batching.sample import Sample, make_samples
from batching.scheduler import Scheduler, SchedulerConfig
from core.families import FAMILIES
from core.params import CompatibilityKey, GenerationParams

_job_numbers = itertools.count(1)


def make_sample(
    job_id: str | None = None,
    *,
    key: str = "A",
    steps: int = 4,
    guidance: float = 7.5,
    prompt: str = "a red fox",
    priority: str = "normal",
) -> Sample:
    """A sample; samples with the same `key` letter share a compatibility key."""
    params = GenerationParams(
        prompt=prompt, model=f"test:{key}", num_inference_steps=steps, guidance_scale=guidance, seed=0
    )
    return make_samples(job_id or f"job-{next(_job_numbers)}", params, FAMILIES["sd"], priority=priority)[0]


def key_of(letter: str) -> CompatibilityKey:
    return make_sample(key=letter).key


def make_scheduler(*jobs: Sample, **config) -> Scheduler:
    scheduler = Scheduler(SchedulerConfig(**config))
    for job in jobs:
        scheduler.add(job)
    return scheduler


class FakeRunner:
    """Plays the model runner: holds per-sample state from admission until it finishes, fails or is
    aborted, one forward per group; like the real runner it drops finished and failed samples itself."""

    def __init__(self) -> None:
        self.num_steps_by_job: dict[str, int] = {}
        self.steps_done_by_job: dict[str, int] = {}
        self.forwards: list[list[str]] = []  # job ids of each forward run, in order

    def execute(self, plan: SchedulerPlan, *, fail: tuple[str, ...] = ()) -> RunnerOutput:
        for job_id in plan.aborted_sample_ids:
            self._drop(job_id)
        for job in plan.new_samples:
            assert job.sample_id not in self.num_steps_by_job, "a sample's params are sent once"
            self.num_steps_by_job[job.sample_id] = job.num_steps
            self.steps_done_by_job[job.sample_id] = 0
        output = RunnerOutput()
        for job_ids in plan.groups.values():
            assert all(job_id in self.num_steps_by_job for job_id in job_ids), "a planned sample the runner freed"
            self.forwards.append(list(job_ids))
            output.samples_per_forward.append(len(job_ids))
            for job_id in job_ids:
                if job_id in fail:
                    output.failed[job_id] = "simulated failure"
                    self._drop(job_id)
                    continue
                self.steps_done_by_job[job_id] += 1
                output.stepped_sample_ids.append(job_id)
                if self.steps_done_by_job[job_id] == self.num_steps_by_job[job_id]:
                    output.finished_sample_ids.append(job_id)
                    self._drop(job_id)
        return output

    def _drop(self, job_id: str) -> None:
        self.num_steps_by_job.pop(job_id, None)
        self.steps_done_by_job.pop(job_id, None)

    def progress(self, job_id: str) -> int | None:
        return self.steps_done_by_job.get(job_id)


def run_iteration(scheduler: Scheduler, runner: FakeRunner, *, fail: tuple[str, ...] = ()):
    """One engine iteration: schedule, execute, update. Returns (plan, output, ids that left)."""
    plan = scheduler.schedule()
    output = runner.execute(plan, fail=fail)
    scheduler.update_from_output(plan, output)
    return plan, output, [*output.failed, *output.finished_sample_ids]


def run_to_completion(scheduler: Scheduler, runner: FakeRunner, max_iterations: int = 1000) -> list[SchedulerPlan]:
    plans = []
    while scheduler.has_unfinished():
        assert len(plans) < max_iterations, "the scheduler did not drain"
        plans.append(run_iteration(scheduler, runner)[0])
    return plans


def admitted_ids(plan: SchedulerPlan) -> list[str]:
    return [job.sample_id for job in plan.new_samples]


def assert_no_state_left(scheduler: Scheduler, runner: FakeRunner) -> None:
    leftovers = {
        name: value for name, value in vars(scheduler).items() if isinstance(value, (dict, list, set)) and value
    }
    assert leftovers == {}
    assert not scheduler.has_unfinished()
    assert runner.num_steps_by_job == {} and runner.steps_done_by_job == {}
