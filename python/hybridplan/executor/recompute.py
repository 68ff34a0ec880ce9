"""Activation recompute (checkpointing) of the modules a plan names (`"recompute": true` on an
assignment entry; docs/formats.md). The forward of such a module runs under
torch.utils.checkpoint (non-reentrant): autograd keeps only the module's inputs, and the forward
runs again, with the same random state, just before the module's backward. Placement and data
parallel plans recompute node modules; a pipeline recomputes whole stages (the stage module's
forward), which is how the cost model prices them (csrc/planner/memory_cost.h, evaluate.h).

Selective recompute (`"recompute": "selective"`) keeps more: torch's selective activation
checkpointing (create_selective_checkpoint_contexts) saves the outputs of the ops in SAVED_OPS
(the matrix products, convolutions and attention: costly to run again, and what their
backward reads) and runs only the other ops (elementwise, normalisation, softmax, views) again
before the backward. The profiler measures, per node, what that policy keeps and how much of
the forward it runs again (profiler.block_timing.selective_recompute) with this same list.

A recomputed forward runs every side effect twice: BatchNorm's running statistics, for one,
move twice per step, as under any activation checkpointing."""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint
from torch import nn

FULL, SELECTIVE = "full", "selective"
KINDS = (FULL, SELECTIVE)


def _saved_ops() -> frozenset:
    """The ops whose outputs selective recompute keeps (aten overload packets; torchtitan's
    choice of the same kind: matmuls and attention, plus convolutions)."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution",
             "mkldnn_convolution", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


SAVED_OPS = _saved_ops()


def saves(op) -> bool:
    """Whether selective recompute keeps `op`'s outputs (an OpOverload or its packet)."""
    return getattr(op, "overloadpacket", op) in SAVED_OPS


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if saves(op) else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """context_fn for torch.utils.checkpoint: the selective policy above."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def recompute(module: nn.Module, kind: str = FULL) -> None:
    """Makes `module`'s forward a checkpointed one, on this module object (its parameters,
    hooks and state-dict names unchanged): `kind` "full" keeps only its inputs, "selective"
    also the outputs of SAVED_OPS. Idempotent."""
    if kind not in KINDS:
        raise ValueError(f"recompute: kind must be one of {KINDS} (got {kind!r})")
    if getattr(module.forward, "_hybridplan_recompute", False):
        return
    forward = module.forward
    options = {"context_fn": selective_context} if kind == SELECTIVE else {}

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False,
                                                 **options, **kwargs)

    checkpointed._hybridplan_recompute = True
    module.forward = checkpointed
