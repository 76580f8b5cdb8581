"""Admission policies: which waiting samples join the running set this iteration. Torch-free.

A policy sees the waiting samples in arrival order and the running ones, and returns the
samples to admit (at most `num_free`); the scheduler moves them and plans their steps.

- `GroupedAdmission` (policy "default"): the running set holds up to `max_num_groups`
  compatibility keys, one forward each per iteration. The queue is walked in one order:
  first the samples that reached the starvation bound, in arrival order, then the others
  by priority (high, normal, low) and arrival within a priority. Every sample that fits
  is admitted (capacity left, and its key already runs or another group is allowed); a
  sample that does not fit is passed over and does not block those behind it.
  Starvation bound: a waiting sample is overtaken (a sample that arrived later admitted
  while it waits, whatever the reason: key or priority) in at most `max_wait_iterations`
  iterations. After that it is walked before every sample that has not reached the
  bound, and when it does not fit nothing behind it is admitted, so it is admitted at
  the latest once every sample running or at the bound ahead of it has left; a low
  priority sample is passed over by higher ones for at most that many iterations too.
  `max_wait_iterations=0` gives arrival-order admission with several groups.
- `FifoAdmission` (policy "fifo", the reference behaviour kept for comparison): strict
  arrival order and one key running at once (the wave); as in the reference, that key
  also holds the guidance scale; priorities are ignored. An incompatible head admits
  nothing until the running set drains; then the head's key becomes the wave.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from batching.scheduler import ScheduledSample


class AdmissionPolicy(Protocol):
    max_num_groups: int  # distinct compatibility keys the running set may hold

    def admit(
        self, waiting: Sequence[ScheduledSample], running: Sequence[ScheduledSample], num_free: int
    ) -> list[ScheduledSample]:
        """The waiting samples to admit now, at most `num_free`, in admission order."""
        ...


class GroupedAdmission:
    def __init__(self, max_num_groups: int, max_wait_iterations: int) -> None:
        self.max_num_groups = max_num_groups
        self.max_wait_iterations = max_wait_iterations

    def admit(
        self, waiting: Sequence[ScheduledSample], running: Sequence[ScheduledSample], num_free: int
    ) -> list[ScheduledSample]:
        running_keys = {sample.key for sample in running}
        bound = self.max_wait_iterations

        def walk_order(arrival: int) -> tuple[int, int, int]:
            sample = waiting[arrival]
            if sample.num_iterations_overtaken >= bound:
                return (0, 0, arrival)  # at the bound: before everyone else, in arrival order
            return (1, sample.priority_rank, arrival)

        admitted: list[int] = []  # arrival indexes
        for arrival in sorted(range(len(waiting)), key=walk_order):
            if len(admitted) == num_free:
                break
            sample = waiting[arrival]
            if sample.key in running_keys or len(running_keys) < self.max_num_groups:
                running_keys.add(sample.key)
                admitted.append(arrival)
                continue
            if sample.num_iterations_overtaken >= bound:
                break  # starvation bound: hold every sample behind it back until it is admitted
        if admitted:  # each waiting sample that arrived before an admitted one was overtaken, once per iteration
            latest, taken = max(admitted), set(admitted)
            for arrival in range(latest):
                if arrival not in taken:
                    waiting[arrival].num_iterations_overtaken += 1
        return [waiting[arrival] for arrival in admitted]


class FifoAdmission:
    max_num_groups = 1

    def admit(
        self, waiting: Sequence[ScheduledSample], running: Sequence[ScheduledSample], num_free: int
    ) -> list[ScheduledSample]:
        wave_key = _reference_key(running[0]) if running else None
        admitted: list[ScheduledSample] = []
        for sample in waiting:
            if len(admitted) == num_free:
                break
            wave_key = wave_key or _reference_key(sample)
            if _reference_key(sample) != wave_key:
                break
            admitted.append(sample)
        return admitted


def _reference_key(sample: ScheduledSample) -> tuple:
    """The reference design's key, which also holds the guidance setting."""
    return sample.key, sample.new_sample.params.guidance_scale
