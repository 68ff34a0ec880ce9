"""Pipeline mode: runs this rank's stage with torch.distributed.pipelining.

- The stages come from profiler.stage_split (the export-based `pipeline()` cut at the plan's
  stage boundaries); this rank's stage runs in a `PipelineStage` (manual frontend, static
  metadata from the export: no warm-up forward, which would move BatchNorm statistics) under
  `ScheduleGPipe` or `Schedule1F1B` over the replica's ranks.
- Data parallelism: with dp > 1 the stage is wrapped in DistributedDataParallel over its DP
  group {r * mp + stage}; pipelining's schedules run every micro-batch but the last under
  DDP's no_sync and arm the reducer for the last backward (`backward_maybe_with_nosync`), so
  the all-reduce overlaps the last micro-batch's backward, as the cost model assumes.
- Sharded data parallelism (the plan's "sharding": "zero2", see sharding): with dp > 1 the
  stage module is instead one FSDP unit (`fully_shard(..., reshard_after_forward=False)`) over
  its DP group; PipelineStage runs every micro-batch's backward without gradient reduction and
  reduce-scatters the accumulated gradient once after the last (`perform_reduce_grad`), the
  parameters gathered once per step and kept until then.
- Micro-batches are equal parts of the replica's batch (the stages are traced at that shape)
  and each micro-batch's loss is divided by their number, so the accumulated gradient is the
  replica batch's mean-loss gradient (scale_grads=False: nothing to rescale afterwards).
- Tied weights (a parameter read on several stages; the Pipe gives each stage a copy): after
  the schedule, each copy's gradient is summed over the replica's stages that hold it, as
  Megatron-LM does for its embedding group (https://arxiv.org/abs/2104.04473, section 3), so
  every copy takes the same step. torch.distributed.pipelining leaves this to the caller.
  Sharded, each copy's gradient is a DTensor holding this replica's shard: its local tensor is
  summed, the same shard on each of the replica's stages (each is DP rank `replica` of its
  stage's group, and the copies have one shape).
- Recompute: a stage the plan recomputes runs its forward under torch.utils.checkpoint
  (executor.recompute), keeping only its inputs (the receive buffers) between a micro-batch's
  forward and backward.
- BatchNorm in a stage normalises each micro-batch with its own statistics and updates the
  running statistics once per micro-batch, as GPipe does (https://arxiv.org/abs/1811.06965).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .._bucket_policy import ddp_bucket_kwargs
from ..profiler.stage_split import StageCut, original_name
from . import sharding as _sharding
from .recompute import recompute

SCHEDULES = ("gpipe", "1f1b")


def _schedule_class(name: str):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]


class PipelineRunner:
    """One rank's stage of one replica: `step(flat_inputs, target)` runs the schedule."""

    def __init__(self, cut: StageCut, stage: int, device: torch.device, schedule: str,
                 num_microbatches: int, loss_fn: Callable, pipe_group, dp_group, dp: int,
                 tie_groups: Dict[int, Any], recompute_stage: bool = False,
                 sharding: str = "none"):
        from torch.distributed.pipelining import PipelineStage

        self.cut, self.stage_index, self.num_microbatches = cut, stage, num_microbatches
        self.module = cut.stages[stage].to(device)
        if recompute_stage:  # a pipeline recomputes whole stages (executor.recompute)
            recompute(self.module)  # before fully_shard, as for placement (see sharding)
        has_params = any(p.requires_grad for p in self.module.parameters())
        wrapped, self.ddp = self.module, None  # self.ddp: for a DDP comm hook
        if dp > 1 and has_params and sharding != "none":  # one FSDP unit: the stage module
            _sharding.shard(self.module, _sharding.data_parallel_mesh(dp_group, device),
                            sharding)
        elif dp > 1 and has_params:
            wrapped = self.ddp = DistributedDataParallel(self.module, process_group=dp_group,
                                                         **ddp_bucket_kwargs())
        inputs_meta, outputs_meta = cut.meta_of(stage)
        self.stage = PipelineStage(wrapped, stage, cut.num_stages, device,
                                   input_args=tuple(inputs_meta), output_args=tuple(outputs_meta),
                                   group=pipe_group)
        self.is_first, self.is_last = stage == 0, stage == cut.num_stages - 1

        def micro_loss(outputs, target):
            return loss_fn(cut.unflatten_outputs(outputs), target) / num_microbatches
        self.schedule = _schedule_class(schedule)(self.stage, num_microbatches,
                                                  loss_fn=micro_loss, scale_grads=False)
        # tied parameter copies on this stage -> the group of this replica's stages holding it
        self.tied = [(self.module.part.get_parameter(uses[stage]), tie_groups[i])
                     for i, uses in enumerate(cut.tied) if stage in uses]
        self.actions: Optional[List[tuple]] = None  # record_actions(): (kind, mb, start, end)
        self._time_actions()

    def _time_actions(self) -> None:
        """While `self.actions` is a list, every forward and backward of a micro-batch appends
        ("F" | "B", micro-batch, start, end) in time.perf_counter seconds: the executor's own
        timeline, which `hybridplan validate` draws beside the cost model's schedule."""
        import time

        def timed(kind, run):
            def wrapper(chunk, *args, **kwargs):
                if self.actions is None:
                    return run(chunk, *args, **kwargs)
                start = time.perf_counter()
                out = run(chunk, *args, **kwargs)
                self.actions.append((kind, chunk, start, time.perf_counter()))
                return out
            return wrapper
        self.stage.forward_one_chunk = timed("F", self.stage.forward_one_chunk)
        self.stage.backward_one_chunk = timed("B", self.stage.backward_one_chunk)

    def step(self, flat_inputs: Optional[Sequence[torch.Tensor]], target: Any) -> torch.Tensor:
        """One training step's schedule; returns the replica's mean loss on the last stage, 0
        elsewhere. Gradients (summed over tied copies) are left in the stage's parameters."""
        kwargs: Dict[str, Any] = {}
        if self.is_last:
            kwargs.update(target=target, losses=[])
        args = tuple(flat_inputs) if self.is_first else ()
        self.schedule.step(*args, return_outputs=False, **kwargs)
        for param, group in self.tied:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            # sharded (FSDP): the grad is a DTensor whose local tensor is this replica's shard,
            # the same shard index on every stage of the replica (one DP rank per replica)
            grad = param.grad.to_local() if _sharding.is_sharded(param.grad) else param.grad
            dist.all_reduce(grad, group=group)
        if self.is_last:
            return torch.stack([loss.detach() for loss in kwargs["losses"]]).sum()
        return torch.zeros((), device=self.stage.device)

    def parameters(self) -> List[nn.Parameter]:
        return list(self.module.parameters())

    def local_state(self) -> Dict[str, torch.Tensor]:
        """This stage's parameters and buffers under the original module's names (CPU; a
        sharded stage's parameters gathered over its DP group: collective there)."""
        state = _sharding.full_cpu_state(self.module.state_dict(keep_vars=True))
        return {original_name(k): v for k, v in state.items()}


def merge_states(original: nn.Module, parts: Sequence[Dict[str, torch.Tensor]]
                 ) -> Dict[str, torch.Tensor]:
    """The original module's state_dict (its keys, in its order) from the stages' states. A key
    no stage holds takes a stage's value of a tied name of the same tensor (GPT-2's
    lm_head.weight from the stage holding transformer.wte.weight), else the value as built."""
    import collections

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
