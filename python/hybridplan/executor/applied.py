"""AppliedPlan: a module trained under a plan on this rank, as recipe.apply() built it. The class
is assembled from its roles, each in a module of its own: training (stepping.Stepping),
the state and checkpoints (checkpointing.Checkpointing) and switching to another plan in place
(switching.Switching); this module holds what ties them together (what the recipe built, the
plan's process groups) and the orderly shutdown."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint, noise, precision, switching
from .checkpointing import Checkpointing
from .layout import Mesh
from .lifecycle import Lifecycle, destroy_groups
from .stepping import Stepping
from ..planner import Plan


@dataclasses.dataclass
class Built:
    """What the recipe built on this rank for one plan (recipe.place_replica / recipe.
    run_stages): the module this rank trains and how its step reaches it."""
    original: nn.Module                 # the whole module (SyncBatchNorm-converted if asked)
    module: nn.Module                   # this rank's part: the replica, a stage or stages
    params: List[nn.Parameter]          # what the optimizer steps (DTensors when sharded)
    ddp: Optional[nn.Module] = None     # placement without sharding or TP: the DDP wrapper
    devices: List[torch.device] = dataclasses.field(default_factory=list)  # placement
    hooks: List[Any] = dataclasses.field(default_factory=list)  # placement's input-moving hooks
    shard_units: List[str] = dataclasses.field(default_factory=list)  # sharded placement
    runner: Any = None                  # pipeline: the PipelineRunner of this rank's stages
    cut: Any = None                     # pipeline: the export-based StageCut
    device: Optional[torch.device] = None  # pipeline: this rank's device
    stages: Optional[List[int]] = None  # pipeline: the stages this rank holds
    replica_group: Any = None           # pipeline: this TP rank's pipeline of the replica
    first_rank: int = 0                 # pipeline: the rank holding stage 0 (reads inputs)
    last_rank: int = 0                  # pipeline: the rank holding the last stage (the loss)
    tp: Any = None                      # tp > 1: recipe.TpSplit (styles, kinds, sequence layout)
    precision: Any = None               # precision.Precision: how the plan's precision applies


class AppliedPlan(Stepping, Checkpointing, switching.Switching):
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

    def __init__(self, spec: Plan, mesh: Mesh, built: Built, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable, timeout: datetime.timedelta, batch_dim: int,
                 switch_options: Dict[str, Any], aliases: Dict[str, str],
                 noise_meter: Optional[noise.NoiseScaleMeter] = None,
                 resumed: Optional[Dict[str, Any]] = None, resumed_from: str = "",
                 checkpoint_dir: Optional[str] = None, *, clip_grad_norm: Optional[float] = None,
                 accumulation_steps: int = 1, lr_scheduler: Any = None):
        self.plan, self.loss_fn, self.batch_dim = spec, loss_fn, batch_dim
        self.rank = dist.get_rank()
        self.layout = mesh.layout  # where this rank sits; its groups: self._mesh
        self.replica = self.layout.replica_of(self.rank)
        self.stage = self.layout.stage_of(self.rank)
        self.tp_rank = self.layout.tp_rank_of(self.rank)
        self.predicted_step_s = spec.predicted_step_s
        self._timeout = timeout
        self.recorded_actions: List[tuple] = []  # record_actions()
        self.step_count = 0
        # every process group this plan uses (made at once by the recipe); close() destroys
        # them (self._groups: the same list)
        self._mesh, self._groups = mesh, mesh.groups
        self.original, self.module, self._params = built.original, built.module, built.params
        self.ddp, self.shard_units = built.ddp, built.shard_units
        self._tp_sequence = getattr(built.tp, "sequence", None)  # sequence parallelism's layout
        self._precision = built.precision or precision.Precision()  # the plan's precision
        if spec.mode == "placement":
            self.devices, self._hooks = built.devices, built.hooks
            self.stages = [self.stage]
        else:
            self._runner, self._cut, self.device = built.runner, built.cut, built.device
            self.stages = built.stages
            self._replica_group = built.replica_group
            self._first_rank, self._last_rank = built.first_rank, built.last_rank
        self.optimizer = optimizer
        self._scaler = self._precision.scaler(self._first_device())  # fp16's loss scaler
        if spec.mode == "pipeline":
            self._runner.scaler = self._scaler
        # the step's options (stepping): clipping, accumulation, the LR scheduler
        self._clip, self._accumulation = clip_grad_norm, accumulation_steps
        self._scheduler = lr_scheduler
        self._micro = 0  # forward_backward calls since the last optimizer step
        self._last_grad_norm: Optional[torch.Tensor] = None
        self._noise = noise_meter
        self._closed = False
        self.checkpoint_dir = checkpoint_dir  # save_sharded's default directory
        self._pending_save: Any = None  # an asynchronous save not yet complete
        self.last_save_stall_s = 0.0  # how long the last save_sharded held the training thread
        self.resumed_from = resumed_from  # the checkpoint resumed ("" if none)
        self.resumed_extra = resumed.get("extra") if resumed is not None else None
        self._switch_options = switch_options  # what switch() carries over to the next plan
        self.switches: List[Dict[str, Any]] = []  # one entry per switch(): step, from, to, ...
        self._adapt: Optional[switching.Adapt] = switch_options.get("adapt")
        self._last_inputs: Any = None  # the last step's inputs: a pipeline switch's example
        # parameter name -> canonical name (tied names -> the first), taken before the cut
        self._aliases = aliases
        self._rebuild: Optional[Callable] = None  # recipe.apply: switch() rebuilds through it
        Lifecycle.track(self)
        if resumed is not None:  # the model state was loaded into `original` before the cut
            checkpoint.load_optimizer_state(self.optimizer, self._param_names(),
                                            resumed["optimizer"], resumed_from)
            checkpoint.load_scheduler_state(self._scheduler, resumed, resumed_from)
            checkpoint.load_scaler_state(self._scaler, resumed, resumed_from)  # fp16
            self.step_count = resumed["step"]
        self._adapt_state = {"checked": self.step_count, "switched": self.step_count}

    @property
    def grad_scaler(self) -> Any:
        """fp16's loss scaler (executor/precision.py: its get_scale(), state_dict()); None under
        fp32 and bf16. Checkpoints hold its state and resuming restores it."""
        return self._scaler

    def _first_device(self) -> torch.device:
        return self.devices[0] if self.plan.mode == "placement" else self.device

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
            Lifecycle.forget(self)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r}: {what}() after close() (call state_dict() or "
                               f"save_checkpoint() before close())")

    def __enter__(self) -> "AppliedPlan":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # after an error (a lost peer) do not wait for ranks that may never arrive
        self.close(wait_for_peers=exc_type is None)

    def __repr__(self) -> str:
        tp = f", tp={self.plan.tp}, tp_rank={self.tp_rank}" if self.plan.tp > 1 else ""
        return (f"AppliedPlan(mode={self.plan.mode!r}, dp={self.plan.dp}, mp={self.plan.mp}{tp}, "
                f"rank={self.rank}, replica={self.replica}, stage={self.stage})")
