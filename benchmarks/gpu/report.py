"""The GPU suite's markdown summary, from its results document (gpu_results.json)."""

from __future__ import annotations

from pathlib import Path


def write_summary(results: dict, path: Path) -> None:
    machine = results["machine"]
    profile = results["profile"]
    lines = [
        f"# stepwise GPU suite ({profile['device']}, {profile['dtype']}, {profile['scale']} sizes)",
        "",
        f"Device: {machine.get('device')}; torch {machine.get('torch')}, diffusers {machine.get('diffusers')}. "
        f"Total {results['total_seconds']:.0f} s. "
        f"Skipped (time budget): {', '.join(results['skipped']) or 'nothing'}.",
        "",
    ]
    for name, model in results["models"].items():
        run = model["run"]
        millions = sum(model["parameters"].values()) / 1e6
        lines += [
            f"## {name} at {run['size']}x{run['size']} ({millions:,.0f} M parameters, built in "
            f"{model['build_seconds']:.0f} s)",
            "",
        ]
        if "forward_ceiling" in model:
            lines += _ceiling(model["forward_ceiling"])
        if "throughput" in model:
            lines += [
                f"Throughput, {run['num_jobs']} jobs of {run['num_steps']} steps, "
                f"max_num_seqs={run['max_num_seqs']} "
                f"(Poisson at {model['throughput']['poisson_rate_per_second']:.2f}/s):",
                "",
                "| variant | burst images/s | burst p95 latency s | Poisson images/s | Poisson p95 latency s |",
                "|---|---|---|---|---|",
            ]
            for variant, burst in model["throughput"]["burst"].items():
                poisson = model["throughput"]["poisson"][variant]
                lines.append(
                    f"| {variant} | {burst['throughput_images_per_second']:.3f} | "
                    f"{burst['latency_seconds']['p95']:.2f} | {poisson['throughput_images_per_second']:.3f} | "
                    f"{poisson['latency_seconds']['p95']:.2f} |"
                )
            lines.append("")
        if "invariance" in model:
            shown = ", ".join(f"{mode}: {diff}" for mode, diff in model["invariance"].items())
            lines += [f"Invariance, largest pixel difference alone vs batched (0-255): {shown}.", ""]
        if "decode_overlap" in model:
            lines += [
                "Decode overlap (mixed-step burst):",
                "",
                "| decode | images/s | denoiser busy | engine busy | decode s/image |",
                "|---|---|---|---|---|",
            ]
            for mode, figures in model["decode_overlap"].items():
                lines.append(
                    f"| {mode} | {figures['images_per_second']:.3f} "
                    f"| {figures['denoiser_busy_fraction']:.1%} | "
                    f"{figures['engine_busy_fraction']:.1%} | {figures['decode_seconds_per_image']:.3f} |"
                )
            lines.append("")
        if "encode_overlap" in model:
            lines += [
                "Encode overlap (a job arrives at each step of a running job):",
                "",
                "| encode | images/s | max stall s | median step gap s | encode s/job |",
                "|---|---|---|---|---|",
            ]
            for mode, figures in model["encode_overlap"].items():
                lines.append(
                    f"| {mode} | {figures['images_per_second']:.3f} | {figures['max_stall_seconds']:.3f} | "
                    f"{figures['median_step_gap_seconds']:.3f} | {figures['encode_seconds_per_job']:.3f} |"
                )
            lines.append("")
    if "flux" in results:
        lines += ["## FLUX-sized transformer alone", ""] + _ceiling(results["flux"]["forward_ceiling"])
    if "wan" in results:
        lines += _wan(results["wan"])
    path.write_text("\n".join(lines) + "\n")


def _ceiling(rows: list[dict]) -> list[str]:
    lines = ["| rows | forward ms | rows/s |", "|---|---|---|"]
    for row in rows:
        if row.get("seconds") is None:
            lines.append(f"| {row['rows']} | {row.get('error', '-')} | - |")
        else:
            lines.append(f"| {row['rows']} | {row['seconds'] * 1000:.1f} | {row['rows_per_second']:.1f} |")
    return lines + [""]


def _wan(wan: dict) -> list[str]:
    videos = ", ".join(f"{w}x{h}x{f} ({tokens} tokens)" for (h, w, f), tokens in zip(wan["videos"], wan["tokens"]))
    lines = ["## Wan-sized video transformer alone", "", f"Videos (width x height x frames): {videos}.", ""]
    if "error" in wan:
        return lines + [f"Stopped: {wan['error']}.", ""]
    lines += [
        "Videos of the first shape, one forward (batched) vs one forward each (serial):",
        "",
        "| videos | batched ms | serial ms | speedup |",
        "|---|---|---|---|",
    ]
    for row in wan["uniform"]:
        lines.append(
            f"| {row['rows']} | {row['seconds'] * 1000:.1f} | {row['serial_seconds'] * 1000:.1f} | "
            f"{row['speedup']:.2f}x |"
        )
    mixed = wan["mixed"]
    lines += [
        "",
        f"One video of each shape in one forward: {mixed['seconds'] * 1000:.1f} ms, each alone "
        f"{mixed['alone_seconds'] * 1000:.1f} ms ({mixed['speedup']:.2f}x); a mixed video's prediction differs from "
        f"its alone one by at most {mixed['max_abs_difference']:.2e} ({mixed['relative_difference']:.2e} of the "
        "largest value).",
        "",
    ]
    return lines
