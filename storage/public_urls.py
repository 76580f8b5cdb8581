"""The URLs a client is given for a job, the same in the API's job view and in webhook payloads.

An image's URL is a presigned storage URL when the image store gives one (S3), else the API's
own `/v1/jobs/{id}/image` route under `base_url` (STEPWISE_PUBLIC_URL, or the request's host).
"""

from __future__ import annotations

from storage.image_store import ImageStore


def job_url(base_url: str, job_id: str, suffix: str = "") -> str:
    return f"{base_url}/v1/jobs/{job_id}{suffix}"


def image_urls(base_url: str, job_id: str, image_keys: list[str], images: ImageStore) -> list[str]:
    urls = []
    for index, key in enumerate(image_keys):
        presigned = images.presigned_url(key)
        urls.append(presigned or job_url(base_url, job_id, "/image" + (f"?index={index}" if index else "")))
    return urls
