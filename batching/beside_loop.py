"""What the decoder and the encoder share: work handed over by the loop thread, done on a worker
thread beside the denoise loop (on CUDA in a stream of its own) or inline, with the results picked
up by the loop without waiting.

A subclass hands its batches over with `_hand_over()`, implements `_work()` (the worker thread's
loop over `self._queue`, ending at `None`), `_run()` (one batch, which never raises: it fails the
batch's samples with the error instead) and `_failed()`; the loop takes results with `collect()`,
which drops the samples whose job ended meanwhile (`discard()`).

A worker thread that stops anyway (an error outside any batch) is not silent: the loop's next
`collect()` fails every sample it still held, naming the reason, `stop_reason` keeps it for the
engine's stats(), and the work goes on inline on the loop thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Collection
from typing import Any, Generic, TypeVar

import torch

from batching.pipelines.contract import PipelineAdapter

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


class BesideTheLoop(Generic[Result]):
    def __init__(
        self, model: PipelineAdapter, *, is_async: bool, thread_name: str, on_result: Callable[[], None]
    ) -> None:
        self.model = model
        self.is_async = is_async
        self.thread_name = thread_name
        self.pending: dict[str, Any] = {}  # sample_id -> what was handed over, not yet collected; loop thread only
        self.stop_reason: str | None = None  # why the worker thread stopped (set on it); None while it serves
        self._on_result = on_result  # called from the worker after each batch (the engine wakes its loop)
        self._results: list[Result] = []
        self._lock = threading.Lock()
        self._discarded: set[str] = set()  # loop thread only
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stream = torch.cuda.Stream(model.device) if is_async and model.device.type == "cuda" else None
        self._thread: threading.Thread | None = None
        if is_async:
            self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)
            self._thread.start()

    def has_results(self) -> bool:
        with self._lock:
            return bool(self._results) or (self._thread is not None and self.stop_reason is not None)

    def collect(self) -> list[Result]:
        """The batches done since the last call, without the discarded samples; never waits."""
        with self._lock:
            results, self._results = self._results, []
            reason = self.stop_reason if self._thread is not None else None
        if reason is not None:  # what the stopped thread held fails; its work goes on inline
            returned = {sample_id for result in results for sample_id in self._sample_ids(result)}
            stranded = [sample_id for sample_id in self.pending if sample_id not in returned]
            results.append(self._failed(stranded, f"the {self.thread_name} thread stopped: {reason}"))
            self.is_async, self._thread, self._stream, self._queue = False, None, None, queue.Queue()
        for result in results:
            sample_ids = self._sample_ids(result)
            for sample_id in sample_ids:
                self.pending.pop(sample_id, None)
            self._drop(result, self._discarded & sample_ids)
            self._discarded -= sample_ids
        return results

    def discard(self, sample_ids: Collection[str]) -> None:
        """Forget these samples when their results arrive (their job ended meanwhile)."""
        self._discarded.update(self.pending.keys() & set(sample_ids))

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _hand_over(self, items: dict[str, Any], batch: Any) -> None:
        """`items` (sample_id -> what of it was handed over) in `batch`: queued to the worker, or run inline."""
        self.pending.update(items)
        if self.is_async:
            self._queue.put(batch)
        else:
            self._finish(self._run(batch))

    def _finish(self, result: Result) -> None:
        with self._lock:
            self._results.append(result)
        self._on_result()

    def _serve(self) -> None:
        try:
            self._work()
        except BaseException as e:
            logger.exception("the %s thread stopped; its work goes on on the loop thread", self.thread_name)
            with self._lock:
                self.stop_reason = f"{type(e).__name__}: {e}"
            self._on_result()

    def _work(self) -> None:
        raise NotImplementedError

    def _run(self, batch: Any) -> Result:
        raise NotImplementedError

    def _failed(self, sample_ids: list[str], message: str) -> Result:
        """A result that fails these samples with `message`."""
        raise NotImplementedError

    def _sample_ids(self, result: Result) -> set[str]:
        """The samples a result reports, started or decoded or failed."""
        raise NotImplementedError

    def _drop(self, result: Result, sample_ids: set[str]) -> None:
        """Remove these (discarded) samples from a result."""
        raise NotImplementedError
