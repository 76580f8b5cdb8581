"""Repeated, interleaved runs of one bench workload: medians that the machine's load swings less.

    python -m benchmarks.mixed_size_ab --model builtin:tiny-flux --workload mixed_size [--rounds 3]

`stepwise bench` runs each variant once; on a shared machine one run's ratio can move by
20% with the load. This opens static, fifo and default once (as `stepwise bench` does, at
its full size: 16 jobs, 20 steps, capacity 8, the engines at static batching's capacity in
tokens), then runs the workload on each in turn, `--rounds` times, and prints each
variant's median images/s and tokens/s and the median ratios default / static and
default / fifo. With `--workload mixed_size` it also runs `mixed_size_uniform` and prints
the mixed / uniform tokens-per-second ratio of the default policy.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks import workloads
from benchmarks.run import SIZES
from benchmarks.variants import EngineVariant, StaticBatchVariant, variant_specs
from core.families import FAMILIES

BUILDERS = {"two_resolution": workloads.two_resolution, "mixed_size": workloads.mixed_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-flux")
    parser.add_argument("--workload", choices=sorted(BUILDERS), default="mixed_size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    size = SIZES["full"]
    shape = workloads.JobShape(model=args.model, num_steps=size.num_steps, size=size.size, second_size=size.second_size)
    suite = [BUILDERS[args.workload](shape, size.num_jobs["builtin:tiny"])]
    if args.workload == "mixed_size":
        suite.append(workloads.mixed_size_uniform(shape, suite[0]))
    sizes = sorted({s for workload in suite for s in workload.sizes})
    family = FAMILIES[shape.family]
    max_num_tokens = size.max_num_seqs * max(family.sample_cost(h, w, shape.guidance_scale) for h, w in sizes)
    specs = {spec.name: spec for spec in variant_specs(size.max_num_seqs, max_num_tokens)}
    variants: dict[str, EngineVariant | StaticBatchVariant] = {
        "static": StaticBatchVariant(specs["static"], args.model, "cpu", args.threads, 0.3),
        "fifo": EngineVariant(specs["fifo"], args.model, "cpu", args.threads, 1),
        "default": EngineVariant(specs["default"], args.model, "cpu", args.threads, 1),
    }
    for variant in variants.values():
        variant.open(sizes)
    tokens_per_second: dict[tuple[str, str], list[float]] = {}
    for round_index in range(args.rounds):
        for workload in suite:
            for name, variant in variants.items():
                record = variant.run(workload)
                rate = workloads.total_tokens(workload) / record.wall_seconds
                tokens_per_second.setdefault((workload.name, name), []).append(rate)
                images_per_second = workload.num_jobs / record.wall_seconds
                print(
                    f"round {round_index + 1} {workload.name:<18} {name:<8} {images_per_second:5.2f} "
                    f"images/s  load {record.load_average_end[0]:.1f}",
                    flush=True,
                )
    for variant in variants.values():
        variant.close()
    median = {key: statistics.median(values) for key, values in tokens_per_second.items()}
    name = suite[0].name
    print(f"{args.model} {name}, median of {args.rounds} interleaved rounds:")
    print(
        f"  default / static {median[(name, 'default')] / median[(name, 'static')]:.2f}x, "
        f"default / fifo {median[(name, 'default')] / median[(name, 'fifo')]:.2f}x"
    )
    if len(suite) > 1:
        for variant_name in variants:
            ratio = median[(name, variant_name)] / median[(suite[1].name, variant_name)]
            print(f"  {variant_name}: mixed / uniform tokens per second {ratio:.2f}x")


if __name__ == "__main__":
    main()
