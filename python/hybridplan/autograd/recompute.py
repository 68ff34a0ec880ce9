"""Activation recompute (checkpointing) of the modules a plan names (`"recompute": true` on an
assignment entry; docs/formats.md). The forward of such a module runs under
torch.utils.checkpoint (non-reentrant): autograd keeps only the module's inputs, and the forward
runs again, with the same random state, just before the module's backward. Placement and data
parallel plans recompute node modules; a pipeline recomputes whole stages (the stage module's
forward), which is how the cost model prices them (csrc/planner/costs/memory_cost.h, evaluate.h).

Selective recompute (`"recompute": "selective"`) keeps more: torch's selective activation
checkpointing (create_selective_checkpoint_contexts) saves the outputs of the ops in SAVED_OPS
(the matrix products, convolutions and attention: costly to run again, and what their
backward reads) and runs only the other ops (elementwise, normalisation, softmax, views) again
before the backward. The profiler measures, per node, what that policy keeps and how much of
the forward it runs again (profiler.block_timing.selective_recompute) with this same list.

A recomputed forward would run every in-place side effect twice: BatchNorm's running statistics
and num_batches_tracked, for one, would move twice per step under plain activation checkpointing.
The buffers a module's forward changes are therefore copied when the recompute starts and put
back when it ends, so the recompute leaves them as the forward left them and the running
statistics equal training without recompute exactly. Which buffers: those named as
normalisation layers name their running statistics (RUNNING_STATS: BatchNorm's kernel updates
running_mean and running_var inside the op, which moves no version counter, and a pipeline
stage, a traced graph, keeps the names but not the BatchNorm class), and any other whose
version counter moved during the original forward (an in-place update). This holds for node
modules and pipeline stages alike; the copies cost those buffers' bytes once per recompute."""

from __future__ import annotations

import contextlib
import functools
from typing import List

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

FULL, SELECTIVE = "full", "selective"
KINDS = (FULL, SELECTIVE)
RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")  # torch's _NormBase


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
    return CheckpointPolicy.MUST_SAVE if saves(op) else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """context_fn for torch.utils.checkpoint: the selective policy above."""
    return create_selective_checkpoint_contexts(_policy)


class _KeepBuffers:
    """The recompute's context: puts back, when the recompute ends (or stops early, as
    non-reentrant checkpointing does once it has what the backward needs), the buffers the
    original forward changed in place (`changed`, filled once that forward has returned)."""

    def __init__(self, changed: List[torch.Tensor]):
        self.changed, self.saved = changed, []

    def __enter__(self) -> None:
        self.saved = [b.clone() for b in self.changed]

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for buffer, value in zip(self.changed, self.saved):
                buffer.copy_(value)
        self.saved = []


def _contexts(kind: str, changed: List[torch.Tensor]):
    """context_fn for one checkpointed call: (forward context, recompute context). The buffers
    are copied outside the selective policy's dispatch mode, which would otherwise take the
    copies for recomputed ops."""
    if kind != SELECTIVE:
        return contextlib.nullcontext(), _KeepBuffers(changed)
    forward_context, recompute_context = selective_context()
    stack = contextlib.ExitStack()

    class Recompute:
        def __enter__(self):
            stack.enter_context(_KeepBuffers(changed))
            stack.enter_context(recompute_context)

        def __exit__(self, *exc):
            return stack.__exit__(*exc)
    return forward_context, Recompute()


def recompute(module: nn.Module, kind: str = FULL) -> None:
    """Makes `module`'s forward a checkpointed one, on this module object (its parameters,
    hooks and state-dict names unchanged): `kind` "full" keeps only its inputs, "selective"
    also the outputs of SAVED_OPS. Idempotent."""
    if kind not in KINDS:
        raise ValueError(f"recompute: kind must be one of {KINDS} (got {kind!r})")
    if getattr(module.forward, "_hybridplan_recompute", False):
        return
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        named = list(module.named_buffers())
        changed = [b for name, b in named if name.rpartition(".")[2] in RUNNING_STATS]
        others = [(b, b._version) for name, b in named
                  if name.rpartition(".")[2] not in RUNNING_STATS]
        out = torch.utils.checkpoint.checkpoint(
            forward, *args, use_reentrant=False,
            context_fn=functools.partial(_contexts, kind, changed), **kwargs)
        changed.extend(b for b, version in others if b._version != version)  # before backward
        return out

    checkpointed._hybridplan_recompute = True
    module.forward = checkpointed
