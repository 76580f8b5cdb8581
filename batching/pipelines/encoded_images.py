"""The last few encodings of input images (FLUX.2's reference images, Qwen-Image-Edit's edit images, Wan's first
frames), kept by key: a job's several outputs, or jobs editing one picture, share one encoder pass, the costly part
(a video's VAE encode, or a ~1024x1024 edit image's)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Encoded = TypeVar("Encoded")


class EncodedImages(Generic[Encoded]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # encodings kept; the least recently used beyond it are dropped
        self._encoded: OrderedDict[Hashable, Encoded] = OrderedDict()
        self._lock = threading.Lock()  # engines of one model in one process may share one (Qwen-Image-Edit's)

    def get(self, key: Hashable, encode: Callable[[], Encoded]) -> Encoded:
        """The encoding kept under `key`, else `encode()`'s, then kept."""
        with self._lock:
            if key in self._encoded:
                self._encoded.move_to_end(key)
                return self._encoded[key]
        encoded = encode()
        with self._lock:
            self._encoded[key] = encoded
            while len(self._encoded) > self.capacity:
                self._encoded.popitem(last=False)
        return encoded
