"""Calibration: measures what the executor really pays on this machine and writes a Cluster
(docs/formats.md, kind "hybridplan.cluster") whose numbers the cost model then uses.

    torchrun --standalone --nproc-per-node 2 -m hybridplan calibrate --graph G --out cluster.json
        [--model MODULE:FACTORY --batch B]

What is measured (every fit by least squares, its points and residuals under "measured"):

  intra_node (p2p link)        one-way times of batch_isend_irecv ping-pongs (how
                               torch.distributed.pipelining sends activations), alpha + bytes/bw
  intra_node.allreduce         all_reduce of flat float32 buckets (as DDP reduces its buckets),
                               as the link that makes the ring formula reproduce them
  runtime.step_s               a data-parallel step of a tiny model under hybridplan.apply, minus
                               the tiny model's own compute, its all-reduce and its optimizer's
                               per-tensor cost: the executor's fixed cost per step (zero_grad, DDP
                               bookkeeping), which the cost model charges plans of more than one
                               replica only (Runtime::step_overhead_s): a one-replica plan has no
                               data-parallel wrapper, and the tiny pipelines below fit to a fixed
                               cost of ~0 beside it
  runtime.schedule_action_s    the cost per schedule action that makes the cost model's own
  (and runtime.action_s,       schedule reproduce measured pipeline steps: a fixed part and a
  runtime.(schedule_)action_sample_s)  part per sample of the micro-batch (least squares on
                               evaluate()'s slope, relative residuals, _fit_action_s), fitted for
                               each schedule on its own runs. The schedule simulation follows
                               torch's messages (when each schedule posts and waits on them,
                               pipeline_schedule.h); the
                               action cost prices what remains, on CPU ranks mostly a waiting
                               rank's wake-up (docs/calibration.md "The stalls"), which the runs
                               show differs by schedule. action_s is 1F1B's (the value for any
                               other schedule).
                               With --graph and --model: two-stage pipelines of that model
                               (kModelMicrobatchCounts micro-batches of the --batch) under
                               hybridplan.apply, because on CPU ranks the cost of an action is
                               mostly waiting for a message while the other rank computes, which
                               an idle tiny model does not show; three rounds of each, fitted
                               on each configuration's median round (one slow round moved a
                               two-round least-squares fit by 2-3x). Otherwise (and always reported as
                               tiny_pipeline_actions): the tiny model, 1..32 micro-batches.
                               The multi-stage schedules (interleaved-1f1b, interleaved-zb, zbv:
                               two stages per rank, so four stages of the model) are fitted on
                               the model's own runs only (the tiny model has two nodes); without
                               --model they take 1F1B's.
  runtime.shared_host_slowdown a workload's forward+backward (the --model, else the built-in
                               branchy_cnn) on each rank alone vs on every rank at once, in
                               interleaved rounds: how much slower ranks compute when they share
                               the node's cores, caches and memory bandwidth; the rounds come in
                               kSharedHostBursts bursts spread over the calibration (its start,
                               middle and end), medians over all of them. With --graph of the
                               same model at the same --batch (equal parameter bytes and batch),
                               both entries are relative to the graph's own forward+backward sum
                               instead ([1, alone / graph], [P, slowest together / graph]): the
                               wall clock of a whole step under the job's conditions, against
                               the profile's clock (which may be a thread's CPU time, blind to
                               time the host takes away)
  intra_node.allgather         sharded data parallelism's collectives as FSDP2 runs them (its
  intra_node.reduce_scatter    copies in and out, hooks and the collective; Gloo reduce-scatters
                               with an all-reduce): a model of kShardUnits Linear units of
                               kShardUnitBytes each, its forward+backward timed unsharded, as
                               zero2 and as zero3 (fully_shard per unit, as the executor shards):
                               per unit, gather = (zero3 - zero2) / units, reduce-scatter =
                               (zero2 - unsharded) / units - gather; fitted over the unit sizes
                               as the links that make the ring formula (p-1) alpha + (p-1)/p
                               bytes / bw reproduce them (allreduce_cost.h). With --graph and
                               --model (one node), the latencies are then fitted again on the
                               model's own data-parallel step, unsharded, zero2 and zero3, at
                               a quarter of --batch and twice it per replica
                               (_fit_shard_latencies): a unit's fixed cost moves with its
                               structure (tensors, hooks, copies) and the host's state, which
                               six one-tensor units do not show; the bandwidths stay the
                               synthetic fit's (fit "model_shard_units" under measured)
  runtime.sharded_compute_slowdown  from the same runs: the share of the compute a sharded
                               step adds beyond its collectives' fixed cost (the ranks meet at
                               every unit, each waiting for the slower one's compute since the
                               last, and Gloo's threads share the cores): zero2 - unsharded grows
                               with the batch (transformer_lm: 62.7 ms at 8 per replica, 76.3 at
                               32), so the two batches tell it from the reduce-scatter's latency
  intra_node.tp_allreduce      tensor parallelism's collectives as DTensor runs them (the
                               collective, its copies and the dispatch of the split Linears'
                               ops): kTpPairs column-then-row Linear pairs split by
                               parallelize_module against the same model with each rank's
                               narrower Linears and no DTensor, per collective = the difference
                               / (2 kTpPairs) (one all-reduce in forward, one in backward per
                               pair), over three activation sizes, fitted as the link that makes
                               the ring formula 2(p-1) alpha + 2(p-1)/p bytes / bw reproduce them;
                               timed with each shared-core burst, each size's median fitted
  runtime.sharded_optimizer_tensor_s  as optimizer_tensor_s, over sharded parameters (DTensor
                               shards over the ranks, each update op dispatched by DTensor)
  runtime.(sharded_)optimizer_tensor_s_by_optimizer  the two per Job optimizer (OPTIMIZERS:
                               each dispatches its own ops per tensor); the scalars are the
                               default Job's (kJobOptimizer); fits "(sharded_)optimizer_tensors.NAME"
  device.memory_bandwidth      an SGD-momentum step over a 32 Mi-element parameter (5 bytes
                               touched per parameter byte, optimizer_cost.h) / its time
  runtime.optimizer_tensor_s   the slope of the Job optimizer's step times over 16, 64 and 256
                               small parameters (torch.optim's per-tensor loop)
  runtime.selective_op_s       selective recompute's cost per aten op beyond running it again
                               (torch's policy is a Python dispatch mode): the slope of
                               (selective - full recompute) forward+backward time of a Linear
                               and 16, 64, 256 elementwise ops on a tiny tensor (fit
                               "selective_ops")
  device.compute_speedup       the workload's forward+backward (--model, else branchy_cnn) in
                               fp32 / its time under torch.autocast in bf16 and in fp16, as the
                               executor runs a 16-bit precision (compute_speedup; the planner
                               divides a float32 graph's node times by it: precision_cost.h)
  device.*, type, collectives  as the probe (python/hybridplan/measure/probe.py); "cpu" and Gloo
                               on CPU

Each time is a median over repeats, the slowest rank's, taken with one intra-op thread per rank
and under the executor's allocator policy from the first measurement on (freed memory kept in
the process, profiler.block_timing.retain_freed_memory), as the executor's jobs run here. The
graph (--graph) sizes the messages: up to its gradient bytes (all-reduce) and its largest edge
(p2p), never below 16 MiB so that transfer time dominates latency. Gloo on CPU, NCCL on CUDA; every collective times out after `timeout_s`.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import statistics
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

from .. import models
from ..autograd.recompute import FULL, SELECTIVE, recompute
from ..convergence.tradeoff import OPTIMIZERS
from ..executor import apply
from ..factories import load_factory
from ..hand_plans import hand_plan
from ..planner import Cluster, Graph, evaluate
from ..profiler import profile_dict
from ..profiler.block_timing import backward_roots, retain_freed_memory
from . import probe as _probe
from .fitting import fit_line, fit_through_origin, fit_two_through_origin
from .timing import max_over_ranks, median_slowest, min_over_ranks, timed_samples

# torch.distributed.tensor and FSDP are imported inside the measurements that use them: they
# take seconds to import, which validate (it reads host_speed from here) would pay for nothing.

__all__ = ["calibrate", "host_speed"]

kMinLargestBytes = 16 << 20
kMaxLargestBytes = 256 << 20
kMicrobatchCounts = (1, 2, 4, 8, 16, 32)
# The model's own pipeline runs (GPipe and 1F1B): counts `hybridplan validate`'s plan spread does
# not pick by default (it takes each schedule's fewest and most), so validation predicts unseen
# runs.
# The optimizer the model's own runs train with: the default Job's (csrc/planner/documents/job.h), which
# the fits price them with (evaluate() without a job), so its state and step are the predicted ones.
kJobOptimizer = "sgd"
kModelMicrobatchCounts = (2, 8, 16)
kSchedules = ("gpipe", "1f1b")
# Fitted on the model's own runs only, at 2 stages per rank (docs/schedules.md).
kMultiStageSchedules = ("interleaved-1f1b", "interleaved-zb", "zbv")


def _sizes_up_to(largest: int) -> List[int]:
    sizes, n = [], 4 << 10
    while n < largest:
        sizes.append(n)
        n *= 4
    return sizes + [largest]


def message_sizes(graph: Optional[dict]) -> Tuple[List[int], List[int]]:
    """(all-reduce sizes, p2p sizes): 4 KiB, 16 KiB, ... up to the graph's gradient bytes and its
    largest edge, each clamped to 16..256 MiB."""
    grads = sum(n["param_bytes"] for n in graph["nodes"]) if graph else 0
    edge = max((e.get("bytes", 0) for e in graph["edges"]), default=0) if graph else 0
    clamp = lambda b: int(min(kMaxLargestBytes, max(kMinLargestBytes, b)))  # noqa: E731
    return _sizes_up_to(clamp(grads)), _sizes_up_to(clamp(edge))


# ---- links ------------------------------------------------------------------------------------

def _time_p2p(nbytes: int, rank: int, device, warmup: int, repeats: int) -> float:
    """One-way seconds of `nbytes` between ranks 0 and 1 with batch_isend_irecv (half a round
    trip), the slowest rank's median."""
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def round_trip():
        if rank in (0, 1):
            peer = 1 - rank
            first, second = (dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, buf, peer))
            for op in ((first, second) if rank == 0 else (second, first)):
                for work in dist.batch_isend_irecv([op]):
                    work.wait()
    samples = timed_samples(round_trip, device, warmup, repeats, barrier=True)
    return median_slowest([s / 2 for s in samples], device)


# ---- the executor's fixed costs ---------------------------------------------------------------

class _Tiny(nn.Module):
    """Two small Linear layers: an executor workload whose compute is negligible."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.first = nn.Linear(width, width)
        self.second = nn.Linear(width, width)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def _tiny_data(batch: int, width: int = 8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def _mse(output, target):
    return torch.nn.functional.mse_loss(output, target)


def _step_times_s(plan: dict, batch: int, device, warmup: int, repeats: int,
                  timeout_s: float) -> float:
    """Median step time (slowest rank) of the tiny model trained under `plan`."""
    torch.manual_seed(0)
    module = _Tiny()
    inputs, target = _tiny_data(batch)
    example = inputs[:plan["per_replica_batch"]] if plan["mode"] == "pipeline" else None
    hp = apply(plan, module, loss_fn=_mse, timeout_s=timeout_s, example_inputs=example,
               optimizer=lambda p: torch.optim.SGD(p, lr=0.01))
    samples = timed_samples(lambda: hp.step(*hp.shard(inputs, target)), device, warmup, repeats,
                            barrier=True)
    return median_slowest(samples, device)


def _tiny_compute_s(warmup: int, repeats: int) -> float:
    """This process's forward + backward + optimizer step of the tiny model, no executor."""
    module = _Tiny()
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    inputs, target = _tiny_data(2)

    def step():
        opt.zero_grad(set_to_none=True)
        _mse(module(inputs), target).backward()
        opt.step()
    return statistics.median(timed_samples(step, torch.device("cpu"), warmup, repeats))


def _hand_plan(mode: str, dp: int, mp: int, schedule: str = "none", microbatches: int = 1,
               per_replica_batch: int = 2) -> dict:
    return hand_plan(_Tiny(), mode=mode, dp=dp, mp=mp, schedule=schedule,
                     num_microbatches=microbatches, per_replica_batch=per_replica_batch,
                     name="calibration_tiny")


def _tiny_graph() -> dict:
    """The tiny model's graph (the cost model's view of the calibration workload)."""
    return profile_dict(_Tiny(), _tiny_data(1)[:1], verbose=False, warmup=3, repeats=15,
                        batch_sizes=())


def _graph_pipeline_plan(graph: dict, module: nn.Module, schedule: str, microbatches: int,
                         batch: int, cuts: Sequence[int]) -> dict:
    """A pipeline plan on 2 ranks (hand_plan's) over the profiled `graph` of `module`: stage k
    holds the nodes from position cuts[k-1] of the graph's node order (len(cuts) + 1 stages: 2
    for GPipe and 1F1B, 4 for the schedules with two stages per rank)."""
    stages = len(cuts) + 1
    plan = hand_plan(module, mode="pipeline", dp=1, mp=2, schedule=schedule,
                     num_microbatches=microbatches, per_replica_batch=batch,
                     name=graph.get("name", ""), virtual_stages=stages // 2)
    plan["graph"]["sha256"] = Graph.from_dict(graph, "calibration graph").sha256
    plan["assignment"] = [{"node": n["id"], "name": n["name"],
                           "device": sum(p >= c for c in cuts)}
                          for p, n in enumerate(graph["nodes"])]
    return plan


def _tiny_pipeline_plan(graph: dict, run: dict) -> dict:
    """The tiny model's 1x2 pipeline plan of `run`, over its profiled graph (one node a stage)."""
    return _graph_pipeline_plan(graph, _Tiny(), run["schedule"], run["num_microbatches"],
                                run["per_replica_batch"], cuts=[(len(graph["nodes"]) + 1) // 2])


def _even_cuts(graph: dict, stages: int) -> Optional[List[int]]:
    """The stages - 1 node positions nearest k/stages of the graph's node order where a pipeline
    stage may begin (nodes[].cut_before), increasing; None when there are too few. ValueError
    when the graph cannot be cut at all."""
    nodes = graph["nodes"]
    split = graph.get("pipeline_split", {})
    allowed = [p for p in range(1, len(nodes)) if nodes[p].get("cut_before", True)]
    if split.get("supported") is False or not allowed:
        raise ValueError(f"calibrate: graph {graph.get('name')!r} cannot be cut into pipeline "
                         f"stages ({split.get('reason', 'no node may begin a stage')})")
    cuts: List[int] = []
    for k in range(1, stages):
        left = [p for p in allowed if p > (cuts[-1] if cuts else 0)]
        if len(left) < stages - k:
            return None
        cuts.append(min(left[:len(left) - (stages - 1 - k)],
                        key=lambda p: abs(stages * p - k * len(nodes))))
    return cuts


def _fit_action_s(graph: dict, cluster: dict, runs: List[dict]) -> dict:
    """The schedule's cost per action, a fixed part and a part per sample of the micro-batch
    (Runtime::action_cost_s), by least squares on the runs' relative residuals: measured = base
    + slope * (action_s + action_sample_s * b/M), where base and slope are evaluate()'s step
    time of each run's plan (run["plan"], over `graph`) at no action cost and its change per
    second of it. The per-sample part needs runs at three micro-batch sizes at least (else 0):
    two parameters through two points fit exactly and say nothing of their own error, and on
    this host's noise such a fit at 8 and 16 micro-batches priced 2 micro-batches 50-65 % slow.
    Measured on transformer_lm's own 1x2 pipelines (batch 32, 2 CPU ranks), GPipe's cost per
    action was 2.0, 2.5, 3.4 and 4.1 ms at 2, 4, 8 and 16 samples a micro-batch: a fixed cost
    fitted at 2-4 samples priced the 16-sample pipelines 17-22 % fast."""
    g = Graph.from_dict(graph, "calibration graph")

    def predicted(run, action_s):
        c = json.loads(json.dumps(cluster))
        c["runtime"]["action_s"] = action_s
        for key in ("schedule_action_s", "action_sample_s", "schedule_action_sample_s"):
            c["runtime"].pop(key, None)
        return evaluate(g, Cluster.from_dict(c, "calibration cluster"), run["plan"])["step_s"]

    for run in runs:
        run["base_s"] = predicted(run, 0.0)
        run["slope"] = (predicted(run, 1e-3) - run["base_s"]) / 1e-3
        run["microbatch_samples"] = run["per_replica_batch"] / run["num_microbatches"]
    weights = [1.0 / r["step_s"] ** 2 for r in runs]
    excess = [r["step_s"] - r["base_s"] for r in runs]
    if len({r["microbatch_samples"] for r in runs}) >= 3:
        action_s, sample_s = fit_two_through_origin(
            [r["slope"] for r in runs], [r["slope"] * r["microbatch_samples"] for r in runs],
            excess, weights)
    else:
        action_s, sample_s = max(0.0, fit_through_origin([r["slope"] for r in runs], excess)), 0.0
    for run in runs:
        run["fitted_s"] = run["base_s"] + run["slope"] * (action_s
                                                          + sample_s * run["microbatch_samples"])
    errors = [abs(r["fitted_s"] / r["step_s"] - 1) for r in runs]
    return {"action_s": action_s, "action_sample_s": sample_s,
            "runs": [{k: v for k, v in r.items() if k != "plan"} for r in runs],
            "median_abs_error": statistics.median(errors), "worst_abs_error": max(errors)}


def _median_runs(runs: List[dict]) -> List[dict]:
    """One run per (schedule, micro-batches): the median step of its rounds ("round_step_s"
    lists them), as validate keeps each plan's median launch: one round on a shared CPU can run
    slow throughout, and a least-squares fit over every round follows it."""
    grouped: Dict[Tuple[str, int], List[dict]] = {}
    for run in runs:
        grouped.setdefault((run["schedule"], run["num_microbatches"]), []).append(run)
    out = []
    for group in grouped.values():
        steps = [r["step_s"] for r in group]
        out.append(dict(group[0], step_s=statistics.median(steps), round_step_s=steps))
    return out


def _fit_action_s_by_schedule(graph: dict, cluster: dict, runs: List[dict]) -> Dict[str, dict]:
    """_fit_action_s over each schedule's own runs, each configuration's rounds as their median
    (_median_runs): {"gpipe": fit, "1f1b": fit, ...} (the schedules that ran)."""
    runs = _median_runs(runs)
    return {schedule: _fit_action_s(graph, cluster, [r for r in runs if r["schedule"] == schedule])
            for schedule in kSchedules + kMultiStageSchedules
            if any(r["schedule"] == schedule for r in runs)}


def _model_pipeline_runs(model_spec: str, graph: dict, batch: int, device, warmup: int,
                         repeats: int, timeout_s: float, rounds: int = 3) -> List[dict]:
    """The model's own 1x2 GPipe and 1F1B pipelines under hybridplan.apply at
    kModelMicrobatchCounts micro-batches of `batch` (those dividing it), and the multi-stage
    schedules (2 ranks x 2 stages) at the same counts when the graph has 3 places to cut,
    `rounds` times in turn (GPipe 2, 8, 16, 1F1B 2, 8, 16, ..., again: on a shared CPU one run
    can be slower throughout, from how the ranks' threads happen to be scheduled): the median step
    (slowest rank) of each run."""
    counts = [m for m in kModelMicrobatchCounts if batch % m == 0]
    cuts = {2: _even_cuts(graph, 2), 4: _even_cuts(graph, 4)}
    shapes = [(s, m) for s in kSchedules for m in counts]
    if cuts[4] is not None and counts:
        shapes += [(s, m) for s in kMultiStageSchedules for m in counts]
    runs = []
    for _, (schedule, m) in itertools.product(range(rounds), shapes):
        plan, samples = timed_model_pipeline(
            model_spec, graph, schedule, m, batch, cuts[4 if schedule in kMultiStageSchedules else 2],
            device, warmup, max(repeats, 20), timeout_s)
        runs.append({"schedule": schedule, "num_microbatches": m, "per_replica_batch": batch,
                     "step_s": median_slowest(samples, device), "plan": plan})
    return runs


def timed_model_pipeline(model_spec: str, graph: dict, schedule: str, microbatches: int,
                         batch: int, cuts, device, warmup: int, repeats: int, timeout_s: float,
                         barrier: bool = True, applied: Optional[Callable[[], None]] = None
                         ) -> Tuple[dict, List[float]]:
    """(plan, this rank's step seconds): the model built fresh (seed 0) and pipelined at `cuts`
    under hybridplan.apply, trained with the default job's optimizer and timed over `repeats`
    steps after `warmup` (`barrier`: every rank starts each step together), then closed. One of
    calibrate's model pipeline runs; bench/pipeline_step_spread.py times the same runs (its
    `applied()` called once the plan is applied, before the first step: the bench places the
    process's threads there, every one of them started by then)."""
    torch.manual_seed(0)
    module = load_factory(model_spec)()
    plan = _graph_pipeline_plan(graph, module, schedule, microbatches, batch, cuts)
    inputs = module.example_inputs(batch)
    target = module.example_target(batch)
    hp = apply(plan, module, timeout_s=timeout_s, example_inputs=inputs,
               optimizer=lambda p: OPTIMIZERS[kJobOptimizer](p, 0.01))
    if applied is not None:
        applied()
    samples = timed_samples(lambda: hp.step(*hp.shard(inputs, target)), device, warmup,
                            repeats, barrier=barrier)
    hp.close()
    return plan, samples


# ---- shared cores -----------------------------------------------------------------------------

# The shared-core workload without --model.
kDefaultWorkload = "hybridplan.models:branchy_cnn"


def _workload(model_spec: Optional[str], batch: int) -> Tuple[nn.Module, Callable[[], None]]:
    """A forward+backward step of the user's model (MODULE:FACTORY) or the built-in
    branchy_cnn, at `batch`."""
    module = load_factory(model_spec or kDefaultWorkload)()
    inputs = tuple(module.example_inputs(batch)) if hasattr(module, "example_inputs") else None
    if inputs is None:
        raise ValueError(f"calibrate: {type(module).__name__} has no example_inputs(batch); "
                         "give a model with example inputs for the shared-core measurement")

    # the step the profile measured: the model's own loss where it has one (models.loss_and_target)
    loss_fn, target = models.loss_and_target(module, batch)
    loss = None if loss_fn is None else (lambda output: loss_fn(output, target))

    def step():
        module.zero_grad(set_to_none=True)
        roots = backward_roots(module(*inputs), loss)
        torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])

    return module, step


def compute_speedup(step: Callable[[], None], device, warmup: int, repeats: int
                    ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Cluster device.compute_speedup: how many times faster `step` (the workload's forward and
    backward) runs under torch.autocast in bf16 and in fp16 than in fp32 on this device, as the
    executor runs a plan in that precision (executor/precision.py); the slowest rank's medians.
    Returns ({"bf16": ratio, "fp16": ratio}, the median seconds by precision). A dtype autocast
    does not run on this device is left out."""
    seconds: Dict[str, float] = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        context = (contextlib.nullcontext() if dtype is None
                   else torch.autocast(device_type=device.type, dtype=dtype))

        def run():
            with context:
                step()
        try:
            samples = timed_samples(run, device, warmup, repeats)
        except RuntimeError:  # autocast has no such dtype on this device type
            continue
        seconds[name] = (median_slowest(samples, device) if dist.is_initialized()
                         else statistics.median(samples))  # one process (bench_precision.py)
    return ({k: seconds["fp32"] / v for k, v in seconds.items() if k != "fp32" and v > 0},
            seconds)


def _graph_step_s(graph: Optional[dict], module: Optional[nn.Module], batch: int) -> float:
    """The graph's forward+backward sum at its profiled batch, when the graph is `module`'s
    (the --model's) profile at --batch (same batch, same parameter bytes); else 0 (not
    comparable)."""
    if not graph or module is None or graph.get("profiled", {}).get("batch_size") != batch:
        return 0.0
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    graph_param_bytes = sum(n.get("param_bytes", 0) for n in graph["nodes"])
    if param_bytes != graph_param_bytes:
        return 0.0
    return sum(n["forward_s"] + n["backward_s"] for n in graph["nodes"])


def _shared_host_slowdown(step: Callable[[], None], rank: int, world: int, device, rounds: int,
                          steps: int) -> dict:
    """Interleaved rounds: each rank alone (the others wait in a barrier), then all at once.
    A synchronous job waits for its slowest rank, so per round the ratio is the slowest rank's
    time all at once over the ranks' median time alone; factor = median over rounds (at least 1).
    (A per-rank ratio understates it: measured here, one rank slowed by 8 % and the other not at
    all, round after round.)"""
    # Not timing.timed_samples: ranks take turns, and each turn reads its CPU time beside the wall.
    step()  # warm up
    alone_s, together_s, cpu_share = [], [], []
    for _ in range(rounds):
        mine = None
        for turn in range(world):
            dist.barrier()
            if turn == rank:
                start, start_cpu = time.perf_counter(), time.thread_time()
                for _ in range(steps):
                    step()
                mine = (time.perf_counter() - start) / steps
                cpu_share.append((time.thread_time() - start_cpu) / (mine * steps))
            dist.barrier()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        both = (time.perf_counter() - start) / steps
        dist.barrier()
        alone_s.append(mine)
        together_s.append(both)
    gathered = [None] * world
    dist.all_gather_object(gathered, (alone_s, together_s, cpu_share))
    slowest_together = [max(g[1][i] for g in gathered) for i in range(rounds)]
    median_alone = [statistics.median(g[0][i] for g in gathered) for i in range(rounds)]
    ratios = [t / a for t, a in zip(slowest_together, median_alone)]
    return {"factor": max(1.0, statistics.median(ratios)), "ratios": ratios,
            "alone_s": [g[0] for g in gathered], "together_s": [g[1] for g in gathered],
            "slowest_together_s": slowest_together, "processes": world,
            "alone_cpu_share": statistics.median(x for g in gathered for x in g[2])}


# The shared-core measurement's bursts, spread over the calibration (before the links, after the
# executor's steps, at the end). One burst is a few seconds, and on this shared 2-core host that
# is a snapshot: one calibration's burst measured every rank together at 1.41x alone (four of
# five rounds at 33-34 ms against 23-25 alone), its launches minutes later ran as if 1.1x, and
# every two-process plan came out 35 % slow; the quiet-hours figure is 1.16-1.19.
kSharedHostBursts = 3


def _median_alone_s(shared_host: dict) -> float:
    """The workload's time alone in a shared-core measurement: the median over every rank's
    rounds ("alone_s")."""
    return statistics.median(t for per_rank in shared_host["alone_s"] for t in per_rank)


def _merge_bursts(bursts: List[dict]) -> dict:
    """One shared-host measurement from _shared_host_slowdown bursts taken apart in time: every
    round of every burst (ratios, each rank's alone_s, together_s, slowest_together_s, in
    order), factor = the median over all rounds (at least 1), alone_cpu_share = the median of
    the bursts' shares; "burst_factors" keeps each burst's own."""
    ratios = [r for b in bursts for r in b["ratios"]]
    world = bursts[0]["processes"]
    return {"factor": max(1.0, statistics.median(ratios)), "ratios": ratios,
            "alone_s": [[t for b in bursts for t in b["alone_s"][k]] for k in range(world)],
            "together_s": [[t for b in bursts for t in b["together_s"][k]]
                           for k in range(world)],
            "slowest_together_s": [t for b in bursts for t in b["slowest_together_s"]],
            "processes": world,
            "alone_cpu_share": statistics.median(b["alone_cpu_share"] for b in bursts),
            "burst_factors": [b["factor"] for b in bursts],
            # each burst's workload alone (median over ranks and rounds): the host's own speed
            # at the calibration's start, middle and end (a record, not a warning: one thread's
            # step wanders 24-38 ms within seconds here, so bursts 15 % apart are the rule)
            "burst_alone_s": [_median_alone_s(b) for b in bursts]}


# A rank computing alone (the others wait in a barrier, one intra-op thread) has a core to itself
# on a quiet machine: two runs of _shared_host_slowdown on this 2-core machine measured 0.997
# and 0.998 of its wall time on the CPU, and 0.72 while two busy-loop processes shared the
# cores. Below this share another process took the core part of the time.
kBusyCpuShare = 0.9


# validate's host-speed check: the calibration's workload timed again, one thread, alone, as
# calibrate's ranks timed it (their median over rounds), and a difference beyond this fraction
# said (the same plan measured 185.7 ms in one validation and 91.5 ms in the next on this host,
# and a calibration taken in a slow spell predicted every plan 25-45 % slow).
kHostSpeedTolerance = 0.15


# validate's host-speed check: rounds of steps, each round's time per step (host_speed).
kHostCheckRounds = 5
kHostCheckSteps = 3


def _one_thread_times_s(step: Callable[[], None], rounds: int, steps: int) -> List[float]:
    """`rounds` times `steps` steps after one warm-up step, with one intra-op thread, each
    round's seconds per step: validate's host-speed check, and calibrate's own reading of it
    (the same loop, so that the two compare like with like; host_speed)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step()
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times.append((time.perf_counter() - start) / steps)
    finally:
        torch.set_num_threads(threads)
    return times


def host_speed(shared_host: dict, rounds: int = kHostCheckRounds,
               steps: int = kHostCheckSteps) -> Optional[dict]:
    """This host's speed now against when it was calibrated: calibrate's shared-core workload
    (`shared_host["workload"]`: the model and batch) timed in this process (_one_thread_times_s)
    under the executor's allocator policy (retain_freed_memory: process-wide, it stays), against
    calibrate's rank 0 timing it the same way in each shared-core burst, the other ranks waiting
    ("check_alone_s"; clusters calibrated before it: the ranks' times alone, "alone_s", which
    calibrate takes in turns, each rank right after the other's, and which read 10-26 % slower
    than this check in every run of 2026-12-04 21:10-22:30 UTC while the plans' signed errors
    fell on both sides). {"calibrated_alone_s", "now_alone_s", "ratio" (now / calibrated),
    "warning" (a sentence, or None within kHostSpeedTolerance)}; None for a cluster that does
    not name its workload (calibrated before it did, or a preset)."""
    workload = shared_host.get("workload")
    if not workload or not (shared_host.get("check_alone_s") or shared_host.get("alone_s")):
        return None
    retain_freed_memory()  # the allocator policy calibrate's ranks measured under (see _measure)
    _, step = _workload(workload["model"], int(workload["batch"]))
    times = _one_thread_times_s(step, rounds, steps)
    calibrated = (statistics.median(shared_host["check_alone_s"])
                  if shared_host.get("check_alone_s") else _median_alone_s(shared_host))
    now = statistics.median(times)
    ratio = now / calibrated
    warning = None
    if abs(ratio - 1) > kHostSpeedTolerance:
        warning = (f"this host ran the calibration's workload ({workload['model']} at batch "
                   f"{workload['batch']}, one thread) {abs(ratio - 1):.0%} "
                   f"{'slower' if ratio > 1 else 'faster'} than when calibrated ({now * 1e3:.1f} "
                   f"ms now, {calibrated * 1e3:.1f} ms then): every prediction carries that "
                   "difference. Calibrate again when the host is as it will be used.")
    return {"calibrated_alone_s": calibrated, "now_alone_s": now, "now_samples_s": times,
            "ratio": ratio, "warning": warning}


def busy_host_warning(shared_host: dict) -> Optional[str]:
    """A warning when the ranks, each computing alone, had less than kBusyCpuShare of a core:
    another job shares the cores, and every fitted cost then includes its interference (a
    calibration taken so predicted a transformer's pipelines 40-50 % slow). None otherwise."""
    share = shared_host.get("alone_cpu_share")
    if share is None or share >= kBusyCpuShare:
        return None
    return (f"calibrate: the CPU is busy: each rank computing alone ran {share:.0%} of the "
            f"time (median; a quiet machine gives {kBusyCpuShare:.0%} or more), so another "
            "process shares the cores and the costs fitted here include its interference. "
            "Calibrate again on a quiet machine.")


# ---- memory bandwidth -------------------------------------------------------------------------

def _memory_bandwidth(device, repeats: int = 7) -> dict:
    """5 x parameter bytes / the time of an SGD-momentum step (optimizer_cost.h)."""
    p = nn.Parameter(torch.zeros(32 << 20, device=device))
    p.grad = torch.ones_like(p)
    opt = torch.optim.SGD([p], lr=0.01, momentum=0.9)
    seconds = statistics.median(timed_samples(opt.step, device, 1, repeats))
    nbytes = p.numel() * p.element_size()
    return {"bandwidth_bytes_per_s": 5 * nbytes / seconds, "step_s": seconds,
            "param_bytes": nbytes}


# The parameter counts of the per-tensor fit: small tensors (64 elements), so that the loop's
# fixed cost per tensor, not the bytes, decides (branchy_cnn has 72 tensors, GPT-2 small 148).
kOptimizerTensorCounts = (16, 64, 256)


def _optimizer_tensor_times(device, warmup: int, repeats: int, world: int = 0,
                            optimizer: str = kJobOptimizer) -> List[Tuple[int, float]]:
    """(tensors, median seconds of one step of the Job optimizer `optimizer` (OPTIMIZERS, as the
    executor's jobs build it) over that many 64-element parameters), with torch's default
    implementation for the device. `world` > 0: each parameter a DTensor sharded over the
    `world` ranks (64 elements a rank), as fully_shard leaves them."""
    def parameter():
        if not world:
            return nn.Parameter(torch.zeros(64, device=device))
        return nn.Parameter(distribute_tensor(torch.zeros(64 * world, device=device), mesh,
                                              [Shard(0)]))
    if world:
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh(device.type, (world,))
    out = []
    for count in kOptimizerTensorCounts:
        params = [parameter() for _ in range(count)]
        for p in params:
            p.grad = torch.ones_like(p)
        opt = OPTIMIZERS[optimizer](params, 0.01)
        samples = timed_samples(opt.step, device, warmup, repeats)
        out.append((count, median_slowest(samples, device)))
    return out


# Elementwise ops in the chains timed for runtime.selective_op_s.
kSelectiveChainOps = (16, 64, 256)


class _OpChain(nn.Module):
    """A Linear and `n` cheap elementwise ops on a tiny tensor: its time is the ops' dispatch."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.linear = n, nn.Linear(8, 8)

    def forward(self, x):
        x = self.linear(x)
        for _ in range(self.n):
            x = x * 1.001
        return x


def _count_ops(module: nn.Module, x: torch.Tensor) -> int:
    """The aten ops `module`'s forward dispatches (what a dispatch mode sees: the profiler's
    block_timing.selective_recompute counts a node's the same way)."""
    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))
    with Count():
        module(x)
    return Count.ops


def _selective_op_s(device, warmup: int, repeats: int, fits: Dict[str, dict]) -> float:
    """runtime.selective_op_s: what torch's selective activation checkpointing adds per aten op
    beyond running the op again (its dispatch mode sees every op of the forward, records or
    caches its output, and sees it again in the recompute): the slope over kSelectiveChainOps
    of (selective - full recompute) forward+backward time of an _OpChain, under the executor's
    own recompute() (full recompute runs the same ops again without the mode; the chain's ops
    are the cheap kind selective recompute also runs again). Fit "selective_ops"; 0 where
    unresolved (no measurable cost)."""
    points = []
    for n in kSelectiveChainOps:
        x = torch.randn(4, 8, device=device)
        times = {}
        for kind in (FULL, SELECTIVE):
            chain = _OpChain(n).to(device)
            recompute(chain, kind)

            def step(chain=chain):
                chain(x).sum().backward()
            times[kind] = median_slowest(timed_samples(step, device, warmup, repeats), device)
        points.append((_count_ops(_OpChain(n).to(device), x), times[SELECTIVE] - times[FULL]))
    fit = fit_line([n for n, _ in points], [t for _, t in points], relative=False)
    fits["selective_ops"] = fit.to_dict()
    return max(0.0, fit.beta) if fit.resolved else 0.0


# The sharded units' parameter bytes (one square Linear without bias each) and their count.
kShardUnitBytes = (4 << 10, 1 << 20, 4 << 20)
kShardUnits = 6


def _sharded_unit_times(device, world: int, warmup: int, repeats: int
                        ) -> Dict[str, List[Tuple[int, float]]]:
    """Per unit size: (bytes, seconds) of FSDP2's gather and reduce-scatter per unit (see the
    module doc), the slowest rank's medians; every rank runs the same models in turn."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    gathers, scatters = [], []
    for nbytes in kShardUnitBytes:
        width = int(round((nbytes / 4) ** 0.5))
        x = torch.randn(2, width, device=device)
        medians = {}
        for kind in ("none", "zero2", "zero3"):
            torch.manual_seed(0)
            model = nn.Sequential(*[nn.Linear(width, width, bias=False)
                                    for _ in range(kShardUnits)]).to(device)
            if kind != "none":
                for unit in model:
                    fully_shard(unit, mesh=mesh, reshard_after_forward=kind == "zero3")
                fully_shard(model, mesh=mesh, reshard_after_forward=kind == "zero3")

            def step():
                model(x).sum().backward()
            samples = timed_samples(step, device, warmup, repeats, barrier=True)
            medians[kind] = median_slowest(samples, device)
        unit_bytes = 4 * width * width
        gather = max(0.0, medians["zero3"] - medians["zero2"]) / kShardUnits
        scatter = max(0.0, (medians["zero2"] - medians["none"]) / kShardUnits - gather)
        gathers.append((unit_bytes, gather))
        scatters.append((unit_bytes, scatter))
    return {"allgather": gathers, "reduce_scatter": scatters}


def shard_collective_link(points: List[Tuple[int, float]], p: int, fits: Dict[str, dict],
                          name: str) -> Optional[Dict[str, float]]:
    """Link alpha/bandwidth that make (p-1) alpha + (p-1)/p bytes / bw reproduce the measured
    per-unit times of p ranks (allreduce_cost.h ring_shard_collective); None when no unit took
    measurably longer sharded than not (every per-unit time 0: the differences of medians were
    within noise, as with few repeats on a busy host), which leaves no bandwidth to derive: the
    Cluster then prices the collective on its all-reduce link."""
    fit = fit_line([b for b, _ in points], [t for _, t in points])
    fits[name] = fit.to_dict()
    if fit.beta <= 0:
        fits[name]["note"] = ("no unit took measurably longer sharded than not: not calibrated "
                              "(the all-reduce link prices it)")
        return None
    return {"bandwidth_bytes_per_s": ((p - 1) / p) / fit.beta, "latency_s": fit.alpha / (p - 1)}


# The model's own data-parallel step unsharded, as zero2 and as zero3 (with --graph and --model),
# at these fractions of --batch per replica: a unit's collectives cost the same at every batch,
# but the ranks meeting at every unit cost a share of the compute (runtime.sharded_compute_slowdown),
# so two batches on either side of --batch separate the two, and the validated plans, which run
# at --batch, are predicted at a batch the fit never saw.
kModelShardBatchFractions = (0.25, 2.0)
kShardKinds = ("none", "zero2", "zero3")


def model_shard_batches(batch: int) -> List[int]:
    """The per-replica batches _model_shard_runs runs at for --batch `batch`."""
    return sorted({max(1, int(batch * f)) for f in kModelShardBatchFractions})


def _model_shard_runs(model_spec: str, graph: dict, per_replica_batches: Sequence[int], device,
                      world: int, warmup: int, repeats: int, timeout_s: float,
                      rounds: int = 2) -> List[dict]:
    """The model's dp=world placement plan (every node on the replica's one device) under
    hybridplan.apply, unsharded, zero2 and zero3 in turn at each per-replica batch, `rounds`
    times (the batches and kinds interleaved): the median step (slowest rank) of each run."""
    sha256 = Graph.from_dict(graph, "calibration graph").sha256
    unsharded = {}  # per-replica batch -> the dp plan, every node on the replica's device
    for per_replica in per_replica_batches:
        plan = hand_plan(load_factory(model_spec)(), mode="placement", dp=world, mp=1,
                         per_replica_batch=per_replica, name=graph.get("name", ""))
        plan["graph"]["sha256"] = sha256
        plan["assignment"] = [{"node": n["id"], "name": n["name"], "device": 0}
                              for n in graph["nodes"]]
        unsharded[per_replica] = plan
    runs = []
    for _, per_replica, kind in itertools.product(range(rounds), per_replica_batches,
                                                  kShardKinds):
        torch.manual_seed(0)
        module = load_factory(model_spec)()
        plan = (dict(unsharded[per_replica], sharding=kind) if kind != "none"
                else unsharded[per_replica])
        inputs = module.example_inputs(world * per_replica)
        target = module.example_target(world * per_replica)
        hp = apply(plan, module, timeout_s=timeout_s,
                   optimizer=lambda p: OPTIMIZERS[kJobOptimizer](p, 0.01))
        samples = timed_samples(lambda: hp.step(*hp.shard(inputs, target)), device, warmup,
                                max(repeats, 15), barrier=True)
        hp.close()
        runs.append({"sharding": kind, "per_replica_batch": per_replica,
                     "step_s": median_slowest(samples, device), "plan": plan})
    return runs


def _nonnegative_least_squares(columns: List[List[float]], ts: List[float]) -> List[float]:
    """x >= 0 minimising |sum_j x_j columns[j] - ts|: the unconstrained solution where it is
    non-negative, else the best of the fits with some coefficients held at zero (few columns:
    every subset is tried)."""
    import numpy as np  # optional (the test extra), and only this fit needs it

    a, t = np.array(columns, dtype=float).T, np.array(ts, dtype=float)
    best, best_residual = [0.0] * len(columns), float(np.sum(t * t))
    for subset in itertools.chain.from_iterable(
            itertools.combinations(range(len(columns)), k) for k in range(1, len(columns) + 1)):
        x, *_ = np.linalg.lstsq(a[:, list(subset)], t, rcond=None)
        if (x < 0).any():
            continue
        residual = float(np.sum((a[:, list(subset)] @ x - t) ** 2))
        if residual < best_residual - 1e-18:
            best, best_residual = [0.0] * len(columns), residual
            for j, v in zip(subset, x):
                best[j] = float(v)
    return best


def _fit_shard_latencies(graph: dict, cluster: dict, runs: List[dict]) -> dict:
    """intra_node (and inter_node) allgather / reduce_scatter latency_s and
    runtime.sharded_compute_slowdown from the model's own sharded runs (_model_shard_runs),
    the bandwidths kept (the synthetic units' fit, or the all-reduce link's where that found
    none), each parameter against the cost model's own prediction of the same plans (evaluate(),
    linear in each): zero3 - zero2 is one more gather per unit (the gather's latency; both plans
    pay the slowdown), then zero2 - unsharded is a gather and a reduce-scatter per unit in place
    of DDP's all-reduce, plus the slowdown's share of the compute: at two batches the
    reduce-scatter's latency (the same at both) and the slowdown (growing with the compute) are
    told apart (non-negative least squares; at one batch the slowdown stays 0). On this host a
    unit's collectives cost 1-3 ms however small the unit (two processes meeting on shared
    cores), and that latency moves with the host's state and with the units' structure (their
    tensors, hooks and copies), which six single-Linear units do not show: the model's own units
    are the measurement."""
    g = Graph.from_dict(graph, "calibration graph")
    batches = sorted({r["per_replica_batch"] for r in runs})
    measured = {b: {kind: statistics.median(r["step_s"] for r in runs
                                            if r["sharding"] == kind and r["per_replica_batch"] == b)
                    for kind in kShardKinds} for b in batches}
    plans = {b: {kind: next(r["plan"] for r in runs
                            if r["sharding"] == kind and r["per_replica_batch"] == b)
                 for kind in kShardKinds} for b in batches}
    links = {}
    for name in ("allgather", "reduce_scatter"):
        intra = cluster["intra_node"]
        link = intra.get(name) or {  # else the all-reduce link's (the link's own without one)
            "bandwidth_bytes_per_s": intra.get("allreduce", intra)["bandwidth_bytes_per_s"],
            "latency_s": 0.0}
        links[name] = dict(link)
    params = {"allgather": 0.0, "reduce_scatter": 0.0, "slowdown": 0.0}

    def predicted(b: int, kind: str, trial: dict) -> float:
        c = json.loads(json.dumps(cluster))
        for level in ("intra_node", "inter_node"):
            for name in links:
                c[level][name] = dict(links[name], latency_s=trial[name])
        c.setdefault("runtime", {})["sharded_compute_slowdown"] = trial["slowdown"]
        return evaluate(g, Cluster.from_dict(c, "calibration cluster"), plans[b][kind])["step_s"]

    def difference(b, high, low, trial):
        return predicted(b, high, trial) - predicted(b, low, trial)

    def slope(b, high, low, name):  # d difference / d params[name], the others as fitted so far
        step = 1e-3
        return (difference(b, high, low, dict(params, **{name: step}))
                - difference(b, high, low, dict(params, **{name: 0.0}))) / step

    fit = {"measured_step_s": measured[batches[0]], "per_replica_batch": batches[0],
           "per_replica_batches": batches,
           "measured_step_s_by_batch": {str(b): measured[b] for b in batches},
           "synthetic_latency_s": {n: links[n]["latency_s"] for n in links}}
    # the gather: zero3 - zero2 at every batch, through the cost model's base
    base = [difference(b, "zero3", "zero2", params) for b in batches]
    slopes = [slope(b, "zero3", "zero2", "allgather") for b in batches]
    gaps = [measured[b]["zero3"] - measured[b]["zero2"] for b in batches]
    if min(slopes) <= 0:
        fit["allgather"] = {"note": "the plans' predicted difference does not grow with the "
                                    "latency: not fitted"}
    else:
        params["allgather"] = max(0.0, fit_through_origin(
            slopes, [gap - b0 for gap, b0 in zip(gaps, base)]))
        fit["allgather"] = {"latency_s": params["allgather"], "base_s": base, "slope": slopes,
                            "measured_difference_s": gaps}
    # the reduce-scatter and the slowdown: zero2 - unsharded at every batch
    base = [difference(b, "zero2", "none", params) for b in batches]
    columns = [[slope(b, "zero2", "none", "reduce_scatter") for b in batches]]
    if len(batches) > 1:
        columns.append([slope(b, "zero2", "none", "slowdown") for b in batches])
    gaps = [measured[b]["zero2"] - measured[b]["none"] for b in batches]
    if min(columns[0]) <= 0:
        fit["reduce_scatter"] = {"note": "the plans' predicted difference does not grow with "
                                         "the latency: not fitted"}
        columns = columns[1:]
    solved = _nonnegative_least_squares(columns, [gap - b0 for gap, b0 in zip(gaps, base)])
    names = (["reduce_scatter"] if "reduce_scatter" not in fit else []) + \
        (["slowdown"] if len(batches) > 1 else [])
    params.update(zip(names, solved))
    if "reduce_scatter" not in fit:
        fit["reduce_scatter"] = {"latency_s": params["reduce_scatter"], "base_s": base,
                                 "slope": columns[0], "measured_difference_s": gaps}
    fit["sharded_compute_slowdown"] = (
        params["slowdown"] if len(batches) > 1
        else {"note": "one batch: the slowdown cannot be told from the latency; 0"})
    for name in links:
        links[name]["latency_s"] = params[name]
    for level in ("intra_node", "inter_node"):
        cluster[level].update(json.loads(json.dumps(links)))
    cluster.setdefault("runtime", {})["sharded_compute_slowdown"] = params["slowdown"]
    fit["predicted_step_s_by_batch"] = {str(b): {kind: predicted(b, kind, params)
                                                 for kind in kShardKinds} for b in batches}
    fit["predicted_step_s"] = fit["predicted_step_s_by_batch"][str(batches[0])]
    return fit


# Tensor parallelism's collectives as DTensor runs them: kTpPairs column-then-row Linear pairs
# (width kTpWidth -> 4 kTpWidth -> kTpWidth), at these rows per step (activation bytes 4 * rows *
# kTpWidth: 64 KiB .. 1 MiB)
kTpWidth = 128
kTpRows = (128, 512, 2048)
kTpPairs = 6


def _tp_pair_times(device, world: int, warmup: int, repeats: int) -> List[Tuple[int, float]]:
    """Per activation size: (bytes, seconds) of one tensor-parallel collective as DTensor runs it
    (the slowest rank's medians): a model of kTpPairs Linear pairs split by parallelize_module
    (ColwiseParallel, RowwiseParallel, as the executor splits a region) against the same model
    with each rank's narrower Linears and no DTensor, both on every rank at once; each pair
    all-reduces its row-wise output in forward and its column-wise input gradient in backward,
    so one collective = (split - narrow) / (2 kTpPairs): the collective, its copies and DTensor's
    dispatch of the pair's ops."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh(device.type, (world,))

    def pairs(hidden: int) -> nn.Module:
        torch.manual_seed(0)
        layers: List[nn.Module] = []
        for _ in range(kTpPairs):
            layers += [nn.Linear(kTpWidth, hidden), nn.GELU(), nn.Linear(hidden, kTpWidth)]
        return nn.Sequential(*layers).to(device)

    split = pairs(4 * kTpWidth)
    parallelize_module(split, mesh, {
        str(i): ColwiseParallel() if i % 3 == 0 else RowwiseParallel()
        for i in range(3 * kTpPairs) if i % 3 != 1})
    narrow = pairs(4 * kTpWidth // world)
    points = []
    for rows in kTpRows:
        x = torch.randn(rows, kTpWidth, device=device, requires_grad=True)
        medians = {}
        for kind, model in (("narrow", narrow), ("split", split)):
            def step(model=model):
                model(x).sum().backward()
            medians[kind] = median_slowest(timed_samples(step, device, warmup, repeats,
                                                         barrier=True), device)
        per = max(0.0, medians["split"] - medians["narrow"]) / (2 * kTpPairs)
        points.append((4 * rows * kTpWidth, per))
    return points


def _tp_link(bursts: List[List[Tuple[int, float]]], world: int, fits: Dict[str, dict]
             ) -> Optional[Dict[str, float]]:
    """intra_node's "tp_allreduce" link: the alpha and bandwidth that make the ring all-reduce
    2(p-1) alpha + 2(p-1)/p bytes / bw reproduce the tensor-parallel collectives measured by
    _tp_pair_times (the cost model prices a TP group's collectives on it where present:
    csrc/planner/costs/tensor_parallel_cost.h); None when they were not measurably slower than the
    narrow model (the all-reduce link then prices them). `bursts`: _tp_pair_times taken with
    the shared-core bursts, apart in time; each size's median over them is fitted (one
    measurement fitted 4.06 ms of latency where the calibration before had 1.24, its 1 MiB
    collective faster than its 256 KiB one, and the TP plans came out 73-97 % slow)."""
    points = [(size, statistics.median(burst[i][1] for burst in bursts))
              for i, (size, _) in enumerate(bursts[0])]
    fit = fit_line([b for b, _ in points], [t for _, t in points])
    fits["tp_allreduce"] = fit.to_dict()
    fits["tp_allreduce"]["bursts"] = bursts
    if fit.beta <= 0 or fit.alpha < 0:
        fits["tp_allreduce"]["note"] = ("no growth with the bytes, or a negative intercept, "
                                        "within noise: not calibrated (the all-reduce link "
                                        "prices tensor parallelism)")
        return None
    return {"bandwidth_bytes_per_s": (2 * (world - 1) / world) / fit.beta,
            "latency_s": fit.alpha / (2 * (world - 1))}


# ---- the whole calibration --------------------------------------------------------------------

def calibrate(graph_path: Optional[str] = None, model: Optional[str] = None, batch: int = 32,
              out: Optional[str] = None, name: Optional[str] = None, warmup: int = 3,
              repeats: int = 15, timeout_s: float = 120.0,
              compile_graph: Optional[str] = None) -> Optional[dict]:
    """Runs the measurements above on every rank of this torchrun job; rank 0 returns the
    Cluster dict and writes it atomically to `out` (if given), the others return None.
    `compile_graph`: rank 0 also writes the graph with each node's compile speed-up there
    (measure/compile_speedup.py; needs graph_path and model)."""
    env = _probe.rank_env("calibrate", min_ranks=1)
    if compile_graph and not (graph_path and model):
        raise ValueError("calibrate: --compile-graph needs --graph (the model's profile) and "
                         "--model (the model it times)")
    graph = None
    if graph_path:
        with open(graph_path, encoding="utf-8") as f:
            graph = json.load(f)
    torch.set_num_threads(1)
    with _probe.process_group(env, timeout_s) as (device, backend):
        cluster = _measure(env, device, backend, graph, model, batch, warmup, repeats, timeout_s,
                           name)
    if env.rank != 0:
        return None
    if out:
        _probe.write_json(out, cluster)
    if compile_graph:
        _probe.write_json(compile_graph, measured_compile_graph(graph, model, batch, warmup,
                                                                repeats))
    return cluster


def measured_compile_graph(graph: dict, model: str, batch: int, warmup: int, repeats: int,
                           options: Optional[dict] = None) -> dict:
    """`graph` with each node's compile_speedup measured on `model` (MODULE:FACTORY, with
    example_inputs(batch)) in this process, on its first device (the profile's)."""
    from .compile_speedup import compile_speedups, with_compile_speedups

    module, _ = _workload(model, batch)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    inputs = tuple(module.example_inputs(batch))
    module.train()
    speedups = compile_speedups(module, inputs, [n["name"] for n in graph["nodes"]], device,
                                warmup, repeats, options)
    return with_compile_speedups(graph, speedups)


def _copy_link(device, sizes: List[int], warmup: int, repeats: int, fits: Dict[str, dict]) -> dict:
    """One device: nothing crosses a link, and a Cluster still names one; the device's own copy
    time (clone) stands in, unused by one-device plans."""
    points = []
    for n in sizes:
        buf = torch.ones(max(1, n // 4), dtype=torch.float32, device=device)
        samples = timed_samples(buf.clone, device, warmup, repeats)
        points.append((n, statistics.median(samples)))
    return _probe.fit_link(points, fits, "copy")


def _intra_node_link(env, device, graph, warmup: int, repeats: int, fits: Dict[str, dict]) -> dict:
    """intra_node: the p2p link with its all-reduce link, or one device's copy link."""
    allreduce_sizes, p2p_sizes = message_sizes(graph)
    if env.world_size == 1:
        return _copy_link(device, p2p_sizes, warmup, repeats, fits)
    _probe.time_allreduce(allreduce_sizes[-1], device, 1, 1)  # connections, unmeasured
    _time_p2p(p2p_sizes[-1], env.rank, device, 1, 1)
    p2p = [(n, _time_p2p(n, env.rank, device, warmup, repeats)) for n in p2p_sizes]
    allreduce = [(n, _probe.time_allreduce(n, device, warmup, repeats))
                 for n in allreduce_sizes]
    intra = _probe.fit_link(p2p, fits, "p2p")
    intra["allreduce"] = _probe.allreduce_link(allreduce, env.world_size, fits, "allreduce")
    return intra


def _optimizer_tensor_s(device, warmup: int, repeats: int, fits: Dict[str, dict],
                        world: int = 0) -> Dict[str, float]:
    """{Job optimizer: its cost per parameter tensor}, each from its own steps (fit
    "optimizer_tensors.NAME"; with `world`, over sharded parameters,
    "sharded_optimizer_tensors.NAME"); 0 when unresolved, i.e. the step time did not grow with
    the count: not a cost here. Each optimizer is timed: per tensor, plain SGD dispatches one
    op, SGD-momentum three, Adam about ten, and on 2 CPU ranks over DTensor shards they took
    14, 67 and 222 us a tensor (a cost fitted on one priced the others 3-5x off)."""
    out = {}
    for name in OPTIMIZERS:
        times = _optimizer_tensor_times(device, warmup, repeats, world=world, optimizer=name)
        fit = fit_line([n for n, _ in times], [t for _, t in times], relative=False)
        fits[f"{'sharded_' if world else ''}optimizer_tensors.{name}"] = fit.to_dict()
        out[name] = fit.beta if fit.resolved else 0.0
    return out


def _shard_links(device, world: int, warmup: int, repeats: int, fits: Dict[str, dict]) -> dict:
    """intra_node's allgather and reduce_scatter links, where a unit took measurably longer
    sharded than not (shard_collective_link)."""
    links = {}
    for kind, points in _sharded_unit_times(device, world, warmup, repeats).items():
        link = shard_collective_link(points, world, fits, kind)
        if link is not None:
            links[kind] = link
    return links


def _executor_step_s(env, device, warmup: int, repeats: int, timeout_s: float,
                     fits: Dict[str, dict], optimizer_tensor_s: float) -> Dict[str, float]:
    """The executor's fixed cost per step, from tiny-model runs under hybridplan.apply, less what
    the model prices separately: the tiny model's compute, all-reduce and per-tensor updates."""
    tiny_compute_s = max_over_ranks(_tiny_compute_s(warmup, repeats), device)
    dp_step_s = _step_times_s(_hand_plan("placement", env.world_size, 1), 2 * env.world_size,
                              device, warmup, repeats, timeout_s)
    tiny_params = list(_Tiny().parameters())
    tiny_grad_bytes = sum(p.numel() * 4 for p in tiny_params)
    allreduce_fit = fits.get("allreduce", {"alpha": 0.0, "beta": 0.0})  # none on one device
    step_s = max(0.0, dp_step_s - tiny_compute_s - (allreduce_fit["alpha"] + allreduce_fit["beta"]
                                                    * tiny_grad_bytes)
                 - len(tiny_params) * optimizer_tensor_s)
    return {"step_s": step_s, "tiny_compute_s": tiny_compute_s, "dp_step_s": dp_step_s}


def _tiny_pipeline_runs(device, warmup: int, repeats: int, timeout_s: float) -> List[dict]:
    """The tiny model's 1x2 pipelines (2 ranks) at kMicrobatchCounts micro-batches, each
    schedule: the median step (slowest rank) of each."""
    runs = []
    for m in kMicrobatchCounts:
        for schedule in kSchedules:
            if schedule == "1f1b" and m < 2:
                continue  # Schedule1F1B needs a micro-batch per stage
            plan = _hand_plan("pipeline", 1, 2, schedule, m, m)
            runs.append({"schedule": schedule, "num_microbatches": m, "per_replica_batch": m,
                         "step_s": _step_times_s(plan, m, device, warmup, repeats, timeout_s)})
    return runs


def _slowdown_table(slowdown: dict, graph_s: float, local_world_size: int) -> List[List[float]]:
    """runtime.shared_host_slowdown from a shared-core measurement (_merge_bursts'): [[1, 1],
    [P, factor]], or, with `graph_s` (the graph's own forward+backward sum where the graph is
    the measured model's, _graph_step_s; 0 otherwise), relative to it (see the module doc); the
    graph-relative figures are added to `slowdown`. calibrate's table, and validate's rebuilt
    from the bursts each launch takes (launch_slowdown_table)."""
    if not graph_s:
        return [[1, 1.0], [local_world_size, slowdown["factor"]]]
    alone = _median_alone_s(slowdown)
    slowdown["graph_step_s"] = graph_s
    slowdown["alone_over_graph"] = alone / graph_s
    slowdown["together_over_graph"] = statistics.median(slowdown["slowest_together_s"]) / graph_s
    table = [[1, slowdown["alone_over_graph"]]]
    if local_world_size > 1:
        table.append([local_world_size,
                      max(slowdown["together_over_graph"], slowdown["alone_over_graph"])])
    return table


# validate's shared-core bursts in each launch (validate_worker): rounds per burst and steps per
# turn, one burst right before the launch's timed steps and one right after (a few seconds).
kLaunchBurstRounds = 3
kLaunchBurstSteps = 3


def launch_slowdown_table(bursts: List[dict], shared_host: dict,
                          local_world_size: int) -> Tuple[List[List[float]], dict]:
    """runtime.shared_host_slowdown as the host was during one launch of validate: the
    _shared_host_slowdown bursts its ranks took on the calibration's own workload
    (`shared_host["workload"]`) merged (_merge_bursts) and made a table by calibrate's own
    _slowdown_table, relative to the same graph sum the calibration's table was
    (`shared_host["graph_step_s"]`, absent where calibrate's table was the factor alone).
    Returns (the table, the merged measurement)."""
    if not bursts:
        raise ValueError("launch_slowdown_table: no shared-host bursts")
    merged = _merge_bursts(bursts)
    return _slowdown_table(merged, shared_host.get("graph_step_s", 0.0), local_world_size), merged


def _fit_pipeline_actions(cluster: dict, measured: dict, graph: Optional[dict], runs: List[dict],
                          model_runs: List[dict]) -> None:
    """runtime.action_s and schedule_action_s into `cluster`, from the model's own runs where
    there are any, else the tiny model's (see the module doc); both fits into `measured`."""
    tiny = _tiny_graph()
    for run in runs:
        run["plan"] = _tiny_pipeline_plan(tiny, run)
    action = _fit_action_s_by_schedule(tiny, cluster, runs)
    measured["tiny_pipeline_actions"] = action
    if model_runs:  # the model's own stages decide (see the module doc)
        action = _fit_action_s_by_schedule(graph, cluster, model_runs)
    cluster["runtime"]["action_s"] = action["1f1b"]["action_s"]
    cluster["runtime"]["schedule_action_s"] = {s: fit["action_s"] for s, fit in action.items()}
    cluster["runtime"]["action_sample_s"] = action["1f1b"]["action_sample_s"]
    cluster["runtime"]["schedule_action_sample_s"] = {s: fit["action_sample_s"]
                                                      for s, fit in action.items()}
    measured["pipeline_actions"] = action


def _measure(env, device, backend, graph, model, batch, warmup, repeats, timeout_s, name):
    """Every measurement of the module doc, in the same order on every rank (each is
    collective), and the Cluster built from them."""
    # The executor's and the profiler's allocator policy, from the first measurement on (it is
    # process-wide and stays). Calibrate used to get it only from its first hybridplan.apply,
    # after the first shared-core burst: that burst then page-faulted on every large freed
    # block: in the nine calibrations of 2026-12-04 its rounds alone ran 22-38 % slower than the
    # later bursts' for BigLSTM and 6-25 % for branchy_cnn, and -5 to +4 % for transformer_lm.
    retain_freed_memory()
    fits: Dict[str, dict] = {}
    module, module_step = _workload(model, batch)
    bursts: List[dict] = []
    tp_bursts: List[List[Tuple[int, float]]] = []

    check_s: List[float] = []  # rank 0 timing the workload as validate's check will

    def shared_host_burst():  # and the tensor-parallel collectives, spread over time alike
        bursts.append(_shared_host_slowdown(module_step, env.rank, env.world_size, device,
                                            rounds=max(3, repeats // 3), steps=3))
        dist.barrier()
        if env.rank == 0:
            check_s.extend(_one_thread_times_s(module_step, kHostCheckRounds, kHostCheckSteps))
        dist.barrier()
        if env.world_size > 1:
            tp_bursts.append(_tp_pair_times(device, env.world_size, warmup, repeats))

    shared_host_burst()
    intra = _intra_node_link(env, device, graph, warmup, repeats, fits)
    optimizer_tensor_s = _optimizer_tensor_s(device, warmup, repeats, fits)
    selective_op_s = _selective_op_s(device, warmup, repeats, fits)
    sharded_optimizer_tensor_s = {}
    if env.world_size > 1:  # sharded data parallelism: FSDP2's collectives and DTensor updates
        intra.update(_shard_links(device, env.world_size, warmup, repeats, fits))
        sharded_optimizer_tensor_s = _optimizer_tensor_s(device, warmup, repeats, fits,
                                                         world=env.world_size)
    # the tiny runs train with the default Job's optimizer: its per-tensor cost is theirs
    executor = _executor_step_s(env, device, warmup, repeats, timeout_s, fits,
                                optimizer_tensor_s[kJobOptimizer])
    for _ in range(kSharedHostBursts - 2):  # the middle ones
        shared_host_burst()
    runs = (_tiny_pipeline_runs(device, warmup, repeats, timeout_s) if env.world_size == 2
            else [])
    model_runs, shard_runs = [], []
    if env.world_size == 2 and graph is not None and model:
        model_runs = _model_pipeline_runs(model, graph, batch, device, warmup, repeats, timeout_s)
    if env.world_size > 1 and env.num_nodes == 1 and graph is not None and model:
        shard_runs = _model_shard_runs(model, graph, model_shard_batches(batch), device,
                                       env.world_size, warmup, repeats, timeout_s)
    shared_host_burst()
    slowdown = _merge_bursts(bursts)
    if tp_bursts:
        tp_link = _tp_link(tp_bursts, env.world_size, fits)
        if tp_link is not None:
            intra["tp_allreduce"] = tp_link
    # what validate times again to tell whether the host's speed has moved since (host_speed)
    slowdown["workload"] = {"model": model or kDefaultWorkload, "batch": batch}
    if check_s:
        slowdown["check_alone_s"] = check_s
    bandwidth = _memory_bandwidth(device)
    peak_flops = min_over_ranks(_probe.peak_flops(device), device)
    speedup, speedup_s = compute_speedup(module_step, device, warmup, repeats)

    slowdown_table = _slowdown_table(
        slowdown, _graph_step_s(graph, module if model else None, batch), env.local_world_size)
    cluster = {
        "schema_version": 1, "kind": "hybridplan.cluster",
        "name": name or ("localhost-cpu" if device.type == "cpu" else "calibrated-cuda"),
        "num_nodes": env.num_nodes, "devices_per_node": env.local_world_size,
        "device": {"name": _probe.device_name(device), "type": device.type,
                   "memory_bytes": _probe.device_memory_bytes(device, env.local_world_size),
                   "peak_flops": peak_flops,
                   "memory_bandwidth_bytes_per_s": bandwidth["bandwidth_bytes_per_s"],
                   "compute_speedup": speedup},
        "intra_node": intra, "inter_node": dict(intra),
        "collectives": {"library": backend if backend in ("gloo", "nccl") else "nccl"},
        "runtime": {"step_s": executor["step_s"], "action_s": 0.0,
                    "optimizer_tensor_s": optimizer_tensor_s[kJobOptimizer],
                    "optimizer_tensor_s_by_optimizer": optimizer_tensor_s,
                    "sharded_optimizer_tensor_s": sharded_optimizer_tensor_s.get(kJobOptimizer,
                                                                                 0.0),
                    **({"sharded_optimizer_tensor_s_by_optimizer": sharded_optimizer_tensor_s}
                       if sharded_optimizer_tensor_s else {}),
                    "selective_op_s": selective_op_s,
                    "shared_host_slowdown": slowdown_table},
    }
    measured = {"fits": fits, "tiny_compute_s": executor["tiny_compute_s"],
                "dp_step_s": executor["dp_step_s"], "shared_host": slowdown,
                "memory_bandwidth": bandwidth, "compute_speedup_step_s": speedup_s,
                "world_size": env.world_size, "warmup": warmup,
                "repeats": repeats}
    busy = busy_host_warning(slowdown)
    if busy and env.rank == 0:
        warnings.warn(busy, stacklevel=2)
        measured["busy_host_warning"] = busy
    if runs and env.rank == 0:
        _fit_pipeline_actions(cluster, measured, graph, runs, model_runs)
    if shard_runs and env.rank == 0:  # after the action fits: evaluate() prices with them
        measured["model_shard_units"] = _fit_shard_latencies(graph, cluster, shard_runs)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cluster["sources"] = [
        f"measured {date} by `torchrun --nproc-per-node {env.local_world_size} -m hybridplan "
        f"calibrate` ({backend}, one intra-op thread per rank, medians of {repeats} after "
        f"{warmup} warm-up, slowest rank; fits and residuals under measured; the method is "
        "python/hybridplan/measure/calibration.py's docstring)",
        "inter_node: one node measured; copied from intra_node"]
    cluster["measured"] = measured
    return cluster
