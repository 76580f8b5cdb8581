"""The step scheduler: which samples run in the next denoise iteration, grouped by key.

Torch-free; the engine loop thread owns it (it is not thread-safe). Samples enter the
waiting queue in arrival order, are admitted into the running set by the admission
policy (`batching.admission`), take one denoise step per iteration in the forward of
their compatibility key, and leave by finishing, failing or being aborted.

Guarantees under every policy:
- At most `max_num_seqs` samples run at once, in at most the policy's `max_num_groups`
  groups; nobody is admitted while admission is paused.
- The running samples' costs (rows x latent tokens, `FamilySpec.sample_cost`) sum to at
  most the token budget (`max_num_tokens`, lowered to the knee of the measured forward curve when
  there is one: `batching.forward_curve`), except a sample that costs more than the whole budget: it is
  admitted only into an empty running set and runs alone, so it cannot starve.
- Each plan lists every running sample exactly once, in the group of its key; samples
  with different step counts or at different current steps share a group.
- A sample that left the running set is never in a later plan's groups. The runner
  drops finished and failed samples itself; a running sample that is aborted has its id
  in `aborted_sample_ids` of exactly one plan, the next one.
- Once every sample has finished, failed or been aborted and that plan was taken, no
  per-sample state remains.
- A sample leaves the running set when its last step ran (`denoised_sample_ids`): its
  decode runs beside the loop and does not hold a running slot.
- After an out-of-memory split the runner reports the most samples of a key that fit in
  one forward (`admission_caps`); no sample of that key is admitted while that many run.
  The cap is dropped once no sample of the key runs (the group drained: memory freed).

Each sample carries its job's priority (high, normal, low), tenant and `complete_by`; the default
policy admits by rank (priority, then least slack, then the tenant with fewer running samples:
`batching.preemption`) within its starvation bound, and fifo ignores them (`batching.admission`).

Preemption (default policy, `preemption=True`): when a waiting sample outranks running ones and
there is no room for it, the lowest-ranked running samples are paused at this step boundary
(`batching.preemption.samples_to_pause`). A paused sample leaves the running set but not the
runner: its tensors stay there, it is in no plan's groups (so it does not step), it waits again in
its arrival place and resumes where it stopped when admitted again (it is not in `new_samples`
then). Paused samples resume while admission is paused too (a drain finishes what it started). A
sample overtaken `max_wait_iterations` times is never paused.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batching.admission import AdmissionPolicy, FifoAdmission, GroupedAdmission
from batching.forward_curve import ForwardCurve
from batching.plan import RunnerOutput, SchedulerPlan
from batching.preemption import StepTimes, rank_key, samples_to_pause
from batching.sample import Sample
from core.params import CompatibilityKey

POLICIES = ("default", "fifo")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8  # running capacity in samples; 1 = step-wise path without batching
    policy: str = "default"  # "default" or "fifo" (see batching.admission)
    max_num_groups: int = 2  # default policy: distinct keys running at once (one forward each per iteration)
    max_wait_iterations: int = 50  # default policy: times a waiting sample may be overtaken before blocking
    max_num_tokens: int | None = None  # token budget of the running set (rows x latent tokens); None: no budget
    preemption: bool = True  # default policy: pause running samples at a step boundary for ones that outrank them
    forward_curve: ForwardCurve | None = None  # the denoiser's measured time against its rows: admit up to its knee

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)} (got {self.policy!r})")
        for name, low in (("max_num_seqs", 1), ("max_num_groups", 1), ("max_wait_iterations", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low} (got {value!r})")
        tokens = self.max_num_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ValueError(f"max_num_tokens must be an integer >= 1 or None (got {tokens!r})")

    @property
    def token_budget(self) -> int | None:
        """What the running set's costs may sum to: `max_num_tokens`, lowered to the forward curve's knee."""
        if self.forward_curve is None:
            return self.max_num_tokens
        if self.max_num_tokens is None:
            return self.forward_curve.token_budget
        return min(self.max_num_tokens, self.forward_curve.token_budget)

    def admission_policy(self) -> AdmissionPolicy:
        if self.policy == "fifo":
            return FifoAdmission()
        return GroupedAdmission(self.max_num_groups, self.max_wait_iterations)


class Scheduler:
    def __init__(self, config: SchedulerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock  # unix seconds, as complete_by
        self.step_times = StepTimes()  # the engine reports each iteration's seconds (slack estimates)
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self._policy = config.admission_policy()
        self._waiting: dict[str, Sample] = {}  # sample_id -> sample, in arrival order
        self._running: dict[str, Sample] = {}  # sample_id -> sample, in admission order
        self._aborted_sample_ids: list[str] = []  # aborted while running, since the last plan
        self._admission_caps: dict[CompatibilityKey, int] = {}  # key -> most running samples (out-of-memory splits)
        self._is_admission_paused = False
        self._curve_view = config.forward_curve.as_dict() if config.forward_curve else None  # for snapshot()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_running_tokens(self) -> int:
        return sum(sample.cost for sample in self._running.values())

    @property
    def is_admission_paused(self) -> bool:
        return self._is_admission_paused

    def add(self, sample: Sample) -> None:
        """Queue a sample behind every sample already waiting."""
        if sample.sample_id in self._waiting or sample.sample_id in self._running:
            raise ValueError(f"sample {sample.sample_id!r} is already scheduled")
        assert sample.params.num_images == 1, "split multi-image jobs into one sample per image"
        assert sample.num_steps_done == 0 and sample.num_iterations_overtaken == 0, "a sample is scheduled once"
        sample.arrival = next(self._arrivals)
        self._waiting[sample.sample_id] = sample

    def abort(self, sample_id: str) -> bool:
        """Remove a waiting or running sample; False when it is unknown or already gone."""
        waiting = self._waiting.pop(sample_id, None)
        if waiting is not None:
            if waiting.is_paused:  # the runner holds its tensors
                self._aborted_sample_ids.append(sample_id)
            return True
        if self._running.pop(sample_id, None) is not None:
            self._aborted_sample_ids.append(sample_id)
            return True
        return False

    def pause_admission(self) -> None:
        """Admit nobody until resumed; running samples keep stepping (engine drain)."""
        self._is_admission_paused = True

    def resume_admission(self) -> None:
        self._is_admission_paused = False

    def has_unfinished(self) -> bool:
        """True while a sample waits or runs, or aborted ids still have to reach the runner."""
        return bool(self._waiting or self._running or self._aborted_sample_ids)

    def late_sample_ids(self) -> set[str]:
        """Samples that can no longer finish by their complete_by, by the measured step times."""
        now = self.clock()
        samples = [*self._waiting.values(), *self._running.values()]
        return {sample.sample_id for sample in samples if self.step_times.slack(sample, now) < 0}

    def paused_sample_ids(self) -> set[str]:
        return {sample.sample_id for sample in self._waiting.values() if sample.is_paused}

    def snapshot(self) -> dict[str, Any]:
        """Counts for stats(): samples waiting, running and paused, in total, per key and per tenant."""
        paused = [sample for sample in self._waiting.values() if sample.is_paused]
        return {
            "policy": self.config.policy,
            "is_admission_paused": self._is_admission_paused,
            "num_waiting": len(self._waiting),
            "num_running": len(self._running),
            "num_paused": len(paused),  # waiting samples that ran and were set aside (counted in num_waiting)
            "num_preemptions": self.num_preemptions,
            "running_by_tenant": dict(Counter(sample.tenant for sample in self._running.values())),
            "waiting_by_tenant": dict(Counter(sample.tenant for sample in self._waiting.values())),
            "paused_by_tenant": dict(Counter(sample.tenant for sample in paused)),
            "num_running_tokens": self.num_running_tokens,
            "max_num_tokens": self.config.token_budget,  # the budget in force (the curve's knee included)
            "forward_curve": self._curve_view,
            "waiting_by_key": dict(Counter(str(sample.key) for sample in self._waiting.values())),
            "running_by_key": dict(Counter(str(sample.key) for sample in self._running.values())),
            "admission_caps_by_key": {str(key): cap for key, cap in self._admission_caps.items()},
        }

    def schedule(self) -> SchedulerPlan:
        """Pause what preemption asks, admit what the policy allows and plan one step for every running sample."""
        now = self.clock()
        if self.config.preemption and self.config.policy == "default":
            self._preempt(now)
        admitted = self._admit(now, paused_only=self._is_admission_paused)
        new_samples = [sample for sample in admitted if not sample.is_paused]
        for sample in admitted:
            sample.is_paused = False  # a resumed one runs on from where it stopped
        plan = SchedulerPlan(new_samples=new_samples, aborted_sample_ids=self._aborted_sample_ids)
        self._aborted_sample_ids = []
        for sample in self._running.values():
            plan.groups.setdefault(sample.key, []).append(sample.sample_id)
        assert len(plan.groups) <= self._policy.max_num_groups and len(self._running) <= self.config.max_num_seqs
        budget = self.config.token_budget
        assert budget is None or self.num_running_tokens <= budget or len(self._running) == 1, "over the token budget"
        return plan

    def update_from_output(self, plan: SchedulerPlan, output: RunnerOutput) -> None:
        """Apply the runner's result for `plan`: finished and failed samples leave.

        The runner has advanced each stepped sample's `num_steps_done` (the one count of its steps). A sample
        that ran its last step is in both `stepped_sample_ids` and `finished_sample_ids`. Ids of samples aborted
        after `plan` was made are ignored.
        """
        planned_ids = {sample_id for sample_ids in plan.groups.values() for sample_id in sample_ids}
        for sample_id in output.failed:
            self._running.pop(sample_id, None)
        for sample_id in output.stepped_sample_ids:
            assert sample_id in planned_ids, f"runner stepped {sample_id!r}, which was not planned"
            sample = self._running.get(sample_id)
            assert sample is None or sample.num_steps_done <= sample.num_steps, f"{sample_id!r} stepped past its end"
        for sample_id in output.denoised_sample_ids + output.finished_sample_ids:
            sample = self._running.pop(sample_id, None)
            if sample is not None:
                assert sample.num_steps_done == sample.num_steps, f"sample {sample_id!r} finished before its last step"
        for key, cap in output.admission_caps.items():
            self._admission_caps[key] = min(cap, self._admission_caps.get(key, cap))

    def _rank(self, now: float) -> Callable[[Sample], tuple]:
        running_by_tenant = Counter(sample.tenant for sample in self._running.values())
        return lambda sample: rank_key(sample, now, self.step_times, running_by_tenant)

    def _preempt(self, now: float) -> None:
        """Pause the running samples that the waiting ones outranking them need the room of."""
        if not self._waiting:
            return
        bound = self.config.max_wait_iterations
        rank = self._rank(now)
        keys = {sample.key for sample in self._running.values()}
        joinable = [
            sample
            for sample in self._waiting.values()
            if (sample.key in keys or len(keys) < self._policy.max_num_groups)
            and (not self._is_admission_paused or sample.is_paused)
        ]
        joinable.sort(key=lambda sample: (sample.num_iterations_overtaken < bound, rank(sample), sample.arrival))
        budget = self.config.token_budget
        victims = samples_to_pause(
            joinable,
            [sample for sample in self._running.values() if sample.num_steps_done >= 1],  # not while starting
            num_free=self.config.max_num_seqs - len(self._running),
            tokens_free=math.inf if budget is None else budget - self.num_running_tokens,
            now=now,
            step_times=self.step_times,
            max_wait_iterations=bound,
        )
        for victim in victims:
            sample = self._running.pop(victim.sample_id)
            sample.is_paused = True
            sample.num_times_paused += 1
            self._waiting[sample.sample_id] = sample
        if victims:
            self.num_preemptions += len(victims)
            self._waiting = dict(sorted(self._waiting.items(), key=lambda item: item[1].arrival))

    def _admit(self, now: float, *, paused_only: bool = False) -> list[Sample]:
        num_free = self.config.max_num_seqs - len(self._running)
        budget = self.config.token_budget
        tokens_free = math.inf if budget is None else budget - self.num_running_tokens
        running_by_key = Counter(sample.key for sample in self._running.values())
        self._admission_caps = {key: cap for key, cap in self._admission_caps.items() if running_by_key[key]}
        waiting = [sample for sample in self._waiting.values() if sample.is_paused or not paused_only]
        if not waiting:
            return []
        rank = self._rank(now)
        if self._admission_caps:
            room = {key: cap - running_by_key[key] for key, cap in self._admission_caps.items()}
            waiting = [sample for sample in waiting if room.get(sample.key, 1) > 0]
            admitted = []
            for sample in self._policy.admit(waiting, list(self._running.values()), num_free, tokens_free, rank):
                if sample.key in room:
                    if room[sample.key] <= 0:
                        continue  # stays waiting
                    room[sample.key] -= 1
                admitted.append(sample)
        else:
            admitted = self._policy.admit(waiting, list(self._running.values()), num_free, tokens_free, rank)
        for sample in admitted:
            del self._waiting[sample.sample_id]
            self._running[sample.sample_id] = sample
        return admitted
