"""Scheduler tests without a model: a fake runner steps every planned sample once per plan."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching.plan import SchedulerPlan
from batching.scheduler import Scheduler, SchedulerConfig
from core.params import PRIORITIES
from tests.support.scheduling import (
    FakeRunner,
    admitted_ids,
    assert_no_state_left,
    key_of,
    make_sample,
    make_scheduler,
    run_iteration,
    run_to_completion,
)


@pytest.mark.parametrize("policy", ["default", "fifo"])
def test_compatible_jobs_are_batched_up_to_capacity(policy):
    jobs = [make_sample() for _ in range(6)]
    scheduler = make_scheduler(*jobs, max_num_seqs=4, policy=policy)

    plan = scheduler.schedule()

    assert admitted_ids(plan) == [job.sample_id for job in jobs[:4]]
    assert plan.groups == {key_of("A"): [job.sample_id for job in jobs[:4]]}
    assert (scheduler.num_running, scheduler.num_waiting) == (4, 2)


def test_jobs_with_different_step_counts_share_one_forward_and_finish_on_their_own_step():
    short, long = make_sample("short", steps=2), make_sample("long", steps=5)
    scheduler, runner = make_scheduler(short, long), FakeRunner()

    left_by_iteration = [run_iteration(scheduler, runner)[2] for _ in range(5)]

    assert runner.forwards == [["short", "long"]] * 2 + [["long"]] * 3
    assert left_by_iteration == [[], ["short"], [], [], ["long"]]


def test_a_late_joiner_shares_the_forward_of_a_job_already_midway():
    scheduler, runner = make_scheduler(make_sample("early", steps=6)), FakeRunner()
    for _ in range(3):
        run_iteration(scheduler, runner)

    scheduler.add(make_sample("late", steps=2, guidance=2.0, prompt="another prompt"))
    plan, output, _ = run_iteration(scheduler, runner)

    assert admitted_ids(plan) == ["late"]
    assert plan.groups == {key_of("A"): ["early", "late"]}
    assert output.samples_per_forward == [2]
    assert runner.progress("early") == 4 and runner.progress("late") == 1
    run_to_completion(scheduler, runner)
    assert runner.forwards[3:] == [["early", "late"]] * 2 + [["early"]]


def test_max_num_seqs_of_one_runs_jobs_one_at_a_time_in_arrival_order():
    jobs = [make_sample(f"job-{i}", steps=i + 1) for i in range(3)]
    scheduler, runner = make_scheduler(*jobs, max_num_seqs=1), FakeRunner()

    run_to_completion(scheduler, runner)

    assert runner.forwards == [["job-0"]] + [["job-1"]] * 2 + [["job-2"]] * 3


def test_fifo_incompatible_head_blocks_everything_behind_it_until_the_wave_drains():
    jobs = [
        make_sample("a1", key="A", steps=3),
        make_sample("b1", key="B", steps=2),
        make_sample("a2", key="A", steps=1),
        make_sample("a3", key="A", steps=1),
    ]
    scheduler, runner = make_scheduler(*jobs, max_num_seqs=8, policy="fifo"), FakeRunner()

    plans = run_to_completion(scheduler, runner)

    assert [admitted_ids(plan) for plan in plans] == [["a1"], [], [], ["b1"], [], ["a2", "a3"]], (
        "no extra iteration only to free finished samples"
    )
    assert runner.forwards == [["a1"]] * 3 + [["b1"]] * 2 + [["a2", "a3"]]


def test_fifo_keeps_guidance_in_its_key_like_the_reference_and_default_does_not():
    jobs = [
        make_sample("g7", guidance=7.5, steps=2),
        make_sample("g1", guidance=1.0, steps=2),
        make_sample("g7b", guidance=7.5, steps=2),
    ]

    fifo = make_scheduler(*jobs, policy="fifo")
    default = make_scheduler(*jobs)

    assert admitted_ids(fifo.schedule()) == ["g7"], "another guidance scale is another wave in the reference"
    assert admitted_ids(default.schedule()) == ["g7", "g1", "g7b"], "guidance is applied per row after the forward"


def test_incompatible_head_does_not_block_compatible_jobs_under_the_default_policy():
    scheduler = make_scheduler(
        make_sample("a1", key="A"), make_sample("b1", key="B"), make_sample("a2", key="A"), max_num_groups=1
    )

    plan = scheduler.schedule()

    assert admitted_ids(plan) == ["a1", "a2"]
    assert "b1" not in admitted_ids(plan) and scheduler.num_waiting == 1


def test_default_policy_runs_two_groups_at_once_with_one_forward_each():
    jobs = [
        make_sample("a1", key="A", steps=2),
        make_sample("b1", key="B", steps=1),
        make_sample("a2", key="A", steps=2),
        make_sample("c1", key="C", steps=1),
    ]
    scheduler, runner = make_scheduler(*jobs), FakeRunner()

    first, output, _ = run_iteration(scheduler, runner)
    second, _, _ = run_iteration(scheduler, runner)

    assert first.groups == {key_of("A"): ["a1", "a2"], key_of("B"): ["b1"]}
    assert output.samples_per_forward == [2, 1]
    assert admitted_ids(second) == ["c1"], "the third key waits for a group to drain"
    assert second.groups == {key_of("A"): ["a1", "a2"], key_of("C"): ["c1"]}


def _feed_a_stream_of_a_jobs(scheduler: Scheduler, runner: FakeRunner, num_iterations: int) -> list[SchedulerPlan]:
    """B arrives behind a one-step A job; then a two-step A job arrives every iteration, so A jobs overlap."""
    scheduler.add(make_sample("a-0", key="A", steps=1))
    scheduler.add(make_sample("b", key="B", steps=2))
    plans = []
    for i in range(1, num_iterations + 1):
        scheduler.add(make_sample(f"a-{i}", key="A", steps=2))
        plans.append(run_iteration(scheduler, runner)[0])
    return plans


def _iterations_in_which_b_was_overtaken(plans: list[SchedulerPlan]) -> list[int]:
    overtaken = []
    for iteration, plan in enumerate(plans):
        if "b" in admitted_ids(plan):
            break
        if any(job_id.startswith("a-") and job_id != "a-0" for job_id in admitted_ids(plan)):
            overtaken.append(iteration)
    return overtaken


def test_a_high_priority_sample_is_admitted_before_normal_ones_that_arrived_earlier():
    scheduler, runner = make_scheduler(make_sample("running", steps=2), max_num_seqs=1), FakeRunner()
    run_iteration(scheduler, runner)
    for name in ("normal-1", "normal-2"):
        scheduler.add(make_sample(name, steps=1))
    scheduler.add(make_sample("high", steps=1, priority="high"))
    scheduler.add(make_sample("low", steps=1, priority="low"))

    order = []
    while scheduler.has_unfinished():
        order += admitted_ids(run_iteration(scheduler, runner)[0])

    assert order == ["high", "normal-1", "normal-2", "low"]


def test_a_low_priority_sample_passed_over_by_a_stream_of_high_ones_is_admitted_at_the_bound():
    scheduler, runner = make_scheduler(max_num_seqs=1, max_wait_iterations=3), FakeRunner()
    scheduler.add(make_sample("low", steps=1, priority="low"))
    admitted_at = {}
    for iteration in range(20):
        scheduler.add(make_sample(f"high-{iteration}", steps=1, priority="high"))
        for sample_id in admitted_ids(run_iteration(scheduler, runner)[0]):
            admitted_at[sample_id] = iteration

    assert admitted_at["low"] == 3, "overtaken in 3 iterations (the bound), then admitted next"
    assert runner.progress("low") is None, "low ran to completion (the runner dropped it)"


def test_fifo_ignores_priority_and_admits_in_arrival_order():
    scheduler, runner = make_scheduler(make_sample("running", steps=2), max_num_seqs=1, policy="fifo"), FakeRunner()
    run_iteration(scheduler, runner)
    scheduler.add(make_sample("low", steps=1, priority="low"))
    scheduler.add(make_sample("normal", steps=1))
    scheduler.add(make_sample("high", steps=1, priority="high"))

    order = []
    while scheduler.has_unfinished():
        order += admitted_ids(run_iteration(scheduler, runner)[0])

    assert order == ["low", "normal", "high"]


def test_without_a_starvation_bound_a_stream_of_compatible_jobs_passes_over_a_job_forever():
    scheduler, runner = make_scheduler(max_num_seqs=2, max_num_groups=1, max_wait_iterations=10**9), FakeRunner()

    plans = _feed_a_stream_of_a_jobs(scheduler, runner, 100)

    assert scheduler.snapshot()["waiting_by_key"][str(key_of("B"))] == 1
    assert len(_iterations_in_which_b_was_overtaken(plans)) == 100


def test_starvation_bound_admits_a_passed_over_job_once_the_jobs_ahead_of_it_drain():
    scheduler, runner = make_scheduler(max_num_seqs=2, max_num_groups=1, max_wait_iterations=3), FakeRunner()

    plans = _feed_a_stream_of_a_jobs(scheduler, runner, 100)

    b_admitted_at = next(i for i, plan in enumerate(plans) if "b" in admitted_ids(plan))
    assert _iterations_in_which_b_was_overtaken(plans) == [0, 1, 2]
    assert b_admitted_at == 4, "admitted as soon as the A jobs admitted before the bound finished"
    assert sum("b" in forward for forward in runner.forwards) == 2, "b ran to completion while A jobs kept arriving"


def test_aborting_a_waiting_job_removes_it_before_it_ever_reaches_the_runner():
    scheduler, runner = make_scheduler(make_sample("a1"), make_sample("a2"), max_num_seqs=1), FakeRunner()

    assert scheduler.abort("a2") is True
    plans = run_to_completion(scheduler, runner)

    assert all("a2" not in admitted_ids(plan) + plan.aborted_sample_ids for plan in plans)
    assert scheduler.abort("a2") is False
    assert_no_state_left(scheduler, runner)


def test_aborting_a_running_job_frees_it_in_the_next_plan_and_it_is_never_stepped_again():
    scheduler, runner = make_scheduler(make_sample("kept", steps=4), make_sample("aborted", steps=4)), FakeRunner()
    run_iteration(scheduler, runner)

    assert scheduler.abort("aborted") is True
    plans = run_to_completion(scheduler, runner)

    assert plans[0].aborted_sample_ids == ["aborted"]
    assert runner.forwards[1:] == [["kept"]] * 3
    assert scheduler.abort("aborted") is False and runner.progress("aborted") is None
    assert_no_state_left(scheduler, runner)


def test_a_job_aborted_while_the_runner_executes_is_freed_once_and_its_output_ignored():
    scheduler, runner = make_scheduler(make_sample("kept", steps=1), make_sample("aborted", steps=1)), FakeRunner()
    plan = scheduler.schedule()
    output = runner.execute(plan)

    scheduler.abort("aborted")
    scheduler.update_from_output(plan, output)

    next_plan = scheduler.schedule()
    assert next_plan.aborted_sample_ids == ["aborted"] and next_plan.groups == {}
    assert not scheduler.has_unfinished()


def test_a_failed_job_leaves_while_the_others_in_its_group_keep_running():
    jobs = [make_sample("ok-1", steps=3), make_sample("bad", steps=3), make_sample("ok-2", steps=3)]
    scheduler, runner = make_scheduler(*jobs), FakeRunner()
    run_iteration(scheduler, runner)

    _, _, left = run_iteration(scheduler, runner, fail=("bad",))
    plans = run_to_completion(scheduler, runner)

    assert left == ["bad"]
    assert runner.forwards[2:] == [["ok-1", "ok-2"]]
    assert len(plans) == 1 and plans[0].aborted_sample_ids == [], "the runner dropped the failed sample itself"


@pytest.mark.parametrize("policy", ["default", "fifo"])
def test_no_state_remains_after_jobs_finish_fail_or_are_aborted(policy):
    jobs = [make_sample(f"job-{i}", key="ABC"[i % 3], steps=1 + i % 4, guidance=(1.0, 7.5)[i % 2]) for i in range(12)]
    scheduler, runner = make_scheduler(*jobs, max_num_seqs=3, policy=policy), FakeRunner()
    run_iteration(scheduler, runner)
    scheduler.abort("job-0")
    scheduler.abort("job-11")
    run_iteration(scheduler, runner, fail=("job-1", "job-4"))

    run_to_completion(scheduler, runner)

    assert_no_state_left(scheduler, runner)
    assert scheduler.snapshot()["waiting_by_key"] == {} and scheduler.snapshot()["running_by_key"] == {}


def test_paused_admission_lets_running_jobs_finish_and_admits_nobody_until_resumed():
    scheduler, runner = make_scheduler(make_sample("running", steps=2)), FakeRunner()
    run_iteration(scheduler, runner)
    scheduler.add(make_sample("waiting", steps=1))

    scheduler.pause_admission()
    paused = [run_iteration(scheduler, runner)[0] for _ in range(3)]
    scheduler.resume_admission()
    resumed = scheduler.schedule()

    assert [plan.groups for plan in paused] == [{key_of("A"): ["running"]}, {}, {}]
    assert all(plan.new_samples == [] for plan in paused) and scheduler.snapshot()["is_admission_paused"] is False
    assert admitted_ids(resumed) == ["waiting"]


def test_snapshot_counts_waiting_and_running_jobs_per_key():
    scheduler = make_scheduler(
        make_sample(key="A"), make_sample(key="A"), make_sample(key="B"), make_sample(key="C"), max_num_groups=1
    )
    scheduler.schedule()

    snapshot = scheduler.snapshot()

    assert snapshot["running_by_key"] == {str(key_of("A")): 2}
    assert snapshot["waiting_by_key"] == {str(key_of("B")): 1, str(key_of("C")): 1}
    assert (snapshot["num_running"], snapshot["num_waiting"], snapshot["policy"]) == (2, 2, "default")


def test_adding_a_job_id_twice_is_refused():
    scheduler = make_scheduler(make_sample("same"))

    with pytest.raises(ValueError, match="same"):
        scheduler.add(make_sample("same"))


@pytest.mark.parametrize(
    "config, field",
    [
        ({"policy": "lifo"}, "policy"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_groups": 0}, "max_num_groups"),
        ({"max_wait_iterations": -1}, "max_wait_iterations"),
    ],
)
def test_an_invalid_config_is_refused_with_a_message_naming_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**config)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["default", "fifo"]),
    max_num_seqs=st.integers(1, 5),
    max_num_groups=st.integers(1, 3),
    max_wait_iterations=st.integers(0, 4),
)
def test_random_arrivals_aborts_and_failures_keep_every_guarantee(
    seed, policy, max_num_seqs, max_num_groups, max_wait_iterations
):
    rng = random.Random(seed)
    scheduler = make_scheduler(
        policy=policy, max_num_seqs=max_num_seqs, max_num_groups=max_num_groups, max_wait_iterations=max_wait_iterations
    )
    runner, aborted_ids_sent, aborted_running_ids = FakeRunner(), [], set()
    waiting_arrivals: list[int] = []  # arrival numbers of the jobs still waiting; job "job-N" arrived N-th
    num_overtaken_by_arrival: dict[int, int] = {}
    for iteration in range(400):
        if iteration < 60 and rng.random() < 0.6:
            arrival = len(num_overtaken_by_arrival)
            scheduler.add(
                make_sample(
                    f"job-{arrival}", key=rng.choice("ABC"), steps=rng.randint(1, 4), priority=rng.choice(PRIORITIES)
                )
            )
            waiting_arrivals.append(arrival)
            num_overtaken_by_arrival[arrival] = 0
        if rng.random() < 0.05 and num_overtaken_by_arrival:
            arrival = rng.randrange(len(num_overtaken_by_arrival))
            was_running = f"job-{arrival}" in runner.num_steps_by_job
            is_aborted = scheduler.abort(f"job-{arrival}")
            if is_aborted and was_running:
                aborted_running_ids.add(f"job-{arrival}")
            elif is_aborted:
                waiting_arrivals.remove(arrival)
        fail = tuple(job_id for job_id in runner.num_steps_by_job if rng.random() < 0.03)
        plan, _, _ = run_iteration(scheduler, runner, fail=fail)
        aborted_ids_sent += plan.aborted_sample_ids
        admitted_arrivals = [int(job_id.removeprefix("job-")) for job_id in admitted_ids(plan)]
        waiting_arrivals = [arrival for arrival in waiting_arrivals if arrival not in admitted_arrivals]
        for arrival in waiting_arrivals:
            num_overtaken_by_arrival[arrival] += any(later > arrival for later in admitted_arrivals)
        planned = [job_id for job_ids in plan.groups.values() for job_id in job_ids]
        assert len(planned) == len(set(planned)) <= max_num_seqs
        assert len(plan.groups) <= (1 if policy == "fifo" else max_num_groups)
        assert not aborted_running_ids & set(planned), "an aborted job is never stepped again"
    assert max(num_overtaken_by_arrival.values(), default=0) <= (0 if policy == "fifo" else max_wait_iterations)
    assert sorted(aborted_ids_sent) == sorted(aborted_running_ids), "each aborted running id reaches the runner once"
    assert_no_state_left(scheduler, runner)
