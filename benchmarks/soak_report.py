"""Accounting and the report of `benchmarks/soak.py`: every accepted job's end, and latencies around
each fault. See that module for what the soak does."""

from __future__ import annotations

import json
import os
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
import requests

from benchmarks.machine import describe_machine
from storage.redis_keys import RedisKeys

DRAIN_SECONDS = 900.0  # after traffic stops, for every accepted job to end
WINDOW_SECONDS = 120.0  # latency windows before and after each fault
TERMINAL = {"succeeded", "failed", "canceled", "expired"}


def timestamp(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def get(url: str, key: str, **kwargs) -> requests.Response:
    return requests.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kwargs)


def final_views(api_url: str, tenants: dict[str, str], accepted: list) -> dict[str, dict | None]:
    """Each accepted job's view once it ended (None: 404, lost), polling until DRAIN_SECONDS pass."""
    views: dict[str, dict | None] = {}
    pending = {entry.job_id: entry for entry in accepted}
    deadline = time.monotonic() + DRAIN_SECONDS
    while pending and time.monotonic() < deadline:
        for job_id, entry in list(pending.items()):
            try:
                response = get(f"{api_url}/v1/jobs/{job_id}", tenants[entry.tenant])
            except requests.RequestException:
                continue
            if response.status_code == 404:
                views[job_id] = None
                del pending[job_id]
            elif response.status_code == 200:
                view = views[job_id] = response.json()
                if view["state"] in TERMINAL:
                    del pending[job_id]
        if pending:
            time.sleep(2)
    return views


def image_is_readable(api_url: str, key: str, view: dict) -> bool:
    for index in range(len(view["image_urls"]) or 1):
        try:
            response = get(f"{api_url}/v1/jobs/{view['job_id']}/image", key, params={"index": index})
        except requests.RequestException:
            return False
        if response.status_code != 200 or not response.content.startswith(b"\x89PNG"):
            return False
    return bool(view["image_urls"])


def listed_job_ids(api_url: str, key: str) -> list[str]:
    job_ids, cursor = [], None
    while True:
        params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        page = get(f"{api_url}/v1/jobs", key, params=params).json()
        job_ids += [job["job_id"] for job in page["jobs"]]
        cursor = page.get("next_cursor")
        if not cursor:
            return job_ids


def account(api_url: str, redis_url: str, tenants: dict[str, str], ledger, s3) -> dict[str, Any]:
    views = final_views(api_url, tenants, ledger.accepted)
    outcomes: dict[str, int] = {}
    problems: list[str] = []
    reasons: dict[str, int] = {}
    by_job = {entry.job_id: entry for entry in ledger.accepted}
    for job_id, entry in by_job.items():
        view = views.get(job_id)
        if view is None:
            outcome = "lost" if job_id in views else "stuck"
        elif view["state"] not in TERMINAL:
            outcome = "stuck"
        elif view["state"] == "succeeded":
            outcome = "succeeded" if image_is_readable(api_url, tenants[entry.tenant], view) else "image_unreadable"
        elif view["state"] in ("failed", "expired") and not (view.get("error") or {}).get("message"):
            outcome = "failed_without_reason"
        else:
            outcome = view["state"]
            if view.get("error"):
                reasons[view["error"]["code"]] = reasons.get(view["error"]["code"], 0) + 1
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome in ("lost", "stuck", "image_unreadable", "failed_without_reason"):
            problems.append(f"{job_id} ({entry.kind}, {entry.tenant}): {outcome}")
    for tenant, key in tenants.items():
        listed = listed_job_ids(api_url, key)
        mine = sorted(entry.job_id for entry in ledger.accepted if entry.tenant == tenant)
        if sorted(listed) != mine:
            problems.append(f"{tenant}: the API lists {len(listed)} jobs, {len(mine)} were accepted")
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        counted = int(client.hget(RedisKeys("stepwise").finished_counts, "succeeded") or 0)
    if counted != outcomes.get("succeeded", 0) + outcomes.get("image_unreadable", 0):
        problems.append(f"Redis counts {counted} successes for {outcomes.get('succeeded', 0)} succeeded jobs")
    requeued = sum(1 for view in views.values() if view and view.get("requeued"))
    attempts = [view["attempts"] for view in views.values() if view]
    return {
        "outcomes": dict(sorted(outcomes.items())),
        "error_codes": dict(sorted(reasons.items())),
        "requeued_jobs": requeued,
        "max_attempts": max(attempts, default=0),
        "problems": problems,
        "latencies": latencies(views),
        "ends": ends(views),
    }


def ends(views: dict[str, dict | None]) -> list[tuple[float, float, str, bool]]:
    """(created_at, finished_at, end state, whether its images waited in a spool) of each ended job."""
    points = []
    for view in views.values():
        if view and view["state"] in TERMINAL:
            created, finished = timestamp(view["created_at"]), timestamp(view["finished_at"])
            if created is not None and finished is not None:
                points.append((created, finished, view["state"], "storing" in (view.get("timings") or {})))
    return points


def storage_recovery(fault, ends: list[tuple[float, float, str, bool]]) -> dict[str, Any]:
    """How the jobs accepted before a stopped S3 server came back ended, and how long after it they finished."""
    before = [end for end in ends if end[0] < fault.storage_back_at]
    states: dict[str, int] = {}
    for _, _, state, _ in before:
        states[state] = states.get(state, 0) + 1
    after = [finished - fault.storage_back_at for _, finished, state, _ in before if state == "succeeded"]
    after = [seconds for seconds in after if seconds >= 0]
    return {
        "jobs_accepted_before_storage_was_back": len(before),
        "their_end_states": dict(sorted(states.items())),
        "spooled_jobs": sum(1 for *_, spooled in before if spooled),
        "succeeded_after_storage_was_back": len(after),
        "seconds_from_storage_back_to_their_success": {
            **percentiles(after),
            "max": round(max(after), 2) if after else None,
        },
    }


def latencies(views: dict[str, dict | None]) -> list[tuple[float, float]]:
    """(created_at, seconds from created to finished) of each succeeded job."""
    points = []
    for view in views.values():
        if view and view["state"] == "succeeded":
            created, finished = timestamp(view["created_at"]), timestamp(view["finished_at"])
            if created is not None and finished is not None:
                points.append((created, finished - created))
    return sorted(points)


def percentiles(values: list[float]) -> dict[str, float | int]:
    if len(values) < 2:
        return {"jobs": len(values)}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"jobs": len(values), "p50": round(cuts[49], 2), "p95": round(cuts[94], 2), "p99": round(cuts[98], 2)}


def write_report(out: Path, started: float, args, ledger, outcome: dict[str, Any]) -> Path:
    points = outcome.pop("latencies")
    job_ends = outcome.pop("ends")
    kinds: dict[str, int] = {}
    for entry in ledger.accepted:
        kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
    faults = []
    for fault in ledger.faults:
        before = [seconds for created, seconds in points if fault.at - WINDOW_SECONDS <= created < fault.at]
        after = [seconds for created, seconds in points if fault.at <= created < fault.at + WINDOW_SECONDS]
        faults.append(
            {
                "kind": fault.kind,
                "at_seconds": round(fault.at - started, 1),
                "back_after_seconds": round(fault.seconds, 1),
                "note": fault.note,
                "latency_before": percentiles(before),
                "latency_after": percentiles(after),
                **({"storage_recovery": storage_recovery(fault, job_ends)} if fault.storage_back_at else {}),
            }
        )
    report = {
        "command": f"nice -n 10 python -m benchmarks.soak --minutes {args.minutes:g} --rate {args.rate:g} "
        f"--faults-per-kind {args.faults_per_kind} --seed {args.seed}"
        + (f" --storage-outage-minutes {args.storage_outage_minutes:g}" if args.storage_outage_minutes else ""),
        "machine": {**describe_machine("cpu", 1), "load_average_at_end": list(os.getloadavg())},
        "minutes": args.minutes,
        "jobs_accepted": len(ledger.accepted),
        "accepted_by_kind": dict(sorted(kinds.items())),
        "submits_never_accepted": dict(sorted(ledger.refused.items())),
        **outcome,
        "latency_overall": percentiles([seconds for _, seconds in points]),
        "faults": faults,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    path = out / "report.md"
    path.write_text(markdown(report))
    return path


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Soak: {report['minutes']:g} minutes, {report['jobs_accepted']} jobs, {len(report['faults'])} faults",
        "",
        f"`{report['command']}`; machine: {report['machine']}",
        "",
        f"- accepted by kind: {report['accepted_by_kind']}",
        f"- submits never accepted (after two minutes of retries): {report['submits_never_accepted'] or 'none'}",
        f"- outcomes: {report['outcomes']}; error codes: {report['error_codes'] or 'none'}",
        f"- jobs re-queued at least once: {report['requeued_jobs']}; "
        f"most attempts of one job: {report['max_attempts']}",
        f"- problems (lost, stuck, duplicated, image unreadable, failed without a reason): "
        f"{report['problems'] or 'none'}",
        f"- latency, submit to end, succeeded jobs: {report['latency_overall']}",
        "",
        "| fault | at (s) | back after (s) | latency before: jobs, p50/p95/p99 s | after |",
        "|---|---|---|---|---|",
    ]
    for fault in report["faults"]:
        lines.append(
            f"| {fault['kind']} | {fault['at_seconds']} | {fault['back_after_seconds']} | "
            f"{_cell(fault['latency_before'])} | {_cell(fault['latency_after'])} |"
        )
    for fault in report["faults"]:
        if "storage_recovery" in fault:
            lines += ["", f"S3 stopped at {fault['at_seconds']} s ({fault['note']}): {fault['storage_recovery']}"]
    return "\n".join(lines) + "\n"


def _cell(stats: dict) -> str:
    if "p50" not in stats:
        return f"{stats['jobs']} jobs"
    return f"{stats['jobs']}: {stats['p50']} / {stats['p95']} / {stats['p99']}"
