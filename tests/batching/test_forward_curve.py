"""Admission from the measured forward cost (`batching.forward_curve`): the scheduler admits up to the knee of
the denoiser's time against its rows. Hand-built curves, no model; one engine test measures a real one."""

from __future__ import annotations

import pytest

from batching.forward_curve import ForwardCurve, row_buckets
from batching.sample import Sample, make_samples
from core.families import FAMILIES
from core.params import GenerationParams
from tests.support.engines import make_params
from tests.support.scheduling import FakeRunner, admitted_ids, make_scheduler, run_iteration

SD_512_TOKENS = FAMILIES["sd"].tokens_per_row(512, 512)


def sized_sample(sample_id: str, size: int) -> Sample:
    """A two-step CFG job of the SD family at `size` pixels a side, as the scheduler sees it."""
    params = GenerationParams(
        prompt="a red fox", model="test:A", height=size, width=size, num_inference_steps=2, guidance_scale=7.5, seed=0
    )
    return make_samples(sample_id, params, FAMILIES["sd"])[0]


def curve_of(rows_per_second: dict[int, float], tokens_per_row: int = SD_512_TOKENS) -> ForwardCurve:
    return ForwardCurve(tuple((rows, rows / rate) for rows, rate in rows_per_second.items()), tokens_per_row)


def test_the_knee_is_where_a_doubling_of_rows_stops_raising_throughput():
    # The H200 figures of benchmarks/results/gpu/run1 (rows -> rows a second of the bare forward).
    sd15 = curve_of({1: 26.7, 2: 58.2, 4: 160.9, 8: 270.0, 16: 319.5})
    sdxl = curve_of({1: 11.5, 2: 34.3, 4: 52.1, 8: 54.9, 16: 55.6})
    assert sd15.knee_rows == 16, "each doubling still buys 18% or more"
    assert sdxl.knee_rows == 8, "from 8 to 16 rows: 1% more rows a second for twice the step time"
    assert curve_of({2: 10.0, 4: 10.2, 8: 30.0}).knee_rows == 2, "the first step that buys little ends the walk"
    assert sdxl.token_budget == 8 * SD_512_TOKENS


def test_a_measured_curve_caps_a_group_where_it_says():
    # Knee at 8 rows: four CFG jobs (two rows each) of eight waiting run together, though max_num_seqs is 8 and
    # the token budget holds eight.
    curve = curve_of({2: 30.0, 4: 58.0, 8: 110.0, 16: 112.0})
    jobs = [sized_sample(f"job-{i}", 512) for i in range(8)]
    scheduler = make_scheduler(*jobs, max_num_seqs=8, max_num_tokens=8 * jobs[0].cost, forward_curve=curve)
    runner = FakeRunner()

    plan, output, _ = run_iteration(scheduler, runner)

    assert admitted_ids(plan) == [job.sample_id for job in jobs[:4]]
    assert output.samples_per_forward == [4] and scheduler.num_waiting == 4
    assert scheduler.snapshot()["max_num_tokens"] == curve.token_budget == 4 * jobs[0].cost
    assert scheduler.snapshot()["forward_curve"]["knee_rows"] == 8
    run_iteration(scheduler, runner)
    plan, _, _ = run_iteration(scheduler, runner)  # the first four finished (2 steps): the next four start
    assert admitted_ids(plan) == [job.sample_id for job in jobs[4:]]


def test_an_explicit_budget_below_the_knee_still_holds():
    curve = curve_of({2: 30.0, 4: 58.0, 8: 110.0, 16: 210.0})  # no knee below 16 rows
    jobs = [sized_sample(f"job-{i}", 512) for i in range(8)]
    scheduler = make_scheduler(*jobs, max_num_seqs=8, max_num_tokens=3 * jobs[0].cost, forward_curve=curve)

    assert len(admitted_ids(scheduler.schedule())) == 3


def test_row_buckets_double_the_samples_up_to_the_most_rows():
    assert row_buckets(16, 2) == (2, 4, 8, 16)
    assert row_buckets(6, 1) == (1, 2, 4, 6)
    assert row_buckets(1, 1) == (1,)


def test_a_curve_refuses_rows_out_of_order():
    with pytest.raises(ValueError, match="ascending"):
        ForwardCurve(((4, 0.1), (2, 0.05)), 64)


def test_an_engine_measures_its_curve_before_its_first_job_and_reports_it(fresh_engine):
    engine = fresh_engine(max_num_seqs=2, measure_forward_curve=True)
    params = make_params(num_inference_steps=2)

    assert engine.submit(params).result(timeout=60).image.size == (params.width, params.height)

    stats = engine.stats()
    curve = stats["forward_curve"]
    assert list(curve["seconds_by_rows"]) == [2, 4], "builtin:tiny's CFG rows: one and two jobs"
    assert curve["knee_rows"] in (2, 4)
    assert stats["max_num_tokens"] == min(curve["token_budget"], FAMILIES["sd"].default_token_budget(2))


def test_measuring_the_curve_also_runs_every_other_count_of_a_jobs_rows_once():
    """An eager denoiser's first forward at a new batch size selects its kernels (on CUDA also cuDNN's plans):
    after the curve every count of whole jobs up to max_num_seqs has run once, so none is cold when jobs come
    and go."""
    from batching.encoder import Encoder
    from batching.forward_measure import measure_forward_curve
    from batching.model_loading import load_model

    adapter = load_model("builtin:tiny", "cpu")
    rows_run: list[int] = []
    forward = adapter.forward

    def counting(batch):
        rows_run.append(len(batch.timesteps))
        return forward(batch)

    adapter.forward = counting  # type: ignore[method-assign]

    curve = measure_forward_curve(adapter, Encoder(adapter, is_async=False), max_num_seqs=5, repeats=1)

    assert curve is not None and [rows for rows, _ in curve.points] == [2, 4, 8, 10]
    assert sorted(set(rows_run)) == [2, 4, 6, 8, 10] and rows_run.count(6) == 1, "6 rows: warmed once, not timed"


def test_a_checkpoint_whose_pipeline_states_no_size_is_served_by_its_familys_checkpoint_size():
    from batching.engine import serving_size

    zimage, sd = FAMILIES["zimage"], FAMILIES["sd"]
    assert serving_size((128, 128), zimage, is_builtin=False) == (1024, 1024), "Z-Image's pipeline picks 1024 itself"
    assert serving_size((128, 128), zimage, is_builtin=True) == (128, 128), "a built-in draws its own small size"
    assert serving_size((512, 512), sd, is_builtin=False) == (512, 512), "a size the pipeline states is kept"
    assert serving_size((480, 832), FAMILIES["wan"], is_builtin=False) == (480, 832)
