"""A job view's progress as one line for a human: `step 120/200`, and `image 2 of 2` while a job runs its
images one after another (the view's `progress.current_image`). Steps are the job's own: a 2-image job of
200 steps counts to 200."""

from __future__ import annotations

from typing import Any


def progress_text(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    text = f"step {progress.get('step', 0)}/{progress.get('total', 0)}"
    image = image_text(job)
    return f"{text}, {image}" if image else text


def image_text(job: dict[str, Any]) -> str:
    """`image 2 of 2` while the job runs its images one after another, else empty."""
    current = (job.get("progress") or {}).get("current_image")
    num_images = (job.get("params") or {}).get("num_images", 1)
    return f"image {current} of {num_images}" if current and num_images > 1 else ""
