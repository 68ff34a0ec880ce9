"""The gradient noise scale measured online, during data-parallel training.

In DP training each replica holds its local gradient (its batch b) before the all-reduce and the
averaged one (the global batch B = dp * b) after it: the two batch sizes of McCandlish et al.'s
estimator (https://arxiv.org/abs/1812.06162, appendix A) come for free. A DDP communication hook
(torch.distributed.algorithms.ddp_comm_hooks: it wraps the default allreduce_hook, so the
training is unchanged) takes per bucket |g_b|^2 before the all-reduce and |g_B|^2 after it; per
measured step one all-reduce over the world of four float64 scalars
    [sum over this rank's buckets of |g_b|^2, ... of |g_B|^2, b, b^2]
adds the pieces up: over a pipeline replica's stages (|G|^2 and tr(Sigma) over all parameters
are sums over the stages' parameters) and over replicas (the mean of the dp local |g_b|^2 is an
unbiased |G_b|^2 with less variance than one replica's; every replica holds the same |g_B|^2).
The all-reduce is asynchronous; its result is read once it has arrived (at a later step's
start) or when noise_scale() asks.

The math is gradient_noise.noise_scale.estimate_from_norms, the offline estimator's, with step
weights decay^age: numerator and denominator are exponential moving averages, each taken
separately and divided once, as the paper smooths them (their per-step ratio is biased).

Caveats: replicas must hold equal batches (a step where they do not, or where b differs from the
earlier steps', e.g. an epoch's last partial batch, is skipped and counted in `skipped`); with
weights tied across pipeline stages, each copy's partial gradient counts as its own parameter;
with BatchNorm the local gradients are DDP's (statistics over each replica's b samples), so the
figure is that of b-sample batches, where the offline estimator normalises its big batch as a
whole; with dp = 1 there is no second batch size (apply refuses measure_noise_scale then).
A sharded plan ("sharding": "zero2" / "zero3") trains under FSDP, which reduce-scatters each
unit's gradient inside its post-backward and offers no hook on the local gradient before it:
apply refuses measure_noise_scale there too.
"""

import collections
import math
import warnings
from typing import Any, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..gradient_noise.noise_scale import NoiseScale, estimate_from_norms

# A step whose weight decay^age fell below this is dropped from the window.
_MIN_WEIGHT = 1e-4
# Measured steps whose all-reduce may still be in flight before a step waits for the oldest.
_MAX_PENDING = 4
# decay == 1 (a plain mean over every measurement) keeps at most this many steps.
_MAX_WINDOW = 100_000


def check_options(every: Any, decay: Any, dp: int, source: str, sharding: str = "none") -> None:
    """ValueError naming the option unless measure_noise_scale / noise_scale_decay are usable
    (with the plan's "sharding": the meter needs DDP, see the module doc)."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"hybridplan.apply: measure_noise_scale must be an integer >= 0 (every "
                         f"N steps; 0: off) (got {every!r})")
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
        raise ValueError(f"hybridplan.apply: noise_scale_decay must be in (0, 1] "
                         f"(got {decay!r})")
    if every and dp < 2:
        raise ValueError(f"{source}: measure_noise_scale needs dp >= 2: the online estimate "
                         f"compares a replica's local gradient with the all-reduced one, and "
                         f"with one replica they are the same batch (got dp={dp}); measure "
                         f"offline with hybridplan.noise_scale instead")
    if every and sharding != "none":
        raise ValueError(f"{source}: measure_noise_scale needs the plan's \"sharding\" to be "
                         f"\"none\": the meter reads each replica's local gradient in a DDP "
                         f"communication hook, and a sharded plan's gradients are "
                         f"reduce-scattered inside FSDP, where no local gradient is left to "
                         f"read (got sharding={sharding!r}); measure under the same plan with "
                         f"\"sharding\": \"none\", or offline with hybridplan.noise_scale")


class _HookState:
    def __init__(self, meter: "NoiseScaleMeter", process_group: Any):
        self.meter, self.process_group = meter, process_group


def _squared_norm(t: torch.Tensor) -> torch.Tensor:
    """|t|^2 as a float64 0-d tensor on t's device, without a sync. The norm accumulates in
    float32 (half-precision buckets are widened: their norm could overflow); a copy of the bucket
    in float64 would cost a memory pass for precision that the estimator's noise swamps."""
    wide = None if t.dtype in (torch.float32, torch.float64) else torch.float32
    return torch.linalg.vector_norm(t, dtype=wide).double().square()


# No `from __future__ import annotations` in this file: DDP's register_comm_hook checks these
# annotations at runtime and rejects strings.
def _comm_hook(state: _HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default allreduce_hook (divide by the group size, all-reduce), with the squared norm
    of the local bucket before it and of the averaged bucket after it on measured steps."""
    meter = state.meter
    if not meter.active:
        return default_hooks.allreduce_hook(state.process_group, bucket)
    meter.local.append(_squared_norm(bucket.buffer()))
    fut = default_hooks.allreduce_hook(state.process_group, bucket)

    def after(f: torch.futures.Future) -> torch.Tensor:
        reduced = f.value()
        meter.reduced.append(_squared_norm(reduced))
        return reduced
    return fut.then(after)


class NoiseScaleMeter:
    """One rank's part of the online estimate; AppliedPlan drives it (see the module doc)."""

    def __init__(self, every: int, decay: float, dp: int, device: torch.device):
        self.every, self.decay, self.dp, self.device = every, float(decay), dp, device
        self.active = False
        self.local: List[torch.Tensor] = []     # this step's |g_b|^2 per bucket
        self.reduced: List[torch.Tensor] = []   # this step's |g_B|^2 per bucket
        self.steps = 0          # training steps seen
        self.measured = 0       # steps whose measurement entered the estimate
        self.skipped = 0        # measured steps left out (unequal or changed batches)
        self.small_batch: Optional[int] = None
        maxlen = (_MAX_WINDOW if self.decay == 1
                  else min(_MAX_WINDOW, math.ceil(math.log(_MIN_WEIGHT) / math.log(self.decay))))
        self._small = collections.deque(maxlen=max(2, maxlen))
        self._big = collections.deque(maxlen=max(2, maxlen))
        # (work, tensor) of measured steps' all-reduces, oldest first. They are read when done
        # and waited for only by estimate() or when _MAX_PENDING pile up: a wait at the next
        # step would hold a pipeline's first stage until its last stage has finished the step.
        self._pending: collections.deque = collections.deque()

    def install(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        ddp.register_comm_hook(_HookState(self, ddp.process_group), _comm_hook)

    def begin_step(self) -> None:
        """Before the step's backward: measure it when it is the N-th."""
        self.collect(wait=False)
        self.active = self.steps % self.every == 0
        self.steps += 1
        self.local.clear()
        self.reduced.clear()

    def end_step(self, local_batch: int) -> None:
        """After the step's gradient all-reduce: sends this rank's pieces (async)."""
        if not self.active:
            return
        self.active = False
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        parts = [sum((t.to(self.device) for t in self.local), zero),
                 sum((t.to(self.device) for t in self.reduced), zero)]
        b = float(local_batch)
        vector = torch.stack(parts + [torch.tensor(v, dtype=torch.float64, device=self.device)
                                      for v in (b, b * b)])
        self._pending.append((dist.all_reduce(vector, async_op=True), vector))

    def collect(self, wait: bool = True) -> None:
        """Adds the measured steps whose all-reduce has finished to the window, in step order;
        with `wait` (or too many in flight) waits for them."""
        while self._pending:
            work, vector = self._pending[0]
            if not (wait or len(self._pending) > _MAX_PENDING or work.is_completed()):
                return
            self._pending.popleft()
            work.wait()
            self._add(vector)

    def _add(self, vector: torch.Tensor) -> None:
        local_sum, reduced_sum, b_sum, b2_sum = vector.tolist()
        nproc = dist.get_world_size()
        b = b_sum / nproc
        if b2_sum * nproc != b_sum * b_sum or b != round(b) or b < 1:
            self._skip("replicas held unequal batches")
            return
        b = int(round(b))
        if self.small_batch is not None and b != self.small_batch:
            self._skip(f"the local batch changed from {self.small_batch} to {b}")
            return
        self.small_batch = b
        self._small.append(local_sum / self.dp)   # mean over replicas, summed over stages
        self._big.append(reduced_sum / self.dp)   # every replica holds the same |g_B|^2
        self.measured += 1

    def _skip(self, why: str) -> None:
        if self.skipped == 0:
            warnings.warn(f"hybridplan noise scale: a measured step was skipped ({why}); the "
                          f"estimate needs equal per-replica batches, the same on every step",
                          stacklevel=3)
        self.skipped += 1

    def estimate(self) -> Optional[NoiseScale]:
        """The smoothed estimate, or None before two measured steps."""
        self.collect()
        if len(self._small) < 2:
            return None
        n = len(self._small)
        weights = [self.decay ** (n - 1 - i) for i in range(n)]
        return estimate_from_norms(self.small_batch, self.small_batch * self.dp,
                                   list(self._small), list(self._big), weights=weights)
