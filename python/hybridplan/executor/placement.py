"""Placement mode: one process per replica; each assigned graph node (profiler.block_list) lives
on the replica device the plan gives it, and its inputs follow it there (a forward pre-hook
moves tensor arguments), so branches on different devices run where the planner put them.
Parameters the root holds itself (belonging to no node) stay on the replica's device 0. A
module called more than once (graph nodes "name", "name@1", ...) holds one set of parameters,
so every call runs on the device of its first call. The
replica is then wrapped in DistributedDataParallel over all replicas (world = dp), on a
process group of its own that AppliedPlan.close() destroys."""

from __future__ import annotations

from typing import AbstractSet, Any, Dict, List

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..autograd.recompute import FULL, SELECTIVE, recompute
from ..profiler.block_list import split_call_name
from ..profiler.dataflow import map_tensors
from .bucket_policy import ddp_bucket_kwargs


def _move(value: Any, device: torch.device) -> Any:
    return map_tensors(value, lambda t: t.to(device))


def _inputs_follow(device: torch.device):
    def hook(module, args, kwargs):
        return _move(args, device), _move(kwargs, device)
    return hook


def _to(module: nn.Module, device: torch.device) -> None:
    """module.to(device), except for a module built on the meta device, which has nothing to
    move: apply gives its tensors storage on their node's device later (executor.materialize)."""
    if not any(t.is_meta for t in module.parameters()) and \
            not any(t.is_meta for t in module.buffers()):
        module.to(device)


def place(module: nn.Module, assignment: Dict[str, int], devices: List[torch.device],
          recomputed: AbstractSet[str] = frozenset(),
          selective: AbstractSet[str] = frozenset()) -> List[torch.utils.hooks.RemovableHandle]:
    """Moves the module to devices[0], then each assigned node to devices[assignment[name]],
    with a hook that brings its inputs along, and recomputes the nodes in `recomputed`
    (autograd.recompute; those also in `selective` selectively). Returns the hook handles."""
    _to(module, devices[0])
    handles = []
    for name, k in assignment.items():
        name, call = split_call_name(name)
        if call:
            continue  # a later call of a module runs where its parameters are (the module doc)
        node = module.get_submodule(name)
        _to(node, devices[k])
        if name in recomputed:  # the calls of one module recompute together (plan rule)
            recompute(node, SELECTIVE if name in selective else FULL)
        if len(set(devices)) > 1:  # on one device (e.g. CPU) there is nothing to move
            handles.append(node.register_forward_pre_hook(_inputs_follow(devices[k]),
                                                          with_kwargs=True))
    return handles


def wrap_ddp(module: nn.Module, devices: List[torch.device], process_group=None
             ) -> DistributedDataParallel:
    """DDP over `process_group` (all replicas; default: the default group). device_ids only for
    a module on one CUDA device; a multi-device or CPU module takes device_ids=None."""
    single_cuda = len(set(devices)) == 1 and devices[0].type == "cuda"
    return DistributedDataParallel(module, device_ids=[devices[0]] if single_cuda else None,
                                   process_group=process_group, **ddp_bucket_kwargs())
