"""Applies a Plan to a torch.nn.Module inside a torch.distributed job (torchrun).

    hp = hybridplan.apply(plan, model, optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                          example_inputs=one_replica_batch)   # pipeline plans: the traced shape
    for inputs, target in loader:                 # the global batch, the same on every rank
        loss = hp.step(*hp.shard(inputs, target))  # this replica's share; forward+backward+update
    full = hp.state_dict()                        # the original module's keys, on every rank

apply() initialises the default process group if needed (env:// rendezvous as torchrun sets it
up; Gloo on CPU, NCCL for CUDA tensors), checks the plan against the module and the job, makes
every rank agree on torch and hybridplan versions, plan and parameter shapes, builds the process
groups the plan needs (one named DeviceMesh, executor/layout.py), then:

  placement  (one process per replica, rank = replica, world = dp): each assigned graph node
             moves to its replica device, inputs follow, and the replica is wrapped in
             DistributedDataParallel over the replicas (see placement).
  pipeline   (one process per device, rank = replica * mp + k, world = dp * mp): the module
             is cut into the plan's mp * virtual_stages stages by torch.export
             (profiler.stage_split) and this rank's stage (or, under the interleaved and
             zero-bubble schedules, stages; the plan's stage_ranks say which) runs in
             torch.distributed.pipelining's PipelineStage under the plan's schedule, wrapped in
             DDP over its DP group {r * mp + k} (see pipeline).

Sharded data parallelism (the plan's "sharding": "zero2" or "zero3"; see sharding): in place
of DDP, torch's FSDP2 fully_shard over the same data-parallel group shards parameters,
gradients and optimizer state over the replicas. Placement plans (mp == 1) shard each graph
node as a unit and the root as one more (zero2 keeps a unit's gathered parameters from its
forward through its backward, zero3 frees them after the forward and gathers them again);
pipeline plans shard each stage module as one unit (zero2 only). The training is the same;
state_dict() and save_checkpoint() gather the shards, so checkpoints move between sharded and
unsharded plans.

Tensor parallelism (the plan's "tp" > 1, docs/tensor_parallel.md; see tensor_parallel): every
process above becomes tp processes, TP rank t innermost (placement rank = replica * tp + t,
pipeline rank = (replica * mp + k) * tp + t), that split the nodes profiler.tensor_parallel.
detect_layout names (apply() calls it on the module, with example_inputs) over their TP group
with DTensor's parallelize_module; data parallelism over the replicas of one TP rank is FSDP2's
(fully_shard for sharded plans, else replicate), and each TP rank runs its own pipeline.

Inputs as users have them: `inputs` is a tensor, a tuple of positional arguments or a dict of
keyword arguments (input_ids=..., attention_mask=...); the module may return a tensor, a
tuple, a dict or a ModelOutput, which loss_fn(output, target) receives as the module returns it.

Training under any plan is the same training as on one device with the global batch (up to
float reassociation): the loss is mean-reduced, micro-batch losses are divided by their number
(equal micro-batches), replicas average their gradients and tied weights' copies sum theirs.
BatchNorm: placement (DDP) trains as torch DDP does, which apply() notes once; with
sync_batchnorm=True it normalises over the global batch (torch's SyncBatchNorm over the
replicas), as one process does; a pipeline stage normalises each micro-batch alone, as GPipe
does (see pipeline, batch_norm).

apply(..., measure_noise_scale=N) measures the gradient noise scale every N steps from the
replicas' local and all-reduced gradients (a DDP comm hook, see noise; not under sharding);
hp.noise_scale() reads it and hp.switch_advice(graph, cluster, job) says whether another plan
would now win. hp.switch(other_plan) moves the running job to another plan on the same
processes, the state handed over in memory, and hp becomes that plan; apply(...,
adapt=Adapt(graph, cluster, job)) switches by itself when the advice says so (see switching).
"""

from __future__ import annotations

import atexit
import datetime
import functools
import gc
import os
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..profiler import block_list, block_timing, stage_split
from ..profiler.dataflow import map_tensors
from . import batch_norm, checkpoint, lost_peer, noise, placement, sharded_checkpoint, sharding
from . import switching
from . import tensor_parallel
from .layout import Layout
from .pipeline import PipelineRunner, merge_states
from ..planner import Plan
from .plan_spec import graph_sha256, parse_plan
from . import rank_agreement
from .rank_agreement import RankReport, agree_across_ranks, param_signature

__all__ = ["apply", "AppliedPlan", "destroy_groups"]

kDefaultTimeoutS = 300.0
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def destroy_groups(groups: Sequence[Optional["dist.ProcessGroup"]] = (None,)) -> None:
    """Destroys `groups` newest first (None: every group, the default included) after a garbage
    collection, while Python is fully alive. Call it once the DDP wrappers (and anything else
    holding a group) are dropped; AppliedPlan.close() does, and so does every plain-DDP job in
    the tests and benches (a CI run had both ranks of torch DDP abort at exit without it).

    Why (~1 exit in 4 aborted with "terminate called without an active exception" before):
    each backward stashes a Python object in thread-local state
    (torch.autograd.graph._engine_run_backward), and every all-reduce DDP launches from the
    backward keeps a copy of that state in its Gloo Work. A Gloo worker thread drops its last
    reference to a Work just after wait() returns; if the interpreter is finalizing by then,
    releasing the Python object makes the thread exit from inside take_gil (pthread_exit), which
    unwinds through the Work's noexcept destructor: std::terminate. A process group's Gloo
    threads are joined when its last reference goes, so the wrappers (which hold the groups, in
    reference cycles only a collection frees) must be collected and the groups destroyed while
    Python is alive. Order: the wrappers go first, while the groups are still registered, so
    that a DDP Reducer never holds a group's last reference. Its destruction would join the Gloo
    threads with the GIL held while a thread waits for the GIL to release that Python object: a
    deadlock (seen as hung plain-DDP ranks, exit_launches.py --plain-ddp).
    destroy_process_group() drops the registered references, and the group's own binding
    releases the GIL before joining."""
    gc.collect()
    for group in reversed(list(groups)):
        if dist.is_initialized():  # else every group is destroyed already
            dist.destroy_process_group(group)  # its last reference: joins its threads


class _Lifecycle:
    """What apply() started in this process, so that it can be shut down in order: the
    AppliedPlans not yet closed (weak references, in creation order) and whether apply()
    created the default process group (then the last close() destroys it)."""
    open_plans: List["weakref.ref[AppliedPlan]"] = []
    owns_default_group = False
    atexit_registered = False
    store: Optional[Any] = None  # the job's rendezvous store, kept for the process's life
    incarnation = 0              # default groups apply() created so far (the same on every rank)

    @classmethod
    def track(cls, hp: "AppliedPlan") -> None:
        cls.open_plans.append(weakref.ref(hp))
        if not cls.atexit_registered:
            atexit.register(cls.shutdown)
            cls.atexit_registered = True

    @classmethod
    def forget(cls, hp: Optional["AppliedPlan"]) -> None:
        cls.open_plans = [r for r in cls.open_plans if r() is not None and r() is not hp]
        if not cls.open_plans and cls.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
            cls.owns_default_group = False

    @classmethod
    def shutdown(cls) -> None:
        """atexit: closes the plans the user did not close, newest first. After an uncaught
        exception (sys.last_value is set before atexit runs) it does not wait for the peers:
        they may be blocked in a collective this rank will never join, and they learn of its
        exit sooner from the closed connections than from a barrier's timeout."""
        failed = getattr(sys, "last_value", None) is not None
        for ref in reversed(list(cls.open_plans)):
            hp = ref()
            if hp is not None:
                try:
                    hp.close(wait_for_peers=not failed)
                except Exception:  # exiting anyway; a lost peer must not hang or mask it
                    pass
        cls.forget(None)


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
    # The rendezvous store lives as long as the process, and each default group apply()
    # creates rendezvouses under a prefix of its own. With init_process_group's env:// store,
    # rank 0's TCPStore server stops when close() destroys the group; a second apply() in the
    # same processes then raced it: a rank that re-initialised before rank 0 had destroyed its
    # group joined the old server and its old keys, and rank 0 waited at the new one forever.
    _Lifecycle.incarnation += 1
    store = dist.PrefixStore(f"{_restart_prefix()}hybridplan/apply{_Lifecycle.incarnation}",
                             _job_store(timeout))
    dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    _Lifecycle.owns_default_group = True


def _restart_prefix() -> str:
    """"restart<N>/" when torchrun restarted this job's workers and they share the agent's
    store, else "". torchrun's agent keeps one TCPStore for every attempt (torch's shared
    rendezvous store, TORCHELASTIC_USE_AGENT_STORE), so a restarted worker found the keys the
    killed attempt's ranks had written (their Gloo addresses) and connected to dead ports:
    `Gloo connectFullMesh failed ... Connection refused`, or a hang (pytorch/pytorch#135712).
    The restart count tells the attempts apart only where every worker has the same one: one
    agent (GROUP_WORLD_SIZE 1, torchrun --standalone). Several agents count their restarts
    each on its own (a node that joins starts at 0): launch those with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (`python -m hybridplan run` sets it), which gives
    every attempt a store of its own."""
    if (os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)
            or os.environ.get("GROUP_WORLD_SIZE", "1") != "1"):
        return ""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return "" if restart == "0" else f"restart{restart}/"


def _job_store(timeout: datetime.timedelta) -> Any:
    """The job's TCPStore at MASTER_ADDR:MASTER_PORT, created once per process as torch's env://
    rendezvous creates it: a client of torchrun's agent store when torchrun hosts one
    (TORCHELASTIC_USE_AGENT_STORE), else hosted by rank 0 (multi-tenant, as env:// does)."""
    if _Lifecycle.store is None:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
        _Lifecycle.store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
            int(os.environ["WORLD_SIZE"]), is_master=not agent and int(os.environ["RANK"]) == 0,
            timeout=timeout, multi_tenant=True)
    return _Lifecycle.store


def _device(spec: Plan, global_device: int) -> torch.device:
    """cuda:<local index> for mesh entry node * devices_per_node + local; CPU without CUDA."""
    if torch.cuda.is_available():
        return torch.device("cuda", global_device % spec.devices_per_node)
    return torch.device("cpu")


def _check_module(spec: Plan, module: nn.Module) -> None:
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


def as_call(inputs: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """(args, kwargs) from a tensor, a tuple/list of positional arguments or a dict of keyword
    arguments."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _first_microbatch(spec: Plan, example_inputs: Any, batch_dim: int
                      ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """One micro-batch of the example: the shape the stages are traced at."""
    if example_inputs is None:
        raise ValueError(f"{spec.source}: a pipeline plan needs apply(..., example_inputs=) (one "
                         "replica batch): its stages are cut by torch.export at that shape")
    if batch_dim != 0:
        raise ValueError(f"{spec.source}: pipeline plans cut micro-batches along dimension 0, "
                         f"as torch.distributed.pipelining does (got batch_dim={batch_dim})")
    m, b = spec.num_microbatches, spec.per_replica_batch
    if b % m:
        raise ValueError(f"{spec.source}: per_replica_batch must be a multiple of "
                         f"num_microbatches={m}: the stages run equal micro-batches (got {b})")

    def part(v):
        if not isinstance(v, torch.Tensor):
            return v
        if v.dim() == 0 or v.shape[0] != b:
            raise ValueError(f"{spec.source}: example_inputs tensors must hold per_replica_batch"
                             f"={b} samples along dim 0 (got shape {list(v.shape)})")
        return v[: b // m]
    args, kwargs = as_call(example_inputs)
    return tuple(part(v) for v in args), {k: part(v) for k, v in kwargs.items()}


def _local_checks(spec: Plan, module: nn.Module, graph: Any, world_size: int,
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
    _check_module(spec, module)
    if spec.mode == "pipeline":
        _first_microbatch(spec, example_inputs, batch_dim)


def _cut(spec: Plan, module: nn.Module, example_inputs: Any, batch_dim: int,
         tp_styles: Optional[Dict[str, str]] = None) -> stage_split.StageCut:
    """The plan's stages (pipeline mode): the export-based cut at one micro-batch; with
    tensor parallelism, of a copy holding this TP rank's shards (tensor_parallel.
    narrowed_for_export: the traced stages record the sizes the rank runs)."""
    args, kwargs = _first_microbatch(spec, example_inputs, batch_dim)
    if spec.tp > 1 and tp_styles:
        module = tensor_parallel.narrowed_for_export(
            module, tp_styles, Layout.of(spec).tp_rank_of(dist.get_rank()), spec.tp)
    return stage_split.split(module, args, kwargs, spec.assignment, spec.num_stages, spec.source)


class AppliedPlan:
    """A module trained under a plan on this rank. Attributes: `module` (this rank's part: the
    whole replica in placement mode, the stage module in pipeline mode, an nn.ModuleList of
    the stage modules where the rank holds several), `plan` (the hybridplan Plan applied),
    `layout` (its process grid, executor/layout.py), `rank`, `replica`,
    `stage` (the pipeline rank within the replica, 0..mp-1: with one stage per rank, the stage),
    `stages` (the stages this rank holds; [stage] unless the schedule runs several per rank),
    `optimizer`, `predicted_step_s`, `step_count` (optimizer steps
    taken, a resumed checkpoint's included), `shard_units` (a sharded placement plan: the graph
    nodes FSDP shards as units of their own; the root is one more, see sharding), `switches`
    (one dict per switch(): step, from, to, reason, and the advice's figures)."""

    def __init__(self, spec: Plan, original: nn.Module, cut: Optional[stage_split.StageCut],
                 loss_fn: Callable, optimizer: Union[Callable, torch.optim.Optimizer, None],
                 timeout: datetime.timedelta, batch_dim: int,
                 measure_noise_scale: int = 0, noise_scale_decay: float = 0.99,
                 aliases: Optional[Dict[str, str]] = None,
                 resumed: Optional[Dict[str, Any]] = None, resumed_from: str = "",
                 tp_styles: Optional[Dict[str, str]] = None,
                 tp_kinds: Optional[Dict[str, str]] = None, tp_sequence: Any = None,
                 sync_batchnorm: bool = False):
        self.plan, self.original, self.loss_fn, self.batch_dim = spec, original, loss_fn, batch_dim
        # tensor parallelism (tp > 1): node -> style, node module -> weight kind (apply())
        self._tp_styles, self._tp_kinds = tp_styles or {}, tp_kinds or {}
        self._tp_sequence = tp_sequence  # sequence parallelism's SpLayout, or None
        self.rank = dist.get_rank()
        self.layout = Layout.of(spec)  # where this rank sits; its groups: self._mesh
        self.replica = self.layout.replica_of(self.rank)
        self.stage = self.layout.stage_of(self.rank)
        self.tp_rank = self.layout.tp_rank_of(self.rank)
        self.stages: List[int] = [self.stage]  # pipeline: the stages this rank holds
        self.predicted_step_s = spec.predicted_step_s
        self._timeout = timeout
        self.recorded_actions: List[tuple] = []  # record_actions()
        self.step_count = 0
        # every process group this plan uses, created here at once (collective); close()
        # destroys them (self._groups: the same list)
        self._mesh = self.layout.build(timeout)
        self._groups: List[Any] = self._mesh.groups
        self.shard_units: List[str] = []  # sharded placement: the nodes sharded on their own
        self._closed = False
        self.checkpoint_dir: Optional[str] = None  # apply's: save_sharded's default directory
        self._pending_save: Any = None  # an asynchronous save not yet complete
        self.last_save_stall_s = 0.0  # how long the last save_sharded held the training thread
        self.resumed_from = resumed_from  # the checkpoint resumed ("" if none)
        self.resumed_extra = resumed.get("extra") if resumed is not None else None
        # what switch() carries over to the next plan (loss_fn None: the module's default)
        self._switch_options: Dict[str, Any] = {
            "loss_fn": None if loss_fn == _default_loss(original) else loss_fn,
            "optimizer": optimizer, "timeout_s": timeout.total_seconds(), "batch_dim": batch_dim,
            "measure_noise_scale": measure_noise_scale, "noise_scale_decay": noise_scale_decay,
            "adapt": None, "sync_batchnorm": sync_batchnorm}
        self.switches: List[Dict[str, Any]] = []  # one entry per switch(): step, from, to, ...
        self._adapt: Optional[switching.Adapt] = None  # apply(..., adapt=)
        self._adapt_state = {"checked": 0, "switched": 0}  # step_count of the last of each
        self._last_inputs: Any = None  # the last step's inputs: a pipeline switch's example
        # parameter name -> canonical name (tied names -> the first), taken before the cut
        self._aliases = aliases if aliases is not None else checkpoint.parameter_aliases(original)
        if spec.mode == "placement":
            self._init_placement()
        else:
            self._init_pipeline(cut)
        self.optimizer = self._make_optimizer(optimizer)
        self._noise: Optional[noise.NoiseScaleMeter] = None
        if measure_noise_scale:
            self._noise = noise.NoiseScaleMeter(measure_noise_scale, noise_scale_decay, spec.dp,
                                                self._first_device())
            ddps = [self.ddp] if spec.mode == "placement" else self._runner.ddps
            for ddp in ddps:  # a pipeline stage without parameters adds zeros
                if ddp is not None:
                    self._noise.install(ddp)
        _Lifecycle.track(self)
        if resumed is not None:  # the model state was loaded into `original` before the cut
            checkpoint.load_optimizer_state(self.optimizer, self._param_names(),
                                            resumed["optimizer"], resumed_from)
            self.step_count = resumed["step"]

    # ---- construction ---------------------------------------------------------------------------
    def _init_placement(self) -> None:
        spec, mesh = self.plan, self._mesh
        if self._switch_options["sync_batchnorm"]:  # before place(): a BN node may be replaced
            self.original = batch_norm.convert_sync(self.original, mesh.dp_group(),  # tp == 1
                                                    _device(spec, spec.mesh[self.replica][0]))
        self.devices = [_device(spec, g + self.tp_rank) for g in spec.mesh[self.replica]]
        self._hooks = placement.place(self.original, spec.assignment, self.devices,
                                      spec.recompute, spec.selective)
        if spec.tp > 1:  # mp == 1 (plan rule): TP over the replica's group, DP over the dp dim
            tensor_parallel.parallelize(self.original, self._tp_styles, self._tp_kinds,
                                        mesh.tp(), sequence=self._tp_sequence)
            self.ddp = None
            if spec.dp > 1 and spec.sharding != "none":
                self.shard_units = sharding.shard_placement(
                    self.original, spec.assignment, mesh.dp(), spec.sharding)
            elif spec.dp > 1:
                tensor_parallel.replicate_placement(self.original, spec.assignment, mesh.dp_tp())
        elif spec.sharding == "none":
            self.ddp = placement.wrap_ddp(self.original, self.devices, mesh.dp_group())
        else:  # mp == 1 (plan rule): one device; recompute was applied above, before sharding
            self.ddp = None
            self.shard_units = sharding.shard_placement(
                self.original, spec.assignment, mesh.hsdp() if self.layout.hybrid else mesh.dp(),
                spec.sharding)
        self.module = self.original
        self._params = list(self.original.parameters())  # FSDP's DTensors when sharded

    def _init_pipeline(self, cut: stage_split.StageCut) -> None:
        spec, layout, mesh = self.plan, self.layout, self._mesh
        # per tied parameter: the ranks of this replica and TP rank holding a copy (a group
        # where they are several; where one rank holds every copy, it sums them alone: see
        # pipeline)
        stage_ranks = spec.stage_ranks
        tie_groups: Dict[int, Any] = {}
        for i, uses in enumerate(cut.tied):
            holders = sorted({stage_ranks[s] for s in uses})
            if len(holders) > 1:
                tie_groups[i] = mesh.tied_group(holders)
        self._replica_group = mesh.pp_group()  # this TP rank's pipeline of the replica
        self.device = _device(spec, spec.mesh[self.replica][self.stage] + self.tp_rank)
        self.stages = spec.stages_of(self.stage)
        recomputed = {spec.assignment[n] for n in spec.recompute}
        selective = {spec.assignment[n] for n in spec.selective}  # whole stages (plan rule)
        self._runner = PipelineRunner(
            cut, self.stages, self.device, spec.schedule, spec.num_microbatches, self.loss_fn,
            self._replica_group, mesh.dp_group(), spec.dp, tie_groups,
            recompute_stages=sorted(recomputed), sharding=spec.sharding,
            dp_mesh=mesh.hsdp() if layout.hybrid else mesh.dp(),
            selective_stages=sorted(selective),
            tensor_parallel=((self._tp_styles, self._tp_kinds, mesh.dp_tp()) if spec.tp > 1
                             else None))
        # the ranks of this TP rank's pipeline holding stage 0 (the batch's inputs) and the last
        self._first_rank = layout.rank_of(self.replica, stage_ranks[0], self.tp_rank)
        self._last_rank = layout.rank_of(self.replica, stage_ranks[-1], self.tp_rank)
        self._cut = cut
        self.module = self._runner.module
        self._params = self._runner.parameters()

    def _make_optimizer(self, optimizer) -> torch.optim.Optimizer:
        if isinstance(optimizer, torch.optim.Optimizer):
            if self.plan.mode == "pipeline" and self._cut.tied:
                raise ValueError("hybridplan.apply: with tied weights across pipeline stages "
                                 "pass an optimizer factory (each stage steps its own copy)")
            return optimizer  # parameters of other stages get no grad, so it skips them
        factory = optimizer or functools.partial(torch.optim.SGD, lr=0.01)
        params = [p for p in self._params if p.requires_grad]
        if not params:  # a stage without parameters still takes part in the schedule
            params = [nn.Parameter(torch.zeros(0, device=self._first_device()))]
        return factory(params)

    def _first_device(self) -> torch.device:
        return self.devices[0] if self.plan.mode == "placement" else self.device

    # ---- training -------------------------------------------------------------------------------
    def shard(self, inputs: Any, target: Any = None) -> Tuple[Any, Any]:
        """This replica's share (1/dp along batch_dim) of a global batch of inputs (a tensor, a
        tuple or a dict, see apply) and target, in the same form."""
        def part(v):
            if isinstance(v, torch.Tensor):
                return torch.tensor_split(v, self.plan.dp, dim=self.batch_dim)[self.replica]
            return v
        if isinstance(inputs, dict):
            return {k: part(v) for k, v in inputs.items()}, part(target)
        if isinstance(inputs, (tuple, list)):
            return tuple(part(v) for v in inputs), part(target)
        return part(inputs), part(target)

    def step(self, inputs: Any, target: Any) -> torch.Tensor:
        """Forward, backward and optimizer step on this replica's batch (`inputs`: a tensor, a
        tuple of positional or a dict of keyword arguments of forward(); in pipeline mode only
        the rank holding stage 0 reads the inputs and only the one holding the last stage the
        target, others may pass None). Returns the replica's mean loss on every rank (broadcast
        from the rank holding its last stage: pipeline rank mp - 1, or 0 under "zbv").

        If a peer is lost (killed, or silent past the timeout), raises RuntimeError naming it
        (see lost_peer) instead of the transport's error. Under apply(..., adapt=) a step may
        end with a switch to another plan: read the next global batch from hp.plan.
        """
        self._check_open("step")
        self._last_inputs = inputs
        try:
            loss = self._step(inputs, target)
        except Exception as e:
            if not lost_peer.is_communication_error(e):
                raise
            raise lost_peer.lost_peer_error(e, f"step {self.step_count + 1}", self.rank,
                                            dist.get_world_size(),
                                            f"step{self.step_count + 1}") from e
        if self._adapt is not None:  # may switch this AppliedPlan to another plan
            switching.maybe_adapt(self)
        return loss

    def _step(self, inputs: Any, target: Any) -> torch.Tensor:
        self._settle()
        self.optimizer.zero_grad(set_to_none=True)
        if self._noise is not None:
            self._noise.begin_step()
        if self.plan.mode == "placement":
            args, kwargs = as_call(inputs)
            output = (self.ddp or self.original)(*args, **kwargs)
            loss = self.loss_fn(output, _to(target, _device_of(output)))
            loss.backward()
            if self._noise is not None:
                self._noise.end_step(_batch_size(args, kwargs, self.batch_dim))
            self.optimizer.step()
            self.step_count += 1
            return loss.detach()
        flat = None
        if self.rank == self._first_rank:
            args, kwargs = as_call(inputs)
            flat = [_to(t, self.device) for t in self._cut.flatten_inputs(args, kwargs,
                                                                          self.plan.source)]
            _check_batch(self.plan, flat)
        loss = self._runner.step(flat, _to(target, self.device))
        if self._noise is not None:
            self._noise.end_step(self.plan.per_replica_batch)  # stage 0 checked the batch
        self._loss_sent = None
        if self.plan.mp > 1:  # the last stage's rank sends the loss to the replica's others
            last = self._last_rank
            work = dist.broadcast(loss, src=last, group=self._replica_group, async_op=True)
            # The sender does not wait for it here: it finishes its schedule before stage 0,
            # and a rank blocked in a collective took CPU from the ranks still computing on a
            # shared CPU (+5-10 % step time in bench/bench_executor.py).
            if self.rank == last:
                self._loss_sent = work
            else:
                work.wait()
        self.optimizer.step()
        self.step_count += 1
        return loss

    def _settle(self) -> None:
        """Waits for the previous step's loss broadcast (pipeline, last stage; long since sent)."""
        if getattr(self, "_loss_sent", None) is not None:
            self._loss_sent.wait()
            self._loss_sent = None

    # ---- statistical efficiency ---------------------------------------------------------------
    def noise_scale(self):
        """The gradient noise scale B_simple measured online (apply(..., measure_noise_scale=N):
        every N-th step), as a convergence.noise_scale.NoiseScale: `b_simple` and its `stderr`,
        `g_squared`, `trace_sigma`, `effective_steps` (1 / sum of squared step weights), with
        small_batch = this replica's batch and big_batch = dp times it. Numerator and
        denominator are exponential moving averages (weight noise_scale_decay per measured
        step). None before two measured steps. The same on every rank. See executor/noise.py."""
        if self._noise is None:
            raise ValueError("hybridplan: noise_scale() needs apply(..., measure_noise_scale=N) "
                             "(measure every N steps; it needs dp >= 2)")
        return self._noise.estimate()

    def switch_advice(self, graph: Any, cluster: Any, job: Any, *, devices: Optional[int] = None,
                      min_gain: float = 0.05, processes: Optional[int] = None,
                      modes: Optional[Sequence[str]] = None):
        """Whether another plan would now win, with the measured critical batch in place of
        `job`'s (see convergence.noise_scale_job.switch_advice): a SwitchAdvice with the best
        plan for the measured critical batch and the predicted gain of switching to it. `graph`,
        `cluster` and `job` are what the applied plan was planned with; `devices` defaults to
        the plan's world size. None until noise_scale() has an estimate."""
        from ..convergence.noise_scale_job import switch_advice

        estimate = self.noise_scale()
        if estimate is None:
            return None
        return switch_advice(self.plan, estimate, graph, cluster, job, devices=devices,
                             min_gain=min_gain, processes=processes, modes=modes)

    def switch(self, plan: Any, *, module: Optional[nn.Module] = None, example_inputs: Any = None,
               **apply_options: Any) -> "AppliedPlan":
        """Moves this job to `plan` on the same processes, without a restart: every rank must
        call it (collective). This AppliedPlan becomes the new plan (plan, module, optimizer,
        ... are the new plan's; step() goes on) and is returned. The training state (model,
        optimizer state and hyperparameters as they are now: the learning rate is not
        rescaled, step_count) is handed over in memory (consolidated_state); loss_fn, the
        optimizer factory, timeout, batch_dim, the noise-scale options and the adaptive policy
        carry over unless `apply_options` (apply's keyword arguments, not resume_from) say
        otherwise. The default process group stays; the old plan's own groups are destroyed.

        module      required after a sharded plan (FSDP2 cannot be undone): a freshly built
                    model of the same architecture; otherwise the running module is reused.
        example_inputs  pipeline plans: one replica batch at the new per_replica_batch; by
                    default rank 0's last step's inputs, cut or repeated to it.

        Raises ValueError on every rank, with the old plan unchanged and still training, when
        the new plan does not fit (world size, module, options; an Optimizer instead of a
        factory; a sharded module without module=). A failure while building the new plan
        (after the old one is closed) leaves this AppliedPlan closed. Objects built on the old
        optimizer (LR schedulers) must be rebuilt on hp.optimizer. See executor/switching.py.
        """
        return _switch(self, plan, module=module, example_inputs=example_inputs,
                       **apply_options)

    def parameters(self) -> List[nn.Parameter]:
        """The parameters this rank trains (its stages' in pipeline mode, tied copies
        included, one per stage holding it; the whole replica's in placement mode)."""
        return list(self._params)

    def record_actions(self, enabled: bool = True) -> None:
        """Pipeline mode: from the next step on, record every forward and backward of a
        micro-batch into `recorded_actions` as (kind, stage, micro-batch, start, end) with
        time.perf_counter seconds (cleared by each call); kind is "F", "B", or under a
        zero-bubble schedule "I" and "W" (the backward's input and weight passes, see
        pipeline). A no-op in placement mode."""
        self.recorded_actions: List[tuple] = []
        if self.plan.mode == "pipeline":
            self._runner.actions = self.recorded_actions if enabled else None

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The whole model's state, keyed as the original module's state_dict, on every rank
        (pipeline: the stages' tensors gathered over the replica's ranks; sharded plans: each
        parameter gathered over the DP group; CPU copies). Collective: every rank calls it."""
        self._check_open("state_dict")
        if self.plan.mode == "placement":
            return sharding.full_cpu_state(self.original.state_dict(keep_vars=True))
        self._settle()
        parts: List[Optional[Dict[str, torch.Tensor]]] = [None] * self.plan.mp
        dist.all_gather_object(parts, self._runner.local_state(), group=self._replica_group)
        return merge_states(self.original, parts)

    # ---- shutting down ---------------------------------------------------------------------------
    def close(self, *, wait_for_peers: bool = True) -> None:
        """Orderly shutdown on every rank: waits for this rank's last loss broadcast (pipeline),
        then (wait_for_peers) for every rank to arrive here (a barrier under the plan's
        timeout: no rank tears down a connection a peer still uses), drops the DDP wrappers and
        the pipeline schedule, destroys the process groups this plan created, newest first, and
        the default group if apply() created it and no other AppliedPlan is open. Idempotent;
        apply() registers it at exit for plans never closed. After close(), step() raises.
        A sharded module stays sharded (FSDP has no undo): its DTensor parameters refer to the
        destroyed group, so take its state (state_dict, save_checkpoint) before close()."""
        if self._closed:
            return
        self._closed = True
        try:
            self._settle()
            if wait_for_peers:
                self.wait_checkpoint()
            if self._noise is not None and wait_for_peers:
                self._noise.collect(wait=True)  # no noise-scale all-reduce left in flight
            if wait_for_peers and dist.is_initialized():
                dist.barrier()
        finally:
            # The wrappers go first, while the groups are still registered: see destroy_groups.
            self.ddp = self._runner = self._replica_group = None
            destroy_groups(self._groups)
            self._groups = []
            _Lifecycle.forget(self)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r}: {what}() after close() (call state_dict() or "
                               f"save_checkpoint() before close())")

    def __enter__(self) -> "AppliedPlan":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # after an error (a lost peer) do not wait for ranks that may never arrive
        self.close(wait_for_peers=exc_type is None)

    def _param_names(self) -> Dict[int, str]:
        """id(parameter) -> canonical name, for this rank's parameters (a tied weight's copies
        on several stages share the name; a parameter-free stage's placeholder has none)."""
        if self.plan.mode == "placement":
            named = self.original.named_parameters(remove_duplicate=False)
        else:
            named = self._runner.named_parameters()
        return {id(p): self._aliases.get(name, name) for name, p in named}

    def _gather_parts(self) -> Optional[List[Any]]:
        """Replica 0's ranks' model states and optimizer states by name, gathered on rank 0 (a
        list, one entry per rank, None for ranks that contribute nothing); None on the other
        ranks. Collective: every rank must call it. A sharded plan's ranks all gather their
        full parameters and optimizer state first (DTensor.full_tensor is collective over the DP
        group), then replica 0's contribute as without sharding."""
        self._settle()
        part = None
        # sharded or TP plans: each parameter is a DTensor over a mesh with the other replicas
        # (FSDP2's), gathered whole by every rank of it
        if self.replica == 0 or self.plan.sharding != "none" or self.plan.tp > 1:
            model = (sharding.full_cpu_state(self.original.state_dict(keep_vars=True))
                     if self.plan.mode == "placement" else self._runner.local_state())
            part = {"model": model,
                    "optimizer": checkpoint.optimizer_state_by_name(self.optimizer,
                                                                     self._param_names())}
            if self.replica != 0 or self.tp_rank != 0:
                part = None  # gathered for replica 0's TP rank 0 ranks, which contribute it
        parts: Optional[List[Any]] = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(part, parts, dst=0)  # every rank has contributed once it returns
        return parts

    def _build_consolidated(self, parts: List[Any]) -> Dict[str, Any]:
        """The consolidated checkpoint (checkpoint.build) from _gather_parts' list (rank 0)."""
        mine = [p for p in parts if p is not None]
        return checkpoint.build(
            merge_states(self.original, [p["model"] for p in mine]),
            checkpoint.merge_optimizer_states([p["optimizer"] for p in mine]),
            self.step_count, self.plan.to_json(), self.plan.graph_sha256)

    def consolidated_state(self) -> Dict[str, Any]:
        """The whole training state in memory, on every rank, as save_checkpoint writes it
        (docs/formats.md "Checkpoint": the model under the original module's state_dict keys,
        the optimizer state by parameter name, step, plan). Collective: every rank must call
        it; rank 0 gathers and broadcasts it."""
        self._check_open("consolidated_state")
        parts = self._gather_parts()
        return rank_agreement.rank_zero_acts(
            lambda: self._build_consolidated(parts), rank_agreement.rank_zero_error(
                lambda why: f"hybridplan: the training state could not be gathered (rank 0: "
                            f"{why})"))

    def save_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Writes one consolidated checkpoint to `path` (docs/formats.md "Checkpoint"): the
        whole model under the original module's state_dict keys, the optimizer state keyed by
        parameter name, step_count, the plan and its graph hash. Every rank must call it (it is
        collective); replica 0's ranks contribute their parts (_gather_parts), rank 0 writes.
        Atomic: the file at `path` is the previous one until the new one is complete (see
        checkpoint). Raises RuntimeError on every rank if the write failed."""
        self._check_open("save_checkpoint")
        path = os.fspath(path)
        parts = self._gather_parts()
        rank_agreement.rank_zero_acts(
            lambda: checkpoint.write_atomic(self._build_consolidated(parts), path),
            rank_agreement.rank_zero_error(
                lambda why: f"{path}: checkpoint not written (rank 0: {why}); the previous "
                            f"file, if any, is unchanged"))

    def save_sharded(self, directory: Union[str, os.PathLike, None] = None, *,
                     async_save: bool = False, keep: int = 2, extra: Any = None
                     ) -> Optional[str]:
        """Writes a sharded checkpoint with torch.distributed.checkpoint to
        `<directory>/step-<step_count>/` (default directory: apply's checkpoint_dir): every rank
        writes its own part in parallel, and a manifest of every file's size and sha256 is
        written last (docs/checkpoints.md; sharded_checkpoint). `keep`: the newest checkpoints
        kept (0: all). `extra`: any picklable object (say, the data loader's position), given
        back as hp.resumed_extra on resume; rank 0's is kept. Collective.

        async_save: the state is copied to CPU memory and written by a thread while training
        goes on; the checkpoint becomes complete (manifest, final name) at the next
        save_sharded, wait_checkpoint() or close(). Returns the completed checkpoint's path:
        this one's when synchronous, else the previous asynchronous one's if this call
        completed it (None otherwise). Raises RuntimeError on every rank if a write failed;
        the checkpoints already complete are left as they were."""
        self._check_open("save_sharded")
        self._settle()
        if directory is None:
            directory = self.checkpoint_dir
        if directory is None:
            raise ValueError("save_sharded: directory must be given (or apply's checkpoint_dir)")
        if not isinstance(keep, int) or keep < 0:
            raise ValueError(f"save_sharded: keep must be an int >= 0 (got {keep!r})")
        completed = self.wait_checkpoint()
        started = time.perf_counter()
        pending = sharded_checkpoint.begin(self, os.fspath(directory), self._mesh.world_group(),
                                           async_save, extra)
        pending.keep = keep
        pending.stall_s = time.perf_counter() - started
        self.last_save_stall_s = pending.stall_s
        self._pending_save = pending
        if not async_save:
            return self.wait_checkpoint()
        return completed

    def wait_checkpoint(self) -> Optional[str]:
        """Completes the asynchronous save in flight, if any (waits for every rank's write,
        writes the manifest, gives the directory its final name); returns its path. Collective."""
        pending, self._pending_save = getattr(self, "_pending_save", None), None
        if pending is None:
            return None
        return sharded_checkpoint.finalize(pending, self._mesh.world_group(), pending.keep)

    def export_pretrained(self, directory: Union[str, os.PathLike], **kw: Any) -> None:
        """Writes the trained model to `directory` as a Hugging Face checkpoint (config.json +
        model.safetensors) that from_pretrained loads; the original module must be a
        transformers.PreTrainedModel. Collective, atomic: see hf_export.export_pretrained."""
        from . import hf_export
        hf_export.export_pretrained(self, directory, **kw)

    def __repr__(self) -> str:
        tp = f", tp={self.plan.tp}, tp_rank={self.tp_rank}" if self.plan.tp > 1 else ""
        return (f"AppliedPlan(mode={self.plan.mode!r}, dp={self.plan.dp}, mp={self.plan.mp}{tp}, "
                f"rank={self.rank}, replica={self.replica}, stage={self.stage})")


def _check_batch(spec: Plan, flat: List[Any]) -> None:
    for t in flat:
        if t.dim() == 0 or t.shape[0] != spec.per_replica_batch:
            raise ValueError(f"{spec.source}: a pipeline step takes per_replica_batch="
                             f"{spec.per_replica_batch} samples per input tensor, the shape its "
                             f"stages were traced at (got shape {list(t.shape)})")


def _batch_size(args: Tuple[Any, ...], kwargs: Dict[str, Any], batch_dim: int) -> int:
    """Samples in a placement step's local batch: the first input tensor's size along
    batch_dim (0 when no input is a tensor: the noise-scale meter then skips the step)."""
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > batch_dim:
            return int(v.shape[batch_dim])
    return 0


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


# ---- switching plans in place (AppliedPlan.switch; the adaptive policy: executor/switching.py) ---

# apply() options a switch accepts (the rest are apply's own: resume_from is the running state)
_OPTIONS = ("loss_fn", "optimizer", "timeout_s", "graph", "batch_dim", "measure_noise_scale",
            "noise_scale_decay", "adapt", "retain_freed_memory", "sync_batchnorm")
_STATE_NOTE = ("The training state at the switch is the exception's .hybridplan_state: "
               "hybridplan.apply(plan, module, resume_from=e.hybridplan_state) resumes it")
# AppliedPlan's own public attributes: every other public attribute is the user's, carried over
_OWN = {"plan", "original", "loss_fn", "batch_dim", "rank", "replica", "stage", "stages",
        "predicted_step_s", "recorded_actions", "step_count", "shard_units", "optimizer",
        "module", "ddp", "devices", "device", "switches", "layout", "tp_rank"}


def _agree(rank: int, plan_sha: Optional[str], error: Optional[str], module: nn.Module) -> None:
    """Every rank's local verdict gathered and judged alike (rank_agreement): ValueError on
    every rank if one failed, naming that the running plan is unchanged."""
    try:
        signature = param_signature(module) if error is None else []
        rank_agreement.agree_across_ranks(
            RankReport(rank, plan_sha, error, signature, *rank_agreement.local_versions()))
    except ValueError as e:
        raise ValueError(f"hybridplan switch refused ({e}); the running plan is unchanged and "
                         f"trains on") from None


def _resized(value: Any, want: int) -> Any:
    """`value`'s tensors cut or repeated to `want` samples along dim 0 (CPU copies)."""
    def resize(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu()
        if t.dim() == 0 or t.shape[0] == 0:
            return t
        return t.index_select(0, torch.arange(want) % t.shape[0])
    return map_tensors(value, resize)


def _derived_example(hp: Any, spec: Any) -> Any:
    """One replica batch at the new plan's per_replica_batch from rank 0's last step's inputs
    (rank 0 holds replica 0's inputs under every plan), broadcast to every rank; None when
    rank 0 has none (no step yet) or the batch is not along dim 0. Collective."""
    box: List[Any] = [None]
    if hp.rank == 0 and hp._last_inputs is not None and hp.batch_dim == 0:
        box[0] = _resized(hp._last_inputs, spec.per_replica_batch)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _unplace(hp: Any) -> None:
    """Undoes what a placement plan did to the original module besides DDP: the input-moving
    hooks and the recompute wrappers; drops its gradients."""
    for handle in getattr(hp, "_hooks", None) or []:
        handle.remove()
    if hp.plan.mode == "placement":
        for name in hp.plan.recompute:
            node = hp.original.get_submodule(name.split("@")[0])
            if getattr(node.__dict__.get("forward"), "_hybridplan_recompute", False):
                del node.forward  # recompute() set it on the instance
    if hp.plan.mode == "placement" and hp.plan.sharding == "none":
        for p in hp.original.parameters():
            p.grad = None


def _switch(hp: "AppliedPlan", plan: Any, *, module: Optional[nn.Module] = None,
           example_inputs: Any = None, record: Optional[Dict[str, Any]] = None,
           **options: Any) -> Any:
    """AppliedPlan.switch (see there and executor/switching.py's module doc)."""

    hp._check_open("switch")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"AppliedPlan.switch() got unexpected options {unknown} (it takes "
                        f"apply's {list(_OPTIONS)}; the state comes from the running plan)")
    settings = dict(hp._switch_options)
    settings.update(options)  # loss_fn None: the module's default (apply's rule)
    requested_measure = settings["measure_noise_scale"]  # kept for later switches
    rank, world = hp.rank, dist.get_world_size()
    target = module if module is not None else hp.original
    spec, plan_sha, error, dropped = None, None, None, False
    try:
        if isinstance(settings["optimizer"], torch.optim.Optimizer):
            raise ValueError("a switch builds a new optimizer over the new plan's parameters: "
                             "pass apply(..., optimizer=) a factory (params -> Optimizer, e.g. "
                             "functools.partial(torch.optim.SGD, lr=0.1)), not an Optimizer "
                             "(its state is carried over by parameter name)")
        if target is hp.original and hp.plan.sharding != "none":
            raise ValueError(f"the running plan shards the module (\"sharding\": "
                             f"{hp.plan.sharding!r}), which FSDP2 cannot undo: pass "
                             f"switch(..., module=) a freshly built model (the same "
                             f"architecture; its weights are replaced by the running state)")
        if target is hp.original and hp.plan.tp > 1:
            raise ValueError(f"the running plan splits the module over its TP groups (\"tp\": "
                             f"{hp.plan.tp}; its parameters are DTensors), which cannot be "
                             f"undone: pass switch(..., module=) a freshly built model (the "
                             f"same architecture; its weights are replaced by the running "
                             f"state)")
        spec = parse_plan(plan)  # read once: the new plan's object from here on
        plan_sha = spec.sha256
        if ("measure_noise_scale" not in options and settings["measure_noise_scale"]
                and (spec.dp < 2 or spec.sharding != "none" or spec.tp > 1)):
            settings["measure_noise_scale"] = 0  # the new plan cannot measure it (noise.py)
            dropped = True
        if options.get("adapt") is not None:
            switching.check_adapt(options["adapt"], settings["measure_noise_scale"])
    except ValueError as e:
        error = str(e)
    _agree(rank, plan_sha, error, target)
    if spec.mode == "pipeline" and example_inputs is None:
        example_inputs = _derived_example(hp, spec)
        if example_inputs is not None:
            device = next((p.device for p in target.parameters()), torch.device("cpu"))
            example_inputs = map_tensors(example_inputs, lambda t: t.to(device))
    try:
        if spec.mode == "pipeline" and example_inputs is None:
            raise ValueError(f"{spec.source}: a switch to a pipeline plan needs "
                             f"example_inputs= (one replica batch of per_replica_batch="
                             f"{spec.per_replica_batch} samples: the stages are cut by "
                             f"torch.export at that shape); it is derived from the last "
                             f"step's inputs when they are batched along dim 0, and no step "
                             f"has run or batch_dim is {hp.batch_dim}")
        _local_checks(spec, target, settings.get("graph"), world, example_inputs,
                               settings["batch_dim"], settings["measure_noise_scale"],
                               settings["noise_scale_decay"], settings["optimizer"])
        batch_norm.check_sync(spec, target, settings.get("sync_batchnorm", False))
        if target is hp.original and hp._switch_options.get("sync_batchnorm") \
                and not settings.get("sync_batchnorm"):
            raise ValueError("the running plan converted the module's BatchNorm layers to "
                             "SyncBatchNorm over its replicas' group: pass switch(..., "
                             "module=) a freshly built model to train without sync_batchnorm")
    except ValueError as e:
        error = str(e)
    _agree(rank, plan_sha, error, target)
    state = hp.consolidated_state()  # collective; the old plan is still intact
    if module is not None:
        try:
            checkpoint.check_model(state, module, "the running state")
        except ValueError as e:
            error = str(e)
        _agree(rank, plan_sha, error, module)

    # ---- past this point the old plan is gone: a failure leaves hp closed ----
    old_spec, step = hp.plan, hp.step_count
    carried = {k: v for k, v in hp.__dict__.items()
               if not k.startswith("_") and k not in _OWN}
    switches = list(hp.switches)
    adapt_state = dict(hp._adapt_state)
    old_ddp = weakref.ref(hp.ddp) if getattr(hp, "ddp", None) is not None else None
    reused = target is hp.original
    hp._settle()
    hp.wait_checkpoint()  # an asynchronous save in flight completes on the old plan's group
    if hp._noise is not None:
        hp._noise.collect(wait=True)  # no noise-scale all-reduce left in flight
    dist.barrier()  # every rank is done with the old plan's collectives
    if reused:
        _unplace(hp)
    groups, ids = hp._groups, {k: hp.__dict__[k] for k in ("rank", "replica", "stage")}
    hp.__dict__.clear()  # drops the DDP wrappers, the pipeline schedule, the optimizer
    hp.__dict__.update(ids, plan=old_spec, _closed=True, _groups=[])  # a closed plan's
    destroy_groups(groups)  # gc first: the old DDP's reducer goes before its group
    if reused and old_ddp is not None and old_ddp() is not None:
        gc.collect()
        if old_ddp() is not None:
            _Lifecycle.forget(hp)
            error = RuntimeError("hybridplan switch: the old plan's DistributedDataParallel "
                                 "wrapper is still referenced (a reference to hp.ddp kept by "
                                 "the caller?); its reducer's hooks would fire in the new "
                                 "plan's backward. hp is closed")
            error.hybridplan_state = state
            error.add_note(_STATE_NOTE)
            raise error
    try:
        new = apply(
            spec, target, loss_fn=settings["loss_fn"], optimizer=settings["optimizer"],
            timeout_s=settings["timeout_s"], graph=settings.get("graph"),
            batch_dim=settings["batch_dim"], example_inputs=example_inputs,
            measure_noise_scale=settings["measure_noise_scale"],
            noise_scale_decay=settings["noise_scale_decay"], resume_from=state,
            retain_freed_memory=settings.get("retain_freed_memory", True),
            sync_batchnorm=settings.get("sync_batchnorm", False))
    except BaseException as e:
        _Lifecycle.forget(hp)
        e.hybridplan_state = state
        e.add_note("hybridplan switch: the new plan could not be built after the old one was "
                   "closed; this AppliedPlan is closed. " + _STATE_NOTE)
        raise
    # hp becomes the new plan: its attributes are new's, and new is no longer tracked apart
    hp.__dict__.update(new.__dict__)
    hp.__dict__.update(carried)
    _Lifecycle.open_plans = [r for r in _Lifecycle.open_plans
                                      if r() is not new]
    new.__dict__.clear()
    new._closed = True
    entry = {"step": step, "from": switching.describe(old_spec), "to": switching.describe(hp.plan),
             "reason": "switch()"}
    entry.update(record or {})
    hp.switches = switches + [entry]
    adapt_state["switched"] = adapt_state["checked"] = step
    hp._adapt_state = adapt_state
    hp._adapt = settings.get("adapt")
    hp._switch_options.update(adapt=hp._adapt, measure_noise_scale=requested_measure)
    if dropped and rank == 0:
        warnings.warn(f"hybridplan switch: the new plan ({switching.describe(hp.plan)}) cannot measure "
                      f"the gradient noise scale (it needs dp >= 2 and no sharding): "
                      f"measure_noise_scale is off from here on"
                      + ("; the adaptive mode pauses" if hp._adapt is not None else ""),
                      stacklevel=3)
    return hp


def apply(plan: Any, module: nn.Module, *, loss_fn: Optional[Callable] = None,
          optimizer: Union[Callable, torch.optim.Optimizer, None] = None,
          timeout_s: float = kDefaultTimeoutS, graph: Any = None,
          batch_dim: int = 0, example_inputs: Any = None, measure_noise_scale: int = 0,
          noise_scale_decay: float = 0.99,
          resume_from: Union[str, os.PathLike, Dict[str, Any], None] = None,
          checkpoint_dir: Union[str, os.PathLike, None] = None,
          retain_freed_memory: bool = True, adapt: Optional[switching.Adapt] = None,
          sync_batchnorm: bool = False) -> AppliedPlan:
    """Trains `module` under `plan` in this torch.distributed job; see the module docstring.

    plan       a hybridplan Plan (anything with to_dict()), a plan dict, or a path to its JSON.
    module     the full model, built identically on every rank (same parameter shapes).
    loss_fn    loss(output, target), mean-reduced over the batch; default: module.loss if the
               module has one, else torch.nn.functional.cross_entropy.
    optimizer  a factory params -> Optimizer (e.g. functools.partial(torch.optim.Adam, lr=1e-3))
               or an Optimizer over module.parameters() (not with sharding: a factory then);
               default SGD(lr=0.01).
    timeout_s  timeout of the process groups and of every p2p wait.
    graph      optional Graph (object, dict or path); its sha256 must equal the plan's.
    batch_dim  dimension of inputs and target that indexes samples (pipeline plans: 0).
    example_inputs  pipeline plans: one replica batch as step() receives it (a tensor, tuple or
               dict); the stages are traced by torch.export at one micro-batch of it, in the
               module's current train/eval mode, so every step must have that shape. Plans with
               tp > 1 too: each node's split is checked on it (tensor_parallel.detect).
    measure_noise_scale  N > 0: measure the gradient noise scale every N steps from the
               replicas' local and all-reduced gradients (needs dp >= 2; one extra scalar
               all-reduce per measured step); read it with AppliedPlan.noise_scale(). 0: off.
    noise_scale_decay  the moving averages' weight per measured step, in (0, 1]; 1 averages
               every measurement equally.
    resume_from  a checkpoint written by AppliedPlan.save_checkpoint under this or any other
               plan (or AppliedPlan.consolidated_state()'s dict): the model state is loaded
               before the module is placed or cut, the optimizer state of this rank's
               parameters by name, and step_count. Also a sharded checkpoint (save_sharded's
               step-<N>/ directory), a directory of them (the newest complete one), or
               "latest": the newest complete one in checkpoint_dir, or none yet (a first run
               starts from the beginning, logged). A checkpoint whose files do not match its
               manifest is refused, naming the file; a directory's newest complete one is
               taken past those (logged).
    checkpoint_dir  where save_sharded() writes by default and resume_from="latest" looks.
    retain_freed_memory  on a CPU job, keep freed memory in the process (glibc mallopt,
               process-wide; profiler.block_timing.retain_freed_memory) as the profiler does and
               as caching allocators (CUDA's) do: otherwise every large activation or gradient
               buffer of every step is mapped anew and page-faults on first touch. BigLSTM's
               step at batch 32 took 28.8 ms without, 21.4 ms with it (one process, median of
               10); the profile, and so the plan's prediction, assumes it. False: leave malloc
               as it is.
    adapt      a hybridplan.Adapt policy (needs measure_noise_scale): the adaptive mode, in which
               step() now and then asks switch_advice on rank 0 and switches this AppliedPlan
               in place (AppliedPlan.switch) when it says so; see executor/switching.py.
    sync_batchnorm  True: the module's BatchNorm layers are converted in place
               (nn.SyncBatchNorm.convert_sync_batchnorm, the same parameters and buffers) to
               normalise over the replicas' process group: the global batch's statistics, so
               data parallelism trains as one process on the global batch. Placement plans
               with tp = 1 only (ValueError for a pipeline; see executor/batch_norm.py). False:
               each replica normalises its own share, as torch DDP does (noted once).

    Raises ValueError, on every rank, if the plan is malformed or does not fit the module or the
    job's world size, or if ranks run different torch or hybridplan versions or hold different
    plans or parameter shapes.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    switching.check_adapt(adapt, measure_noise_scale)  # the same arguments on every rank
    if retain_freed_memory and not torch.cuda.is_available():  # the devices are CPUs (_device)
        block_timing.retain_freed_memory()
    _init_process_group(timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    plan_sha, spec, cut, error = None, None, None, None
    resumed, resumed_from = None, ""
    tp_styles: Dict[str, str] = {}
    tp_kinds: Dict[str, str] = {}
    tp_sequence = None
    signature = param_signature(module)  # before the cut, which may copy tied parameters
    aliases = checkpoint.parameter_aliases(module)  # likewise
    versions = rank_agreement.local_versions()
    try:
        spec = parse_plan(plan)  # the one plan object this job holds
        plan_sha = spec.sha256
        _local_checks(spec, module, graph, world_size, example_inputs, batch_dim,
                      measure_noise_scale, noise_scale_decay, optimizer)
        batch_norm.check_sync(spec, module, sync_batchnorm)
        if spec.tp > 1:  # the profiler's one definition of what splits, on this module
            tp_layout = tensor_parallel.detect(module, spec.assignment, example_inputs,
                                               spec.source)
            tp_styles = tensor_parallel.check_layout(tp_layout, spec.tp, spec.source)
            tp_kinds = tensor_parallel.weight_kinds(module, tp_styles)
            if spec.sequence_parallel:
                if spec.mode == "pipeline":
                    raise ValueError(
                        f"{spec.source}: sequence_parallel with a pipeline (mp={spec.mp}) is "
                        "not applied: a pipeline stage is a traced graph with no blocks to "
                        "split the sequence between; plan it with sequence_parallel off")
                tp_sequence = tensor_parallel.detect_sequence(
                    module, tp_layout, spec.tp, spec.assignment, example_inputs, spec.source)
        if resume_from is not None:
            resumed, resumed_from = sharded_checkpoint.resolve(resume_from, checkpoint_dir)
            if resumed is not None:
                checkpoint.check_model(resumed, module, resumed_from)
    except ValueError as e:
        error = str(e)
    agree_across_ranks(RankReport(rank, plan_sha, error, signature, *versions,
                                  resumed=resumed_from))
    if resumed is not None:  # into the whole module, before it is placed or cut
        with torch.no_grad():
            module.load_state_dict(resumed["model"])
    if spec.mode == "pipeline":  # the cut can fail too (stages not contiguous, export)
        try:
            cut = _cut(spec, module, example_inputs, batch_dim, tp_styles)
        except ValueError as e:
            error = str(e)
        agree_across_ranks(RankReport(rank, plan_sha, error, signature, *versions))
    hp = AppliedPlan(spec, module, cut, loss_fn or _default_loss(module), optimizer, timeout,
                     batch_dim, measure_noise_scale, noise_scale_decay,
                     aliases=aliases, resumed=resumed, resumed_from=resumed_from,
                     tp_styles=tp_styles, tp_kinds=tp_kinds,
                     tp_sequence=tp_sequence, sync_batchnorm=sync_batchnorm)
    batch_norm.note_data_parallel(spec, module, sync_batchnorm, rank)
    hp.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
    hp._adapt = hp._switch_options["adapt"] = adapt
    hp._adapt_state = {"checked": hp.step_count, "switched": hp.step_count}
    return hp
