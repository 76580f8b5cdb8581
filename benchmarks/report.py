"""The suite's report: a Markdown table per workload and PNG plots, from summary.json's content."""

from __future__ import annotations

import math
from pathlib import Path

VARIANTS = ("serial", "static", "fifo", "default")
COLORS = {"serial": "tab:gray", "static": "tab:orange", "fifo": "tab:blue", "default": "tab:green"}


def markdown(summary: dict) -> str:
    machine, load, suite = summary["machine"], summary["load_average"], summary["suite"]
    options = summary["command_options"]
    lines = [
        "# stepwise benchmark results",
        "",
        f"`{summary['command']}`: suite `{suite['name']}`, {summary['suite_seconds'] / 60:.1f} minutes; "
        f"models {', '.join(options['models'])}; end to end {'included' if options['e2e'] else 'skipped'}; "
        f"code at `{summary['git_commit']}`.",
        f"Machine: {machine['cpu_count']} × {machine['cpu_model']}, {machine['memory_gib']} GiB; "
        f"device `{machine['device']}`; "
        f"torch {machine['torch']} with {machine['torch_num_threads']} thread(s), diffusers {machine['diffusers']}.",
        f"Load average (1 min) during the suite: min {load['one_minute_min']:.2f}, mean {load['one_minute_mean']:.2f}, "
        f"max {load['one_minute_max']:.2f}, on {machine['cpu_count']} cores shared with other processes; "
        "each run's JSON records the load average at its start and end.",
        f"Jobs: {suite['num_steps']} steps (mixed-steps workload: half, full and 1.5×), {suite['size']}px, "
        f"guidance 7.5 with a negative prompt, Euler; engine capacity and static group size {suite['max_num_seqs']}.",
        "",
        "## Headlines",
        "",
        "Throughput ratios are default / other (above 1: the default policy serves more images per second); "
        "latency ratios are other / default (above 1: the default policy is faster).",
        "",
        "| model | default / serial, burst | default / static, burst | default / fifo, two resolutions "
        "| fifo p95 / default p95, two resolutions | engine efficiency, default burst |",
        "|---|---|---|---|---|---|",
    ]
    for model in summary["models"]:
        h = summary["headlines"][model["model"]]
        lines.append(
            f"| {model['model']} | {_x(h['throughput_default_over_serial_burst'])} "
            f"| {_x(h['throughput_default_over_static_burst'])} "
            f"| {_x(h['throughput_default_over_fifo_two_resolution'])} "
            f"| {_x(h['p95_latency_fifo_over_default_two_resolution'])} "
            f"| {_pct(h['engine_efficiency_default_burst'])} |"
        )
    lines += ["", "![throughput vs arrival rate](throughput_vs_rate.png)", ""]
    if summary.get("correctness"):
        lines += _correctness_section(summary["correctness"])
    if summary.get("e2e"):
        lines += _e2e_section(summary["e2e"])
    for model in summary["models"]:
        lines += _model_section(model, summary["headlines"][model["model"]])
    return "\n".join(lines) + "\n"


def _correctness_section(shapes: dict) -> list[str]:
    lines = [
        f"## Correctness: {shapes['model']} judged by its pixel checker",
        "",
        f"{shapes['num_cases']} fixed prompts and seeds, 20 steps, 128px, guidance mixed (5, 7.5, 10); "
        "co-batched: each job "
        f"joins two steps after the previous one, up to {shapes['max_num_seqs']} at once.",
        "",
        "| run | drawn as asked | images/s |",
        "|---|---|---|",
    ]
    for mode, label in (("alone", "alone"), ("co_batched", "co-batched")):
        result = shapes[mode]
        lines.append(
            f"| {label} | {result['num_passed']}/{shapes['num_cases']} ({_pct(result['accuracy'])}) "
            f"| {result['images_per_second']:.2f} |"
        )
    failures = shapes["alone"]["failures"] + shapes["co_batched"]["failures"]
    if failures:
        lines += ["", "Not drawn as asked:", ""] + [f"- {failure}" for failure in failures]
    return lines + [""]


def _model_section(model: dict, headlines: dict) -> list[str]:
    short = _short(model["model"])
    lines = [
        f"## {model['model']}",
        "",
        f"Serial capacity (serial burst): {model['serial_capacity']:.2f} images/s; Poisson rates are multiples of it; "
        "static batching launches a partial group once its oldest request has waited "
        f"{model['static_timeout_seconds']:.2f} s "
        "(one serial job time).",
        "",
        f"![latency CDF, {model['model']}](latency_cdf_{short}.png)",
        "",
    ]
    mixed = headlines.get("throughput_mixed_over_uniform_equal_tokens") or {}
    if any(value is not None for value in mixed.values()):
        shown = ", ".join(f"{variant} {_x(value)}" for variant, value in mixed.items() if value is not None)
        lines += [f"Mixed-size / uniform throughput at equal tokens (latent tokens per second): {shown}.", ""]
    runs = {(r["workload"], r["variant"]): r for r in model["runs"]}
    for workload in model["workloads"]:
        ratios = headlines["per_workload"][workload["name"]]
        lines += [
            f"### {workload['name']}: {workload['description']}",
            "",
            "| variant | images/s | latency p50 s | p95 s | p99 s | queue wait p50 s | rows / forward "
            "| efficiency (of wall / of busy) | run |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for variant in VARIANTS:
            run = runs.get((workload["name"], variant))
            if run is None:
                continue
            m = run["metrics"]
            lat, wait = m["latency_seconds"], m["queue_wait_seconds"]
            efficiency = m["efficiency"]
            eff = (
                f"{_pct(efficiency['ideal_over_wall'])} / {_pct(efficiency['ideal_over_busy'])}"
                if efficiency
                else "n/a"
            )
            lines.append(
                f"| {variant} | {_num(m['throughput_images_per_second'])} | {_num(lat['p50'])} | {_num(lat['p95'])} "
                f"| {_num(lat['p99'])} | {_num(wait['p50'])} | {_num(m['mean_rows_per_forward'], 1)} | {eff} "
                f"| [json]({run['file']}) |"
            )
        lines += [
            "",
            f"default / serial {_x(ratios['throughput_default_over_serial'])}, "
            f"/ static {_x(ratios['throughput_default_over_static'])}, "
            f"/ fifo {_x(ratios['throughput_default_over_fifo'])} in images/s; p95 latency serial / default "
            f"{_x(ratios['p95_latency_serial_over_default'])}, "
            f"static / default {_x(ratios['p95_latency_static_over_default'])}, "
            f"fifo / default {_x(ratios['p95_latency_fifo_over_default'])}.",
            "",
        ]
    return lines


def _e2e_section(e2e: dict) -> list[str]:
    lines = [
        "## End to end (`stepwise up`: API, Redis, Celery worker, local image store)",
        "",
        f"{e2e['description']}",
        "",
        *([f"**The end-to-end part failed:** {e2e['error']}", ""] if e2e.get("error") else []),
        "| run | jobs | images/s | latency p50 s | p95 s | overhead p50 s | overhead p95 s "
        "| broker wait p50 s | p95 s | worker overhead p50 s | p95 s | upload p50 s | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in e2e["runs"].items():
        if run.get("error"):
            lines.append(f"| {name} | failed: {run['error']} |" + " |" * 11)
            continue
        lat, over = run["latency_seconds"], run["overhead_seconds"]
        lines.append(
            f"| {name} | {run['num_jobs']} | {_num(run['throughput_images_per_second'])} | {_num(lat['p50'])} "
            f"| {_num(lat['p95'])} | {_num(over['p50'], 3)} | {_num(over['p95'], 3)} "
            f"| {_num(run['broker_wait_seconds']['p50'], 3)} | {_num(run['broker_wait_seconds']['p95'], 3)} "
            f"| {_num(run['worker_overhead_seconds']['p50'], 3)} | {_num(run['worker_overhead_seconds']['p95'], 3)} "
            f"| {_num(run['upload_seconds']['p50'], 3)} "
            f"| [json]({run['file']}) |"
        )
    submit = e2e.get("api_submit")
    if submit:
        lines += [
            "",
            f"API submit throughput: {submit['requests_per_second']:.0f} POST /v1/jobs per second "
            f"({submit['clients']} client processes, {submit['seconds']:.0f} s, "
            f"p50 {submit['p50_ms']:.1f} ms, "
            f"p99 {submit['p99_ms']:.1f} ms, statuses {submit['statuses']}), measured while the worker was "
            "generating, on the same cores.",
        ]
    return lines + [""]


def plots(summary: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = [_throughput_plot(plt, summary, out / "throughput_vs_rate.png")]
    for model in summary["models"]:
        written.append(_cdf_plot(plt, model, out / f"latency_cdf_{_short(model['model'])}.png"))
    return written


def _throughput_plot(plt, summary: dict, path: Path) -> Path:
    models = summary["models"]
    figure, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for axis, model in zip(axes[0], models):
        rates = {w["name"]: w["rate_per_second"] for w in model["workloads"] if w["kind"] == "poisson"}
        top = max(rates.values(), default=1.0)
        for variant in VARIANTS:
            points = sorted(
                (rates[r["workload"]], r["metrics"]["throughput_images_per_second"])
                for r in model["runs"]
                if r["variant"] == variant and r["workload"] in rates
            )
            if points:
                axis.plot(*zip(*points), marker="o", color=COLORS[variant], label=variant)
                top = max(top, max(y for _, y in points))
        axis.plot([0, top], [0, top], linestyle=":", color="black", linewidth=0.8, label="offered load")
        axis.set_title(model["model"])
        axis.set_xlabel("arrival rate (images/s)")
        axis.set_ylabel("throughput (images/s)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Throughput vs Poisson arrival rate")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _cdf_plot(plt, model: dict, path: Path) -> Path:
    names = [w["name"] for w in model["workloads"]]
    columns = 3
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    for axis, name in zip(axes.flat, names):
        for variant in VARIANTS:
            run = next((r for r in model["runs"] if r["workload"] == name and r["variant"] == variant), None)
            if run:
                latencies = run["latencies"]
                fractions = [(i + 1) / len(latencies) for i in range(len(latencies))]
                axis.step(latencies, fractions, where="post", color=COLORS[variant], label=variant)
        axis.set_title(name, fontsize=10)
        axis.set_xlabel("latency (s)")
        axis.set_ylabel("fraction of jobs")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(names) :]:
        axis.set_visible(False)
    figure.suptitle(f"Latency CDF, {model['model']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _short(model: str) -> str:
    return model.removeprefix("builtin:").replace("/", "_")


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}×"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"
