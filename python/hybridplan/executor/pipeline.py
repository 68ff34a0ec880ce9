"""Pipeline mode: runs this rank's stages with torch.distributed.pipelining.

- The stages come from profiler.stage_split (the export-based `pipeline()` cut at the plan's
  stage boundaries); each of this rank's stages runs in a `PipelineStage` (manual frontend,
  static metadata from the export: no warm-up forward, which would move BatchNorm statistics)
  over the replica's ranks, under the plan's schedule: `ScheduleGPipe` or `Schedule1F1B` with
  one stage per rank, or with mp * virtual_stages stages over mp ranks `ScheduleInterleaved1F1B`
  (Megatron-LM's interleaving, https://arxiv.org/abs/2104.04473), `ScheduleInterleavedZeroBubble`
  (ZB1P) or `ScheduleZBVZeroBubble` (ZB-V, https://arxiv.org/abs/2401.10241). Stage s lies on
  pipeline rank Plan.stage_ranks[s] (s % mp; along a V for "zbv", whose last stage is on rank
  0, beside the first). The cut passes every value from stage to adjacent stage (CarryStage),
  which is all the multi-stage runtime sends.
- Zero-bubble schedules split each backward into I (input gradients, which the previous stage
  waits for) and W (weight gradients, run in the schedule's bubbles). torch's own split computes
  wrong gradients or fails on most stages a cut gives (split_backward explains why), so the
  stages here run split_backward's, which equals one backward exactly.
- Data parallelism: with dp > 1 each stage module is wrapped in DistributedDataParallel over
  its DP group {r * mp + k} (k: the pipeline rank; one group serves every stage on that rank,
  whose DDPs reduce in the same order on every replica). pipelining's schedules run every
  micro-batch's backward but the last under DDP's no_sync and arm the reducer for the last one
  (`backward_maybe_with_nosync`), so the all-reduce overlaps the last micro-batch's backward, as
  the cost model assumes. Under a zero-bubble schedule the last backward of a stage is its last
  W (stage 0: its only pass, a full backward), which split_backward runs through autograd's
  AccumulateGrad, the nodes DDP's reducer hooks, so DDP reduces as after a plain backward.
- Sharded data parallelism (the plan's "sharding": "zero2", see sharding): with dp > 1 each
  stage module is instead one FSDP unit (`fully_shard(..., reshard_after_forward=False)`) over
  its DP group; PipelineStage runs every micro-batch's backward without gradient reduction and
  reduce-scatters the accumulated gradient once after the last (`perform_reduce_grad`), the
  parameters gathered once per step and kept until then.
- Micro-batches are equal parts of the replica's batch (the stages are traced at that shape)
  and each micro-batch's loss is divided by their number, so the accumulated gradient is the
  replica batch's mean-loss gradient (scale_grads=False: nothing to rescale afterwards).
- Tied weights (a parameter read on several stages; the Pipe gives each stage a copy): after
  the schedule, each copy's gradient is replaced by the sum of every copy's gradient in the
  replica, as Megatron-LM does for its embedding group (https://arxiv.org/abs/2104.04473,
  section 3), so every copy takes the same step. torch.distributed.pipelining leaves this to
  the caller. With several stages per rank, one rank may hold several copies (zbv puts the
  first and last stages, GPT-2's wte and lm_head, on rank 0): a rank adds its own copies'
  gradients once each, then the sum is all-reduced over the replica's ranks that hold a copy
  (none when one rank holds them all), and every copy takes the total.
  Sharded, each copy's gradient is a DTensor holding this replica's shard: its local tensor is
  summed, the same shard on each of the replica's stages (each is DP rank `replica` of its
  stage's group, and the copies have one shape).
- Tensor parallelism (the plan's "tp" > 1; tensor_parallel): each TP rank runs a pipeline of
  its own over the replica's stages (ranks (r * mp + k) * tp + t for one t), its stage modules
  split over the stage's TP group before PipelineStage wraps them, so what stages send and
  receive are whole (replicated) tensors; with dp > 1 a stage is replicated over its DP group
  by FSDP2's replicate (a 2-D (dp, tp) mesh), which PipelineStage drives as it drives FSDP.
- Recompute: a stage the plan recomputes runs its forward under torch.utils.checkpoint
  (autograd.recompute), keeping only its inputs (the receive buffers) between a micro-batch's
  forward and backward.
- Precision (the plan's "precision": bf16 or fp16; executor/precision.py): each stage's
  forward and the last stage's loss run under torch.autocast (PipelineStage's
  forward_maybe_with_nosync), the parameters staying fp32; the floating values a stage sends
  travel in the compute dtype (their static metadata, so the receive buffers, in it), and their
  gradients with them. fp16's loss scaler scales each micro-batch's loss.
- BatchNorm in a stage normalises each micro-batch with its own statistics and updates the
  running statistics once per micro-batch, as GPipe does (https://arxiv.org/abs/1811.06965).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..autograd import split_backward
from ..autograd.recompute import FULL, SELECTIVE, recompute
from ..profiler.stage_split import StageCut, original_name
from .bucket_policy import ddp_bucket_kwargs
from . import compiling as _compiling
from . import sharding as _sharding
from . import tensor_parallel as _tp

# torch.distributed.pipelining, FSDP and FSDP's replicate are imported inside the functions that
# build a pipeline: they take seconds to import, which every plan without one would pay.

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv")
MULTI_STAGE = ("interleaved-1f1b", "interleaved-zb", "zbv")  # a list of stages per rank


def _schedule_class(name: str):
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble,
                                              ScheduleZBVZeroBubble)

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
            "interleaved-1f1b": ScheduleInterleaved1F1B,
            "interleaved-zb": ScheduleInterleavedZeroBubble,
            "zbv": ScheduleZBVZeroBubble}[name]


@functools.lru_cache(maxsize=None)
def _stage_class():
    """PipelineStage with split_backward's I and W (see the module doc); a full backward is
    torch's. The data-parallel handling is PipelineStage.backward_maybe_with_nosync's."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import PipelineStage

    class SplitBackwardStage(PipelineStage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._detach_after_weight: Dict[int, List[torch.Tensor]] = {}  # last stage's

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True,
                               last_backward=False):
            """torch detaches the last stage's outputs in place after its backward; before a
            split backward's W that breaks W where the stage's graph saved an output (a tanh
            whose result is both returned and read by the head). Views it leaves alone: the
            cached outputs become views of themselves (its only use of them on that stage)."""
            entry = self.fwd_cache.get(bwd_chunk_id)
            if self.is_last and not full_backward and isinstance(entry, tuple) \
                    and len(entry) == 2:
                outputs, inputs = entry
                self.fwd_cache[bwd_chunk_id] = (tuple(
                    t.view_as(t) if isinstance(t, torch.Tensor) and not t._is_view() else t
                    for t in outputs), inputs)
                # detached after W instead (backward_weight_one_chunk), with the loss
                self._detach_after_weight[bwd_chunk_id] = [
                    t for t in tuple(outputs) + (loss,) if isinstance(t, torch.Tensor)]
            return super().backward_one_chunk(bwd_chunk_id, loss=loss,
                                              full_backward=full_backward,
                                              last_backward=last_backward)

        def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
            """I ran its autograd.grad with retain_graph (W runs the same graph's weight side),
            so the input side's saved tensors live as long as something references the graph:
            on the last stage the schedule keeps each micro-batch's loss to the step's end, and
            the outputs torch would have detached after I. Detached in place once W is done,
            as torch detaches them after a full backward, the micro-batch's activations go
            then (a transformer's ZB-V last stage held 5.2 MiB a micro-batch to the step's
            end without it)."""
            super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
            for t in self._detach_after_weight.pop(bwd_chunk_id, ()):
                if t.grad_fn is not None and not t._is_view():  # views: not in place
                    t.detach_()

        # False on an accumulation's earlier steps (PipelineRunner.step): no backward of the
        # schedule is the last, so DDP and FSDP keep accumulating without reducing
        sync_gradients = True
        # the plan's precision (executor/precision.py) and, under autocast, the dtypes this
        # stage sends its outputs in (None: as computed); PipelineRunner sets both
        mixed = None
        send_dtypes: Optional[List[torch.dtype]] = None

        def forward_maybe_with_nosync(self, *args, **kwargs):
            """torch's, under the plan's autocast; a stage's floating outputs leave in the
            dtypes its peers' receive buffers were allocated in (the compute dtype)."""
            if self.mixed is None or not self.mixed.autocasts:
                return super().forward_maybe_with_nosync(*args, **kwargs)
            with self.mixed.autocast(self.device):
                output = super().forward_maybe_with_nosync(*args, **kwargs)
            if self.send_dtypes is None:
                return output

            def cast(t, dtype):
                return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype != dtype else t
            if isinstance(output, torch.Tensor):
                return cast(output, self.send_dtypes[0])
            return type(output)(cast(t, d) for t, d in zip(output, self.send_dtypes))

        def perform_reduce_grad(self, grad_scale_factor):
            """torch's, except on an accumulation's earlier steps: FSDP's post-backward then
            runs as after a backward with gradient sync off (the unsharded gradients kept for
            the next step to add to), which torch's sets on."""
            if self.sync_gradients or not isinstance(self.submod, FSDPModule):
                return super().perform_reduce_grad(grad_scale_factor)
            from torch.distributed._composable.replicate_with_fsdp import (ReplicateModule,
                                                                         replicate)
            from torch.distributed.fsdp import fully_shard

            module = self.submod
            module.set_is_last_backward(True)
            module.set_reshard_after_backward(True)
            module.set_requires_gradient_sync(False)
            state = (replicate.state(module) if isinstance(module, ReplicateModule)
                     else fully_shard.state(module))
            for each in state._state_ctx.all_states:
                for group in each._fsdp_param_groups:
                    group.post_backward()
            state._root_post_backward_final_callback()
            if grad_scale_factor != 1:
                self.scale_grads(grad_scale_factor)

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            last_backward = last_backward and self.sync_gradients
            if backward_type == "full":
                return super().backward_maybe_with_nosync(backward_type, bwd_kwargs,
                                                          last_backward)
            if backward_type == "input":
                def run():
                    return split_backward.backward_input(
                        bwd_kwargs["stage_output"], bwd_kwargs["output_grads"],
                        bwd_kwargs["input_values"], list(self.submod.parameters()))
            elif backward_type == "weight":
                def run():
                    split_backward.backward_weight(bwd_kwargs["param_groups"])
                    return (), None
            else:
                raise RuntimeError(f"Unknown backward type: {backward_type}")
            module = self.submod
            if isinstance(module, DistributedDataParallel):
                if last_backward:  # arm the reducer, as PipelineStage does for a full backward
                    module.reducer.prepare_for_backward(list(
                        torch.nn.parallel.distributed._find_tensors(bwd_kwargs["stage_output"])))
                    return run()
                with module.no_sync():
                    return run()
            if isinstance(module, FSDPModule):  # reduce-scattered at REDUCE_GRAD
                module.set_is_last_backward(False)
                module.set_reshard_after_backward(False)
                module.set_requires_gradient_sync(False)
            return run()
    return SplitBackwardStage


def _as_message(meta: Any, precision: Any) -> Any:
    """A stage boundary's traced meta tensor in the dtype it travels in (precision)."""
    if isinstance(meta, torch.Tensor):
        dtype = precision.message_dtype(meta.dtype)
        return meta if dtype == meta.dtype else meta.to(dtype)
    return meta


class PipelineRunner:
    """One rank's stages of one replica: `step(flat_inputs, target)` runs the schedule.
    `stages` are this rank's stage indices (increasing) among cut.num_stages."""

    def __init__(self, cut: StageCut, stages: Sequence[int], device: torch.device,
                 schedule: str, num_microbatches: int, loss_fn: Callable, pipe_group,
                 dp_group, dp: int, tie_groups: Dict[int, Any],
                 recompute_stages: Sequence[int] = (), sharding: str = "none",
                 selective_stages: Sequence[int] = (),
                 dp_mesh: Any = None, tensor_parallel: Optional[tuple] = None,
                 precision: Any = None, compiled: Optional[Dict[str, Any]] = None,
                 nodes: Sequence[str] = ()):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES} (got {schedule!r})")
        if schedule not in MULTI_STAGE and len(stages) != 1:
            raise ValueError(f"schedule {schedule!r} runs one stage per rank (got stages "
                             f"{list(stages)})")
        stage_class = _stage_class()
        self.cut, self.num_microbatches = cut, num_microbatches
        self.stage_indices = list(stages)
        self.modules: List[nn.Module] = []
        self.ddps: List[DistributedDataParallel] = []  # for DDP comm hooks (noise scale)
        self.stages = []  # the PipelineStages, in stage order
        for index in self.stage_indices:
            module = cut.stages[index].to(device)
            if compiled is not None:  # its node modules' forwards, under every wrapper below
                _compiling.compile_stage_blocks(module, nodes, compiled)
            if index in recompute_stages:  # a pipeline recomputes whole stages (recompute)
                recompute(module, SELECTIVE if index in selective_stages else FULL)
                # (before fully_shard, as for placement: see sharding)
            if tensor_parallel is not None:  # its node modules split over the TP group
                styles, kinds, tp_mesh = tensor_parallel
                _tp.parallelize(module, styles, kinds, _tp.tp_dim(tp_mesh),
                                module_name_of=original_name, local=True)
            has_params = any(p.requires_grad for p in module.parameters())
            wrapped = module
            if dp > 1 and has_params and tensor_parallel is not None:  # over the dp dimension
                _tp.replicate(module, tp_mesh)  # (sharding with tp > 1: placement only)
            elif dp > 1 and has_params and sharding != "none":  # one FSDP unit: the stage
                _sharding.shard(module, dp_mesh, sharding)  # HSDP: a 2-D dp_mesh
            elif dp > 1 and has_params:
                wrapped = DistributedDataParallel(module, process_group=dp_group,
                                                  **ddp_bucket_kwargs())
                self.ddps.append(wrapped)
            inputs_meta, outputs_meta = cut.meta_of(index)
            send_dtypes = None
            if precision is not None and precision.autocasts:  # messages in the compute dtype
                if index > 0:
                    inputs_meta = [_as_message(t, precision) for t in inputs_meta]
                if index < cut.num_stages - 1:
                    outputs_meta = [_as_message(t, precision) for t in outputs_meta]
                    send_dtypes = [t.dtype for t in outputs_meta]
            self.modules.append(module)
            stage = stage_class(wrapped, index, cut.num_stages, device,
                                input_args=tuple(inputs_meta),
                                output_args=tuple(outputs_meta), group=pipe_group)
            stage.mixed, stage.send_dtypes = precision, send_dtypes
            self.stages.append(stage)
        self.ddp = self.ddps[0] if len(self.ddps) == 1 else None  # one stage: its DDP
        # `module`: the one stage module, or this rank's stage modules in stage order
        self.module = self.modules[0] if len(self.modules) == 1 else nn.ModuleList(self.modules)
        self.device = device
        self.holds_first = 0 in self.stage_indices
        self.holds_last = cut.num_stages - 1 in self.stage_indices

        self._accumulation = 1  # step()'s accumulation_steps: the loss is divided by it too
        self.scaler = None  # fp16's loss scaler (AppliedPlan sets it; precision.py)

        def micro_loss(outputs, target):
            with (precision.autocast(device) if precision is not None  # the loss, as forward
                  else contextlib.nullcontext()):
                loss = loss_fn(cut.unflatten_outputs(outputs), target)
            if self.scaler is not None:  # fp16: the backward runs on the scaled loss
                loss = self.scaler.scale(loss)
            if self._accumulation == 1:
                return loss / num_microbatches
            return loss / (num_microbatches * self._accumulation)
        schedule_class = _schedule_class(schedule)
        self.schedule = schedule_class(self.stages if schedule in MULTI_STAGE else self.stages[0],
                                       num_microbatches, loss_fn=micro_loss, scale_grads=False)
        # per tied parameter held here: (this rank's copies, one per stage holding it, and the
        # group of the replica's ranks holding a copy, None when this rank holds them all)
        self.tied = []
        for i, uses in enumerate(cut.tied):
            copies = [m.part.get_parameter(uses[index])
                      for index, m in zip(self.stage_indices, self.modules) if index in uses]
            if copies:
                self.tied.append((copies, tie_groups.get(i)))
        # record_actions(): (kind, stage, micro-batch, start, end); see _time_actions
        self.actions: Optional[List[tuple]] = None
        for stage in self.stages:
            self._time_actions(stage)

    def _time_actions(self, stage) -> None:
        """While `self.actions` is a list, every pass of a micro-batch through `stage` appends
        (kind, stage index, micro-batch, start, end) in time.perf_counter seconds: kind "F"
        (forward), "B" (full backward), or under a zero-bubble schedule "I" (input gradients)
        and "W" (weight gradients; stage 0's whole backward runs in its W, its I is empty).
        The executor's own timeline, which `hybridplan validate` draws beside the cost
        model's schedule."""
        def timed(kind_of, run):
            def wrapper(chunk, *args, **kwargs):
                if self.actions is None:
                    return run(chunk, *args, **kwargs)
                start = time.perf_counter()
                out = run(chunk, *args, **kwargs)
                self.actions.append((kind_of(args, kwargs), stage.stage_index, chunk, start,
                                     time.perf_counter()))
                return out
            return wrapper

        def backward_kind(args, kwargs):  # backward_one_chunk(chunk, loss, full_backward, ..)
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            return "B" if full else "I"
        stage.forward_one_chunk = timed(lambda a, k: "F", stage.forward_one_chunk)
        stage.backward_one_chunk = timed(backward_kind, stage.backward_one_chunk)
        stage.backward_weight_one_chunk = timed(lambda a, k: "W",
                                                stage.backward_weight_one_chunk)

    def step(self, flat_inputs: Optional[Sequence[torch.Tensor]], target: Any, *,
             sync: bool = True, accumulation_steps: int = 1) -> torch.Tensor:
        """One training step's schedule; returns the replica's mean loss on the rank holding
        the last stage, 0 elsewhere. Gradients (summed over tied copies) are left in the
        stages' parameters. Gradient accumulation over several steps: each micro-batch's loss
        is divided by accumulation_steps too, and the steps before the last run with `sync`
        False: no backward is the last (DDP and FSDP reduce nothing) and tied copies are summed
        only by the last, once, over what the stages accumulated."""
        kwargs: Dict[str, Any] = {}
        if self.holds_last:
            kwargs.update(target=target, losses=[])
        args = tuple(flat_inputs) if self.holds_first else ()
        self._accumulation = accumulation_steps
        for stage in self.stages:
            stage.sync_gradients = sync
        self.schedule.step(*args, return_outputs=False, **kwargs)
        if self.holds_last:
            loss = torch.stack([loss.detach() for loss in kwargs["losses"]]).sum()
            if self.scaler is not None:  # the loss as computed, not as scaled for backward
                loss = loss / self.scaler.get_scale()
            if accumulation_steps != 1:
                loss = loss * accumulation_steps
        else:
            loss = torch.zeros((), device=self.device)
        if not sync:
            return loss
        for copies, group in self.tied:
            grads = []
            for param in copies:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                elif _sharding.is_sharded(param.grad) and \
                        param.grad.placements != param.placements:
                    # a TP gradient may come back laid out otherwise than its parameter (an
                    # embedding's, whole); the copies' shards are summed in the parameter's
                    param.grad = param.grad.redistribute(param.device_mesh, param.placements)
                # sharded (FSDP): the grad is a DTensor whose local tensor is this replica's
                # shard, the same shard index on every stage of the replica (one DP rank per
                # replica)
                grads.append(param.grad.to_local() if _sharding.is_sharded(param.grad)
                             else param.grad)
            total = grads[0] if len(grads) == 1 else torch.stack(grads).sum(dim=0)
            if group is not None:
                dist.all_reduce(total, group=group)
            for grad in grads:
                if grad is not total:
                    grad.copy_(total)
        return loss

    def parameters(self) -> List[nn.Parameter]:
        """This rank's stages' parameters, in stage order (a tied weight's copies each)."""
        return [p for module in self.modules for p in module.parameters()]

    def counted_parameters(self) -> List[nn.Parameter]:
        """parameters() less the tied copies on any stage but the first holding the weight:
        after step() every copy holds the sum, so a norm over the replica counts it once."""
        later = set()
        for uses in self.cut.tied:
            first = min(uses)
            for index, module in zip(self.stage_indices, self.modules):
                if index in uses and index != first:
                    later.add(id(module.part.get_parameter(uses[index])))
        return [p for p in self.parameters() if id(p) not in later]

    def named_parameters(self) -> List[tuple]:
        """(original module's name, parameter) of parameters(); copies share a name."""
        return [(original_name(k), p) for module in self.modules
                for k, p in module.named_parameters()]

    def local_state(self) -> Dict[str, torch.Tensor]:
        """This rank's stages' parameters and buffers under the original module's names (CPU; a
        sharded stage's parameters gathered over its DP group: collective there). A tied
        weight's copies on two of its stages hold the same value: the later stage's is kept."""
        out: Dict[str, torch.Tensor] = {}
        for module in self.modules:
            state = _sharding.full_cpu_state(module.state_dict(keep_vars=True))
            out.update((original_name(k), v) for k, v in state.items())
        return out


def merge_states(original: nn.Module, parts: Sequence[Dict[str, torch.Tensor]]
                 ) -> Dict[str, torch.Tensor]:
    """The original module's state_dict (its keys, in its order) from the stages' states. A key
    no stage holds takes a stage's value of a tied name of the same tensor (GPT-2's
    lm_head.weight from the stage holding transformer.wte.weight), else the value as built."""
    full = original.state_dict(keep_vars=True)
    names_of: Dict[int, List[str]] = {}
    for key, t in full.items():
        names_of.setdefault(id(t), []).append(key)
    merged = collections.OrderedDict()
    for key, t in full.items():
        value = next((p[name] for name in [key] + names_of[id(t)] for p in parts if name in p),
                     None)
        merged[key] = value if value is not None else t.detach().cpu().clone()
    return merged
