"""serving.json's shape (docs: /work/shared/DESIGN.md section 9, repeated below) and its Markdown table.

    {"machine": {"cuda_device": str, "torch": str, ...},
     "families": {NAME: {"height": int, "width": int, "num_frames": int?,
                         "workloads": {"burst"|"poisson_1x"|"poisson_2x":
                                       {"serial"|"static"|"default": {"throughput_images_per_second": float,
                                                                      "latency_seconds": {"p50": float,
                                                                                          "p95": float}}}},
                         "device_busy": {"burst": float, ...},
                         "mixed_shapes_vs_alone": float?}}}

NAME is one of sd15, sdxl, flux, flux2, sd3, zimage, qwenimage, wan. `shape_errors` lists every place a
document departs from it (the CPU dry run's test, and the suite before it writes, check it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILY_NAMES = ("sd15", "sdxl", "flux", "flux2", "sd3", "zimage", "qwenimage", "wan")
WORKLOADS = ("burst", "poisson_1x", "poisson_2x")
VARIANTS = ("serial", "static", "default")
FAMILY_KEYS = {"height", "width", "num_frames", "workloads", "device_busy", "mixed_shapes_vs_alone"}


def shape_errors(document: Any) -> list[str]:
    """Where `document` departs from serving.json's shape; empty when it holds."""
    if not isinstance(document, dict) or set(document) != {"machine", "families"}:
        return ["the document must hold exactly `machine` and `families`"]
    errors = []
    machine = document["machine"]
    for key in ("cuda_device", "torch"):
        if not isinstance(machine, dict) or not isinstance(machine.get(key), str):
            errors.append(f"machine.{key} must be a string")
    families = document["families"]
    if not isinstance(families, dict):
        return [*errors, "families must be an object"]
    for name, family in families.items():
        where = f"families.{name}"
        if name not in FAMILY_NAMES:
            errors.append(f"{where}: not a family name ({', '.join(FAMILY_NAMES)})")
        if not isinstance(family, dict):
            errors.append(f"{where} must be an object")
            continue
        errors += [f"{where}.{key}: not in the shape" for key in sorted(set(family) - FAMILY_KEYS)]
        for key in ("height", "width") + (("num_frames",) if "num_frames" in family else ()):
            if not _is_int(family.get(key)):
                errors.append(f"{where}.{key} must be an integer")
        if "mixed_shapes_vs_alone" in family and not _is_number(family["mixed_shapes_vs_alone"]):
            errors.append(f"{where}.mixed_shapes_vs_alone must be a number")
        busy = family.get("device_busy")
        if not isinstance(busy, dict) or not all(k in WORKLOADS and _is_number(v) for k, v in busy.items()):
            errors.append(f"{where}.device_busy must map workloads to numbers")
        workloads = family.get("workloads")
        if not isinstance(workloads, dict) or not workloads or set(workloads) - set(WORKLOADS):
            errors.append(f"{where}.workloads must map some of {', '.join(WORKLOADS)}")
            continue
        for workload, variants in workloads.items():
            if not isinstance(variants, dict) or not variants or set(variants) - set(VARIANTS):
                errors.append(f"{where}.workloads.{workload} must map some of {', '.join(VARIANTS)}")
                continue
            for variant, figures in variants.items():
                errors += _figure_errors(f"{where}.workloads.{workload}.{variant}", figures)
    return errors


def _figure_errors(where: str, figures: Any) -> list[str]:
    if not isinstance(figures, dict) or set(figures) != {"throughput_images_per_second", "latency_seconds"}:
        return [f"{where} must hold exactly throughput_images_per_second and latency_seconds"]
    errors = []
    if not _is_number(figures["throughput_images_per_second"]):
        errors.append(f"{where}.throughput_images_per_second must be a number")
    latency = figures["latency_seconds"]
    if not isinstance(latency, dict) or set(latency) != {"p50", "p95"} or not all(map(_is_number, latency.values())):
        errors.append(f"{where}.latency_seconds must hold numbers p50 and p95")
    return errors


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_table(document: dict, details: dict, path: Path) -> None:
    """serving.md: per family and workload, each variant's images/s and p95, and default against static."""
    machine = document["machine"]
    lines = [
        f"# Serving suite: {machine.get('cuda_device') or machine.get('device')}, torch {machine.get('torch')}",
        "",
        f"{details.get('profile', '')}. Skipped: {', '.join(details.get('skipped', [])) or 'nothing'}; "
        f"total {details.get('total_seconds', 0):.0f} s.",
        "",
        "| family | workload | serial img/s | static img/s | default img/s | default/static | p95 static s | "
        "p95 default s | device busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, family in document["families"].items():
        size = f"{family['width']}x{family['height']}" + (f"x{family['num_frames']}" if "num_frames" in family else "")
        for workload, variants in family["workloads"].items():
            rate = {v: variants[v]["throughput_images_per_second"] for v in variants}
            p95 = {v: variants[v]["latency_seconds"]["p95"] for v in variants}
            ratio = rate["default"] / rate["static"] if "default" in rate and rate.get("static") else None
            lines.append(
                f"| {name} {size} | {workload} | {_cell(rate.get('serial'))} | {_cell(rate.get('static'))} | "
                f"{_cell(rate.get('default'))} | {_cell(ratio, 'x')} | {_cell(p95.get('static'))} | "
                f"{_cell(p95.get('default'))} | {_cell(family['device_busy'].get(workload), '%')} |"
            )
        if "mixed_shapes_vs_alone" in family:
            lines.append(
                f"| {name} {size} | mixed shapes vs each alone | | | | {family['mixed_shapes_vs_alone']:.2f}x | | | |"
            )
    for name, family in details.get("families", {}).items():
        lines += _phase_tables(name, family)
    path.write_text("\n".join(lines) + "\n")


def _phase_tables(name: str, family: dict) -> list[str]:
    """The default engine's phases, burst against Poisson 2x, in ms per iteration (device time where measured)."""
    from benchmarks.step_profile import phase_table

    runs = family.get("runs", {}).get("default", {})
    profiles = {w: runs[w] for w in ("burst", "poisson_2x") if runs.get(w, {}).get("phases")}
    if not profiles:
        return []
    lines = ["", f"## {name}: the default engine's iteration, phase by phase (ms per iteration)", ""]
    clocks = (
        [("device_ms", "Device time")]
        if any("device_ms" in k for p in profiles.values() for k in p["phases"].values())
        else []
    )
    for clock, title in [("host_ms", "Host wall time on the loop thread"), ("cpu_ms", "Loop-thread CPU time"), *clocks]:
        lines += [f"{title}:", "", *phase_table(profiles, clock), ""]
    return lines


def _cell(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{value:.0%}"
    return f"{value:.2f}{unit}"
