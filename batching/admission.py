"""Admission policies: which waiting samples join the running set this iteration. Torch-free.

A policy sees the waiting samples in arrival order and the running ones, and returns the
samples to admit: at most `num_free` of them, whose costs (rows x latent tokens) fit in
`tokens_free`. A sample costing more than the whole budget fits only an empty running
set (it runs alone rather than never).

- `GroupedAdmission` (policy "default"): the running set holds up to `max_num_groups`
  compatibility keys, one forward each per iteration. Groups are filled before new ones
  open: the queue is walked (samples at the starvation bound first, in arrival order; then
  the others by rank, `batching.preemption.rank_key`: priority, high, normal, low; within a
  priority least slack to a `complete_by`, then the tenant with fewer running samples; then
  arrival) first for
  samples of a key already running (or, with nothing running, the first one's key), then
  again for the rest, each admitted if
  it fits (slots, tokens, and its key runs or another group is allowed). So a two-size
  burst of a UNet family runs full forwards of one size, then of the other, instead of
  two half-full forwards each step (convolutions cannot mix sizes in one forward). A
  sample that does not fit is passed over and does not block those behind it.
  Starvation bound: a waiting sample is overtaken (a later arrival admitted before it, for
  its key or its priority) in at most `max_wait_iterations` iterations. After that, nothing
  walked after it (no later arrival, no sample below the bound) is admitted before it,
  so it is admitted at the latest once every sample running or
  queued ahead of it at that moment has left. `max_wait_iterations=0` gives
  arrival-order admission with several groups.
- `FifoAdmission` (policy "fifo", the reference behaviour kept for comparison): strict
  arrival order and one key running at once (the wave); as in the reference, that key
  also holds the guidance scale; priorities are ignored. An incompatible head (or one over
  the token budget) admits nothing until the running set drains; then the head's key becomes the wave.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from batching.sample import Sample

Rank = Callable[["Sample"], tuple]  # a sample -> its rank, smaller first
Samples = Sequence["Sample"]  # in arrival order


class AdmissionPolicy(Protocol):
    max_num_groups: int  # distinct compatibility keys the running set may hold

    def admit(
        self, waiting: Samples, running: Samples, num_free: int, tokens_free: float, rank: Rank | None = None
    ) -> list[Sample]:
        """The waiting samples to admit now, in admission order: at most `num_free`, costing at most
        `tokens_free` together (but see `_fits`). `rank(sample)`: its rank, best first (default: priority)."""
        ...


class GroupedAdmission:
    def __init__(self, max_num_groups: int, max_wait_iterations: int) -> None:
        self.max_num_groups = max_num_groups
        self.max_wait_iterations = max_wait_iterations

    def admit(
        self, waiting: Samples, running: Samples, num_free: int, tokens_free: float, rank: Rank | None = None
    ) -> list[Sample]:
        eligible = sorted(waiting, key=self._walk_order(waiting, rank))  # arrival order, bound and rank first
        while True:  # narrow to the first overdue sample left out, until none behind one is admitted
            admitted = self._fill(eligible, running, num_free, tokens_free)
            admitted_ids = {sample.sample_id for sample in admitted}
            overdue = next(
                (
                    i
                    for i, sample in enumerate(eligible)
                    if sample.sample_id not in admitted_ids
                    and sample.num_iterations_overtaken >= self.max_wait_iterations
                ),
                None,
            )
            if overdue is None or not any(sample.sample_id in admitted_ids for sample in eligible[overdue:]):
                break
            eligible = eligible[: overdue + 1]  # nothing walked after it (later at the bound, or not at it) goes first
        _count_overtaken(waiting, admitted_ids)
        return admitted

    def _walk_order(self, waiting: Sequence[Sample], rank: Rank | None):
        """Samples at the starvation bound first, in arrival order; then the others by rank
        (priority by default) and arrival within a rank."""
        arrival = {sample.sample_id: index for index, sample in enumerate(waiting)}
        rank = rank or _priority

        def order(sample: Sample) -> tuple:
            if sample.num_iterations_overtaken >= self.max_wait_iterations:
                return (0, (), arrival[sample.sample_id])
            return (1, rank(sample), arrival[sample.sample_id])

        return order

    def _fill(self, eligible: Samples, running: Samples, num_free: int, tokens_free: float) -> list[Sample]:
        """Running keys' groups first (the head's key when nothing runs), then new groups, each in walk order."""
        keys = {sample.key for sample in running}
        admitted: list[Sample] = []
        admitted_ids: set[str] = set()
        for is_filling_pass in (True, False):
            for sample in eligible:
                if len(admitted) == num_free:
                    break
                if sample.sample_id in admitted_ids or (is_filling_pass and keys and sample.key not in keys):
                    continue
                if sample.key not in keys and len(keys) >= self.max_num_groups:
                    continue
                if not _fits(sample, tokens_free, is_empty=not running and not admitted):
                    continue
                keys.add(sample.key)
                admitted.append(sample)
                admitted_ids.add(sample.sample_id)
                tokens_free -= sample.cost
        return admitted


class FifoAdmission:
    max_num_groups = 1

    def admit(
        self, waiting: Samples, running: Samples, num_free: int, tokens_free: float, rank: Rank | None = None
    ) -> list[Sample]:  # rank is ignored: the reference admits in arrival order
        wave_key = _reference_key(running[0]) if running else None
        admitted: list[Sample] = []
        for sample in waiting:
            if len(admitted) == num_free:
                break
            wave_key = wave_key or _reference_key(sample)
            is_empty = not running and not admitted
            if _reference_key(sample) != wave_key or not _fits(sample, tokens_free, is_empty=is_empty):
                break
            admitted.append(sample)
            tokens_free -= sample.cost
        return admitted


def _priority(sample: Sample) -> tuple:
    return (sample.priority_rank,)


def _fits(sample: Sample, tokens_free: float, *, is_empty: bool) -> bool:
    """Whether the sample's cost fits the budget left; one over the whole budget fits an empty running set."""
    return sample.cost <= tokens_free or is_empty


def _count_overtaken(waiting: Sequence[Sample], admitted_ids: set[str]) -> None:
    """Each sample left waiting that a later arrival was admitted before counts one more overtaking."""
    is_later_admitted = False
    for sample in reversed(waiting):
        if sample.sample_id in admitted_ids:
            is_later_admitted = True
        elif is_later_admitted:
            sample.num_iterations_overtaken += 1


def _reference_key(sample: Sample) -> tuple:
    """The reference design's key, which also holds the guidance setting."""
    return sample.key, sample.params.guidance_scale
