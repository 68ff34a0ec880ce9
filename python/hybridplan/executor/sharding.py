"""Sharded data parallelism: a plan's "sharding" field (docs/sharding.md), applied with torch's
FSDP2 (`torch.distributed.fsdp.fully_shard`) over the data-parallel group.

  "none"   gradients all-reduced by DistributedDataParallel; every replica holds the whole
           parameters, gradients and optimizer state.
  "zero2"  fully_shard(..., reshard_after_forward=False): each replica holds 1/dp of every
           parameter, gradient and optimizer state tensor (dim-0 shards, DTensors). A unit's
           parameters are all-gathered before its forward and kept through backward (one
           all-gather per step); its gradients are reduce-scattered (averaged) after its
           backward, and the optimizer steps the local shards.
  "zero3"  fully_shard(..., reshard_after_forward=True): as zero2, but each unit's gathered
           parameters are freed after its forward and all-gathered again for its backward (two
           all-gathers per step; at most a unit's full parameters held at a time).

The unit is what FSDP gathers and frees at once. Placement plans (mp == 1) make each graph node
module that holds parameters a unit of its own, then the root one unit for the parameters no
node holds. A parameter reached from two nodes (tied weights: GPT-2's wte and lm_head) would be
split over two units, which FSDP does not allow (each unit swaps its parameters for the
gathered ones in its own forward only): the nodes holding it are left to the root's unit.
Activation recompute is applied before fully_shard, as torchtitan does: the recomputed forward
runs inside the unit's backward, after FSDP's pre-backward hook has gathered the parameters.
A pipeline plan (zero2 only; the planner's rule) makes each stage module one unit over its DP
group; torch.distributed.pipelining's PipelineStage turns off gradient reduction for every
micro-batch's backward and reduce-scatters once after the last (`perform_reduce_grad`).

Hybrid sharding (the plan's "dp_shard" < dp, HSDP): the data-parallel group is a 2-D mesh of
dp / dp_shard replicate groups by dp_shard shards (executor/layout.py); FSDP2 shards over the
second dimension and all-reduces each unit's gradient shard over the first after its reduce-scatter.

The training is the same as DDP's: the reduce-scatter averages what the all-reduce averaged.
FSDP does not synchronize buffers (DDP broadcasts replica 0's before every forward), so
BatchNorm's running statistics are each replica's own. The module stays sharded after close():
its parameters are DTensors over the plan's group, which close() destroys; take its state with
AppliedPlan.state_dict() or save_checkpoint() before.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, Iterable, List

import torch
from torch import nn

from ..profiler import block_list

def shard(module: nn.Module, mesh: Any, sharding: str, mp_policy: Any = None) -> nn.Module:
    """fully_shard(module) as one unit with `sharding`'s reshard_after_forward; `mp_policy`: a
    MixedPrecisionPolicy (executor/precision.py), None for FSDP2's default (fp32)."""
    from torch.distributed.fsdp import fully_shard

    if sharding not in ("zero2", "zero3"):
        raise ValueError(f"sharding must be 'zero2' or 'zero3' (got {sharding!r})")
    policy = {} if mp_policy is None else {"mp_policy": mp_policy}
    return fully_shard(module, mesh=mesh, reshard_after_forward=sharding == "zero3", **policy)


def node_units(module: nn.Module, nodes: Iterable[str]) -> List[str]:
    """The graph nodes (module names; "name@k" is a call of "name") that become units of their
    own, in `named_modules` order: those holding parameters that no other node and not the root
    itself holds."""
    modules = block_list.select_nodes(module)
    assigned = {block_list.module_name(x) for x in nodes}
    names = [n for n in modules if n in assigned and modules[n] is not module]
    aliases = block_list.module_aliases(module)
    owners: Dict[int, set] = collections.defaultdict(set)
    for name, p in module.named_parameters(remove_duplicate=False):
        owners[id(p)].add(block_list.node_of(name, modules, aliases))
    units = []
    for n in names:
        params = list(modules[n].parameters())
        if params and all(owners[id(p)] == {n} for p in params):
            units.append(n)
    return units


def shard_placement(module: nn.Module, nodes: Iterable[str], mesh: Any, sharding: str,
                    mp_policy: Any = None) -> List[str]:
    """Shards a placement replica: each node of node_units() as its own unit, then the root
    (every parameter left), each under `mp_policy` (see shard). Returns the node units'
    names."""
    units = node_units(module, nodes)
    for name in units:
        shard(module.get_submodule(name), mesh, sharding, mp_policy)
    shard(module, mesh, sharding, mp_policy)
    return units


def is_sharded(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def full(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole tensor (all-gathered over its mesh: collective, every rank of the mesh
    must call it in the same order), a plain tensor as it is."""
    return value.full_tensor() if is_sharded(value) else value


def full_cpu_state(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A CPU copy of each of a state_dict's tensors, DTensors gathered (in the dict's order; a
    tensor under two keys, a tied weight, gathered once where `state` holds it once:
    state_dict(keep_vars=True))."""
    gathered: Dict[int, torch.Tensor] = {}
    out = collections.OrderedDict()
    for key, value in state.items():
        if id(value) not in gathered:
            gathered[id(value)] = full(value.detach())
        out[key] = gathered[id(value)].cpu().clone()
    return out


def like_param(value: Any, param: torch.Tensor) -> Any:
    """A full optimizer-state tensor of `param` laid out as `param` is: sharded the same way
    when `param` is a DTensor (each rank keeps its own shard of the full tensor it holds, no
    communication), unchanged otherwise or when its shape is not the parameter's (a step)."""
    if not is_sharded(param) or not isinstance(value, torch.Tensor) or is_sharded(value) \
            or value.shape != param.shape:
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(param.device), param.device_mesh, param.placements,
                             src_data_rank=None)
