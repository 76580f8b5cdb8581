"""A denoiser forward's time against its rows, and the knee where more rows stop paying. Torch-free.

The engine measures it once at start (`batching.forward_measure`, at the model's native size); the
scheduler admits up to the knee (`SchedulerConfig.forward_curve`). A forward's rows share its time: more
rows raise throughput (rows a second) while the device has room, and past that they only lengthen
every running job's steps. Walking the measured row counts upwards, the knee is the last one before a
step up that raises rows a second by less than `KNEE_MIN_GAIN` per doubling of the rows: beyond it, one
more row buys little throughput and costs every running job latency. (The H200's SD 1.5 at 512x512:
26.7, 58, 161, 270, 320 rows/s at 1, 2, 4, 8, 16 rows, every doubling at least 18% more: no knee below
16; SDXL at 1024x1024: 11.5, 34, 52, 55, 56 rows/s: the knee is 8 rows, four CFG jobs.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KNEE_MIN_GAIN = 0.05  # a doubling of the rows must raise rows a second by at least this fraction to be worth it


def row_buckets(max_rows: int, rows_per_sample: int = 1) -> tuple[int, ...]:
    """Row counts to measure (and, with a compiled denoiser, to pad forwards to): `rows_per_sample` times
    1, 2, 4, ... samples, and the most rows a forward can carry."""
    buckets = []
    samples = 1
    while samples * rows_per_sample < max_rows:
        buckets.append(samples * rows_per_sample)
        samples *= 2
    return (*buckets, max_rows)


@dataclass(frozen=True)
class ForwardCurve:
    points: tuple[tuple[int, float], ...]  # (rows, seconds of one forward), rows ascending
    tokens_per_row: int  # latent tokens of one measured row (the model's native size): the token budget's unit

    def __post_init__(self) -> None:
        rows = [count for count, _ in self.points]
        if not rows or rows != sorted(set(rows)) or rows[0] < 1:
            raise ValueError(f"a forward curve needs ascending row counts from 1 up (got {rows})")
        if any(not seconds > 0 for _, seconds in self.points):
            raise ValueError("a forward curve's seconds must be positive")
        if self.tokens_per_row < 1:
            raise ValueError(f"tokens_per_row must be at least 1 (got {self.tokens_per_row})")

    @property
    def knee_rows(self) -> int:
        """The most rows worth one forward (see the module's docstring)."""
        knee_rows, knee_seconds = self.points[0]
        for rows, seconds in self.points[1:]:
            gain = (rows / seconds) / (knee_rows / knee_seconds)
            if gain ** (1 / math.log2(rows / knee_rows)) < 1 + KNEE_MIN_GAIN:
                break
            knee_rows, knee_seconds = rows, seconds
        return knee_rows

    @property
    def token_budget(self) -> int:
        """The knee in the scheduler's unit: rows x latent tokens."""
        return self.knee_rows * self.tokens_per_row

    def as_dict(self) -> dict:
        return {
            "seconds_by_rows": {rows: round(seconds, 6) for rows, seconds in self.points},
            "rows_per_second": {rows: round(rows / seconds, 2) for rows, seconds in self.points},
            "knee_rows": self.knee_rows,
            "tokens_per_row": self.tokens_per_row,
            "token_budget": self.token_budget,
        }
