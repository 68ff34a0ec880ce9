"""Applies a Plan to a torch.nn.Module inside a torch.distributed job (torchrun).

    hp = hybridplan.apply(plan, model, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    for inputs, target in loader:                 # the global batch, the same on every rank
        loss = hp.step(*hp.shard(inputs, target))  # this replica's share; forward+backward+update
    full = hp.state_dict()                        # the original module's keys, on every rank

apply() initialises the default process group if needed (env:// rendezvous as torchrun sets it
up; Gloo on CPU, NCCL for CUDA tensors), checks the plan against the module and the job, makes
every rank agree on plan and parameter shapes, builds the process groups the plan needs, then:

  placement  (one process per replica, rank = replica, world = dp): each assigned leaf module
             moves to its replica device, inputs follow, and the replica is wrapped in
             DistributedDataParallel over the replicas.
  pipeline   (one process per device, rank = replica * mp + stage, world = dp * mp): the module
             is cut into the plan's stages (torch.fx + split_module, see _stage_split), this
             rank's stage runs the plan's GPipe or 1F1B schedule with p2p activations and
             gradients, and the stage's gradients are averaged over its DP group
             {r * mp + stage} after the schedule (why not DDP: see _grad_sync).

Training under any plan is the same training as on one device with the global batch (up to
float reassociation): the loss is mean-reduced, micro-batch losses are scaled by their share of
the batch, and replicas average their gradients.
"""

from __future__ import annotations

import collections
import datetime
import functools
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import _grad_sync, _placement
from ._dist_checks import RankReport, agree_across_ranks, param_signature
from ._p2p import Channel
from ._pipeline import PipelineStageRunner
from ._plan_spec import PlanSpec, graph_sha256, load_plan_dict, parse_plan, sha256_hex
from ._stage_split import StageProgram, build_program, leaf_module_names, stage_parameters

__all__ = ["apply", "AppliedPlan"]

kDefaultTimeoutS = 300.0
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _init_process_group(timeout: datetime.timedelta) -> None:
    if dist.is_initialized():
        return
    missing = [k for k in _ENV if k not in os.environ]
    if missing:
        raise ValueError(f"hybridplan.apply must run inside a torch.distributed job (launch with "
                         f"torchrun): environment variables {missing} are not set")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, timeout=timeout)


def _device(spec: PlanSpec, global_device: int) -> torch.device:
    """cuda:<local index> for mesh entry node * devices_per_node + local; CPU without CUDA."""
    if torch.cuda.is_available():
        return torch.device("cuda", global_device % spec.devices_per_node)
    return torch.device("cpu")


def _check_module(spec: PlanSpec, module: nn.Module) -> None:
    """Assignment names must be leaf modules of `module`, and every leaf that holds parameters
    or buffers must be assigned (parameter-free leaves may be left out: they run where their
    inputs are, like functional ops)."""
    leaves = leaf_module_names(module)
    unknown = sorted(set(spec.assignment) - set(leaves))
    if unknown:
        raise ValueError(f"{spec.source}: assignment names must be leaf modules of "
                         f"{type(module).__name__} (got {len(unknown)} unknown: "
                         f"{unknown[:5]})")
    stateful = [n for n in leaves if any(True for _ in module.get_submodule(n).parameters(
        recurse=False)) or any(True for _ in module.get_submodule(n).buffers(recurse=False))]
    missing = [n for n in stateful if n not in spec.assignment]
    if missing:
        raise ValueError(f"{spec.source}: assignment must place every leaf module that holds "
                         f"parameters; missing {len(missing)} of {type(module).__name__}: "
                         f"{missing[:5]}")


def _local_checks(spec: PlanSpec, module: nn.Module, graph: Any, world_size: int
                  ) -> Optional[StageProgram]:
    """World size, graph hash and module names; in pipeline mode also cuts the stages (which
    fails where the plan's stages are not contiguous) and returns the StageProgram."""
    if spec.num_processes != world_size:
        layout = ("one process per replica, world = dp" if spec.mode == "placement"
                  else "one process per device, world = dp * mp")
        raise ValueError(f"{spec.source}: {spec.mode} plan needs world size {spec.num_processes} "
                         f"({layout}; dp={spec.dp}, mp={spec.mp}) (got world size {world_size})")
    if graph is not None:
        sha = graph_sha256(graph)
        if sha != spec.graph_sha256:
            raise ValueError(f"{spec.source}: graph.sha256 must match the graph applied "
                             f"({sha}) (got {spec.graph_sha256})")
    _check_module(spec, module)
    if spec.mode == "pipeline":
        return build_program(module, spec.assignment, spec.mp, spec.source)
    return None


class AppliedPlan:
    """A module trained under a plan on this rank. Attributes: `module` (this rank's part: the
    whole replica in placement mode, the stage's fx submodule in pipeline mode), `plan`
    (PlanSpec), `rank`, `replica`, `stage`, `optimizer`, `predicted_step_s`."""

    def __init__(self, spec: PlanSpec, original: nn.Module, program: Optional[StageProgram],
                 loss_fn: Callable, optimizer: Union[Callable, torch.optim.Optimizer, None],
                 timeout: datetime.timedelta, batch_dim: int):
        self.plan, self.original, self.loss_fn, self.batch_dim = spec, original, loss_fn, batch_dim
        self.rank = dist.get_rank()
        self.replica, self.stage = spec.replica_of(self.rank), spec.stage_of(self.rank)
        self.predicted_step_s = spec.predicted_step_s
        self._timeout = timeout
        self.program = program
        if spec.mode == "placement":
            self._init_placement()
        else:
            self._init_pipeline()
        self.optimizer = self._make_optimizer(optimizer)

    # ---- construction ---------------------------------------------------------------------------
    def _init_placement(self) -> None:
        spec = self.plan
        self.devices = [_device(spec, g) for g in spec.mesh[self.replica]]
        self._hooks = _placement.place(self.original, spec.assignment, self.devices)
        self.ddp = _placement.wrap_ddp(self.original, self.devices)
        self.module = self.original
        self._params = list(self.original.parameters())

    def _init_pipeline(self) -> None:
        spec = self.plan
        # Every rank creates every group, in the same order (new_group is collective).
        dp_groups = [dist.new_group(spec.dp_group_ranks(s), timeout=self._timeout)
                     for s in range(spec.mp)]
        replica_groups = [dist.new_group(spec.replica_ranks(r), timeout=self._timeout)
                          for r in range(spec.dp)]
        self._dp_group = dp_groups[self.stage]
        self._replica_group = replica_groups[self.replica]
        self.device = _device(spec, spec.mesh[self.replica][self.stage])
        sub = self.program.submodules.get(self.stage)
        self.module = sub if sub is not None else nn.Module()
        self._owned = stage_parameters(self.original, self.program, self.stage)
        for _, t in self._owned:  # in place, so the original module shares the moved tensors
            t.data = t.data.to(self.device)
        self._params = [t for _, t in self._owned if isinstance(t, nn.Parameter)]
        # Replicas start from the weights of replica 0, as DDP does.
        for _, t in self._owned:
            dist.broadcast(t.data, src=spec.rank_of(0, self.stage), group=self._dp_group)
        channel = Channel(self.device, self._timeout)
        self._runner = PipelineStageRunner(
            self.original, self.program, self.stage,
            lambda s: spec.rank_of(self.replica, s), channel, spec.schedule,
            spec.num_microbatches, self.loss_fn, self.batch_dim)

    def _make_optimizer(self, optimizer) -> torch.optim.Optimizer:
        if isinstance(optimizer, torch.optim.Optimizer):
            return optimizer  # parameters of other stages get no grad, so it skips them
        factory = optimizer or functools.partial(torch.optim.SGD, lr=0.01)
        params = [p for p in self._params if p.requires_grad]
        if not params:  # a stage without parameters still takes part in the schedule
            params = [nn.Parameter(torch.zeros(0, device=self._first_device()))]
        return factory(params)

    def _first_device(self) -> torch.device:
        return self.devices[0] if self.plan.mode == "placement" else self.device

    # ---- training -------------------------------------------------------------------------------
    def shard(self, inputs: Any, target: Any = None) -> Tuple[Tuple[Any, ...], Any]:
        """This replica's share (1/dp along batch_dim) of a global batch of inputs and target."""
        def part(v):
            if isinstance(v, torch.Tensor):
                return torch.tensor_split(v, self.plan.dp, dim=self.batch_dim)[self.replica]
            return v
        inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        return tuple(part(v) for v in inputs), part(target)

    def step(self, inputs: Any, target: Any) -> torch.Tensor:
        """Forward, backward and optimizer step on this replica's batch (`inputs`: a tensor or
        a tuple of forward() arguments; in pipeline mode only stage 0 reads the inputs and only
        the last stage the target, others may pass None). Returns the replica's mean loss on
        every rank (broadcast from the replica's last stage)."""
        inputs = inputs if isinstance(inputs, (tuple, list)) or inputs is None else (inputs,)
        self.optimizer.zero_grad(set_to_none=True)
        if self.plan.mode == "placement":
            output = self.ddp(*inputs)
            loss = self.loss_fn(output, _to(target, _device_of(output)))
            loss.backward()
            self.optimizer.step()
            return loss.detach()
        inputs = tuple(_to(v, self.device) for v in inputs) if inputs is not None else None
        loss = self._runner.run(inputs, _to(target, self.device))
        _grad_sync.allreduce_mean(self._params, self._dp_group, self.plan.dp)
        self.optimizer.step()
        if self.plan.mp > 1:
            dist.broadcast(loss, src=self.plan.rank_of(self.replica, self.plan.mp - 1),
                           group=self._replica_group)
        return loss

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The whole model's state, keyed as the original module's state_dict, on every rank
        (pipeline: each stage's tensors are gathered over the replica's ranks; CPU copies)."""
        local = {k: v.detach().cpu().clone() for k, v in self.original.state_dict().items()}
        if self.plan.mode == "placement" or self.plan.mp == 1:
            return collections.OrderedDict(local)
        mine = {k: t.detach().cpu().clone() for k, t in self._owned}
        parts: List[Optional[Dict[str, torch.Tensor]]] = [None] * self.plan.mp
        dist.all_gather_object(parts, mine, group=self._replica_group)
        merged = collections.OrderedDict()
        for key, value in local.items():  # keys no stage owns (unused modules) stay as built
            merged[key] = next((p[key] for p in parts if key in p), value)
        return merged

    def __repr__(self) -> str:
        return (f"AppliedPlan(mode={self.plan.mode!r}, dp={self.plan.dp}, mp={self.plan.mp}, "
                f"rank={self.rank}, replica={self.replica}, stage={self.stage})")


def _device_of(value: Any) -> torch.device:
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, (tuple, list)) and value:
        return _device_of(value[0])
    return torch.device("cpu")


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _default_loss(module: nn.Module) -> Callable:
    """The module's own `loss(output, target)` (hybridplan.models have one), else mean
    cross-entropy."""
    loss = getattr(module, "loss", None)
    return loss if callable(loss) else F.cross_entropy


def apply(plan: Any, module: nn.Module, *, loss_fn: Optional[Callable] = None,
          optimizer: Union[Callable, torch.optim.Optimizer, None] = None,
          timeout_s: float = kDefaultTimeoutS, graph: Any = None,
          batch_dim: int = 0) -> AppliedPlan:
    """Trains `module` under `plan` in this torch.distributed job; see the module docstring.

    plan       a hybridplan Plan (anything with to_dict()), a plan dict, or a path to its JSON.
    module     the full model, built identically on every rank (same parameter shapes).
    loss_fn    loss(output, target), mean-reduced over the batch; default: module.loss if the
               module has one, else torch.nn.functional.cross_entropy.
    optimizer  a factory params -> Optimizer (e.g. functools.partial(torch.optim.Adam, lr=1e-3))
               or an Optimizer over module.parameters(); default SGD(lr=0.01).
    timeout_s  timeout of the process groups and of every p2p wait.
    graph      optional Graph (object, dict or path); its sha256 must equal the plan's.
    batch_dim  dimension of inputs and target that indexes samples.

    Raises ValueError, on every rank, if the plan is malformed or does not fit the module or the
    job's world size, or if ranks hold different plans or parameter shapes.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    _init_process_group(timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    plan_sha, spec, program, error = None, None, None, None
    try:
        plan_sha = sha256_hex(load_plan_dict(plan)[0])
        spec = parse_plan(plan)
        program = _local_checks(spec, module, graph, world_size)
    except ValueError as e:
        error = str(e)
    agree_across_ranks(RankReport(rank, plan_sha, error, param_signature(module)))
    return AppliedPlan(spec, module, program, loss_fn or _default_loss(module), optimizer, timeout,
                       batch_dim)
