"""Activation recompute (checkpointing) of the modules a plan names (`"recompute": true` on an
assignment entry; docs/formats.md). The forward of such a module runs under
torch.utils.checkpoint (non-reentrant): autograd keeps only the module's inputs, and the forward
runs again, with the same random state, just before the module's backward. Placement and data
parallel plans recompute node modules; a pipeline recomputes whole stages (the stage module's
forward), which is how the cost model prices them (csrc/planner/memory_cost.h, evaluate.h).

A recomputed forward runs every side effect twice: BatchNorm's running statistics, for one,
move twice per step, as under any activation checkpointing."""

from __future__ import annotations

import functools

import torch.utils.checkpoint
from torch import nn


def recompute(module: nn.Module) -> None:
    """Makes `module`'s forward a checkpointed one, on this module object (its parameters,
    hooks and state-dict names unchanged). Idempotent."""
    if getattr(module.forward, "_hybridplan_recompute", False):
        return
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    checkpointed._hybridplan_recompute = True
    module.forward = checkpointed
