"""Learning-rate schedules for apply(..., lr_scheduler=factory): a factory takes the optimizer
apply builds and returns a torch.optim.lr_scheduler scheduler, which the step advances after
each optimizer step (executor/stepping.py) and the checkpoints and plan switches carry.

    hp = hybridplan.apply(plan, model, optimizer=functools.partial(torch.optim.AdamW, lr=3e-4),
                          lr_scheduler=hybridplan.warmup_cosine(100, 10_000, min_lr_ratio=0.1))
    # any torch scheduler works the same way:
    hp = hybridplan.apply(..., lr_scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 30))

warmup_cosine is the schedule most language models train with (Hugging Face's
get_cosine_with_min_lr_schedule_with_warmup, torchtitan's warmup + cosine): a linear warm-up
to the optimizer's learning rate, then a half cosine down to min_lr_ratio of it, as one
LambdaLR. Its warm-up is the convergence measurement's (convergence.tradeoff.LrRule) over
steps instead of samples: `warmup_fraction`, one definition for both. It gives the first step
1/warmup_steps of the rate, where Hugging Face's gives it 0 (a step that trains nothing).
LrRule also scales the base rate with the global batch; a schedule here leaves the optimizer's
rate as the factory set it (set it to LrRule.lr(B, ...) for that rule's scaling).

Imports no torch at module level (convergence.tradeoff imports warmup_fraction without it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["warmup_fraction", "warmup_cosine", "WarmupCosine"]


def warmup_fraction(done: float, warmup: float) -> float:
    """Linear warm-up: the fraction of the full learning rate for the step after which `done`
    units (samples or steps, this one's included) have been trained, min(1, done / warmup);
    1 without warm-up (warmup 0)."""
    return min(1.0, done / warmup) if warmup else 1.0


@dataclasses.dataclass(frozen=True)
class WarmupCosine:
    """warmup_cosine's factory: call it with an optimizer for its LambdaLR."""
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "total_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"hybridplan.warmup_cosine: {name} must be an integer >= 0 "
                                 f"(got {value!r})")
        if self.total_steps < 1 or self.warmup_steps > self.total_steps:
            raise ValueError(f"hybridplan.warmup_cosine: total_steps must be >= 1 and >= "
                             f"warmup_steps (got warmup_steps={self.warmup_steps}, "
                             f"total_steps={self.total_steps})")
        ratio = self.min_lr_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) \
                or not 0 <= ratio <= 1:
            raise ValueError(f"hybridplan.warmup_cosine: min_lr_ratio must be in [0, 1], the "
                             f"last rate over the optimizer's (got {ratio!r})")

    def factor(self, step: int) -> float:
        """The learning rate of optimizer step `step` + 1 (the scheduler's last_epoch after
        `step` steps) over the optimizer's: warmup_fraction(step + 1, warmup_steps) while
        warming up, then min_lr_ratio + (1 - min_lr_ratio) (1 + cos(pi t)) / 2 with t the
        fraction of the cosine's total_steps - warmup_steps steps done (min_lr_ratio from
        total_steps on)."""
        if step < self.warmup_steps:
            return warmup_fraction(step + 1, self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    def __call__(self, optimizer: Any) -> Any:
        from torch.optim.lr_scheduler import LambdaLR

        def factor(step: int) -> float:  # a function: LambdaLR's state_dict leaves it out
            return self.factor(step)
        return LambdaLR(optimizer, factor)


def warmup_cosine(warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
                  ) -> WarmupCosine:
    """A factory optimizer -> LambdaLR: linear warm-up over warmup_steps optimizer steps, then a
    cosine decay to min_lr_ratio x the optimizer's rate at total_steps (see the module doc)."""
    return WarmupCosine(warmup_steps, total_steps, min_lr_ratio)
