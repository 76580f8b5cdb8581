"""A job's progress is counted in its own steps (issue 33): a 2-image job of 6 steps goes to 6, not 12.

`JobProgress.of` derives it from its images' step counts, which only the model runner advances.
"""

from __future__ import annotations

from batching.job import JobProgress
from batching.sample import make_samples
from core.families import FAMILIES
from core.params import GenerationParams
from tests.support.engines import DEADLINE_SECONDS, make_params


def progress_at(*steps: int, total: int = 4) -> JobProgress:
    params = GenerationParams(prompt="a fox", num_inference_steps=total, num_images=len(steps), seed=1)
    samples = make_samples("job", params, FAMILIES["sd"])
    for sample, done in zip(samples, steps):
        sample.num_steps_done = done
    return JobProgress.of(samples)


def test_images_that_run_together_show_their_common_step_of_the_jobs_step_count():
    assert progress_at(0, 0) == JobProgress(step=0, total=4, current_image=0, has_started=False)
    assert progress_at(3, 3) == JobProgress(step=3, total=4, current_image=0, has_started=True)
    assert progress_at(4, 4).step == 4


def test_images_at_different_steps_show_their_mean_rounded_down_so_it_never_goes_back():
    assert progress_at(1, 0) == JobProgress(step=0, total=4, current_image=1, has_started=True)
    assert progress_at(4, 3).step == 3 and progress_at(4, 3).current_image == 2, "image 2 of 2: the only one partway"
    sequence = [progress_at(*steps).step for steps in [(1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (4, 2), (4, 3), (4, 4)]]
    assert sequence == sorted(sequence) and sequence[-1] == 4


def test_between_two_images_run_one_after_another_the_next_one_is_named():
    assert progress_at(4, 0, 0).current_image == 2
    assert progress_at(4, 4, 0).current_image == 3
    assert progress_at(2, 2, 0).current_image == 0, "two images partway: they run together"


def test_a_two_image_jobs_progress_callback_counts_its_own_steps(batched_engine):
    reported = []
    future = batched_engine.submit(
        make_params(num_images=2, num_inference_steps=5), on_progress=lambda step, total: reported.append((step, total))
    )

    assert len(future.result(timeout=DEADLINE_SECONDS).images) == 2
    assert future.num_steps_total == 5 and future.progress.total == 5
    assert {total for _, total in reported} == {5}
    assert [step for step, _ in reported] == sorted(step for step, _ in reported) and reported[-1] == (5, 5)
    assert future.progress == JobProgress(step=5, total=5, current_image=0, has_started=True)


def test_a_two_image_job_run_one_image_after_the_other_says_which_image_it_is_on(solo_engine):
    seen, futures = [], []

    def on_progress(step: int, total: int) -> None:
        seen.append((futures[0].progress.current_image, step, total))

    solo_engine.pause()  # no step before the test holds the Future
    futures.append(solo_engine.submit(make_params(num_images=2, num_inference_steps=3), on_progress=on_progress))
    solo_engine.resume()
    futures[0].result(timeout=DEADLINE_SECONDS)

    assert seen == [(1, 0, 3), (1, 1, 3), (2, 1, 3), (2, 2, 3), (2, 2, 3), (0, 3, 3)]
