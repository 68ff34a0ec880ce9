"""One rank of `hybridplan validate`: trains a model under a plan and measures the step's terms
from the executor's own clock (see hybridplan/validation.py). Run under torchrun:

    torchrun --nproc-per-node P -m hybridplan._validate_worker --plan p.json \\
        --model hybridplan.models:branchy_cnn --steps 20 --warmup 5 --out measured.json

Every rank builds the same model (torch.manual_seed(0) before the factory) and draws the same
global batch per step (the module's example_inputs / example_target, seeded by the step); rank 0
writes the measurements of all ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

import torch
import torch.distributed as dist

TERMS = ("step_s", "compute_s", "allreduce_s", "optimizer_s", "overhead_s")


class _Clock:
    """Timestamps of one step: the last gradient accumulated, the optimizer's start and end."""

    def __init__(self):
        self.last_grad = None
        self.opt_start = None
        self.opt_end = None

    def grad_hook(self, _param):
        self.last_grad = time.perf_counter()

    def optimizer(self, factory):
        clock = self

        def build(params):
            opt = factory(params)
            original = opt.step

            def step(*args, **kwargs):
                clock.opt_start = time.perf_counter()
                out = original(*args, **kwargs)
                clock.opt_end = time.perf_counter()
                return out
            opt.step = step
            return opt
        return build


def _peak_tensor_bytes(run_step, live_at_start) -> Dict[str, int]:
    """Peak bytes of live tensors during one step, two ways from one torch.profiler run:
    "timeline", torch.profiler's memory timeline (every tensor the step uses, by category), and
    "allocations", the bytes of the tensors alive when the step starts (`live_at_start()`:
    parameters, gradients, optimizer state, buffers, the batch; each storage once) plus the
    peak of the step's allocation events (block_timing.allocation_peak_bytes). The timeline's
    data-flow analysis rejects FSDP2's in-place parameter swaps under zero3 ("version
    mismatch"); there "timeline" is absent and the allocations stand in, which the plans where
    both exist hold against each other (docs/sharding.md)."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    from hybridplan.profiler.block_timing import allocation_peak_bytes

    start = live_at_start()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        run_step()
    out = {"allocations": start + allocation_peak_bytes(prof)}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timeline.json")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated in favour of CUDA-only tools
                prof.export_memory_timeline(path, device="cpu")
        except AssertionError:
            return out
        with open(path) as f:
            _, sizes = json.load(f)
    out["timeline"] = int(max((sum(s) for s in sizes), default=0))
    return out


def _storage_bytes(tensors) -> int:
    """Bytes of the storages under `tensors` (None skipped, a DTensor's local shard), each once."""
    from torch.distributed.tensor import DTensor

    storages = {}
    for t in tensors:
        if isinstance(t, DTensor):
            t = t.to_local()
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--model", required=True, help="MODULE:FACTORY")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--out", required=True)
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args(argv)

    import hybridplan
    from hybridplan.files import write_text_atomic
    from hybridplan.factories import load_factory as _load_factory

    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = _load_factory(args.model)()
    with open(args.plan) as f:
        plan = json.load(f)
    clock = _Clock()
    example = (module.example_inputs(plan["per_replica_batch"])
               if plan["mode"] == "pipeline" else None)
    hp = hybridplan.apply(plan, module, timeout_s=args.timeout_s, example_inputs=example,
                          optimizer=clock.optimizer(
                              lambda params: torch.optim.SGD(params, lr=args.lr, momentum=0.9)))
    for param in hp.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(clock.grad_hook)
    global_batch = plan["global_batch"]
    rank = dist.get_rank()
    samples: Dict[str, List[float]] = {t: [] for t in TERMS}
    actions, last_start = [], 0.0

    def replica_batch(step: int):
        """This replica's share of the step's global batch, copied out of it: what a data loader
        hands a rank, so the measured peak memory holds this batch and not the global one."""
        from torch.utils._pytree import tree_map

        inputs = module.example_inputs(global_batch, seed=step)
        target = module.example_target(global_batch, seed=10_000 + step)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,
                        hp.shard(inputs, target))

    def run_step(shard):
        dist.barrier()
        clock.last_grad = clock.opt_start = clock.opt_end = None
        start = time.perf_counter()
        hp.step(*shard)
        end = time.perf_counter()
        return start, end

    last = args.warmup + args.steps - 1
    for step in range(args.warmup + args.steps):
        hp.record_actions(step == last)
        start, end = run_step(replica_batch(step))
        if step < args.warmup:
            continue
        opt_start = clock.opt_start if clock.opt_start is not None else end
        opt_end = clock.opt_end if clock.opt_end is not None else opt_start
        last_grad = clock.last_grad if clock.last_grad is not None else opt_start
        samples["step_s"].append(end - start)
        samples["compute_s"].append(last_grad - start)
        samples["allreduce_s"].append(max(0.0, opt_start - last_grad))
        samples["optimizer_s"].append(opt_end - opt_start)
        samples["overhead_s"].append(max(0.0, (end - start) - (opt_end - start)))
        if step == last:
            actions = [{"kind": k, "stage": st, "microbatch": i, "start_s": a - start,
                        "end_s": b - start} for k, st, i, a, b in hp.recorded_actions]
            # The ranks share one host and so one monotonic clock: with this, their actions
            # line up across ranks (a message's send on one, its use on the other).
            last_start = start
    mine = {t: statistics.median(v) for t, v in samples.items()}
    mine["rank"] = rank
    mine["actions"] = actions
    mine["last_step_start_s"] = last_start
    hp.record_actions(False)
    shard = replica_batch(args.warmup + args.steps)

    def live_at_start() -> int:
        from torch.utils._pytree import tree_leaves

        params = hp.parameters()
        state = [v for s in hp.optimizer.state.values() for v in s.values()]
        return _storage_bytes(params + [p.grad for p in params] + state
                              + list(hp.module.buffers()) + tree_leaves(shard))
    peaks = _peak_tensor_bytes(lambda: run_step(shard), live_at_start)
    mine["memory_bytes"] = peaks.get("timeline", peaks["allocations"])
    mine["memory_allocations_bytes"] = peaks["allocations"]
    ranks: List[dict] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        slowest = max(ranks, key=lambda r: r["step_s"])
        out = {t: slowest[t] for t in TERMS}
        out["per_rank"] = ranks
        out["memory_bytes"] = [r["memory_bytes"] for r in ranks]
        out["memory_allocations_bytes"] = [r["memory_allocations_bytes"] for r in ranks]
        write_text_atomic(args.out, json.dumps(out))
    dist.barrier()
    close = getattr(hp, "close", None)
    if close is not None:
        close()
    elif dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
