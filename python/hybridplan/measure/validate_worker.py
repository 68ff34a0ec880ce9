"""One rank of `hybridplan validate`: trains a model under a plan and measures the step's terms
from the executor's own clock (see hybridplan/measure/validation.py). Run under torchrun:

    torchrun --nproc-per-node P -m hybridplan.measure.validate_worker --plan p.json \\
        --model hybridplan.models:branchy_cnn --steps 20 --warmup 5 --out measured.json

Every rank builds the same model (torch.manual_seed(0) before the factory) and draws the same
global batch per step (the module's example_inputs / example_target, seeded by the step); rank 0
writes the measurements of all ranks. With --host-workload M --host-batch B (the calibration's
shared-core workload), every rank also takes calibrate's shared-core burst on it right before
the timed steps and right after them (shared_host_bursts: validate's prediction at launch).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_leaves, tree_map

from ..convergence.tradeoff import OPTIMIZERS
from ..executor import apply
from ..factories import load_factory
from ..files import write_text_atomic
from ..profiler.block_timing import (allocation_peak_bytes, profiler_events,
                                      unreported_collective_frees)

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


# The name of the profiled step that validate measures memory in (a record_function range).
kMeasuredStep = "hybridplan::measured_step"


def _peak_tensor_bytes(run_step, live_at_start) -> Dict[str, Any]:
    """Peak bytes of live tensors during one step, two ways from one torch.profiler run:
    "timeline", torch.profiler's memory timeline (every tensor the step uses, by category), and
    "allocations", the bytes of the tensors alive when the step starts (`live_at_start()`:
    {address: bytes} of the parameters, gradients, optimizer state, buffers, the batch; each
    storage once) plus the peak of the step's allocation events (block_timing.
    allocation_peak_bytes). The timeline's data-flow analysis rejects FSDP2's in-place
    parameter swaps under zero3 and DTensor's sequence-parallel collectives ("version
    mismatch"); there "timeline" is absent and the allocations stand in, which the plans where
    both exist hold against each other (docs/sharding.md). Beside them, "product_dtypes": the
    dtypes the step's matrix products ran in (_product_dtypes), read from the same run.

    `run_step(i)` runs step i. The profiler runs across two steps and the measured one is the
    second: torch reports a free to the profiler only for a block allocated while it ran, so
    in a step profiled alone the frees of what the step before left went unreported (gradients
    a step sets anew were counted twice: transformer_lm's sequence-parallel plan measured
    31.9-36.0 MiB across launches, 30.1 MiB where the timeline held, 30.3 predicted). What the
    first step allocated and still holds beyond `live_at_start` (its output, kept until the
    next one replaces it) is alive as the second starts and is counted with it."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        run_step(0)
        start = live_at_start()
        with record_function(kMeasuredStep):
            run_step(1)
    since_ns, until_ns = _range_ns(prof, kMeasuredStep)
    out = {"allocations": sum(start.values()) + allocation_peak_bytes(
        prof, since_ns=since_ns, counted=set(start)),
        "product_dtypes": _product_dtypes(prof, since_ns, until_ns)}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timeline.json")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated in favour of CUDA-only tools
                prof.export_memory_timeline(path, device="cpu")
        except AssertionError:
            return out
        with open(path) as f:
            times, sizes = json.load(f)
    # the timeline's times are microseconds of the same clock; its sizes at each time are all
    # that is alive then, what the profiler found alive at its start included. It reads the
    # same allocation events, so a collective's buffer freed unreported stays in it until its
    # address is allocated again: taken out from when the collective's wait returned.
    frees = unreported_collective_frees(list(profiler_events(prof)))

    def unreported(t_us: int) -> int:
        t = t_us * 1000
        return sum(n for done, _, _, n, again in frees if done <= t and (not again or t < again))

    out["timeline"] = int(max((sum(s) - unreported(t) for t, s in zip(times, sizes)
                               if since_ns // 1000 <= t <= until_ns // 1000), default=0))
    return out


# The ops that do a step's matrix products (forward and backward): the ones a 16-bit precision
# runs in its dtype (autocast's lower-precision list; FSDP2's bf16 parameters), whose inputs'
# dtype tells the precision the step really computed in. Recorded where the dispatcher runs
# the kernel: autocast casts aten::linear's or aten::matmul's fp32 inputs and the products
# below them see the casts.
kProductOps = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                         "aten::_convolution", "aten::mkldnn_rnn_layer",
                         "aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_flash_attention",
                         "aten::_scaled_dot_product_efficient_attention"})

# torch dtypes by the plan's precision names (executor/precision.py); other dtypes by torch's
kDtypeNames = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _product_dtypes(prof, since_ns: int, until_ns: int) -> Dict[str, int]:
    """{dtype: count} of the matrix products (kProductOps) that ran in [since_ns, until_ns] (the
    measured step), by the dtype of each one's first tensor input ("fp32", "bf16", "fp16", else
    torch's name): what precision the step's products really ran in, whatever the plan asked."""
    from torch._C._profiler import _EventType

    counts: Dict[str, int] = {}
    for event in profiler_events(prof):
        if (event.tag != _EventType.TorchOp or event.name not in kProductOps
                or not since_ns <= event.start_time_ns <= until_ns):
            continue
        first = next((x for x in event.extra_fields.inputs
                      if getattr(x, "dtype", None) is not None), None)
        if first is not None:
            name = kDtypeNames.get(first.dtype, str(first.dtype).replace("torch.", ""))
            counts[name] = counts.get(name, 0) + 1
    return counts


def _range_ns(prof, name: str):
    """(start, end) in ns of the profiler's record_function range `name` (the first one)."""
    for event in profiler_events(prof):
        if event.name == name:
            return event.start_time_ns, event.end_time_ns
    raise RuntimeError(f"validate: the profiler recorded no {name!r} range")


def _storages(tensors) -> Dict[int, int]:
    """{address: bytes} of the storages under `tensors` (None skipped, a DTensor's local shard),
    each once."""
    from torch.distributed.tensor import DTensor  # takes seconds to import: only where needed

    storages = {}
    for t in tensors:
        if isinstance(t, DTensor):
            t = t.to_local()
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return storages


def _arguments(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--model", required=True, help="MODULE:FACTORY")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--out", required=True)
    p.add_argument("--lr", type=float, default=0.01)
    # the Job's optimizer the plan was predicted with (validate passes it): its state is memory
    p.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZERS))
    # the calibration's shared-core workload (its measured.shared_host.workload): timed by every
    # rank in a _shared_host_slowdown burst right before the timed steps and right after them
    # (_HostBursts); without it, no bursts
    p.add_argument("--host-workload", default=None, help="MODULE:FACTORY")
    p.add_argument("--host-batch", type=int, default=None)
    args = p.parse_args(argv)
    if args.host_workload and not args.host_batch:
        p.error("--host-workload needs --host-batch (the calibration's workload batch)")
    return args


class _Run:
    """The model trained under the plan, its steps timed by `clock` (the optimizer's step wrapped,
    a hook on every parameter's gradient)."""

    def __init__(self, args: argparse.Namespace):
        torch.manual_seed(0)
        self.module = load_factory(args.model)()
        with open(args.plan) as f:
            self.plan = json.load(f)
        self.clock = _Clock()
        # pipelines trace their stages at this shape; tensor parallelism checks its split on it
        example = (self.module.example_inputs(self.plan["per_replica_batch"])
                   if self.plan["mode"] == "pipeline" or self.plan.get("tp", 1) > 1 else None)
        self.hp = apply(self.plan, self.module, timeout_s=args.timeout_s, example_inputs=example,
                        optimizer=self.clock.optimizer(
                            lambda params: OPTIMIZERS[args.optimizer](params, args.lr)))
        for param in self.hp.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self.clock.grad_hook)

    def replica_batch(self, step: int):
        """This replica's share of the step's global batch, copied out of it: what a data loader
        hands a rank, so the measured peak memory holds this batch and not the global one."""
        global_batch = self.plan["global_batch"]
        inputs = self.module.example_inputs(global_batch, seed=step)
        target = self.module.example_target(global_batch, seed=10_000 + step)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,
                        self.hp.shard(inputs, target))

    def step(self, shard):
        """One step from a barrier: its (start, end) on this host's monotonic clock."""
        # Its own clock, not timing.timed_samples: the step's terms are read from hooks inside it.
        dist.barrier()
        self.clock.last_grad = self.clock.opt_start = self.clock.opt_end = None
        start = time.perf_counter()
        self.hp.step(*shard)
        end = time.perf_counter()
        return start, end

    def live_storages(self, shard) -> Dict[int, int]:
        """{address: bytes} of the storages alive as a step of `shard` starts: parameters,
        gradients, optimizer state, buffers and the batch."""
        params = self.hp.parameters()
        state = [v for s in self.hp.optimizer.state.values() for v in s.values()]
        return _storages(params + [p.grad for p in params] + state
                         + list(self.hp.module.buffers()) + tree_leaves(shard))

    def close(self) -> None:
        close = getattr(self.hp, "close", None)
        if close is not None:
            close()
        elif dist.is_initialized():
            dist.destroy_process_group()


class _HostBursts:
    """The shared-core measurement calibrate makes (calibration._shared_host_slowdown on the
    calibration's own workload: each rank alone, then every rank at once, in interleaved
    rounds), taken inside the launch: validate prices the plan again with the
    runtime.shared_host_slowdown table these bursts give (calibration.launch_slowdown_table), so
    that its prediction holds the host as it was during this launch, not as it was at calibrate
    minutes earlier (this host's speed for two ranks together moves 10-40 % within an hour)."""

    # Built and run under torch.random.fork_rng: the plan's training draws the same random
    # numbers (dropout) with the bursts as without them.

    def __init__(self, model: str, batch: int):
        from .calibration import _workload

        with torch.random.fork_rng(devices=[]):
            self.module, self.workload_step = _workload(model, batch)
        self.bursts: List[dict] = []

    def burst(self) -> None:
        from .calibration import _shared_host_slowdown, kLaunchBurstRounds, kLaunchBurstSteps

        with torch.random.fork_rng(devices=[]):
            self.bursts.append(_shared_host_slowdown(
                self.workload_step, dist.get_rank(), dist.get_world_size(),
                torch.device("cpu"), rounds=kLaunchBurstRounds, steps=kLaunchBurstSteps))

    def release(self) -> List[dict]:
        """The bursts; the workload's model, gradients and batch freed before the profiled
        step, whose peak memory must hold the plan's tensors alone."""
        self.module = self.workload_step = None
        gc.collect()
        return self.bursts


def _timed_terms(run: _Run, warmup: int, steps: int, host: "_HostBursts" = None) -> dict:
    """This rank's median of each term over the timed steps, and the last step's actions;
    `host`'s bursts taken right after the warm-up steps and right after the timed ones."""
    samples: Dict[str, List[float]] = {t: [] for t in TERMS}
    actions, last_start = [], 0.0
    last = warmup + steps - 1
    for step in range(warmup + steps):
        if step == warmup and host is not None:
            host.burst()
        run.hp.record_actions(step == last)
        start, end = run.step(run.replica_batch(step))
        if step < warmup:
            continue
        clock = run.clock
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
                        "end_s": b - start} for k, st, i, a, b in run.hp.recorded_actions]
            # The ranks share one host and so one monotonic clock: with this, their actions
            # line up across ranks (a message's send on one, its use on the other).
            last_start = start
    if host is not None:
        host.burst()
    mine = {t: statistics.median(v) for t, v in samples.items()}
    mine["step_samples_s"] = samples["step_s"]
    mine["rank"] = dist.get_rank()
    mine["actions"] = actions
    mine["last_step_start_s"] = last_start
    run.hp.record_actions(False)
    return mine


def _peak_memory(run: _Run, step: int) -> Dict[str, Any]:
    """The peak tensor bytes of step `step` + 1 (its batch), profiled with step `step` before it
    (_peak_tensor_bytes); the timeline's where it has one."""

    # both batches made before profiling; the warm-up's is dropped after its step
    shards = {0: run.replica_batch(step), 1: run.replica_batch(step + 1)}

    def step_then_meet(i: int):
        # Every rank finishes the step (its last sends and receives with it) before any stops
        # the profiler: a rank that stopped it while Gloo's threads still served the other
        # rank's transfers died in the profiler's teardown (`free(): invalid pointer`) in 3 of
        # 18 launches of branchy_cnn's ZB-V M=2 plan, and in 0 of 18 with this barrier.
        run.step(shards.pop(i) if i == 0 else shards[i])
        dist.barrier()

    peaks = _peak_tensor_bytes(step_then_meet, lambda: run.live_storages(shards[1]))
    return {"memory_bytes": peaks.get("timeline", peaks["allocations"]),
            "memory_allocations_bytes": peaks["allocations"],
            "product_dtypes": peaks["product_dtypes"]}


def _write_all_ranks(mine: dict, path: str, bursts: List[dict] = ()) -> None:
    """Every rank's measurements to rank 0, which writes them with the slowest rank's terms,
    and `bursts` (_HostBursts', every rank's rounds already in each) as shared_host_bursts."""
    ranks: List[dict] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if dist.get_rank() == 0:
        slowest = max(ranks, key=lambda r: r["step_s"])
        out = {t: slowest[t] for t in TERMS}
        # each timed step's slowest rank: how far one step is from the next (step_spread)
        out["step_samples_s"] = [max(s) for s in zip(*(r.pop("step_samples_s") for r in ranks))]
        out["per_rank"] = ranks
        out["memory_bytes"] = [r["memory_bytes"] for r in ranks]
        out["memory_allocations_bytes"] = [r["memory_allocations_bytes"] for r in ranks]
        # per rank, the dtypes its measured step's matrix products ran in (_product_dtypes)
        out["product_dtypes"] = [r["product_dtypes"] for r in ranks]
        if bursts:  # [before the timed steps, after them]
            out["shared_host_bursts"] = list(bursts)
        write_text_atomic(path, json.dumps(out))
    dist.barrier()


def main(argv=None) -> int:
    args = _arguments(argv)
    torch.set_num_threads(1)
    run = _Run(args)
    host = (_HostBursts(args.host_workload, args.host_batch) if args.host_workload else None)
    mine = _timed_terms(run, args.warmup, args.steps, host)
    bursts = host.release() if host is not None else []
    mine.update(_peak_memory(run, args.warmup + args.steps))
    _write_all_ranks(mine, args.out, bursts)
    run.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
