"""An AppliedPlan's training step, its role in the class (applied.py assembles the roles):
the replica's share of a global batch (shard), the step and its parts, the gradient noise scale
the step measures, and the pipeline's action record.

    loss = hp.step(*hp.shard(inputs, target))     # zero_grad, K x forward_backward,
                                                   # clip (apply's clip_grad_norm), optimizer_step
    # or the same loop by hand (accumulation_steps=K: forward_backward K times per step):
    hp.zero_grad()
    for inputs, target in micro_batches:           # K of them, each per_replica_batch samples
        loss = hp.forward_backward(inputs, target)
    norm = hp.clip_grad_norm(1.0)                  # the global norm, the same on every rank
    hp.optimizer_step()                            # and the LR scheduler's step

Gradient accumulation (apply(..., accumulation_steps=K)): the k-th forward_backward since the
last optimizer_step (or zero_grad) backpropagates its loss divided by K, and only the K-th
synchronises the gradients over the replicas (DDP's no_sync, FSDP2's
set_requires_gradient_sync(False) before the others; a pipeline keeps the stages' gradients
and sums tied copies on the K-th), so a step trains as one process on dp x per_replica_batch
x K samples. step() takes this replica's K x per_replica_batch samples and cuts them in K.

Clipping by global norm (clip_grad_norm, apply(..., clip_grad_norm=max_norm)): torch's
get_total_norm over this rank's gradients, one call per gradient layout (a DTensor's norm is of
the whole parameter: FSDP2's shards and a TP slice's parts are reduced over their mesh, a
replicated DTensor counted once), a pipeline's p-th powers summed over the replica's pipeline
(each tied weight counted on the first stage holding it: after the step every copy holds the
summed gradient), nothing summed over the replicas (their gradients are averaged already, the
same on each); then torch's clip_grads_with_norm_. The norm equals one process's
torch.nn.utils.clip_grad_norm_ on the global batch (docs/training_step.md)."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..gradient_noise.noise_scale_job import switch_advice as advise_switch
from . import lost_peer, sharding, switching
from .calls import as_call, batch_size, check_batch, device_of, to_device


def make_scheduler(factory: Any, optimizer: torch.optim.Optimizer) -> Any:
    """factory(optimizer), checked to be an LR scheduler on that optimizer; None without one."""
    if factory is None:
        return None
    scheduler = factory(optimizer)
    if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) \
            or scheduler.optimizer is not optimizer:
        raise ValueError(f"hybridplan.apply: lr_scheduler(optimizer) must return a "
                         f"torch.optim.lr_scheduler.LRScheduler on the optimizer it is given "
                         f"(got {type(scheduler).__name__})")
    return scheduler


def _check_norm_type(norm_type: Any) -> float:
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float)) \
            or not (norm_type > 0):
        raise ValueError(f"clip_grad_norm: norm_type must be a number > 0 or math.inf "
                         f"(got {norm_type!r})")
    return float(norm_type)


def _by_layout(params: Sequence[torch.Tensor]) -> List[List[torch.Tensor]]:
    """Parameters with a gradient, grouped by the gradient's layout (plain tensors; a DTensor's
    mesh and placements), in first-seen order: torch's norm and foreach kernels take one
    layout at a time (a DTensor's ops need one mesh)."""
    groups: Dict[Any, List[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        key = (id(g.device_mesh), tuple(g.placements)) if sharding.is_sharded(g) else None
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def _local_norm_power(params: Sequence[torch.Tensor], norm_type: float,
                      device: torch.device) -> torch.Tensor:
    """This rank's part of the global gradient norm of `params`, on `device`: the sum of the
    p-th powers of each gradient layout's norm (their max for norm_type inf), a DTensor's norm
    that of the whole parameter (reduced over its mesh)."""
    norms = []
    for group in _by_layout(params):
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type)
        norms.append(sharding.full(norm).to(device))  # a DTensor's: over its mesh
    if not norms:
        return torch.zeros((), device=device)
    if math.isinf(norm_type):
        return torch.stack(norms).max()
    return torch.stack(norms).pow(norm_type).sum()


def _send_loss(loss: torch.Tensor, last: int, rank: int, group: Any) -> Any:
    """The pipeline's loss broadcast from the last stage's rank `last` to the replica's others
    (into `loss` there, waited for); on `last` the work, still pending: the sender does not
    wait for it, since it finishes its schedule before stage 0, and a rank blocked in a
    collective took CPU from the ranks still computing on a shared CPU (+5-10 % step time in
    bench/bench_executor.py). Stepping._settle waits for it before the next micro-step."""
    work = dist.broadcast(loss, src=last, group=group, async_op=True)
    if rank == last:
        return work
    work.wait()
    return None


def _share(inputs: Any, target: Any, dp: int, replica: int, batch_dim: int) -> Tuple[Any, Any]:
    """Stepping.shard: replica `replica`'s 1/dp of each tensor along batch_dim, in the same form."""
    def part(v):
        if isinstance(v, torch.Tensor):
            return torch.tensor_split(v, dp, dim=batch_dim)[replica]
        return v
    if isinstance(inputs, dict):
        return {k: part(v) for k, v in inputs.items()}, part(target)
    if isinstance(inputs, (tuple, list)):
        return tuple(part(v) for v in inputs), part(target)
    return part(inputs), part(target)


def _micro_steps(v: Any, k: int, batch_dim: int) -> List[Any]:
    """`v` (a tensor, a dict, a tuple or list of them, or anything else, repeated) in k equal
    parts along batch_dim: one step()'s batch cut into its accumulation's micro-steps."""
    if isinstance(v, torch.Tensor):
        n = v.shape[batch_dim] if v.dim() > batch_dim else 0
        if n == 0 or n % k:
            raise ValueError(
                f"hybridplan step: with accumulation_steps={k} each input and target "
                f"tensor holds accumulation_steps x per_replica_batch samples along "
                f"batch_dim={batch_dim}, cut into {k} equal micro-steps (got "
                f"shape {list(v.shape)})")
        return list(torch.tensor_split(v, k, dim=batch_dim))
    if isinstance(v, dict):
        each = {key: _micro_steps(x, k, batch_dim) for key, x in v.items()}
        return [{key: each[key][i] for key in each} for i in range(k)]
    if isinstance(v, (tuple, list)):
        each_item = [_micro_steps(x, k, batch_dim) for x in v]
        return [tuple(parts[i] for parts in each_item) for i in range(k)]
    return [v] * k


class Stepping:
    """AppliedPlan's training role; the attributes it reads are set by AppliedPlan.__init__
    (_clip, _accumulation, _micro, _scheduler among them: apply's options)."""

    def shard(self, inputs: Any, target: Any = None) -> Tuple[Any, Any]:
        """This replica's share (1/dp along batch_dim) of a global batch of inputs (a tensor, a
        tuple or a dict, see apply) and target, in the same form."""
        return _share(inputs, target, self.plan.dp, self.replica, self.batch_dim)

    # ---- the options the step runs with (apply's) -----------------------------------------------
    @property
    def accumulation_steps(self) -> int:
        """forward_backward calls per optimizer step (apply's accumulation_steps)."""
        return self._accumulation

    @property
    def global_batch(self) -> int:
        """Samples one step() trains on, over every replica: dp x per_replica_batch x
        accumulation_steps."""
        return self.plan.dp * self.plan.per_replica_batch * self._accumulation

    @property
    def lr_scheduler(self) -> Any:
        """The LR scheduler apply's lr_scheduler factory built on hp.optimizer (None without
        one); optimizer_step() steps it."""
        return self._scheduler

    @property
    def last_grad_norm(self) -> Optional[torch.Tensor]:
        """The global gradient norm the last clip_grad_norm() returned (step() clips when
        apply's clip_grad_norm is set); None before."""
        return self._last_grad_norm

    # ---- the step --------------------------------------------------------------------------------
    def step(self, inputs: Any, target: Any) -> torch.Tensor:
        """zero_grad, forward_backward on each of the accumulation_steps equal parts of this
        replica's batch, clip_grad_norm (when apply's clip_grad_norm is set), optimizer_step;
        returns the replica's mean loss on every rank. `inputs`: a tensor, a tuple of
        positional or a dict of keyword arguments of forward(), accumulation_steps x
        per_replica_batch samples along batch_dim. A lost peer is a RuntimeError naming it
        (lost_peer); under apply(..., adapt=) a step may end with a switch to another plan.
        Which pipeline ranks read the inputs and the target: docs/training_step.md."""
        self._check_open("step")
        parts = self._accumulation_parts(inputs, target)
        with self._lost_peer_guard(f"step {self.step_count + 1}"):
            self.zero_grad()
            losses = [self._forward_backward(i, t) for i, t in parts]
            if self._clip is not None:
                self._clip_grad_norm(self._clip, 2.0)
            self._optimizer_step()
        if self._adapt is not None:  # may switch this AppliedPlan to another plan
            switching.maybe_adapt(self)
        return losses[0] if len(losses) == 1 else torch.stack(losses).mean()

    def forward_backward(self, inputs: Any, target: Any) -> torch.Tensor:
        """Forward and backward of one micro-step: this replica's per_replica_batch samples
        (inputs and target as step() takes them). With accumulation_steps = K, the loss is
        divided by K for the backward and the K-th call since the last optimizer_step() or
        zero_grad() synchronises the gradients over the replicas; a K+1-th raises. Returns the
        replica's mean loss on this micro-batch on every rank (not divided by K)."""
        self._check_open("forward_backward")
        with self._lost_peer_guard(f"forward_backward of step {self.step_count + 1}"):
            return self._forward_backward(inputs, target)

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scales every gradient so that the global norm (over the whole model of the replica,
        as one process computes it on the global batch: see the module doc) is at most
        max_norm, as torch.nn.utils.clip_grad_norm_ does; returns that norm before clipping, a
        0-d tensor, the same on every rank. Collective: every rank calls it, after the
        accumulation_steps-th forward_backward."""
        self._check_open("clip_grad_norm")
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) \
                or not max_norm >= 0:
            raise ValueError(f"clip_grad_norm: max_norm must be a number >= 0 (got "
                             f"{max_norm!r})")
        with self._lost_peer_guard(f"clip_grad_norm of step {self.step_count + 1}"):
            return self._clip_grad_norm(float(max_norm), _check_norm_type(norm_type))

    def optimizer_step(self) -> None:
        """The optimizer's step, then the LR scheduler's (apply's lr_scheduler); step_count
        + 1. After the accumulation_steps-th forward_backward (RuntimeError between)."""
        self._check_open("optimizer_step")
        with self._lost_peer_guard(f"optimizer_step of step {self.step_count + 1}"):
            self._optimizer_step()
        if self._adapt is not None:
            switching.maybe_adapt(self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The optimizer's zero_grad (gradients None by default); starts a new accumulation."""
        self._check_open("zero_grad")
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self._micro = 0

    # ---- the parts, unguarded (step() guards them together) ------------------------------------
    @contextlib.contextmanager
    def _lost_peer_guard(self, what: str):
        """A transport error inside names the lost peers (lost_peer); the incident is the step,
        so ranks failing in different parts of one step find each other."""
        try:
            yield
        except Exception as e:
            if not lost_peer.is_communication_error(e):
                raise
            raise lost_peer.lost_peer_error(e, what, self.rank, dist.get_world_size(),
                                            f"step{self.step_count + 1}") from e

    def _accumulation_parts(self, inputs: Any, target: Any) -> List[Tuple[Any, Any]]:
        """step()'s batch in accumulation_steps equal parts along batch_dim."""
        k = self._accumulation
        if k == 1:
            return [(inputs, target)]
        return list(zip(_micro_steps(inputs, k, self.batch_dim),
                        _micro_steps(target, k, self.batch_dim)))

    def _sync_context(self, sync: bool):
        """Placement: no gradient synchronisation on an accumulation's earlier micro-steps
        (DDP's no_sync; FSDP2's, and its replicate's, set_requires_gradient_sync)."""
        from torch.distributed.fsdp import FSDPModule

        if self._accumulation == 1:
            return contextlib.nullcontext()
        if isinstance(self.original, FSDPModule):
            self.original.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        if self.ddp is not None and not sync:
            return self.ddp.no_sync()
        return contextlib.nullcontext()

    def _forward_backward(self, inputs: Any, target: Any) -> torch.Tensor:
        k = self._accumulation
        if self._micro >= k:
            raise RuntimeError(
                f"hybridplan: forward_backward called {self._micro + 1} times since the last "
                f"optimizer_step() or zero_grad() with accumulation_steps={k}: the {k}-th call "
                f"synchronises the gradients; call optimizer_step() after every {k}")
        index = self._micro + 1
        sync = index == k
        self._settle()
        self._last_inputs = inputs
        if index == 1 and self._noise is not None:
            self._noise.begin_step()
            self._noise_batch = 0
        if self.plan.mode == "placement":
            args, kwargs = as_call(inputs)
            with self._sync_context(sync):
                with self._precision.autocast(self.devices[0]):  # forward and loss (precision)
                    output = (self.ddp or self.original)(*args, **kwargs)
                    loss = self.loss_fn(output, to_device(target, device_of(output)))
                scaled = loss if self._scaler is None else self._scaler.scale(loss)  # fp16
                (scaled / k if k > 1 else scaled).backward()
            self._micro = index
            if self._noise is not None:
                self._noise_batch += batch_size(args, kwargs, self.batch_dim)
                if sync:
                    self._noise.end_step(self._noise_batch)
            return loss.detach()
        flat = None
        if self.rank == self._first_rank:
            args, kwargs = as_call(inputs)
            flat = [to_device(t, self.device) for t in self._cut.flatten_inputs(args, kwargs,
                                                                          self.plan.source)]
            check_batch(self.plan, flat)
        loss = self._runner.step(flat, to_device(target, self.device), sync=sync,
                                 accumulation_steps=k)
        self._micro = index
        if self._noise is not None and sync:  # stage 0 checked the batches
            self._noise.end_step(self.plan.per_replica_batch * k)
        self._loss_sent = (_send_loss(loss, self._last_rank, self.rank, self._replica_group)
                           if self.plan.mp > 1 else None)
        return loss

    def _check_accumulated(self, what: str) -> None:
        if 0 < self._micro < self._accumulation:
            raise RuntimeError(
                f"hybridplan: {what}() after {self._micro} of accumulation_steps="
                f"{self._accumulation} forward_backward calls: the gradients are synchronised "
                f"over the replicas by the {self._accumulation}-th")

    def _counted_params(self) -> List[nn.Parameter]:
        """This rank's parameters whose gradients the global norm counts: every one in
        placement mode; in a pipeline each tied weight once per replica (pipeline.
        PipelineRunner.counted_parameters)."""
        if self.plan.mode == "placement":
            return self._params
        return self._runner.counted_parameters()

    def _clip_grad_norm(self, max_norm: float, norm_type: float) -> torch.Tensor:
        self._check_accumulated("clip_grad_norm")
        if self._scaler is not None:  # fp16: the norm of the true gradients (collective)
            self._scaler.unscale_(self.optimizer)
        inf = math.isinf(norm_type)
        total = _local_norm_power(self._counted_params(), norm_type, self._first_device())
        if self.plan.mode == "pipeline" and self.plan.mp > 1:  # over the replica's stages
            dist.all_reduce(total, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM,
                            group=self._replica_group)
        if not inf:
            total = total.pow(1.0 / norm_type)
        for group in _by_layout(self._params):  # every copy of a tied weight is clipped
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        self._last_grad_norm = total
        return total

    def _optimizer_step(self) -> None:
        self._check_accumulated("optimizer_step")
        if self._scaler is None:
            self.optimizer.step()
        else:  # fp16: unscales (if clipping did not), skips a step with an inf, on every rank
            self._scaler.step(self.optimizer)
            self._scaler.update()
        if self._scheduler is not None:
            self._scheduler.step()
        self._micro = 0
        self.step_count += 1

    def _settle(self) -> None:
        """Waits for the previous step's loss broadcast (pipeline, last stage; long since sent)."""
        if getattr(self, "_loss_sent", None) is not None:
            self._loss_sent.wait()
            self._loss_sent = None

    # ---- statistical efficiency ---------------------------------------------------------------
    def noise_scale(self):
        """The gradient noise scale B_simple measured online (apply(..., measure_noise_scale=N)),
        a convergence.noise_scale.NoiseScale (b_simple, stderr, g_squared, trace_sigma,
        effective_steps), the same on every rank; None before two measured steps
        (docs/statistical_efficiency.md "Online", executor/noise.py)."""
        if self._noise is None:
            raise ValueError("hybridplan: noise_scale() needs apply(..., measure_noise_scale=N) "
                             "(measure every N steps; it needs dp >= 2)")
        return self._noise.estimate()

    def switch_advice(self, graph: Any, cluster: Any, job: Any, *, devices: Optional[int] = None,
                      min_gain: float = 0.05, processes: Optional[int] = None,
                      modes: Optional[Sequence[str]] = None):
        """A SwitchAdvice (gradient_noise.noise_scale_job.switch_advice): the best plan with the
        measured critical batch in place of `job`'s, and the predicted gain of switching to it.
        `graph`, `cluster`, `job`: what the applied plan was planned with; `devices`: default
        the plan's world size. None until noise_scale() has an estimate."""
        estimate = self.noise_scale()
        if estimate is None:
            return None
        return advise_switch(self.plan, estimate, graph, cluster, job, devices=devices,
                             min_gain=min_gain, processes=processes, modes=modes)

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
