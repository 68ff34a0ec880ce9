"""Averages a stage's gradients over its data-parallel group after the pipeline schedule.

Why not DistributedDataParallel around each stage: DDP arms its reducer during forward (the
familiar no_sync() trick decides at forward time whether the next backward all-reduces), and
then reduces as soon as the next backward has produced every gradient. Both GPipe and 1F1B run
the forwards of later micro-batches before the backwards of earlier ones, so the armed backward
is not the last one and DDP would reduce gradients that are still incomplete. All-reducing once
after the schedule is correct for every schedule; what it gives up is overlapping the reduction
with the last micro-batch's backward (the only overlap DDP's no_sync pattern would have kept).

Like DDP's default comm hook, each bucket is divided by the group size and then summed, so the
result is the mean over replicas:  grad = sum_r(grad_r / dp).
"""

from typing import List

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from . import _C

kBucketBytes = _C.kDefaultBucketCapBytes  # csrc/planner/bucket_policy.h


def buckets(params: List[torch.nn.Parameter], bucket_bytes: int = kBucketBytes
            ) -> List[List[torch.nn.Parameter]]:
    """Consecutive parameters of one dtype and device, each bucket at most bucket_bytes (a
    larger single parameter is its own bucket). Pure: every replica computes the same buckets."""
    out: List[List[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if (not out or size + nbytes > bucket_bytes or out[-1][0].dtype != p.dtype
                or out[-1][0].device != p.device):
            out.append([])
            size = 0
        out[-1].append(p)
        size += nbytes
    return out


def allreduce_mean(params: List[torch.nn.Parameter], group, group_size: int) -> None:
    """grad <- mean over the group's replicas; a missing grad counts as zeros."""
    if group_size == 1:
        return
    for bucket in buckets([p for p in params if p.requires_grad]):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        flat = _flatten_dense_tensors(grads)
        flat.div_(group_size)
        dist.all_reduce(flat, group=group)
        for p, g in zip(bucket, _unflatten_dense_tensors(flat, grads)):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
