"""BatchNorm under data parallelism: what the replicas' running statistics are, and
apply(..., sync_batchnorm=True), which normalises over the global batch.

Without it each replica normalises its share of the batch with that share's statistics, as
torch DDP does. DDP (placement plans, and each pipeline stage with dp > 1) broadcasts replica
0's buffers at every forward (broadcast_buffers), so every replica starts a step from replica
0's running statistics and the state_dict holds replica 0's; sharded plans (FSDP2) broadcast
no buffers, so each replica keeps its own and state_dict takes replica 0's. apply() says so
once (note_data_parallel).

sync_batchnorm=True converts the module's BatchNorm layers with torch's
nn.SyncBatchNorm.convert_sync_batchnorm over the replicas' process group: the statistics of a
forward are the global batch's, the running statistics move as one process's on the global
batch, and the gradients are that process's, so data parallelism equals one process exactly
(up to float reassociation). It applies to placement plans (data parallelism, with or without
sharding, tp = 1). A pipeline is refused: its stages are traced graphs with no BatchNorm
modules left to convert, and a stage normalises each micro-batch alone (GPipe), so statistics
shared by the replicas would still not be the global batch's.

torch's SyncBatchNorm runs on CUDA (and XPU, HPU) only; on CPU (Gloo jobs) the converted layers
compute the same statistics with torch.distributed.nn's differentiable all_reduce
(_CpuSyncBatchNorm):
the global mean, then the global biased variance around it, each one sum over the group, whose
backward is the sum of the ranks' gradients, as torch's SyncBatchNorm backward is."""

from __future__ import annotations

import warnings
from typing import Any, List

import torch
import torch.distributed as dist
from torch import nn

_BatchNorm = nn.modules.batchnorm._BatchNorm  # BatchNorm1d/2d/3d and SyncBatchNorm


def batch_norms(module: nn.Module) -> List[str]:
    """Qualified names of `module`'s BatchNorm layers that normalise with batch statistics in
    training (all of them: track_running_stats only decides whether running ones are kept)."""
    return [name for name, m in module.named_modules() if isinstance(m, _BatchNorm)]


def check_sync(spec: Any, module: nn.Module, sync_batchnorm: bool) -> None:
    """apply()'s check of sync_batchnorm against the plan and the module (ValueError)."""
    if not sync_batchnorm:
        return
    if spec.mode == "pipeline":
        raise ValueError(
            f"{spec.source}: sync_batchnorm applies to placement (data-parallel) plans, not to "
            f"a pipeline (mp={spec.mp}): its stages are traced graphs without BatchNorm modules, "
            f"and each stage normalises one micro-batch at a time, so statistics shared by the "
            f"replicas would not be the global batch's; plan with modes=(\"placement\",) or "
            f"leave sync_batchnorm off (got mode \"pipeline\")")
    if spec.tp > 1:
        raise ValueError(f"{spec.source}: sync_batchnorm is applied to plans with tp = 1 only "
                         f"(got tp={spec.tp})")
    if not batch_norms(module):
        raise ValueError(f"{spec.source}: sync_batchnorm=True needs a BatchNorm layer to "
                         f"convert (got none in {type(module).__name__})")


def note_data_parallel(spec: Any, module: nn.Module, sync_batchnorm: bool, rank: int) -> None:
    """Warns once, on rank 0, what the running statistics of a data-parallel plan are."""
    names = batch_norms(module)
    if rank != 0 or spec.dp < 2 or not names or sync_batchnorm:
        return
    if spec.sharding != "none" or spec.tp > 1:
        held = ("each replica keeps its own running statistics (FSDP2 broadcasts no buffers) "
                "and state_dict() returns replica 0's")
    else:
        held = ("DDP broadcasts replica 0's running statistics at every forward, so "
                "state_dict() holds replica 0's")
    where = ("each micro-batch of each replica" if spec.mode == "pipeline"
             else "each replica's share of the batch")
    advice = ("" if spec.mode == "pipeline" else
              "; apply(..., sync_batchnorm=True) normalises over the global batch instead "
              "(torch's SyncBatchNorm), as one process would")
    warnings.warn(f"hybridplan apply: {len(names)} BatchNorm layer(s) ({', '.join(names[:3])}"
                  f"{', ...' if len(names) > 3 else ''}) under dp={spec.dp}: {where} is "
                  f"normalised with its own statistics, as torch DDP does; {held}{advice}",
                  stacklevel=3)


def convert_sync(module: nn.Module, group: Any, device: torch.device) -> nn.Module:
    """Converts `module`'s BatchNorm layers in place (torch's convert_sync_batchnorm: the same
    parameters and buffers, so names, optimizer and checkpoints are unchanged) to normalise over
    `group`; on a CPU `device`, to _CpuSyncBatchNorm. Returns the module (a new one only where
    `module` itself is a BatchNorm layer)."""
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group=group)
    if device.type == "cpu":
        for m in converted.modules():
            if type(m) is nn.SyncBatchNorm:
                # torch's layer with a CPU forward; not a SyncBatchNorm any more, which DDP
                # refuses on CPU modules ("SyncBatchNorm layers only work with GPU modules")
                m.__class__ = _CpuSyncBatchNorm
    return converted


class _CpuSyncBatchNorm(_BatchNorm):
    """A converted SyncBatchNorm (its process_group and state) whose forward in training runs
    on CPU (see the module doc); outside training, or with a group of one, BatchNorm's."""

    process_group: Any = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:  # as SyncBatchNorm: (N, C, *)
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        group = self.process_group or dist.group.WORLD
        if not self.training or dist.get_world_size(group) == 1:
            return super().forward(input)
        self._check_input_dim(input)
        from torch.distributed.nn.functional import all_reduce  # differentiable collectives

        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        local = torch.tensor([input.numel() // input.size(1)], dtype=input.dtype,
                             device=input.device)
        sums = all_reduce(torch.cat([input.sum(dims), local]), group=group)
        count = sums[-1]
        mean = sums[:-1] / count
        centred = input - mean.reshape(shape)
        var = all_reduce(centred.square().sum(dims), group=group) / count  # biased
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.track_running_stats:
            self._update_running(mean.detach(), var.detach(), count.item())
        return out

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        """As _BatchNorm does: the unbiased variance, momentum or (None) the cumulative
        average over num_batches_tracked."""
        self.num_batches_tracked.add_(1)
        factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                  else self.momentum)
        unbiased = var * (count / max(count - 1.0, 1.0))
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
