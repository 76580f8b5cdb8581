"""What the built-ins' denoiser training loops share: AdamW on a one-cycle schedule, gradient clipping at 1,
and the exponential moving average of the weights, which is what the scripts save."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

EMA_DECAY = 0.995


class AveragedOptimizer:
    """Trains `modules` together for `num_steps` steps; `averages` are their moving averages, in order."""

    def __init__(
        self,
        modules: Sequence[torch.nn.Module],
        num_steps: int,
        max_lr: float,
        pct_start: float,
        ema_decay: float = EMA_DECAY,
    ) -> None:
        self.modules = list(modules)
        self.parameters = [parameter for module in self.modules for parameter in module.parameters()]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=max_lr, weight_decay=1e-2)
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=max_lr, total_steps=num_steps, pct_start=pct_start
        )
        self.averages = [copy.deepcopy(module).eval() for module in self.modules]
        self.ema_decay = ema_decay
        self.num_steps_taken = 0
        for module in self.modules:
            module.train()

    @property
    def lr(self) -> float:
        return float(self.schedule.get_last_lr()[0])

    def step(self, loss: torch.Tensor) -> None:
        """One optimizer step on `loss`, then the averages move toward the new weights (faster early on)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        self.schedule.step()
        decay = min(self.ema_decay, (1 + self.num_steps_taken) / (10 + self.num_steps_taken))
        with torch.no_grad():
            for average, module in zip(self.averages, self.modules):
                for average_parameter, parameter in zip(average.parameters(), module.parameters()):
                    average_parameter.lerp_(parameter, 1 - decay)
        self.num_steps_taken += 1
