"""`python -m hybridplan`: the Python-side commands (the planner's commands are the C++
`hybridplan` binary).

    python -m hybridplan profile hybridplan.models:branchy_cnn --input-shape 8,3,32,32 --out g.json
    python -m hybridplan profile hybridplan.models:gnmt_lstm --batch-size 8 --out g.json
    torchrun --nproc_per_node 2 -m hybridplan probe --out cluster.json
    torchrun --nproc_per_node 2 -m hybridplan calibrate --graph g.json --out cluster.json
    python -m hybridplan noise-scale hybridplan.models:branchy_cnn --small-batch 8 \
        --big-batch 128 --steps 50 --samples-per-epoch 50000 --per-replica-batch 32 \
        --epochs-at 256:30 --out job.json
    python -m hybridplan explain plan.json --graph g.json --cluster c.json --trace plan.trace.json

    python -m hybridplan run --nproc-per-node 2 train.py [ARGS]   # torchrun --standalone ...
    python -m hybridplan graph-from-config --layers 96 --hidden 12288 --heads 96 \
        --seq-len 2048 --vocab 51200 --out gpt3.json          # no profiling: GEMM model

Bad input exits 2 with a one-line message, as the C++ CLI does.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from . import convergence, planner
from .factories import load_factory
from .files import write_text_atomic
from .gradient_noise.noise_scale import noise_scale
from .gradient_noise.noise_scale_job import critical_batch_job
from .measure import time_to_target, validation
from .trace import predicted_trace, write_trace
from .trainers import cli as trainers_cli

# A command that needs torch imports it, and the modules that import torch at their top
# (models, profiler, measure.probe, measure.calibration), inside its function: the planner's
# commands and `run` work where torch is not installed.

EXIT_BAD_INPUT = 2


def _parse_shape(text: str) -> List[int]:
    try:
        shape = [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers (got {text!r})")
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"dimensions must be >= 1 (got {text!r})")
    return shape


def _parse_sizes(text: str) -> List[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated byte counts (got {text!r})")


def _parse_epochs_at(text: str) -> Tuple[float, float]:
    batch, sep, epochs = text.partition(":")
    try:
        point = (float(batch), float(epochs))
    except ValueError:
        point = None
    if not sep or point is None or not all(math.isfinite(v) and v > 0 for v in point):
        raise argparse.ArgumentTypeError(f"must be GLOBAL_BATCH:EPOCHS, both > 0 (got {text!r})")
    return point


def _positive(convert):
    """An argparse type: `convert(text)` (int or float), finite and > 0."""
    rule = "an integer >= 1" if convert is int else "finite and > 0"

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be {rule} (got {text!r})")
        return value
    return parse


def _add_noise_scale_parser(sub) -> None:
    ns = sub.add_parser("noise-scale", help="measure the gradient noise scale B_simple and write "
                                            "a Job with it as the critical batch")
    ns.add_argument("factory", metavar="MODULE:FACTORY",
                    help="a callable returning the nn.Module, e.g. hybridplan.models:branchy_cnn")
    ns.add_argument("--data", metavar="MODULE:FUNC",
                    help="data(batch_size, step) -> (inputs, target); default: the module's "
                         "example_inputs/example_target seeded by step")
    ns.add_argument("--loss", metavar="MODULE:FUNC",
                    help="loss(output, target), mean over the batch; default: the module's loss")
    ns.add_argument("--small-batch", type=_positive(int), default=8)
    ns.add_argument("--big-batch", type=_positive(int), default=128)
    ns.add_argument("--steps", type=_positive(int), default=50)
    ns.add_argument("--device", default="cpu")
    ns.add_argument("--threads", type=int, help="torch.set_num_threads before measuring")
    ns.add_argument("--samples-per-epoch", type=_positive(int), required=True)
    batch = ns.add_mutually_exclusive_group()
    batch.add_argument("--per-replica-batch", type=_positive(int))
    batch.add_argument("--global-batch", type=_positive(int))
    ns.add_argument("--optimizer", default="sgd_momentum", choices=("sgd", "sgd_momentum", "adam"))
    epochs = ns.add_mutually_exclusive_group(required=True)
    epochs.add_argument("--epochs-min", type=_positive(float),
                        help="epochs to target as the global batch goes to 0")
    epochs.add_argument("--epochs-at", type=_parse_epochs_at, metavar="B:E",
                        help="epochs E measured at global batch B; epochs_min = E / (1 + B / "
                             "B_simple)")
    ns.add_argument("--out", help="write the Job JSON here (default: stdout)")


def _add_run_parser(sub) -> None:
    run = sub.add_parser("run", help="launch a training script (one that calls "
                                     "hybridplan.parallelize) with torchrun")
    run.add_argument("--nproc-per-node", "--nproc_per_node", type=_positive(int), default=1,
                     help="processes on this machine (one per device; default 1)")
    run.add_argument("--nnodes", type=_parse_nnodes, default=1,
                     help="machines (default 1), or MIN:MAX for an elastic job that goes on "
                          "with as few as MIN (torchrun's c10d rendezvous at --master-addr)")
    run.add_argument("--max-restarts", "--max_restarts", type=int, default=0,
                     help="restarts of the whole group after a rank fails (a script applying "
                          "with resume_from=\"latest\" resumes its newest checkpoint; "
                          "default 0)")
    run.add_argument("--node-rank", "--node_rank", type=int, default=0)
    run.add_argument("--master-addr", "--master_addr",
                     help="rank 0's machine (several machines; default: this one, standalone)")
    run.add_argument("--master-port", "--master_port", type=int, default=29500)
    run.add_argument("script", help="the training script, e.g. train.py")
    run.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")


def _parse_nnodes(text: str) -> Any:
    """--nnodes: N (> 0) or MIN:MAX (0 < MIN <= MAX)."""
    lo, sep, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be N or MIN:MAX (got {text!r})") from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"must have 0 < MIN <= MAX (got {text!r})")
    return low if low == high else f"{low}:{high}"


def torchrun_command(nproc_per_node: int, script: str, script_args: Sequence[str] = (),
                     nnodes: Any = 1, node_rank: int = 0, master_addr: Optional[str] = None,
                     master_port: int = 29500, max_restarts: int = 0) -> List[str]:
    """The torchrun command line `run` executes (the environment's torchrun, else python -m
    torch.distributed.run): --standalone on one machine, a static rendezvous at
    master_addr:master_port across several, torchrun's c10d rendezvous there when nnodes is
    "MIN:MAX" (elastic); --max-restarts when max_restarts > 0."""
    launcher = ([shutil.which("torchrun")] if shutil.which("torchrun")
                else [sys.executable, "-m", "torch.distributed.run"])
    if max_restarts < 0:
        raise ValueError(f"run: --max-restarts must be >= 0 (got {max_restarts})")
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    if nnodes == 1 and master_addr is None:
        where = ["--standalone"]
    elif master_addr is None:
        raise ValueError("run: --nnodes > 1 needs --master-addr (rank 0's machine)")
    elif isinstance(nnodes, str):  # MIN:MAX: members come and go, c10d's rendezvous
        where = ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"{master_addr}:{master_port}"]
    else:
        where = ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr",
                 master_addr, "--master-port", str(master_port)]
    return launcher + where + restarts + ["--nproc-per-node", str(nproc_per_node), script,
                                          *script_args]


def _run(args) -> int:
    if not os.path.exists(args.script):
        raise ValueError(f"run: {args.script}: no such script")
    cmd = torchrun_command(args.nproc_per_node, args.script, args.script_args, args.nnodes,
                           args.node_rank, args.master_addr, args.master_port,
                           args.max_restarts)
    env = None
    if args.max_restarts or isinstance(args.nnodes, str):
        # every restart a TCPStore of its own: torchrun's agents otherwise share theirs across
        # attempts and a restarted worker can read the killed attempt's keys (executor's
        # _restart_prefix covers one agent; several count their restarts each on its own)
        env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    print("python -m hybridplan run: " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, env=env)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hybridplan")
    sub = parser.add_subparsers(dest="command", required=True)

    prof = sub.add_parser("profile", help="profile a module into a Graph JSON")
    prof.add_argument("factory", metavar="MODULE:FACTORY",
                      help="a callable returning the nn.Module, e.g. hybridplan.models:branchy_cnn")
    prof.add_argument("--input-shape", type=_parse_shape, action="append", default=[],
                      help="shape of one positional input, e.g. 8,3,32,32 (repeat for more "
                           "inputs); default: the module's example_inputs(--batch-size)")
    prof.add_argument("--input-dtype", action="append", default=[],
                      help="dtype of each input (one for all, or one per --input-shape); "
                           "integer inputs hold random ids in [0, --int-high)")
    prof.add_argument("--int-high", type=int, default=2)
    prof.add_argument("--batch-size", type=int, default=8,
                      help="batch for the module's own example_inputs (without --input-shape)")
    prof.add_argument("--device", default="cpu")
    prof.add_argument("--warmup", type=int)  # default: hybridplan.profile's
    prof.add_argument("--repeats", type=int)
    prof.add_argument("--clock", default="auto", choices=("auto", "wall", "thread", "cuda"))
    prof.add_argument("--threads", type=int, help="torch.set_num_threads before profiling")
    prof.add_argument("--name", help="graph name (default: the factory's name)")
    prof.add_argument("--out", help="write the Graph JSON here (default: stdout)")
    prof.add_argument("--quiet", action="store_true", help="no progress output")

    probe = sub.add_parser("probe", help="measure links and devices into a Cluster JSON "
                                         "(run under torchrun)")
    probe.add_argument("--out", required=True, help="Cluster JSON path (rank 0 writes it)")
    probe.add_argument("--sizes", type=_parse_sizes,
                       help="message sizes in bytes, comma-separated")
    probe.add_argument("--warmup", type=int, default=2)
    probe.add_argument("--repeats", type=int, default=10)
    probe.add_argument("--timeout-s", type=float, default=60.0)
    probe.add_argument("--name", help="cluster name (default localhost-cpu / probed-cuda)")
    cal = sub.add_parser("calibrate", help="measure what the executor pays on this machine into "
                                           "a Cluster JSON (run under torchrun)")
    cal.add_argument("--out", required=True, help="Cluster JSON path (rank 0 writes it)")
    cal.add_argument("--graph", help="the Graph JSON to size messages for (its gradient bytes "
                                     "and largest edge); with --model, the per-action cost is "
                                     "fitted on that model's own pipeline, and compute factors "
                                     "are taken against the graph when it is the model's "
                                     "profile at --batch")
    cal.add_argument("--model", metavar="MODULE:FACTORY",
                     help="workload for the shared-core measurement (default: the built-in "
                          "branchy_cnn) and, with --graph, for the pipeline runs")
    cal.add_argument("--batch", type=int, default=32, help="the workload's batch")
    cal.add_argument("--compile-graph", metavar="OUT",
                     help="with --graph and --model: time each graph node of the model "
                          "compiled (torch.compile, one graph per block) against eager on rank "
                          "0 and write the graph with each node's compile_speedup to OUT (what "
                          "a Job with \"compile\": true prices)")
    cal.add_argument("--warmup", type=int, default=3)
    cal.add_argument("--repeats", type=int, default=15)
    cal.add_argument("--timeout-s", type=float, default=120.0)
    cal.add_argument("--name", help="cluster name (default localhost-cpu / calibrated-cuda)")
    val = sub.add_parser("validate", help="run plans of a model on this machine and compare "
                                          "every term with its prediction")
    val.add_argument("--graph", required=True, help="the model's Graph JSON")
    val.add_argument("--cluster", required=True, help="Cluster JSON or preset name (a "
                                                      "calibrated one: hybridplan calibrate)")
    val.add_argument("--model", metavar="MODULE:FACTORY",
                     help="the model (its module has example_inputs/example_target); required "
                          "unless --time-to-target (the task names the model)")
    val.add_argument("--job", help="Job JSON (default: samples/s at the graph's batch)")
    val.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                     help="the job's precision (default: the --job's, else fp32): the plans "
                          "are the planner's for it and each rank runs its plan in it; a 16-bit "
                          "one needs the cluster's compute_speedup as calibrate measured it")
    val.add_argument("--devices", type=int, default=2)
    val.add_argument("--plans", type=int, default=8, help="how many plans to run")
    val.add_argument("--steps", type=int, default=20)
    val.add_argument("--warmup", type=int, default=5)
    val.add_argument("--rounds", type=int, default=3,
                     help="launches per plan, interleaved; each plan's row is its median launch")
    val.add_argument("--max-launches", type=int, default=None,
                     help="launches of a plan, in extra rounds, until the bootstrap 90 %% "
                          "interval of its launches' median step lies within +-5 %% (default 7, "
                          "or --rounds if more); a plan still wider is unsteady on this host")
    val.add_argument("--timeout-s", type=float, default=120.0)
    val.add_argument("--out-dir", default="out/validate")
    val.add_argument("--baseline-cluster", metavar="CLUSTER",
                     help="also predict the same measured plans with this cluster (e.g. the "
                          "uncalibrated preset localhost-cpu): its errors side by side")
    val.add_argument("--recompute", action="store_true",
                     help="also run the first data-parallel and pipeline plans with every node "
                          "recomputed (activation checkpointing)")
    val.add_argument("--sharding", action="store_true",
                     help="also run the first data-parallel plan as zero2 and zero3 and the "
                          "first pipeline plan with dp >= 2 as zero2 (sharded data parallelism)")
    val.add_argument("--json", action="store_true", help="print the result as JSON")
    tta = val.add_argument_group(
        "time to target", "train plans spanning global batches to the task's target and "
        "compare predicted with measured time to target "
        "(hybridplan/measure/time_to_target.py)")
    tta.add_argument("--time-to-target", action="store_true",
                     help="this mode (needs --task and a --job with a convergence model)")
    tta.add_argument("--task", help="convergence task JSON (as `convergence --task`)")
    tta.add_argument("--noise-job", help="a second Job whose convergence model is the noise "
                                         "scale's (`convergence` writes job-noise-scale.json)")
    tta.add_argument("--seeds", type=_parse_sizes, default=[0, 1, 2],
                     help="seeds, comma-separated: each plan is trained once per seed")
    tta.add_argument("--dp-batches", type=_parse_sizes, default=[8, 128],
                     help="the two per-replica batches of the data-parallel plans")
    tta.add_argument("--one-process", metavar="CONVERGENCE.json",
                     help="the `convergence` record: one-process steps to target beside each "
                          "plan's")
    exp = sub.add_parser("explain", help="describe a plan in words (as the C++ `hybridplan "
                                         "explain`) and, with --trace, write its predicted "
                                         "schedule for Perfetto / chrome://tracing")
    exp.add_argument("plan", help="Plan JSON")
    exp.add_argument("--graph", help="the plan's Graph JSON: names its nodes")
    exp.add_argument("--cluster", help="Cluster JSON or preset name (needs --graph): checks "
                                       "the plan against both and evaluates it again")
    exp.add_argument("--job", help="Job JSON (needs --cluster)")
    exp.add_argument("--trace", metavar="OUT.json",
                     help="write the predicted step as a Chrome trace-event JSON, one thread "
                          "per rank (a pipeline plan needs --graph and --cluster: its "
                          "schedule is simulated)")
    exp.add_argument("--quiet", action="store_true", help="do not print the explanation")
    _add_noise_scale_parser(sub)
    _add_convergence_parser(sub)
    _add_run_parser(sub)
    _add_graph_from_config_parser(sub)
    trainers_cli.add_parsers(sub)   # export, evaluate-config
    return parser


def _add_graph_from_config_parser(sub) -> None:
    gc = sub.add_parser("graph-from-config",
                        help="a GPT-style decoder's Graph JSON from its configuration, priced "
                             "by the GEMM efficiency model instead of profiled "
                             "(hybridplan/profiler/from_config.py)")
    gc.add_argument("--name", default="gpt", help="graph name")
    for flag in ("layers", "hidden", "heads", "seq-len", "vocab"):
        gc.add_argument(f"--{flag}", type=_positive(int), required=True)
    gc.add_argument("--ffn-hidden", type=_positive(int), help="MLP width (default 4 x hidden)")
    gc.add_argument("--micro-batch", type=_positive(int), default=1,
                    help="sequences at profiled.batch_size (batch_times at 2, 4, ... 64 times it)")
    gc.add_argument("--dtype-bytes", type=_positive(int), default=2,
                    help="bytes per activation and weight element (2: fp16/bf16)")
    gc.add_argument("--param-bytes-per-param", type=_positive(int),
                    help="bytes each parameter counts for in param_bytes (default --dtype-bytes;"
                         " 4 prices mixed-precision Adam's 16 bytes under the job's adam)")
    gc.add_argument("--device", default="A100",
                    help="A100 or H100, or a cluster's device name (GEMM efficiency data)")
    gc.add_argument("--efficiency-scale", type=_positive(float), default=1.0,
                    help="multiply the achievable GEMM FLOP/s (sensitivity)")
    gc.add_argument("--parallel-cross-entropy", action="store_true",
                    help="the LM head keeps its logits split (Megatron-LM's vocab-parallel "
                         "cross-entropy) instead of gathering them")
    gc.add_argument("--vocab-multiple", type=_positive(int), default=128,
                    help="pad the vocabulary to a multiple of this (Megatron-LM's default 128)")
    gc.add_argument("--out", help="write the Graph JSON here (default: stdout)")


def _graph_from_config(args) -> int:
    from .profiler.from_config import TransformerConfig, graph_from_config

    cfg = TransformerConfig(args.name, args.layers, args.hidden, args.heads, args.seq_len,
                            args.vocab, ffn_hidden=args.ffn_hidden, dtype_bytes=args.dtype_bytes,
                            param_bytes_per_param=args.param_bytes_per_param)
    g = planner.Graph.from_dict(
        graph_from_config(cfg, device=args.device, micro_batch=args.micro_batch,
                          efficiency_scale=args.efficiency_scale,
                          parallel_cross_entropy=args.parallel_cross_entropy,
                          vocab_multiple=args.vocab_multiple),
        f"graph-from-config {args.name}")
    if args.out:
        g.save(args.out)
        print(f"-> {args.out}: {len(g.nodes)} nodes, {cfg.num_parameters() / 1e9:.2f} B "
              f"parameters", file=sys.stderr)
    else:
        print(g.to_json())
    return 0


_load_factory = load_factory  # the one loader (factories.py); commands call it by this name


def _example_inputs(args, module) -> tuple:
    import torch

    if not args.input_shape:
        if not hasattr(module, "example_inputs"):
            raise ValueError(f"profile: {type(module).__name__} has no example_inputs(); "
                             "give --input-shape")
        return tuple(module.example_inputs(args.batch_size))
    dtypes = args.input_dtype or ["float32"]
    if len(dtypes) not in (1, len(args.input_shape)):
        raise ValueError(f"profile: give one --input-dtype or one per --input-shape "
                         f"(got {len(dtypes)} for {len(args.input_shape)} inputs)")
    dtypes = dtypes * len(args.input_shape) if len(dtypes) == 1 else dtypes
    g = torch.Generator().manual_seed(0)
    inputs = []
    for shape, name in zip(args.input_shape, dtypes):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"profile: --input-dtype {name!r} is not a torch dtype")
        if dtype.is_floating_point:
            inputs.append(torch.randn(shape, generator=g).to(dtype))
        else:
            inputs.append(torch.randint(0, args.int_high, shape, generator=g, dtype=dtype))
    return tuple(inputs)


def _profile(args) -> int:
    import torch

    from . import models
    from .profiler import dataflow, profile_dict

    if args.threads:
        torch.set_num_threads(args.threads)
    factory = _load_factory(args.factory)
    module = factory()
    inputs = _example_inputs(args, module)
    name = args.name or args.factory.partition(":")[2].split(".")[-1]
    counts = {k: v for k, v in (("warmup", args.warmup), ("repeats", args.repeats)) if v is not None}
    batch = next(t for t in dataflow.tensors_in(inputs)).shape[0]
    loss_fn, target = models.loss_and_target(module, batch)  # the executor's default loss
    graph = profile_dict(module, inputs, device=args.device, verbose=not args.quiet, name=name,
                         clock=args.clock, loss_fn=loss_fn, target=target, **counts)
    if args.out:
        # the planner's Graph validates the document and writes its canonical JSON
        planner.Graph.from_dict(graph, source=args.out).save(args.out)
        if not args.quiet:
            print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(json.dumps(graph, indent=2))
    return 0


def _probe(args) -> int:
    from .measure.probe import DEFAULT_SIZES, probe

    cluster = probe(sizes_bytes=args.sizes or DEFAULT_SIZES, warmup=args.warmup,
                    repeats=args.repeats, timeout_s=args.timeout_s, name=args.name,
                    out=args.out)
    if cluster is not None:
        intra = cluster["intra_node"]
        print(f"wrote {args.out}: intra_node latency {intra['latency_s'] * 1e6:.1f} us, "
              f"bandwidth {intra['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s, peak "
              f"{cluster['device']['peak_flops'] / 1e9:.1f} GFLOP/s", file=sys.stderr)
    return 0


def _calibrate(args) -> int:
    from .measure.calibration import calibrate

    if args.warmup < 0 or args.repeats < 3 or args.batch < 1:
        raise ValueError(f"calibrate: need --warmup >= 0, --repeats >= 3 and --batch >= 1 (got "
                         f"{args.warmup}, {args.repeats}, {args.batch})")
    cluster = calibrate(graph_path=args.graph, model=args.model, batch=args.batch, out=args.out,
                        name=args.name, warmup=args.warmup, repeats=args.repeats,
                        timeout_s=args.timeout_s, compile_graph=args.compile_graph)
    if cluster is not None:
        rt, intra = cluster["runtime"], cluster["intra_node"]
        print(f"wrote {args.out}: p2p {intra['latency_s'] * 1e6:.0f} us + "
              f"{intra['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, all-reduce link "
              f"{intra['allreduce']['latency_s'] * 1e6:.0f} us + "
              f"{intra['allreduce']['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, step "
              f"{rt['step_s'] * 1e3:.2f} ms, pipeline action "
              + (", ".join(f"{v * 1e3:.2f} ms ({k})" for k, v in rt["schedule_action_s"].items())
                 if rt.get("schedule_action_s") else f"{rt['action_s'] * 1e3:.2f} ms") + ", "
              f"optimizer {rt['optimizer_tensor_s'] * 1e6:.1f} us per tensor, "
              "compute x" + ", x".join(f"{f:.2f} with {k} process{'es' if k > 1 else ''}"
                                       for k, f in rt["shared_host_slowdown"]),
              file=sys.stderr)
    return 0


def _validate(args) -> int:
    if args.time_to_target:
        if args.precision:
            raise ValueError("validate: --precision is for the plans' validation (the "
                             "--time-to-target job names its own precision)")
        return _validate_time_to_target(args)
    if not args.model:
        raise ValueError("validate: --model is required (or --time-to-target with --task)")
    if min(args.devices, args.plans, args.steps, args.rounds) < 1 or args.warmup < 0:
        raise ValueError(f"validate: need --devices, --plans, --steps, --rounds >= 1 and "
                         f"--warmup >= 0 (got {args.devices}, {args.plans}, {args.steps}, "
                         f"{args.rounds}, {args.warmup})")
    if args.max_launches is not None and args.max_launches < args.rounds:
        raise ValueError(f"validate: --max-launches must be >= --rounds ({args.rounds}) "
                         f"(got {args.max_launches})")
    _load_factory(args.model, "validate", "--model")  # fail here, not in every rank
    result = validation.validate(args.graph, args.cluster, args.model, job=args.job,
                                 devices=args.devices, plans=args.plans, steps=args.steps,
                                 warmup=args.warmup, timeout_s=args.timeout_s,
                                 out_dir=args.out_dir, baseline_cluster=args.baseline_cluster,
                                 rounds=args.rounds, recompute=args.recompute,
                                 sharding=args.sharding, max_launches=args.max_launches,
                                 precision=args.precision)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(validation.markdown(result, "predicted vs measured"))
        print(f"wrote {args.out_dir}/validate.json, validate.md, scatter.png and a trace per "
              "plan (trace-*.json: ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    return 0


def _read_json(path: str, what: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the {what} ({e})") from None


def _validate_time_to_target(args) -> int:
    if not args.task or not args.job:
        raise ValueError("validate --time-to-target: needs --task and --job")
    if len(args.dp_batches) != 2:
        raise ValueError(f"validate: --dp-batches must be two batches (got {args.dp_batches})")
    convergence.task_from_spec(_read_json(args.task, "task"), args.task)  # fail here, not in ranks
    job = _read_json(args.job, "job")
    if "convergence" not in job:
        raise ValueError(f"{args.job}: convergence is required for --time-to-target (a Job "
                         "written by `python -m hybridplan convergence`)")
    result = time_to_target.validate_time_to_target(
        args.graph, args.cluster, args.task, job,
        noise_job=_read_json(args.noise_job, "job") if args.noise_job else None,
        devices=args.devices, seeds=args.seeds, dp_batches=tuple(args.dp_batches),
        timeout_s=args.timeout_s, out_dir=args.out_dir,
        one_process=_read_json(args.one_process, "convergence record") if args.one_process
        else None)
    print(json.dumps(result, indent=1) if args.json else time_to_target.markdown(result))
    print(f"wrote {args.out_dir}/time_to_target.json and time_to_target.md", file=sys.stderr)
    return 0


def _explain(args) -> int:
    if args.cluster and not args.graph:
        raise ValueError("explain: --cluster needs --graph")
    if args.job and not args.cluster:
        raise ValueError("explain: --job needs --cluster")
    plan = planner.load_plan(args.plan)
    if args.trace and plan.mode == "pipeline" and not args.cluster:
        raise ValueError("explain: --trace of a pipeline plan needs --graph and --cluster (the "
                         "cost model simulates its schedule)")
    graph = cluster = job = None
    if args.graph:
        graph = planner.load_graph(args.graph)
    if args.cluster:
        cluster, job = planner.load_cluster(args.cluster), (
            planner.load_job(args.job) if args.job else None)
        # as the C++ explain: checked against the graph and cluster, then evaluated again
        plan.validate(graph, cluster)
        plan = planner.reevaluated(plan.to_dict(), graph, cluster, job)
    if not args.quiet:
        print(planner.explain(plan, graph, cluster, job), end="")
    if args.trace:
        write_trace(args.trace, predicted_trace(plan, graph, cluster, job))
        print(f"wrote {args.trace} (open it in ui.perfetto.dev or chrome://tracing)",
              file=sys.stderr)
    return 0


def _default_data(module, device: str):
    """data(batch_size, step) from a built-in model's seeded example data: a fresh sample per
    step, the same for both batch sizes' first rows where the model draws them in order."""
    for name in ("example_inputs", "example_target"):
        if not hasattr(module, name):
            raise ValueError(f"noise-scale: {type(module).__name__} has no {name}(); give --data")

    def data(batch_size: int, step: int):
        inputs = module.example_inputs(batch_size, seed=2 * step)
        target = module.example_target(batch_size, seed=2 * step + 1)
        return tuple(x.to(device) for x in inputs), target.to(device)
    return data


def _noise_scale(args) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    module = _load_factory(args.factory, "noise-scale")().to(args.device)
    data = (_load_factory(args.data, "noise-scale", "--data") if args.data
            else _default_data(module, args.device))
    if args.loss:
        loss_fn = _load_factory(args.loss, "noise-scale", "--loss")
    elif hasattr(module, "loss"):
        loss_fn = module.loss
    else:
        raise ValueError(f"noise-scale: {type(module).__name__} has no loss(); give --loss")
    est = noise_scale(module, data, loss_fn, args.small_batch, args.big_batch, args.steps)
    print(f"B_simple {est.b_simple:.4g} +- {est.stderr:.2g} (|G|^2 {est.g_squared:.4g} +- "
          f"{est.g_squared_stderr:.2g}, tr(Sigma) {est.trace_sigma:.4g} +- "
          f"{est.trace_sigma_stderr:.2g}; batches {est.small_batch} and {est.big_batch}, "
          f"{est.steps} steps)", file=sys.stderr)
    job = critical_batch_job(est, args.samples_per_epoch, epochs_min=args.epochs_min,
                             epochs_at=args.epochs_at, per_replica_batch=args.per_replica_batch,
                             global_batch=args.global_batch, optimizer=args.optimizer,
                             model=args.factory)
    if args.out:
        write_text_atomic(args.out, json.dumps(job, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(json.dumps(job, indent=2))
    return 0


def _add_convergence_parser(sub) -> None:
    conv = sub.add_parser(
        "convergence", help="train to a target at several global batches and seeds: steps to "
                            "target, the fitted critical batch beside the gradient noise scale, "
                            "and a Job with the measured convergence model")
    conv.add_argument("--task",
                      help="task JSON: model, data, optimizer, lr_rule, target (docs/formats.md)")
    conv.add_argument("--refit", metavar="CONVERGENCE.json",
                      help="fit again the runs of an earlier record (no training) and rewrite "
                           "its outputs in --out-dir")
    conv.add_argument("--batches", type=_parse_sizes, default=[8, 16, 32, 64, 128, 256, 512],
                      help="global batches, comma-separated")
    conv.add_argument("--seeds", type=_parse_sizes, default=[0, 1, 2],
                      help="seeds, comma-separated (model initialisation and data order)")
    conv.add_argument("--branched", action="store_true",
                      help="branch short runs from one run's halfway point instead of training "
                           "every batch from initialisation")
    conv.add_argument("--noise", type=_parse_sizes, default=[8, 512, 50],
                      metavar="SMALL,BIG,STEPS", help="the noise scale's batches and steps")
    conv.add_argument("--per-replica-batch", type=_parse_sizes,
                      help="the written Job's per-replica batch candidates")
    conv.add_argument("--out-dir", default="out/convergence")
    conv.add_argument("--quiet", action="store_true", help="no line per run")


def _convergence(args) -> int:
    if (args.task is None) == (args.refit is None):
        raise ValueError("convergence: give --task (measure) or --refit (fit a record again)")
    if args.refit:
        result = convergence.refit(_read_json(args.refit, "convergence record"), args.refit)
    else:
        spec = _read_json(args.task, "task")
        task = convergence.task_from_spec(spec, args.task)
        if len(args.noise) != 3:
            raise ValueError(f"convergence: --noise must be SMALL,BIG,STEPS (got {args.noise})")

        def line(run):
            if not args.quiet:
                print(f"B={run.global_batch:<5d} seed={run.seed} "
                      f"{'steps to target' if run.reached else 'NOT reached after'} "
                      f"{run.steps} ({run.epochs:.2f} epochs)", flush=True)
        result = convergence.measure_tradeoff(
            task, args.batches, args.seeds, mode="branched" if args.branched else "full",
            noise=tuple(args.noise), optimizer=spec["optimizer"],
            per_replica_batch=args.per_replica_batch, progress=line)
        result["task"] = spec
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    planner.Job.from_dict(result["job"], "measured job")  # the planner's own validation
    write_text_atomic(out / "convergence.json", json.dumps(result, indent=1))
    write_text_atomic(out / "job.json", json.dumps(result["job"], indent=1))
    if result["noise_job"] is not None:
        write_text_atomic(out / "job-noise-scale.json", json.dumps(result["noise_job"], indent=1))
    (out / "convergence.md").write_text(convergence.markdown(result))
    convergence.plot(result, os.fspath(out / "tradeoff.png"))
    print(convergence.markdown(result))
    print(f"-> {out}/convergence.json, job.json, convergence.md, tradeoff.png")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        command = {"profile": _profile, "probe": _probe, "calibrate": _calibrate,
                   "validate": _validate, "explain": _explain, "noise-scale": _noise_scale}
        command["run"] = _run
        command["convergence"] = _convergence
        command["graph-from-config"] = _graph_from_config
        command.update(trainers_cli.COMMANDS)
        return command[args.command](args)
    except ValueError as exc:
        print(f"python -m hybridplan {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
