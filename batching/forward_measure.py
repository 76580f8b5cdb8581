"""Measuring the denoiser's forward curve when the engine starts (`EngineConfig.measure_forward_curve`).

One sample of the model's defaults at the size the engine serves by (`size`: its native size, see
`batching.engine.serving_size`; a video family at most `MAX_CURVE_FRAMES` frames, so the measurement stays
seconds long) is started as any job is (`Encoder.start_now`), and its rows are
repeated to fill forwards of each row bucket (`batching.forward_curve.row_buckets`) through the real
input path (`InputBatch`); each bucket runs once untimed (the first call of a shape pays for kernel
selection, allocation and, with a compiled denoiser, compilation) and `repeats` times timed, waiting for
the device. A bucket that runs out of memory ends the curve there. With an eager denoiser every other
sample count then runs once too, so no job that joins or leaves a running group meets a cold shape. Runs on
the loop thread before its first job (`DiffusionEngine._start_up`): nothing else uses the model meanwhile.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from batching.encoder import Encoder
from batching.forward_curve import ForwardCurve, row_buckets
from batching.input_batch import InputBatch
from batching.oom import free_memory, is_out_of_memory
from batching.pipelines.contract import PipelineAdapter
from batching.sample import make_samples
from batching.sample_tensors import SampleTensors
from core.errors import BatchingError
from core.families import FAMILIES
from core.params import GenerationParams

logger = logging.getLogger(__name__)

MAX_CURVE_FRAMES = 17  # a video family's curve is measured at most this long (its token count scales the budget)
CURVE_JOB_ID = "stepwise-forward-curve"


def measure_forward_curve(
    adapter: PipelineAdapter,
    encoder: Encoder,
    max_num_seqs: int,
    *,
    size: tuple[int, int] | None = None,
    repeats: int = 2,
    warm_every_count: bool = True,
) -> ForwardCurve | None:
    """The curve, or None where the model's defaults cannot start a sample (an edit model needs an image).
    `warm_every_count`: then one untimed forward at each other count of the sample's rows up to `max_num_seqs`
    samples (an eager denoiser's first forward at a new batch size pays for kernel and plan selection: a
    group whose jobs come and go runs at every count; a compiled one is padded to the buckets)."""
    started = time.perf_counter()
    spec = FAMILIES[adapter.family]
    height, width = size or adapter.native_size
    try:
        params = GenerationParams(
            model=adapter.model,
            prompt="a forward curve",
            seed=0,
            height=height,
            width=width,
            num_frames=min(spec.default_num_frames, MAX_CURVE_FRAMES),
        )
        params.validate(adapter.family)
        adapter.check_params(params)
    except BatchingError as e:
        logger.warning("no forward curve: the model's defaults make no job (%s)", e)
        return None
    sample = make_samples(CURVE_JOB_ID, params, spec)[0]
    result = encoder.start_now([sample])
    if not result.samples:
        logger.warning("no forward curve: its sample did not start (%s)", result.failed)
        return None
    tensors = result.samples[0]
    points: list[tuple[int, float]] = []
    for rows in row_buckets(adapter.max_rows_per_sample * max_num_seqs, tensors.num_rows):
        copies = -(-rows // tensors.num_rows)
        try:
            seconds = _time_forward(adapter, [tensors] * copies, repeats)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            free_memory(adapter.device)
            logger.warning("the forward curve stops below %d rows: out of memory", rows)
            break
        points.append((copies * tensors.num_rows, seconds))
    if not points:
        return None
    if warm_every_count:
        _warm(adapter, tensors, points, max_num_seqs)
    tokens_per_row = spec.tokens_per_row(params.height, params.width, params.num_frames)
    curve = ForwardCurve(tuple(points), tokens_per_row)
    logger.info(
        "forward curve in %.1fs: %s rows/s, knee at %d rows",
        time.perf_counter() - started,
        curve.as_dict()["rows_per_second"],
        curve.knee_rows,
    )
    return curve


@torch.inference_mode()
def _warm(adapter: PipelineAdapter, tensors: SampleTensors, points: list[tuple[int, float]], max_num_seqs: int) -> None:
    """One forward at every sample count not measured, up to the most that fitted."""
    measured = {rows for rows, _ in points}
    for copies in range(1, max_num_seqs + 1):
        rows = copies * tensors.num_rows
        if rows > points[-1][0]:
            break
        if rows not in measured:
            adapter.forward(InputBatch(adapter).prepare([tensors] * copies))
    _wait(adapter.device)


@torch.inference_mode()
def _time_forward(adapter: PipelineAdapter, samples: list, repeats: int) -> float:
    batch = InputBatch(adapter).prepare(samples)
    adapter.forward(batch)
    _wait(adapter.device)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        adapter.forward(batch)
        _wait(adapter.device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
