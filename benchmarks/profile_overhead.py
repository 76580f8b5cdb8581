"""Where an engine's time goes on builtin:shapes-dit, phase by phase and inside the forward (issue 45's overhead).

    python -m benchmarks.profile_overhead --variant off|fast|serial [--mode timers|cprofile|torch] [--out DIR]

Reproduces one variant of `benchmarks.step_cache` in this process (same engine config, one torch thread, the
warm-up job, then the 16-job burst of the fixed shapes cases at 112/128 px) and reports, for the burst alone:

- timers: wall-clock seconds of named parts, per thread (the loop thread and the decode worker), from wrappers
  put around the model's submodules and the engine's functions (a wrapper costs ~1 us; thousands of calls);
  the engine's own phase timing (`EngineConfig.phase_timing`) beside them.
- cprofile: cProfile over the loop thread and the decode thread (cumulative seconds, top functions; the
  profiler slows Python-heavy code, so compare shares rather than seconds).
- torch: torch.profiler's operator table over the burst (self CPU time per op).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import pstats
import resource
import threading
import time
from collections import defaultdict
from pathlib import Path

MODEL = "builtin:shapes-dit"

_totals: dict[tuple[str, str], list[float]] = defaultdict(
    lambda: [0.0, 0.0, 0]
)  # (thread, name) -> [wall s, cpu s, calls]
_local = threading.local()


def _record(name: str, seconds: float, cpu: float) -> None:
    entry = _totals[(threading.current_thread().name, name)]
    entry[0] += seconds
    entry[1] += cpu
    entry[2] += 1


def timed(name_or_fn, fn=None):
    """Wrap `fn` so each call adds its wall time under `name_or_fn` (or a name picked per call by a function)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        name = name_or_fn(*args, **kwargs) if callable(name_or_fn) else name_or_fn
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(name, time.perf_counter() - start, time.thread_time() - cpu)

    return wrapper


def patch(owner, attribute: str, name) -> None:
    setattr(owner, attribute, timed(name, getattr(owner, attribute)))


def patch_module_forward(module, name: str) -> None:
    module.forward = timed(name, module.forward)


def install_timers(engine) -> None:
    import batching.batched_steps as batched_steps
    import batching.model_runner as model_runner
    import batching.pipelines.step_cache_rows as rows
    import batching.pipelines.zimage.step_cache as zcache
    from batching.pipelines.zimage import packed

    adapter = engine.model_runner.model
    model = adapter.transformer
    refiner_ids = {id(layer): "noise_refiner" for layer in model.noise_refiner}
    refiner_ids |= {id(layer): "context_refiner" for layer in model.context_refiner}

    def layers_name(layers, *args, **kwargs):
        layers = list(layers)
        return "run_layers:" + (refiner_ids.get(id(layers[0]), "main_blocks") if layers else "empty")

    patch(packed, "run_layers", layers_name)
    patch(packed, "embed", "embed(total)")
    patch(packed, "refine_captions", "refine_captions(total)")
    patch(packed, "unify", "unify")
    patch(packed, "output", "output(final layer+unpatchify)")
    patch(packed, "build_layout", "build_layout")
    patch(zcache, "_refined_captions", "cached:_refined_captions(total)")
    patch(zcache, "cached_blocks", "cached:cached_blocks(total)")
    patch(rows, "decide", "cached:decide")
    patch(rows, "reuse_residuals", "cached:reuse_residuals")
    for layer in model.layers:
        patch_module_forward(layer, "module:main_block")
    for layer in model.noise_refiner:
        patch_module_forward(layer, "module:noise_refiner")
    for layer in model.context_refiner:
        patch_module_forward(layer, "module:context_refiner")
    patch_module_forward(model.all_final_layer["2-1"], "module:final_layer")
    for name in ("patchify_and_embed", "_prepare_sequence", "_build_unified_sequence", "unpatchify"):
        setattr(model, name, timed("diffusers." + name, getattr(model, name)))
    model.rope_embedder.__class__.__call__ = timed("rope_embedder", model.rope_embedder.__class__.__call__)
    model.forward = timed("diffusers.forward(total)", model.forward)
    patch_module_forward(model.t_embedder, "t_embedder")
    patch_module_forward(model.all_x_embedder["2-1"], "x_embedder")
    patch_module_forward(model.cap_embedder, "cap_embedder")
    for name in (
        "forward",
        "forward_cached",
        "_transformer_inputs",
        "_layout",
        "_predictions",
        "encode_prompts",
        "decode",
    ):
        setattr(adapter, name, timed("adapter." + name, getattr(adapter, name)))
    if hasattr(adapter, "latent_vae"):
        adapter.latent_vae.vae.decode = timed("vae.decode(nn)", adapter.latent_vae.vae.decode)
    import batching.pipelines.vae as vae_module

    patch(vae_module, "pixels_to_images", "pixels_to_images")
    patch(model_runner, "guided_predictions", "runner:guided_predictions")
    patch(model_runner, "step_together", "runner:step_together")
    runner = engine.model_runner
    for name in (
        "execute",
        "_forward",
        "_denoise",
        "_step_chunk",
        "_run_group",
        "_step",
        "_collect_started",
        "_hand_to_decoder",
        "_collect_decoded",
        "_admit",
    ):
        setattr(runner, name, timed("runner." + name, getattr(runner, name)))
    for name in ("step", "_publish", "_take_inbox"):
        setattr(engine, name, timed("engine." + name, getattr(engine, name)))
    engine.scheduler.schedule = timed("scheduler.schedule", engine.scheduler.schedule)
    engine.scheduler.update_from_output = timed("scheduler.update", engine.scheduler.update_from_output)
    import batching.input_batch as input_batch

    patch(input_batch.InputBatch, "prepare", "input_batch.prepare")
    del batched_steps


def job_params(case, index: int, cache):
    from benchmarks.step_cache import job_params as bench_params

    return bench_params(MODEL, "zimage", case, index, cache)


def run(variant: str, mode: str, jobs: int) -> dict:
    import torch

    from batching import DiffusionEngine, EngineConfig
    from batching.shapes.accuracy import fixed_cases

    cache = "off" if variant == "serial" else variant
    cases = fixed_cases()
    config = EngineConfig(
        model=MODEL, device="cpu", max_num_seqs=1 if variant == "serial" else 8, num_threads=1, phase_timing=True
    )
    report: dict = {"variant": variant, "mode": mode, "torch_threads": 1}
    with DiffusionEngine(config) as engine:
        engine.submit(job_params(cases[0], 0, cache)).result()  # warm-up, not timed
        engine.phases.reset()
        profilers: dict[str, cProfile.Profile] = {}
        if mode == "timers":
            install_timers(engine)
        elif mode == "cprofile":
            threading.setprofile(None)
            # profile whichever threads run engine code: a profiler per thread, switched on from the thread itself
            runner = engine.model_runner

            def profiled(fn, label):
                @functools.wraps(fn)
                def wrapper(*args, **kwargs):
                    profiler = profilers.get(threading.current_thread().name)
                    if profiler is None:
                        profiler = profilers[threading.current_thread().name] = cProfile.Profile()
                    if getattr(_local, "depth", 0):
                        return fn(*args, **kwargs)
                    _local.depth = 1
                    profiler.enable()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        profiler.disable()
                        _local.depth = 0

                return wrapper

            setattr(engine, "step", profiled(engine.step, "loop"))  # noqa: B010  (wrapping methods: profiling)
            decoder = runner.decoder
            setattr(decoder, "_run", profiled(decoder._run, "decode"))  # noqa: B010
        stats_before = engine.stats()
        cpu_before = _cpu_seconds()
        torch_profile = (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False)
            if mode == "torch"
            else contextlib.nullcontext()
        )
        with torch_profile as prof:
            start = time.perf_counter()
            futures = [engine.submit(job_params(cases[i], i, cache)) for i in range(jobs)]
            results = [future.result(timeout=1800) for future in futures]
            seconds = time.perf_counter() - start
        cpu_seconds = _cpu_seconds() - cpu_before
        stats = engine.stats()
        report["jobs"] = len(results)
        report["seconds"] = round(seconds, 3)
        report["cpu_seconds"] = round(cpu_seconds, 3)
        report["images_per_second"] = round(len(results) / seconds, 3)
        report["images_per_cpu_second"] = round(len(results) / cpu_seconds, 3)
        report["engine_stats"] = {
            name: round(stats[name] - stats_before[name], 3)
            for name in ("forward_seconds", "decode_seconds", "encode_seconds", "busy_seconds", "iterations")
            if name in stats
        }
        sc, sc0 = stats["step_cache"].get("zimage", {}), stats_before["step_cache"].get("zimage", {})
        blocks = sc.get("blocks", 0) - sc0.get("blocks", 0)
        report["skipped_fraction"] = (
            round((sc.get("blocks_skipped", 0) - sc0.get("blocks_skipped", 0)) / blocks, 4) if blocks else 0
        )
        report["phases"] = stats.get("phases")
        if mode == "timers":
            by_thread: dict[str, dict] = defaultdict(dict)
            for (thread, name), (total, cpu, calls) in sorted(_totals.items(), key=lambda item: -item[1][1]):
                by_thread[thread][name] = {
                    "cpu_s": round(cpu, 4),
                    "wall_s": round(total, 4),
                    "calls": calls,
                    "cpu_share": round(cpu / cpu_seconds, 4),
                }
            report["timers"] = by_thread
        elif mode == "cprofile":
            report["cprofile"] = {}
            for thread, profiler in profilers.items():
                stream = io.StringIO()
                pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(60)
                stream.write("\n--- by tottime ---\n")
                pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
                report["cprofile"][thread] = stream.getvalue()
        elif mode == "torch" and prof is not None:
            report["torch_table"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=50)
    return report


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="off")
    parser.add_argument("--mode", default="timers", choices=("timers", "cprofile", "torch", "plain"))
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--out", default="/tmp/prof")
    args = parser.parse_args()
    report = run(args.variant, args.mode, args.jobs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.variant}-{args.mode}.json"
    text = {k: v for k, v in report.items() if k not in ("cprofile", "torch_table")}
    path.write_text(json.dumps(report, indent=1) + "\n")
    for key in ("cprofile", "torch_table"):
        if key in report:
            body = (
                report[key]
                if isinstance(report[key], str)
                else "\n\n".join(f"=== thread {t} ===\n{s}" for t, s in report[key].items())
            )
            (out / f"{args.variant}-{key}.txt").write_text(body)
    print(json.dumps(text, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
