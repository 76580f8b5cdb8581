"""Scheduler tests for the token budget: admission counts what a sample costs a forward (rows x latent
tokens), not how many samples run. No model: the fake runner of test_scheduler steps every planned sample."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from batching.sample import Sample, make_samples
from core.families import FAMILIES
from core.params import GenerationParams
from tests.support.scheduling import FakeRunner, admitted_ids, assert_no_state_left, make_scheduler, run_iteration

SD = FAMILIES["sd"]
SMALL = SD.sample_cost(128, 128, 7.5)  # 2 rows x 16x16 latent


def sized_sample(sample_id: str, size: int, *, steps: int = 2) -> Sample:
    params = GenerationParams(
        prompt="a red fox",
        model="test:A",
        height=size,
        width=size,
        num_inference_steps=steps,
        guidance_scale=7.5,
        seed=0,
    )
    return make_samples(sample_id, params, SD)[0]


def test_a_sample_costs_its_rows_times_its_latent_tokens():
    assert SD.sample_cost(1024, 1024, 7.5) == 4 * SD.sample_cost(512, 512, 7.5), "four times the tokens"
    assert SD.sample_cost(512, 512, 1.0) * 2 == SD.sample_cost(512, 512, 7.5), "no CFG: one row instead of two"
    assert FAMILIES["flux"].sample_cost(128, 192, 3.5) == 8 * 12, "one row of 16-pixel patches"
    assert SD.default_token_budget(8) == 8 * SMALL
    assert sized_sample("x", 256).cost == 4 * SMALL, "a sample's cost is its family's, computed when it is made"


def test_the_default_budget_holds_max_num_seqs_jobs_at_the_checkpoints_own_size():
    # An SD 1.5 checkpoint draws 512x512: eight such jobs share a forward under the default budget (a budget of
    # eight 128x128 jobs ran every real-size job alone on a GPU: one job per forward).
    budget = SD.default_token_budget(8, native_size=(512, 512))
    scheduler = make_scheduler(*(sized_sample(f"j{i}", 512) for i in range(8)), max_num_seqs=8, max_num_tokens=budget)
    plan, _, _ = run_iteration(scheduler, FakeRunner())
    assert sum(len(ids) for ids in plan.groups.values()) == 8
    assert SD.default_token_budget(8, native_size=(64, 64)) == SD.default_token_budget(8), "never below the default"


def test_a_large_sample_takes_the_budget_of_several_small_ones_and_small_ones_fill_what_is_left():
    jobs = [sized_sample("big", 192), *(sized_sample(f"small-{i}", 128) for i in range(4))]
    by_count = make_scheduler(*jobs)
    by_tokens = make_scheduler(*jobs, max_num_tokens=4 * SMALL)

    assert len(admitted_ids(by_count.schedule())) == 5, "without a budget every sample counts one slot"
    plan = by_tokens.schedule()

    assert admitted_ids(plan) == ["big", "small-0"], "192px costs 2.25 small samples; one small fits beside it"
    assert by_tokens.num_running_tokens == SD.sample_cost(192, 192, 7.5) + SMALL <= 4 * SMALL


def _stream_of_small_samples_behind_a_large_one(max_wait_iterations: int, num_iterations: int = 60):
    """Two small samples run; the large one needs three of the four small budgets; a small two-step sample
    arrives every iteration, so without a bound two smalls always run and the large one never fits."""
    scheduler = make_scheduler(
        sized_sample("small-a", 128),
        sized_sample("small-b", 128),
        max_num_tokens=4 * SMALL,
        max_wait_iterations=max_wait_iterations,
    )
    runner = FakeRunner()
    run_iteration(scheduler, runner)
    scheduler.add(sized_sample("big", 192, steps=3))
    plans = []
    for i in range(num_iterations):
        scheduler.add(sized_sample(f"small-{i}", 128))
        plans.append(run_iteration(scheduler, runner)[0])
    return scheduler, runner, plans


def test_without_a_bound_small_samples_keep_a_large_one_waiting():
    _, runner, plans = _stream_of_small_samples_behind_a_large_one(max_wait_iterations=10**9)

    assert not any("big" in admitted_ids(plan) for plan in plans)
    assert all(len(forward) == 2 for forward in runner.forwards[2:]), "the budget keeps two smalls running"


def test_the_starvation_bound_admits_a_large_sample_and_small_ones_then_run_beside_it():
    scheduler, runner, plans = _stream_of_small_samples_behind_a_large_one(max_wait_iterations=3)

    admitted_at = next(i for i, plan in enumerate(plans) if "big" in admitted_ids(plan))
    overtaken = [i for i, plan in enumerate(plans[:admitted_at]) if admitted_ids(plan)]
    assert len(overtaken) == 3, "overtaken exactly max_wait_iterations times"
    assert admitted_at <= 3 + 2, "then admitted once the two-step smalls ahead of it finished"
    big_forwards = [plan.groups for plan in plans if any("big" in ids for ids in plan.groups.values())]
    assert len(big_forwards) == 3
    assert any(len(groups) == 2 for groups in big_forwards), "a small sample ran beside it in the same step"
    while scheduler.has_unfinished():
        run_iteration(scheduler, runner)
    assert_no_state_left(scheduler, runner)


def test_a_sample_over_the_whole_budget_runs_alone_rather_than_never():
    scheduler = make_scheduler(sized_sample("huge", 256), sized_sample("small", 128), max_num_tokens=2 * SMALL)
    runner = FakeRunner()

    first, _, _ = run_iteration(scheduler, runner)
    second, _, _ = run_iteration(scheduler, runner)
    third, _, _ = run_iteration(scheduler, runner)

    assert admitted_ids(first) == ["huge"] and list(first.groups.values()) == [["huge"]]
    assert admitted_ids(second) == [], "nothing joins a set that is over budget"
    assert admitted_ids(third) == ["small"]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    budget=st.integers(1, 12),
    max_wait_iterations=st.integers(0, 4),
    policy=st.sampled_from(["default", "fifo"]),
)
def test_random_sizes_keep_the_budget_and_the_starvation_bound(seed, budget, max_wait_iterations, policy):
    rng = random.Random(seed)
    scheduler = make_scheduler(
        max_num_seqs=6, max_num_tokens=budget * SMALL // 2, policy=policy, max_wait_iterations=max_wait_iterations
    )
    runner, waiting, overtaken = FakeRunner(), [], {}
    for iteration in range(300):
        if iteration < 40 and rng.random() < 0.7:
            arrival = len(overtaken)
            scheduler.add(sized_sample(f"{arrival}", rng.choice([128, 192, 256]), steps=rng.randint(1, 3)))
            waiting.append(arrival)
            overtaken[arrival] = 0
        plan, _, _ = run_iteration(scheduler, runner)
        admitted = [int(sample_id) for sample_id in admitted_ids(plan)]
        waiting = [arrival for arrival in waiting if arrival not in admitted]
        for arrival in waiting:
            overtaken[arrival] += any(later > arrival for later in admitted)
        running = [sample_id for ids in plan.groups.values() for sample_id in ids]
        assert len(running) == 1 or scheduler.num_running_tokens <= budget * SMALL // 2
    assert max(overtaken.values(), default=0) <= (0 if policy == "fifo" else max_wait_iterations)
    assert_no_state_left(scheduler, runner)


def test_a_two_size_burst_runs_full_forwards_of_one_size_then_the_other():
    """Convolutions cannot mix sizes, so the default policy fills one size's group before opening another."""
    jobs = [sized_sample(f"{size}-{i}", size, steps=2) for i in range(8) for size in (128, 192)]
    scheduler, runner = make_scheduler(*jobs, max_num_seqs=8), FakeRunner()

    while scheduler.has_unfinished():
        run_iteration(scheduler, runner)

    assert [len(forward) for forward in runner.forwards] == [8, 8, 8, 8], "not eight forwards of four"
    assert all(len({sample_id.split("-")[0] for sample_id in forward}) == 1 for forward in runner.forwards)


def test_an_adapters_native_size_is_what_its_pipeline_draws_without_a_size(batched_engine):
    import diffusers

    from batching.pipelines.adapter_base import AdapterBase

    adapter = batched_engine.model_runner.model
    assert adapter.native_size == (128, 128), "builtin:tiny's UNet: sample_size 16 x 8"
    wan = object.__new__(AdapterBase)  # only the pipeline's class is read where its __call__ names a size
    wan.pipeline = object.__new__(diffusers.WanPipeline)
    assert wan.native_size == (480, 832)
    assert batched_engine.stats()["max_num_tokens"] == SD.default_token_budget(8, adapter.native_size)
