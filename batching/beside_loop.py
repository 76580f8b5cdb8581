"""What the decoder and the encoder share: work handed over by the loop thread, done on a worker
thread beside the denoise loop (on CUDA in a stream of its own) or inline, with the results picked
up by the loop without waiting.

A subclass queues its batches with `_hand_over()` (or does them inline), implements `_work()`
(the worker thread's loop over `self._queue`, ending at `None`) and reports each result through
`_finish()`; the loop takes them with `_take_results()` and drops the samples whose job ended
meanwhile, which it records with `_discarded`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from batching.pipelines.contract import PipelineAdapter

Result = TypeVar("Result")


class BesideTheLoop(Generic[Result]):
    def __init__(
        self, model: PipelineAdapter, *, is_async: bool, thread_name: str, on_result: Callable[[], None]
    ) -> None:
        self.model = model
        self.is_async = is_async
        self._on_result = on_result  # called from the worker after each batch (the engine wakes its loop)
        self._results: list[Result] = []
        self._lock = threading.Lock()
        self._discarded: set[str] = set()  # loop thread only
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stream = torch.cuda.Stream(model.device) if is_async and model.device.type == "cuda" else None
        self._thread: threading.Thread | None = None
        if is_async:
            self._thread = threading.Thread(target=self._work, name=thread_name, daemon=True)
            self._thread.start()

    def has_results(self) -> bool:
        with self._lock:
            return bool(self._results)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _take_results(self) -> list[Result]:
        with self._lock:
            results, self._results = self._results, []
        return results

    def _finish(self, result: Result) -> None:
        with self._lock:
            self._results.append(result)
        self._on_result()

    def _work(self) -> None:
        raise NotImplementedError
