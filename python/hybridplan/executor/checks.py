"""The checks every rank runs on a plan against its module and job before any slow step (the
cheap ones: world size, graph hash, module names, options), whose verdicts the ranks then agree
on (rank_agreement). recipe.apply runs them before it builds a plan, switching before it
takes the running plan apart."""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch
from torch import nn

from ..planner import Plan
from ..profiler import block_list
from . import noise
from .calls import first_microbatch
from .plan_spec import graph_sha256

__all__ = ["check_module", "local_checks", "check_step_options"]


def check_module(spec: Plan, module: nn.Module) -> None:
    """Assignment names must be graph nodes of `module` (profiler.block_list: a node module, or
    "name@k" for its call k), and every node module that holds parameters or buffers must be
    assigned, except one whose parameters are all those of assigned nodes (block_list.
    uncalled_nodes: a tied embedding that never runs goes where they go). Parameter-free nodes
    may be left out: they run where their inputs are, like functional ops."""
    nodes = block_list.select_nodes(module)
    unknown = sorted(n for n in spec.assignment if block_list.module_name(n) not in nodes)
    if unknown:
        raise ValueError(f"{spec.source}: assignment names must be graph nodes of "
                         f"{type(module).__name__} (got {len(unknown)} unknown: "
                         f"{unknown[:5]})")
    _, missing = block_list.uncalled_nodes(
        nodes, {block_list.module_name(n) for n in spec.assignment})
    if missing:
        raise ValueError(f"{spec.source}: assignment must place every graph node that holds "
                         f"parameters or buffers; missing {len(missing)} of "
                         f"{type(module).__name__}: {missing[:5]}. A profiled graph holds the "
                         f"modules that ran in forward; for one that never runs, "
                         f"{block_list.UNCALLED_ADVICE}")


def local_checks(spec: Plan, module: nn.Module, graph: Any, world_size: int,
                 example_inputs: Any = None, batch_dim: int = 0,
                 measure_noise_scale: int = 0, noise_scale_decay: float = 0.99,
                 optimizer: Any = None) -> None:
    """World size, graph hash, module names, the noise-scale options, the optimizer under
    sharding and (pipeline) the example inputs: the cheap checks, which every rank agrees on
    before any rank spends seconds in torch.export."""
    noise.check_options(measure_noise_scale, noise_scale_decay, spec.dp, spec.source,
                        spec.sharding)
    if spec.sharding != "none" and isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"{spec.source}: with the plan's \"sharding\" ({spec.sharding!r}) "
                         f"pass an optimizer factory, not an Optimizer: fully_shard replaces "
                         f"the module's parameters with DTensor shards, which an optimizer "
                         f"built before apply() does not hold")
    if spec.num_processes != world_size:
        if spec.tp == 1:
            layout = ("one process per replica, world = dp" if spec.mode == "placement"
                      else "one process per device, world = dp * mp")
            degrees = f"dp={spec.dp}, mp={spec.mp}"
        else:
            layout = ("one process per replica and TP rank, world = dp * tp"
                      if spec.mode == "placement"
                      else "one process per device, world = dp * mp * tp")
            degrees = f"dp={spec.dp}, mp={spec.mp}, tp={spec.tp}"
        raise ValueError(f"{spec.source}: {spec.mode} plan needs world size {spec.num_processes} "
                         f"({layout}; {degrees}) (got world size {world_size})")
    if spec.tp > 1 and measure_noise_scale:
        raise ValueError(f"{spec.source}: measure_noise_scale needs the plan's \"tp\" to be 1 "
                         f"(the meter reads DDP's buckets; a TP plan's replicas reduce through "
                         f"FSDP2) (got tp={spec.tp})")
    if spec.tp > 1 and spec.dp_shard < spec.dp:
        raise ValueError(f"{spec.source}: dp_shard must equal dp with tp > 1 (hybrid sharding "
                         f"over a TP mesh is not supported) (got dp_shard={spec.dp_shard}, "
                         f"dp={spec.dp})")
    if graph is not None:
        sha = graph_sha256(graph)
        if sha != spec.graph_sha256:
            raise ValueError(f"{spec.source}: graph.sha256 must match the graph applied "
                             f"({sha}) (got {spec.graph_sha256})")
    check_module(spec, module)
    if spec.mode == "pipeline":
        first_microbatch(spec, example_inputs, batch_dim)


def accumulation_steps_of(spec: Any, option: Optional[int], rank: int = 0) -> int:
    """The accumulation steps a step runs: apply's accumulation_steps where given (an override:
    the plan's predicted step is for its own; rank 0 warns where they differ), else the plan's
    (Plan.accumulation_steps, 1 when it has none). The one place the two meet."""
    if option is None or option == spec.accumulation_steps:
        return spec.accumulation_steps
    if rank == 0 and spec.accumulation_steps != 1:
        warnings.warn(f"hybridplan apply: accumulation_steps={option} overrides the plan's "
                      f"{spec.accumulation_steps} ({spec.source}): the global batch is "
                      f"{spec.dp * spec.per_replica_batch * option}, not the plan's "
                      f"{spec.global_batch}, and its predicted step time is not this step's",
                      stacklevel=3)
    return option


def check_step_options(clip_grad_norm: Any, accumulation_steps: Any, lr_scheduler: Any) -> None:
    """ValueError naming the option unless apply's training-step options are usable."""
    if clip_grad_norm is not None and (
            isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, (int, float))
            or not math.isfinite(clip_grad_norm) or clip_grad_norm <= 0):
        raise ValueError(f"hybridplan.apply: clip_grad_norm must be None (no clipping) or a "
                         f"finite number > 0, the largest global gradient norm "
                         f"(got {clip_grad_norm!r})")
    if accumulation_steps is not None and (
            isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int)
            or accumulation_steps < 1):
        raise ValueError(f"hybridplan.apply: accumulation_steps must be None (the plan's) or an "
                         f"integer >= 1, the forward_backward calls per optimizer step (got "
                         f"{accumulation_steps!r})")
    if lr_scheduler is not None and (isinstance(lr_scheduler, torch.optim.lr_scheduler.LRScheduler)
                                     or not callable(lr_scheduler)):
        raise ValueError(f"hybridplan.apply: lr_scheduler must be a factory optimizer -> "
                         f"torch.optim.lr_scheduler.LRScheduler (e.g. hybridplan.warmup_cosine("
                         f"100, 10000)), not a scheduler: apply builds the optimizer over the "
                         f"parameters this rank trains (got {type(lr_scheduler).__name__})")
