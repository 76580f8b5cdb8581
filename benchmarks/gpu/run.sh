#!/usr/bin/env bash
# The prepared GPU run: installs the carried wheels if diffusers is missing, then runs a suite.
#
#   benchmarks/gpu/fetch_wheels.sh                    # here, with network: fills benchmarks/gpu/wheels/
#   benchmarks/gpu/run.sh [OUT_DIR]                   # on the GPU machine: the serving suite (issue 42)
#   benchmarks/gpu/run.sh --suite gpu [OUT_DIR]       # the first GPU suite (forward ceilings, invariance, overlap)
#   benchmarks/gpu/run.sh [--suite gpu] --dry-run DIR # tiny sizes on the CPU (what `make test` runs)
#
# OUT_DIR defaults to $OUT, else benchmarks/results/gpu. The serving suite (`python -m benchmarks.gpu.serving`)
# writes serving.json, serving.md and serving_details.json there (after each family), in about 8-9 minutes on one
# H100 or H200 (a family starts only if its estimated time is left of --budget-seconds, 520 by default:
# SERVING_BUDGET overrides it; SERVING_FAMILIES=flux,wan runs those alone); the first suite runs
# `stepwise bench --suite gpu` (gpu_results.json, gpu_summary.md). Both run from this tree without installing the
# project: the machine lacks the service's dependencies, which the suites do not need.
#
# The wheels folder is ignored by git: a device run that copies the work tree must carry it (the project's device
# tool: command `benchmarks/gpu/run.sh "$OUT"`, carry `benchmarks/gpu/wheels`, timeout 600; docs/benchmarks.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
suite=serving
if [[ "${1:-}" == "--suite" ]]; then suite=$2; shift 2; fi
args=()
if [[ "${1:-}" == "--dry-run" ]]; then args+=(--dry-run); shift; fi
out=${1:-${OUT:-$root/benchmarks/results/gpu}}
# find_spec, not an import: importing diffusers costs seconds, and the suite imports it anyway.
if ! "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("diffusers") is None)'; then
    # With its dependencies where the machine's satisfy them; otherwise diffusers and its pure-Python helpers alone
    # (transformers already brings huggingface_hub, requests, regex, safetensors).
    "$python" -m pip install --quiet --no-index --find-links "$here/wheels" diffusers ||
        "$python" -m pip install --quiet --no-index --no-deps --find-links "$here/wheels" \
            diffusers importlib_metadata zipp
fi
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
case "$suite" in
    serving)
        exec "$python" -m benchmarks.gpu.serving "${args[@]}" --budget-seconds "${SERVING_BUDGET:-520}" \
            --families "${SERVING_FAMILIES:-}" --out "$out" ;;
    gpu)
        exec "$python" -m stepwise_cli.main bench --suite gpu "${args[@]}" --out "$out" ;;
    *)
        echo "unknown suite $suite (serving or gpu)" >&2
        exit 2 ;;
esac
