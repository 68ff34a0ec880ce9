"""Executor overhead against the same layout written by hand with torch's own APIs, for every
plan kind the Python executor runs (not a timed test; target: executor / torch <= 1.02).

Each row applies a plan with hybridplan.apply to a small causal transformer
(hybridplan.models.transformer_lm) and builds, on the same ranks, the same layout directly
with torch (nothing of hybridplan on that side): the same cut, micro-batches, units, styles,
bucket sizes, data and optimizer (SGD, momentum 0.9). The two step functions alternate step by
step (which one goes first alternates too) so that load from other processes on the machine
hits both alike; a step's time is the slowest rank's (a barrier before each step).

  rows on 2 ranks                       torch by hand
  control    the torch side of dp on    DistributedDataParallel: two copies of the same
             both sides                 code, the harness's own resolution (ratio ~ 1)
  dp         placement dp=2             DistributedDataParallel, buckets [1, 25] MiB
  placement  placement dp=2, mp=2       the same DDP (on one CPU both devices are the CPU:
                                        the executor moves nothing and installs no hook)
  gpipe, 1f1b                           pipelining.pipeline() cut at the same layers,
             pipeline mp=2, M micro-b.  Pipe.build_stage, ScheduleGPipe / Schedule1F1B
  interleaved-1f1b, interleaved-zb, zbv the same with 4 stages (2 per rank: s % 2, or along
             pipeline mp=2 x 2 virtual  the V for zbv), ScheduleInterleaved1F1B /
                                        ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble
  zero2, zero3  placement dp=2 sharded  fully_shard on each parameter-holding node module,
                                        then the root; reshard_after_forward False / True
  recompute  placement dp=2, every      torch.utils.checkpoint (non-reentrant) around each
             node recomputed            node module's forward, then DDP
  tp         placement tp=2             parallelize_module with ColwiseParallel /
                                        RowwiseParallel on the same linear layers
  rows on 4 ranks
  pp-dp      pipeline dp=2 x mp=2 1f1b  DDP per stage (over its DP group) in a PipelineStage
  hsdp       placement dp=4, dp_shard=2 fully_shard over a 2-D (replicate, shard) mesh
             zero2
  tp-dp      placement dp=2 x tp=2      parallelize_module over "tp", then FSDP2's
                                        replicate per unit over "dp"

Prints one table: executor and torch median step (ms), their ratio, and each side's spread
(interquartile range over the median, %). Runs itself under torchrun (Gloo on CPU, one intra-op
thread per rank), once with 2 ranks and once with 4:

    python bench/bench_executor.py [--rows dp 1f1b ...] [--steps 30] [--global-batch 32]
"""

import argparse
import datetime
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

from torchrun_relaunch import relaunch  # this folder

import torch
import torch.distributed as dist
import torch.utils.checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hybridplan  # noqa: E402
from hybridplan.executor import destroy_groups  # noqa: E402
import hybridplan.models as models  # noqa: E402

ROWS = {  # name -> ranks
    "control": 2, "dp": 2, "placement": 2, "gpipe": 2, "1f1b": 2, "interleaved-1f1b": 2, "interleaved-zb": 2,
    "zbv": 2, "zero2": 2, "zero3": 2, "recompute": 2, "tp": 2,
    "pp-dp": 4, "hsdp": 4, "tp-dp": 4}
MULTI_STAGE = ("interleaved-1f1b", "interleaved-zb", "zbv")
TARGET = 1.02
BUCKET_CAPS_MB = [1, 25]  # DDP's default buckets, written out: the executor's policy


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--steps", type=int, default=30, help="timed steps of each side per row")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=4, help="transformer layers (4 stages need 4)")
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--timeout-s", type=float, default=180.0, help="process group timeout")
    p.add_argument("--tp-mesh", choices=("default", "executor"), default="default",
                   help="the hand-written tp rows' mesh: a plain init_device_mesh (default), or "
                        "the executor's own mesh, so both sides' collectives use one Gloo group")
    p.add_argument("--profile-dir", help="after timing, run each side's steps again under "
                   "cProfile, one file per row, side and rank (<row>-<side>.rank<r>.prof)")
    p.add_argument("--json", help=argparse.SUPPRESS)  # a rank job's results file (internal)
    return p.parse_args(argv)


# ---- shared with the other benchmarks in this folder (bench_noise_online imports these) -------

def timed_steps_s(steps_by_name, steps: int, warmup: int):
    """Wall time of every timed step of each step function, the slowest rank's (a barrier
    before each step). The functions alternate step by step, and which goes first alternates
    too, so that load from other processes on the machine hits all alike."""
    names = list(steps_by_name)
    times = torch.zeros(len(names), steps, dtype=torch.float64)
    for i in range(warmup + steps):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            dist.barrier()
            started = time.perf_counter()
            steps_by_name[name](i)
            if i >= warmup:
                times[names.index(name), i - warmup] = time.perf_counter() - started
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return {name: times[k].tolist() for k, name in enumerate(names)}


def timed_medians_s(steps_by_name, steps: int, warmup: int):
    """Median wall time per step of each step function (timed_steps_s)."""
    return {name: statistics.median(t)
            for name, t in timed_steps_s(steps_by_name, steps, warmup).items()}


def data(model, global_batch, i):
    return model.example_inputs(global_batch, seed=i), model.example_target(global_batch, seed=7 + i)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


# ---- the model and its layout, written out for the hand-written side ---------------------------

def build(args):
    return models.get("transformer_lm", seed=0, num_layers=args.layers, d_model=args.d_model,
                      seq_len=args.seq_len)


LAYER_PARTS = ("self_attn", "linear1", "dropout", "linear2", "norm1", "norm2", "dropout1",
               "dropout2")  # nn.TransformerEncoderLayer's modules, in registration order


def node_names(args):
    """transformer_lm's node modules (those holding parameters of their own, or leaves), in
    registration order: what the executor treats as units (graph nodes)."""
    return (["embed", "position"]
            + [f"layers.{i}.{part}" for i in range(args.layers) for part in LAYER_PARTS]
            + ["norm", "head"])


def param_units(args):
    """The node modules holding parameters: FSDP's units, before the root."""
    return [n for n in node_names(args) if "dropout" not in n]


def stage_of_layer(layer: int, layers: int, stages: int) -> int:
    return layer * stages // layers


def first_layers(args, stages: int):
    """The layer each stage after the first begins with (the cut of both sides)."""
    return [min(i for i in range(args.layers) if stage_of_layer(i, args.layers, stages) == s)
            for s in range(1, stages)]


def cut_plan(plan, args, stages: int):
    """A pipeline plan dict whose stages begin at first_layers (the embeddings go with the
    first stage, the final norm and head with the last)."""
    def stage(name):
        if name.startswith("layers."):
            return stage_of_layer(int(name.split(".")[1]), args.layers, stages)
        return 0 if name in ("embed", "position") else stages - 1
    plan["assignment"] = [dict(a, device=stage(a["name"])) for a in plan["assignment"]]
    return plan


def tp_styles_by_hand(args):
    """The Megatron split of transformer_lm as torch's styles: the token embedding by
    vocabulary rows, each layer's feed-forward column-wise then row-wise (its attention is one
    nn.MultiheadAttention, which torch's styles do not split), the vocabulary head column-wise
    with its logits gathered; the position embedding (of computed positions) whole."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    plan = {"embed": RowwiseParallel(input_layouts=Replicate())}
    for i in range(args.layers):
        plan[f"layers.{i}.linear1"] = ColwiseParallel()
        plan[f"layers.{i}.linear2"] = RowwiseParallel()
    plan["head"] = ColwiseParallel(output_layouts=Replicate())
    return plan


# ---- the rows ----------------------------------------------------------------------------------

class Row:
    """One comparison: `executor(i)` and `torch(i)` run step i; `close()` tears both down."""

    def __init__(self, layout, executor, torch_step, close):
        self.layout, self.executor, self.torch, self.close = layout, executor, torch_step, close


def share(value, parts, index):
    if isinstance(value, tuple):
        return tuple(share(v, parts, index) for v in value)
    return value.tensor_split(parts)[index]


def batches(model, args):
    """Four global batches, made once: steps cycle through them (no data making timed)."""
    return [data(model, args.global_batch, i) for i in range(4)]


def executor_row(plan, model, args, example=None):
    hp = hybridplan.apply(plan, model, optimizer=sgd, example_inputs=example,
                          timeout_s=args.timeout_s)
    data_ = batches(model, args)

    def step(i):
        hp.step(*hp.shard(*data_[i % len(data_)]))
    return hp, step


def placement_plan(model, args, dp, mp=1, **fields):
    plan = hybridplan.hand_plan(model, mode="placement", dp=dp, mp=mp,
                                per_replica_batch=args.global_batch // dp)
    plan.update(fields)
    return plan


def with_tp(plan, tp):
    world = plan["world_size"] * tp
    return dict(plan, tp=tp, world_size=world, mesh=[[d * tp for d in row] for row in plan["mesh"]],
                cluster=dict(plan["cluster"], devices_per_node=world, num_nodes=1))


def ddp_by_hand(module, group=None):
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(module, process_group=group, bucket_cap_mb_list=BUCKET_CAPS_MB)


def plain_step(module, loss, opt, data_, dp, replica):
    def step(i):
        inputs, target = data_[i % len(data_)]
        inputs, target = share(inputs, dp, replica), share(target, dp, replica)
        opt.zero_grad(set_to_none=True)
        loss(module(*inputs), target).backward()
        opt.step()
    return step


def row_data_parallel(args, kind):
    """dp, placement (mp=2), recompute, zero2, zero3 on 2 ranks; hsdp on 4."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = build(args)
    fields = {}
    if kind in ("zero2", "zero3"):
        fields["sharding"] = kind
    if kind == "hsdp":
        fields.update(sharding="zero2", dp_shard=2)
    plan = placement_plan(model, args, dp=world, mp=2 if kind == "placement" else 1, **fields)
    if kind == "recompute":
        plan["assignment"] = [dict(a, recompute=True) for a in plan["assignment"]]
    hp, executor_step = executor_row(plan, model, args)
    # the same layout on both sides, or no comparison
    if kind == "recompute" and set(hp.plan.recompute) != set(node_names(args)):
        raise RuntimeError(f"the executor recomputes {sorted(hp.plan.recompute)}, the "
                           f"hand-written side {node_names(args)}")
    if hp.shard_units and hp.shard_units != param_units(args):
        raise RuntimeError(f"the executor's units are {hp.shard_units}, the hand-written "
                           f"side's {param_units(args)}")

    ref = build(args)
    if kind in ("dp", "placement", "recompute"):
        if kind == "recompute":
            for name in node_names(args):
                sub = ref.get_submodule(name)
                sub.forward = functools.partial(torch.utils.checkpoint.checkpoint, sub.forward,
                                                use_reentrant=False)
        wrapped = ddp_by_hand(ref)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = (init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
                if kind == "hsdp" else init_device_mesh("cpu", (world,)))
        reshard = kind == "zero3"
        for name in param_units(args):
            fully_shard(ref.get_submodule(name), mesh=mesh, reshard_after_forward=reshard)
        wrapped = fully_shard(ref, mesh=mesh, reshard_after_forward=reshard)
    opt = sgd(ref.parameters())
    torch_step = plain_step(wrapped, ref.loss, opt, batches(ref, args), world, rank)
    layout = {"dp": "placement dp=2 | DDP", "placement": "placement dp=2 x mp=2 | DDP",
              "recompute": "placement dp=2, all nodes recomputed | checkpoint + DDP",
              "zero2": "placement dp=2 zero2 | fully_shard(reshard_after_forward=False)",
              "zero3": "placement dp=2 zero3 | fully_shard(reshard_after_forward=True)",
              "hsdp": "placement dp=4 zero2 dp_shard=2 | fully_shard on a (2, 2) mesh"}[kind]
    return Row(layout, executor_step, torch_step, lambda: hp.close())


def row_tensor_parallel(args, kind):
    """tp (placement tp=2) on 2 ranks; tp-dp (dp=2 x tp=2) on 4."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    world, rank = dist.get_world_size(), dist.get_rank()
    tp, dp = 2, world // 2
    model = build(args)
    plan = with_tp(placement_plan(model, args, dp=dp), tp)
    example = share(model.example_inputs(args.global_batch), dp, rank // tp)
    hp = hybridplan.apply(plan, model, optimizer=sgd, example_inputs=example,
                          timeout_s=args.timeout_s)
    data_ = batches(model, args)

    def executor_step(i):
        hp.step(*hp.shard(*data_[i % len(data_)]))

    ref = build(args)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    styles = tp_styles_by_hand(args)
    from torch.distributed.tensor import DTensor, Shard
    executor_split = {n.rpartition(".")[0] for n, p in hp.module.named_parameters()
                      if isinstance(p, DTensor) and any(isinstance(x, Shard) for x in
                                                        p.placements[-1:])}  # the tp dim
    if executor_split != set(styles):  # the same layout on both sides, or no comparison
        raise RuntimeError(f"the executor splits {sorted(executor_split)}, the hand-written "
                           f"plan {sorted(styles)}")
    if args.tp_mesh == "executor":  # both sides over the executor's groups
        mesh = hp._mesh.dp_tp()
        mesh = {"tp": mesh[mesh.mesh_dim_names[1]], "dp": mesh[mesh.mesh_dim_names[0]]}
    parallelize_module(ref, mesh["tp"], styles)
    if dp > 1:
        from torch.distributed._composable.replicate_with_fsdp import replicate
        for name in param_units(args):
            replicate(ref.get_submodule(name), mesh=mesh["dp"])
        replicate(ref, mesh=mesh["dp"])
    opt = sgd(ref.parameters())
    torch_step = plain_step(ref, ref.loss, opt, batches(ref, args), dp, rank // tp)
    layout = ("placement tp=2 | parallelize_module" if dp == 1 else
              "placement dp=2 x tp=2 | parallelize_module + replicate")
    return Row(layout, executor_step, torch_step, lambda: hp.close())


def row_pipeline(args, kind):
    """A pipeline schedule (dp=1, mp=2) on 2 ranks; pp-dp (1f1b, dp=2 x mp=2) on 4."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed import pipelining as pp
    world, rank = dist.get_world_size(), dist.get_rank()
    mp = 2
    dp = world // mp
    schedule = "1f1b" if kind == "pp-dp" else kind
    virtual = 2 if schedule in MULTI_STAGE else 1
    stages = mp * virtual
    batch = args.global_batch // dp
    replica, k = rank // mp, rank % mp
    model = build(args)
    example = share(model.example_inputs(args.global_batch), dp, replica)
    plan = cut_plan(hybridplan.hand_plan(
        model, mode="pipeline", dp=dp, mp=mp, schedule=schedule,
        num_microbatches=args.microbatches, per_replica_batch=batch, example_inputs=example,
        virtual_stages=virtual), args, stages)
    hp, executor_step = executor_row(plan, model, args, example)

    # torch by hand: torch's own cut at the same layers, torch's stage and schedule
    ref = build(args)
    micro = tuple(t[: batch // args.microbatches] for t in example)
    pipe = pp.pipeline(ref, micro, split_spec={f"layers.{i}": pp.SplitPoint.BEGINNING
                                               for i in first_layers(args, stages)})
    if schedule == "zbv":  # along the V: rank k holds stages k and 2 mp - 1 - k
        mine = [k, 2 * mp - 1 - k]
    else:
        mine = list(range(k, stages, mp))
    # each stage's input and output for one micro-batch: its PipelineStage's metadata (the
    # executor gives its stages theirs from the export, so neither side runs a shape inference)
    metadata, x = [], micro
    with torch.no_grad():
        for s in range(stages):
            y = pipe.get_stage_module(s)(*x)
            y = y if isinstance(y, tuple) else (y,)
            metadata.append((x, y))
            # a stage sends back the gradient of the inputs its metadata marks as needing one
            x = tuple(t.requires_grad_(t.is_floating_point()) for t in y)
    if dp == 1:
        pp_group, dp_group = None, None
    else:
        mesh = init_device_mesh("cpu", (dp, mp), mesh_dim_names=("dp", "pp"))
        pp_group, dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
    held, params = [], []
    for s in mine:
        module = pipe.get_stage_module(s)
        params += list(module.parameters())
        if dp > 1:  # one DDP per stage over the replicas of this pipeline rank
            module = ddp_by_hand(module, dp_group)
        held.append(pp.PipelineStage(module, s, stages, torch.device("cpu"),
                                     input_args=metadata[s][0], output_args=metadata[s][1],
                                     group=pp_group))
    classes = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B,
               "interleaved-1f1b": pp.ScheduleInterleaved1F1B,
               "interleaved-zb": pp.ScheduleInterleavedZeroBubble,
               "zbv": pp.ScheduleZBVZeroBubble}
    runner = classes[schedule](held if virtual > 1 else held[0], args.microbatches,
                               loss_fn=ref.loss)
    opt = sgd(params)
    holds_first, holds_last = 0 in mine, stages - 1 in mine
    data_ = batches(ref, args)

    def torch_step(i):
        inputs, target = data_[i % len(data_)]
        inputs, target = share(inputs, dp, replica), share(target, dp, replica)
        opt.zero_grad(set_to_none=True)
        kwargs = dict(target=target, losses=[]) if holds_last else {}
        runner.step(*(inputs if holds_first else ()), **kwargs)
        opt.step()
    layout = (f"pipeline mp=2 x v={virtual}, {args.microbatches} micro-batches | "
              f"{classes[schedule].__name__}" if dp == 1 else
              f"pipeline dp=2 x mp=2 1f1b, {args.microbatches} micro-batches | "
              f"DDP per stage + Schedule1F1B")
    return Row(layout, executor_step, torch_step, lambda: hp.close())


def row_control(args):
    """The dp row's torch side against a second copy of itself: what ratio the harness shows
    between two identical steps under the load of the moment."""
    world, rank = dist.get_world_size(), dist.get_rank()
    sides = []
    for _ in range(2):
        ref = build(args)
        sides.append(plain_step(ddp_by_hand(ref), ref.loss, sgd(ref.parameters()),
                                batches(ref, args), world, rank))
    return Row("DDP | the same DDP (no executor)", sides[0], sides[1], lambda: None)


def make_row(args, name):
    if name == "control":
        return row_control(args)
    if name in ("dp", "placement", "recompute", "zero2", "zero3", "hsdp"):
        return row_data_parallel(args, name)
    if name in ("tp", "tp-dp"):
        return row_tensor_parallel(args, name)
    return row_pipeline(args, name)


def spread(times):
    """Interquartile range over the median, in %."""
    q = statistics.quantiles(times, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(times)


def profile(row, name, args):
    """Each side's steps again, under cProfile on every rank (for finding where a side's time
    goes: pstats reads the files)."""
    import cProfile
    os.makedirs(args.profile_dir, exist_ok=True)
    for side, step in (("executor", row.executor), ("torch", row.torch)):
        profiler = cProfile.Profile()
        for i in range(args.steps):
            dist.barrier()
            profiler.enable()
            step(i)
            profiler.disable()
        profiler.dump_stats(os.path.join(args.profile_dir,
                                         f"{name}-{side}.rank{dist.get_rank()}.prof"))


def run_rows(args, names):
    results = []
    for name in names:
        row, entry = None, {"row": name, "ranks": dist.get_world_size()}
        try:
            row = make_row(args, name)
            times = timed_steps_s({"executor": row.executor, "torch": row.torch}, args.steps,
                                  args.warmup_steps)
            ex, th = statistics.median(times["executor"]), statistics.median(times["torch"])
            entry.update(layout=row.layout, executor_ms=1e3 * ex, torch_ms=1e3 * th,
                         ratio=ex / th, executor_spread=spread(times["executor"]),
                         torch_spread=spread(times["torch"]))
            if args.profile_dir:
                profile(row, name, args)
        except Exception as e:  # reported in the table; the other rows go on
            traceback.print_exc()
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        finally:
            if row is not None:
                row.close()
            row = None
            gc.collect()
        if dist.get_rank() == 0:
            print(f"bench_executor: {json.dumps(entry)}", flush=True)
        results.append(entry)
    return results


def print_table(entries, args, threads, load_before):
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"bench_executor: load average {load_before} at the start, {load} at the end "
          f"(1/5/15 min)")
    print(f"bench_executor: transformer_lm ({args.layers} layers, d_model {args.d_model}, "
          f"seq {args.seq_len}), global batch {args.global_batch}, {args.microbatches} "
          f"micro-batches; Gloo on CPU, {threads} thread/rank; median of {args.steps} "
          f"interleaved steps (+{args.warmup_steps} warm-up) per side; target ratio <= {TARGET}")
    print(f"{'row':<17} {'ranks':>5} {'executor ms':>12} {'torch ms':>9} {'ratio':>6} "
          f"{'spread ex/torch %':>18}  layout (executor | torch by hand)")
    for e in entries:
        if "error" in e:
            print(f"{e['row']:<17} {e['ranks']:>5}  failed: {e['error']}")
            continue
        flag = "" if e["ratio"] <= TARGET else "  ABOVE TARGET"
        print(f"{e['row']:<17} {e['ranks']:>5} {e['executor_ms']:12.2f} {e['torch_ms']:9.2f} "
              f"{e['ratio']:6.3f} {e['executor_spread']:8.1f} /{e['torch_spread']:6.1f}  "
              f"{e['layout']}{flag}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if "RANK" not in os.environ:  # the driver: one torchrun job per rank count
        load_before = "/".join(f"{x:.2f}" for x in os.getloadavg())
        entries = []
        with tempfile.TemporaryDirectory() as folder:
            for ranks in sorted({ROWS[r] for r in args.rows}):
                path = os.path.join(folder, f"ranks{ranks}.json")
                rows = [r for r in args.rows if ROWS[r] == ranks]
                code = relaunch(__file__, argv + ["--rows", *rows, "--json", path],
                                ranks=ranks)
                if os.path.exists(path):
                    with open(path) as f:
                        entries += json.load(f)
                if code != 0:
                    print(f"bench_executor: the {ranks}-rank job exited with {code}")
        order = list(ROWS)
        entries.sort(key=lambda e: order.index(e["row"]))
        print_table(entries, args, int(os.environ.get("OMP_NUM_THREADS", "1")), load_before)
        missing = sorted(set(args.rows) - {e["row"] for e in entries})
        return 1 if missing or any("error" in e for e in entries) else 0
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    torch.manual_seed(0)
    entries = run_rows(args, args.rows)
    if dist.get_rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(entries, f)
    destroy_groups()  # the DDP and FSDP baselines are gone: collect, then destroy
    return 0


if __name__ == "__main__":
    sys.exit(main())
