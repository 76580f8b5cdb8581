"""Out of memory is not a job failure: split the work, retry the halves, remember what fitted.

A group forward (or a decode batch) that raises an out-of-memory error is retried in
two halves, each half again if it still does not fit, down to one sample; only a
sample that does not fit even alone fails, with a message that says so. The largest
row count that fitted after a split is remembered per compatibility key (`RowCaps`):
later forwards of that key are cut into chunks of at most that many rows at once (no
repeated failure every step), and the scheduler is told the matching sample count so it
admits no more of that key meanwhile. The cap lasts until memory frees up, which this
module takes to be the moment the key's group drains (its buffers and activations are
gone then); the runner and the scheduler drop it at that same moment.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError, or an allocator error that says so (some backends raise a plain RuntimeError)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def free_memory(device: torch.device) -> None:
    """Give back what the failed attempt held: unreferenced tensors and, on CUDA, the allocator's cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class SplitOutcome(Generic[Item, Result]):
    """What running `items` chunk by chunk gave: results of the chunks that ran, errors of those that failed."""

    results: list[tuple[list[Item], Result]] = field(default_factory=list)  # chunk -> its result, in item order
    failed: list[tuple[Item, BaseException]] = field(default_factory=list)  # items that did not fit even alone
    num_splits: int = 0  # out-of-memory errors that led to a split
    largest_fit: int = 0  # most rows run at once after the first out-of-memory error (0: no error or none fitted)


def run_splitting(
    chunks: Sequence[list[Item]],
    run: Callable[[list[Item]], Result],
    *,
    rows_of: Callable[[list[Item]], int],
    device: torch.device,
) -> SplitOutcome[Item, Result]:
    """Run each chunk; on an out-of-memory error free memory and retry its halves, down to one item.

    Any other exception propagates: it is the caller's to contain.
    """
    outcome: SplitOutcome[Item, Result] = SplitOutcome()
    pending = list(chunks)
    while pending:
        chunk = pending.pop(0)
        try:
            result = run(chunk)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            free_memory(device)
            if len(chunk) == 1:
                outcome.failed.append((chunk[0], error))
                continue
            outcome.num_splits += 1
            middle = len(chunk) // 2
            logger.warning(
                "out of memory at %d rows; retrying as %d + %d items", rows_of(chunk), middle, len(chunk) - middle
            )
            pending[:0] = [chunk[:middle], chunk[middle:]]
            continue
        outcome.results.append((chunk, result))
        if outcome.num_splits:
            outcome.largest_fit = max(outcome.largest_fit, rows_of(chunk))
    return outcome


def alone_message(what: str, num_rows: int, error: BaseException) -> str:
    return (
        f"out of memory: {what} does not fit on the device even alone ({num_rows} rows); "
        f"{type(error).__name__}: {error}"
    )


class RowCaps(Generic[Item]):
    """Per key: the most rows a forward may carry after an out-of-memory split (absent: no cap)."""

    def __init__(self) -> None:
        self.rows_by_key: dict[object, int] = {}

    def chunks(self, key: object, items: list[Item], rows_of_item: Callable[[Item], int]) -> list[list[Item]]:
        """`items` in order, cut so that no chunk holds more than the key's cap (one chunk when uncapped)."""
        cap = self.rows_by_key.get(key)
        if cap is None:
            return [items]
        chunks: list[list[Item]] = [[]]
        rows = 0
        for item in items:
            if chunks[-1] and rows + rows_of_item(item) > cap:
                chunks.append([])
                rows = 0
            chunks[-1].append(item)
            rows += rows_of_item(item)
        return chunks

    def lower(self, key: object, num_rows: int) -> None:
        if num_rows > 0:
            self.rows_by_key[key] = min(num_rows, self.rows_by_key.get(key, num_rows))

    def keep_only(self, keys: Container[object]) -> None:
        """Drop the caps of keys whose group drained (memory freed up)."""
        for key in [key for key in self.rows_by_key if key not in keys]:
            del self.rows_by_key[key]
