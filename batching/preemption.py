"""Ranking samples and preemption at step boundaries. Torch-free; the scheduler calls it.

A sample's rank, best first: its priority (high, normal, low); among one priority, its slack, the
time left to its `complete_by` minus its estimated remaining work (`StepTimes`: measured seconds per
engine iteration times the steps it has left; no `complete_by`: infinite slack); then its tenant's
running samples (fewer first, so one tenant's samples waiting in the engine do not hold another's
back); then arrival.

When a waiting sample outranks running ones and there is no room for it (slots or tokens), the
scheduler pauses running samples at the step boundary, worst-ranked first, until it fits
(`samples_to_pause`). A paused sample keeps its latents and sampler state in the runner; it waits
like any other and resumes where it stopped when admitted again. A waiting sample outranks a running
one when its priority is higher, or, at one priority, when it has a `complete_by` and its slack is
smaller than the running one's by more than the running one's remaining work (a sample without a
`complete_by` has infinite slack), so two samples with deadlines do not swap back and forth at every
step. The starvation bound holds: a sample overtaken `max_wait_iterations` times is never paused
again and goes first (`batching.admission`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

EMA_WEIGHT = 0.2  # of the newest iteration in the running estimate


class Ranked(Protocol):
    sample_id: str
    tenant: str
    priority_rank: int  # 0 high, 1 normal, 2 low
    complete_by: float | None  # unix seconds
    num_steps: int
    num_steps_done: int
    num_iterations_overtaken: int
    cost: int


@dataclass(slots=True)
class StepTimes:
    """Seconds one engine iteration takes (every running sample steps once), measured as they run."""

    seconds_per_iteration: float = 0.0  # 0 until the first iteration is measured

    def observe(self, seconds: float) -> None:
        if self.seconds_per_iteration == 0.0:
            self.seconds_per_iteration = seconds
        else:
            self.seconds_per_iteration += EMA_WEIGHT * (seconds - self.seconds_per_iteration)

    def remaining(self, sample: Ranked) -> float:
        """Estimated seconds of work the sample has left."""
        return (sample.num_steps - sample.num_steps_done) * self.seconds_per_iteration

    def slack(self, sample: Ranked, now: float) -> float:
        """Seconds to spare before its complete_by once its remaining work is done (inf without one)."""
        if sample.complete_by is None:
            return math.inf
        return sample.complete_by - now - self.remaining(sample)


def rank_key(sample: Ranked, now: float, step_times: StepTimes, running_by_tenant: Counter) -> tuple:
    """Sort key, best first (arrival breaks ties: sort a list already in arrival order)."""
    return (sample.priority_rank, step_times.slack(sample, now), running_by_tenant[sample.tenant])


def outranks(waiting: Ranked, running: Ranked, now: float, step_times: StepTimes) -> bool:
    """Whether `waiting` may pause `running` to take its place."""
    if waiting.priority_rank != running.priority_rank:
        return waiting.priority_rank < running.priority_rank
    if waiting.complete_by is None:
        return False
    waiting_slack = step_times.slack(waiting, now)
    return waiting_slack + step_times.remaining(running) < step_times.slack(running, now)


def samples_to_pause(
    waiting: Sequence[Ranked],
    running: Sequence[Ranked],
    *,
    num_free: int,
    tokens_free: float,
    now: float,
    step_times: StepTimes,
    max_wait_iterations: int,
) -> list[Ranked]:
    """Running samples to pause so that the best-ranked waiting ones fit. `waiting` is in walk order
    (best first). Samples at the starvation bound are never paused."""
    candidates = sorted(
        (sample for sample in running if sample.num_iterations_overtaken < max_wait_iterations),
        key=lambda sample: (-sample.priority_rank, -step_times.slack(sample, now), sample.num_steps_done),
    )  # worst first
    paused: list[Ranked] = []
    for sample in waiting:
        if num_free >= 1 and sample.cost <= tokens_free:
            num_free -= 1
            tokens_free -= sample.cost
            continue
        slots, tokens, chosen = num_free, tokens_free, []
        for victim in candidates:
            if slots >= 1 and sample.cost <= tokens:
                break
            if not outranks(sample, victim, now, step_times):
                break  # worst first: it outranks none of the rest either
            chosen.append(victim)
            slots += 1
            tokens += victim.cost
        if not (slots >= 1 and sample.cost <= tokens):
            break  # it cannot get in; nothing walked after it goes ahead of it by pausing
        paused += chosen
        candidates = [victim for victim in candidates if victim not in chosen]
        num_free, tokens_free = slots - 1, tokens - sample.cost
    return paused
