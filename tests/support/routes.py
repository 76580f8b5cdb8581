"""The JSON API's documented routes, as (OpenAPI path, method) pairs: what /openapi.json must list."""

from __future__ import annotations

ROUTES = {
    ("/v1/jobs", "post"),
    ("/v1/jobs", "get"),
    ("/v1/jobs/batch", "post"),
    ("/v1/jobs/{job_id}", "get"),
    ("/v1/jobs/{job_id}", "delete"),
    ("/v1/jobs/{job_id}/cancel", "post"),
    ("/v1/jobs/{job_id}/image", "get"),
    ("/healthz", "get"),
    ("/readyz", "get"),
    ("/metrics", "get"),
    ("/openapi.json", "get"),
    ("/v1/models", "get"),
    ("/v1/admin/tenants", "get"),
    ("/v1/admin/scaling", "get"),
    ("/v1/uploads", "post"),
    ("/v1/loras", "get"),
    ("/v1/loras/{name}", "put"),
    ("/v1/loras/{name}", "get"),
    ("/v1/loras/{name}", "delete"),
    ("/v1/jobs/{job_id}/events", "get"),
    ("/v1/images/generations", "post"),
    ("/v1/images/edits", "post"),
    ("/v1/videos", "post"),
    ("/v1/videos", "get"),
    ("/v1/videos/{video_id}", "get"),
    ("/v1/videos/{video_id}", "delete"),
    ("/v1/videos/{video_id}/content", "get"),
}
