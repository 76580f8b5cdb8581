"""Preemption at step boundaries, least-slack admission and tenants in the engine's admission.

Scheduler tests without a model (a small fake runner that holds each sample's state from admission
until it finishes or is aborted, and steps what a plan's groups name), then the engine on builtin:tiny:
a preempted job's image equals the same job run without preemption."""

from __future__ import annotations

import itertools

import pytest

from batching import DiffusionEngine, EngineConfig
from batching.plan import RunnerOutput, SchedulerPlan
from batching.sample import Sample, make_samples
from batching.scheduler import Scheduler, SchedulerConfig
from core.families import FAMILIES
from core.params import GenerationParams
from tests.support.engines import make_params, max_pixel_diff

_numbers = itertools.count(1)


def sample(priority: str = "normal", *, steps: int = 10, tenant: str = "t", complete_by: float | None = None) -> Sample:
    params = GenerationParams(prompt="a fox", model="test:A", num_inference_steps=steps, guidance_scale=1.0, seed=0)
    job_id = f"{tenant}-{priority}-{next(_numbers)}"
    return make_samples(job_id, params, FAMILIES["sd"], priority=priority, tenant=tenant, complete_by=complete_by)[0]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Runner:
    """Steps every sample a plan's groups name, once; holds state from admission to the end, so a paused
    sample (in no group) keeps its progress, and a resumed one must not be handed over again."""

    def __init__(self) -> None:
        self.steps_left: dict[str, int] = {}
        self.steps_by_plan: list[list[str]] = []  # sample ids stepped, per plan

    def execute(self, plan: SchedulerPlan) -> RunnerOutput:
        for sample_id in plan.aborted_sample_ids:
            assert self.steps_left.pop(sample_id, None) is not None, "an aborted id the runner does not hold"
        for new in plan.new_samples:
            assert new.sample_id not in self.steps_left, "a sample is handed to the runner once"
            self.steps_left[new.sample_id] = new.num_steps
        output = RunnerOutput()
        for sample_ids in plan.groups.values():
            for sample_id in sample_ids:
                self.steps_left[sample_id] -= 1
                output.stepped_sample_ids.append(sample_id)
                if self.steps_left[sample_id] == 0:
                    output.finished_sample_ids.append(sample_id)
                    del self.steps_left[sample_id]
        self.steps_by_plan.append(output.stepped_sample_ids)
        return output


def run_one(scheduler: Scheduler, runner: Runner, clock: Clock | None = None) -> SchedulerPlan:
    plan = scheduler.schedule()
    scheduler.update_from_output(plan, runner.execute(plan))
    if clock is not None:
        clock.now += 1.0
        scheduler.step_times.observe(1.0)
    return plan


def running_ids(plan: SchedulerPlan) -> set[str]:
    return {sample_id for sample_ids in plan.groups.values() for sample_id in sample_ids}


def test_a_high_priority_sample_pauses_the_lowest_ranked_one_at_the_next_boundary_which_resumes_where_it_was():
    scheduler, runner = Scheduler(SchedulerConfig(max_num_seqs=2)), Runner()
    low_a, low_b = sample("low", steps=6), sample("low", steps=6)
    scheduler.add(low_a), scheduler.add(low_b)
    run_one(scheduler, runner), run_one(scheduler, runner)
    high = sample("high", steps=3)
    scheduler.add(high)

    plan = run_one(scheduler, runner)

    assert [new.sample_id for new in plan.new_samples] == [high.sample_id], "admitted at this very boundary"
    assert high.sample_id in running_ids(plan) and len(running_ids(plan)) == 2
    [paused] = {low_a.sample_id, low_b.sample_id} - running_ids(plan)
    assert scheduler.paused_sample_ids() == {paused} and scheduler.snapshot()["num_paused"] == 1
    assert runner.steps_left[paused] == 4, "its progress is kept in the runner"
    plans = [run_one(scheduler, runner) for _ in range(12)]
    assert all(not plan.new_samples for plan in plans), "a resumed sample is not handed over again"
    assert not scheduler.has_unfinished() and runner.steps_left == {}
    assert scheduler.snapshot()["num_preemptions"] == 1


def test_a_low_sample_under_a_sustained_stream_of_high_ones_still_finishes_within_the_bound():
    def run(max_wait_iterations: int) -> int | None:
        scheduler = Scheduler(SchedulerConfig(max_num_seqs=1, max_wait_iterations=max_wait_iterations))
        runner = Runner()
        low = sample("low", steps=5)
        scheduler.add(low)
        for iteration in range(400):
            if iteration % 2 == 0:
                scheduler.add(sample("high", steps=3))  # more high work than the engine can do
            run_one(scheduler, runner)
            if low.sample_id not in runner.steps_left and low.num_steps_done == low.num_steps:
                return iteration
        return None

    assert run(max_wait_iterations=10**6) is None, "without the bound the stream pauses it for ever"
    finished_at = run(max_wait_iterations=8)
    assert finished_at is not None and finished_at < 60, finished_at


def test_of_two_waiting_samples_of_one_priority_the_nearer_complete_by_starts_first():
    clock = Clock()
    scheduler, runner = Scheduler(SchedulerConfig(max_num_seqs=1), clock=clock), Runner()
    blocker = sample("high", steps=2)
    scheduler.add(blocker)
    run_one(scheduler, runner, clock)
    later = sample(steps=4, complete_by=clock.now + 500)
    sooner = sample(steps=4, complete_by=clock.now + 50)
    scheduler.add(later), scheduler.add(sooner)  # arrival order: the later deadline first

    plans = [run_one(scheduler, runner, clock) for _ in range(3)]

    admitted = [new.sample_id for plan in plans for new in plan.new_samples]
    assert admitted[0] == sooner.sample_id, admitted
    assert scheduler.snapshot()["num_preemptions"] == 0, "a far deadline is no reason to pause a running sample"


def test_a_waiting_sample_with_a_deadline_pauses_one_without_but_two_deadlines_do_not_swap():
    clock = Clock()
    scheduler, runner = Scheduler(SchedulerConfig(max_num_seqs=1), clock=clock), Runner()
    relaxed = sample(steps=20)
    scheduler.add(relaxed)
    run_one(scheduler, runner, clock)
    urgent = sample(steps=4, complete_by=clock.now + 10)
    scheduler.add(urgent)
    assert running_ids(run_one(scheduler, runner, clock)) == {urgent.sample_id}
    close_second = sample(steps=4, complete_by=clock.now + 12)
    scheduler.add(close_second)

    plan = run_one(scheduler, runner, clock)

    assert running_ids(plan) == {urgent.sample_id}, "less slack, but not by more than the running one's work"


def test_a_sample_that_cannot_make_its_complete_by_is_reported_late():
    clock = Clock()
    scheduler, runner = Scheduler(SchedulerConfig(max_num_seqs=1), clock=clock), Runner()
    on_time, hopeless = sample(steps=3, complete_by=clock.now + 100), sample(steps=30, complete_by=clock.now + 10)
    scheduler.add(on_time), scheduler.add(hopeless)
    run_one(scheduler, runner, clock)  # one iteration measured: a second per step

    assert scheduler.late_sample_ids() == {hopeless.sample_id}


def test_among_equals_the_tenant_with_fewer_running_samples_is_admitted_first_and_stats_count_tenants():
    scheduler, runner = Scheduler(SchedulerConfig(max_num_seqs=3)), Runner()
    for _ in range(2):
        scheduler.add(sample(tenant="bulk", steps=3))
    run_one(scheduler, runner)
    scheduler.add(sample(tenant="bulk", steps=3))
    alice = sample(tenant="alice", steps=3)
    scheduler.add(alice)

    plan = run_one(scheduler, runner)

    assert [new.sample_id for new in plan.new_samples] == [alice.sample_id]
    snapshot = scheduler.snapshot()
    assert snapshot["running_by_tenant"] == {"bulk": 2, "alice": 1} and snapshot["waiting_by_tenant"] == {"bulk": 1}


def test_a_paused_sample_that_is_aborted_is_freed_in_the_runner_and_paused_ones_resume_while_draining():
    scheduler, runner = Scheduler(SchedulerConfig(max_num_seqs=1)), Runner()
    first, second = sample("low", steps=5), sample("low", steps=5)
    scheduler.add(first)
    run_one(scheduler, runner)
    scheduler.add(sample("high", steps=1))
    run_one(scheduler, runner)
    assert scheduler.paused_sample_ids() == {first.sample_id}
    scheduler.add(second)
    scheduler.pause_admission()  # a drain: no new sample, but the paused one finishes

    plans = [run_one(scheduler, runner) for _ in range(6)]

    assert all(second.sample_id not in running_ids(plan) for plan in plans)
    assert first.num_steps_done == first.num_steps and first.sample_id not in runner.steps_left
    scheduler.resume_admission()
    run_one(scheduler, runner)
    scheduler.add(sample("high", steps=2))
    run_one(scheduler, runner)
    assert scheduler.paused_sample_ids() == {second.sample_id}
    assert scheduler.abort(second.sample_id)
    run_one(scheduler, runner)
    assert second.sample_id not in runner.steps_left, "the runner was told to drop the paused sample's state"


@pytest.fixture(scope="module", params=[False, True], ids=["batched", "deterministic"])
def two_slot_engine(request):
    with DiffusionEngine(
        EngineConfig(model="builtin:tiny", device="cpu", max_num_seqs=2, deterministic=request.param)
    ) as engine:
        yield engine


def test_a_high_job_starts_within_one_step_boundary_and_each_paused_image_equals_itself_without_preemption(
    two_slot_engine,
):
    engine = two_slot_engine
    lows = [make_params(seed=seed, num_inference_steps=14, guidance_scale=1.0) for seed in (1, 2)]
    reference = [engine.submit(params, priority="low") for params in lows]  # together, never preempted
    reference = [future.result(timeout=120).image for future in reference]
    preemptions_before = engine.stats()["num_preemptions"]

    low_steps: dict[str, int] = {"a": 0, "b": 0}
    seen: dict[str, object] = {}
    futures: dict[str, object] = {}

    def on_high_progress(done: int, total: int) -> None:
        if done == 1:
            seen["low steps at high's first step"] = dict(low_steps)
        if done == 2:  # flags and stats as of the end of the first shared iteration
            seen["paused"] = [futures[name].is_paused for name in ("a", "b")]
            seen["stats"] = engine.stats()

    def on_low_a_progress(done: int, total: int) -> None:
        low_steps["a"] = done
        if done == 3:
            seen["low steps at submit"] = dict(low_steps)
            futures["high"] = engine.submit(
                make_params(seed=9, num_inference_steps=4, guidance_scale=1.0),
                priority="high",
                tenant="alice",
                on_progress=on_high_progress,
            )

    futures["a"] = engine.submit(lows[0], priority="low", tenant="bulk", on_progress=on_low_a_progress)
    futures["b"] = engine.submit(
        lows[1], priority="low", tenant="bulk", on_progress=lambda done, total: low_steps.update(b=done)
    )
    preempted = [futures[name].result(timeout=120).image for name in ("a", "b")]
    futures["high"].result(timeout=120)

    at_submit, at_first = seen["low steps at submit"], seen["low steps at high's first step"]
    assert max(at_first.values()) <= max(at_submit.values()) + 1, (at_submit, at_first)
    assert sorted(seen["paused"]) == [False, True], "one low job is paused while the high one runs"
    assert seen["stats"]["num_paused"] == 1 and seen["stats"]["paused_by_tenant"] == {"bulk": 1}
    assert seen["stats"]["running_by_tenant"] == {"bulk": 1, "alice": 1}
    assert engine.stats()["num_preemptions"] == preemptions_before + 1
    for alone, image in zip(reference, preempted):
        assert max_pixel_diff(alone, image) <= (0 if engine.config.deterministic else 1)
