"""Microbenchmark of builtin:shapes-dit's denoiser forward paths, in one process on one torch thread.

    python -m benchmarks.forward_micro [--rows 16|2] [--reps 30] [--profile]

Builds the forward batch the engine builds for the step_cache benchmark's burst (8 CFG samples of the fixed
shapes cases at 112/128 px: 16 rows; `--rows 2`: serial's one sample) and times, alternating, each path's
thread CPU time per forward (min and median over the reps: on a shared machine the minimum is the steadier
figure): the adapter's forward (diffusers' own forward where rows are alike, else packed), the packed forward,
and the step-cached forward with every sample computing. `--profile` adds torch.profiler's op table of each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

MODEL = "builtin:shapes-dit"


def make_batch(adapter, num_samples: int, step: int = 5):
    from batching.pipelines.contract import ForwardBatch
    from batching.shapes.accuracy import fixed_cases
    from benchmarks.step_cache import job_params

    cases = fixed_cases()
    params = [job_params(MODEL, "zimage", cases[i], i, "off") for i in range(num_samples)]
    texts = sorted({text for p in params for text in adapter.texts_to_encode(p)})
    encoded = dict(zip(texts, adapter.encode_prompts(texts)))
    rows, latents, timesteps = [], [], []
    for p in params:
        sample_rows = adapter.row_conditioning(p, encoded)
        sampler = adapter.new_sampler(p)
        generator = torch.Generator().manual_seed(p.seed)
        noise = adapter.initial_latents(p, sampler, generator)
        for row in sample_rows:
            rows.append(row)
            latents.append(noise[0])
            timesteps.append(sampler.timesteps[step])
    lengths = [row["embeds"].shape[0] for row in rows]
    embeds = torch.zeros(len(rows), max(lengths), rows[0]["embeds"].shape[1])
    for index, row in enumerate(rows):
        embeds[index, : lengths[index]] = row["embeds"]
    uniform = len({tuple(x.shape) for x in latents}) == 1
    batch = ForwardBatch(
        torch.stack(latents) if uniform else latents,
        torch.stack(timesteps).float(),
        {"embeds": embeds},
        {"embeds": lengths} if len(set(lengths)) > 1 else {},
        membership=tuple(str(i) for i in range(len(params))),
    )
    return batch, [len(adapter.texts_to_encode(p)) for p in params]


def paths(adapter, batch, num_rows_per_sample):
    from batching.pipelines.contract import CachedSample
    from batching.pipelines.zimage import packed

    def diffusers_or_adapter():
        return adapter.forward(batch)

    def packed_forward():
        latents, t, captions = adapter._transformer_inputs(batch)
        layout, _ = adapter._layout(batch, latents)
        return adapter._predictions(batch, packed.forward(adapter.transformer, layout, latents, t, captions))

    def cached_none():
        samples = [CachedSample(n, None, True) for n in num_rows_per_sample]
        return adapter.forward_cached(batch, samples, may_gather=True).predictions

    def diffusers_forward():
        latents, t, captions = adapter._transformer_inputs(batch)
        return adapter._predictions(batch, adapter.transformer(latents, t, captions, return_dict=False)[0])

    return {
        "diffusers": diffusers_forward,
        "adapter.forward": diffusers_or_adapter,
        "packed.forward": packed_forward,
        "cached(all compute)": cached_none,
    }


def as_list(out):
    return list(out) if not isinstance(out, list) else out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from batching.model_loading import load_model

    adapter = load_model(MODEL, "cpu", "auto")
    batch, per_sample = make_batch(adapter, args.rows // 2)
    fns = paths(adapter, batch, per_sample)
    if args.only:
        fns = {k: v for k, v in fns.items() if k in args.only}
    with torch.inference_mode():
        reference = as_list(fns[next(iter(fns))]())
        for name, fn in fns.items():
            out = as_list(fn())
            diff = max((a - b).abs().max().item() for a, b in zip(out, reference))
            print(f"{name:24s} max |diff| vs first: {diff:.3g}  bit-identical: {diff == 0}")
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.reps):
            for name, fn in fns.items():
                start = time.thread_time()
                fn()
                times[name].append(time.thread_time() - start)
    for name, values in times.items():
        print(
            f"{name:24s} cpu ms per forward: min {1000 * min(values):7.2f}"
            f" median {1000 * statistics.median(values):7.2f}"
        )
    if args.profile:
        for name, fn in fns.items():
            with (
                torch.inference_mode(),
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
            ):
                for _ in range(5):
                    fn()
            print(f"=== {name} (5 forwards) ===")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
