"""Timing repeated calls the one way every measurement here takes them: untimed warm-up calls,
the device synchronized around each timed call (CUDA runs asynchronously; on CPU nothing to
wait for), optionally every rank starting each call together; and the slowest rank's figure,
which is what a synchronous job waits for."""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, Sequence

import torch
import torch.distributed as dist

__all__ = ["sync", "timed_samples", "max_over_ranks", "min_over_ranks", "median_slowest"]


def sync(device: torch.device) -> None:
    """Waits for the work queued on `device` (CUDA); nothing on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_samples(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int,
                  barrier: bool = False) -> List[float]:
    """Seconds of each of `repeats` calls of fn() after `warmup` untimed ones, the device
    synchronized around each call; `barrier`: every rank starts each call together (a
    collective, or a step of a job, is timed from a common start)."""
    samples = []
    for i in range(warmup + repeats):
        if barrier:
            dist.barrier()
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def max_over_ranks(value: float, device: torch.device) -> float:
    """The largest `value` over the ranks of the default group (every rank calls it)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def min_over_ranks(value: float, device: torch.device) -> float:
    """The smallest `value` over the ranks of the default group (every rank calls it)."""
    return -max_over_ranks(-value, device)


def median_slowest(samples: Sequence[float], device: torch.device) -> float:
    """The median of this rank's `samples`, the slowest rank's (every rank calls it)."""
    return max_over_ranks(statistics.median(samples), device)
