"""What a worker knows of a job the engine runs is read from the engine's Future, never counted again."""

from __future__ import annotations

from batching.job import JobFuture, JobProgress
from worker.held_job import HeldJob


def test_a_held_job_reads_the_jobs_own_progress_from_its_future():
    held = HeldJob("job-1", 1, "w#1")
    assert (held.step, held.total, held.has_started_denoising) == (0, 0, False)  # not submitted yet

    held.future = JobFuture("job-1", JobProgress(0, 200))
    held.future.progress = JobProgress(step=120, total=200, current_image=2, has_started=True)
    held.on_progress(120, 200)

    assert (held.step, held.total, held.progress.current_image) == (120, 200, 2)
    assert len(held.step_times) == 1


def test_a_two_image_job_whose_first_image_took_one_step_counts_as_started_for_a_drain():
    """Its step (the images' mean, rounded down) is still 0; a drain must not send it back to the queue."""
    held = HeldJob("job-2", 1, "w#1", future=JobFuture("job-2", JobProgress(0, 200)))
    held.future.progress = JobProgress(step=0, total=200, current_image=1, has_started=True)

    assert held.step == 0 and held.has_started_denoising
