"""`python -m hybridplan`: the Python-side commands (the planner's commands are the C++
`hybridplan` binary).

    python -m hybridplan profile hybridplan.models:branchy_cnn --input-shape 8,3,32,32 --out g.json
    python -m hybridplan profile hybridplan.models:gnmt_lstm --batch-size 8 --out g.json
    torchrun --nproc_per_node 2 -m hybridplan probe --out cluster.json
    torchrun --nproc_per_node 2 -m hybridplan calibrate --graph g.json --out cluster.json
    python -m hybridplan noise-scale hybridplan.models:branchy_cnn --small-batch 8 \
        --big-batch 128 --steps 50 --samples-per-epoch 50000 --per-replica-batch 32 \
        --epochs-at 256:30 --out job.json

Bad input exits 2 with a one-line message, as the C++ CLI does.
"""

import argparse
import importlib
import json
import math
import sys
from typing import List, Optional, Sequence, Tuple

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
    cal.add_argument("--warmup", type=int, default=3)
    cal.add_argument("--repeats", type=int, default=15)
    cal.add_argument("--timeout-s", type=float, default=120.0)
    cal.add_argument("--name", help="cluster name (default localhost-cpu / calibrated-cuda)")
    val = sub.add_parser("validate", help="run plans of a model on this machine and compare "
                                          "every term with its prediction")
    val.add_argument("--graph", required=True, help="the model's Graph JSON")
    val.add_argument("--cluster", required=True, help="Cluster JSON or preset name (a "
                                                      "calibrated one: hybridplan calibrate)")
    val.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                     help="the model (its module has example_inputs/example_target)")
    val.add_argument("--job", help="Job JSON (default: samples/s at the graph's batch)")
    val.add_argument("--devices", type=int, default=2)
    val.add_argument("--plans", type=int, default=8, help="how many plans to run")
    val.add_argument("--steps", type=int, default=20)
    val.add_argument("--warmup", type=int, default=5)
    val.add_argument("--rounds", type=int, default=3,
                     help="launches per plan, interleaved; each plan's row is its median launch")
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
    _add_noise_scale_parser(sub)
    return parser


def _load_factory(spec: str, command: str = "profile", what: str = "factory"):
    """The callable named by MODULE:NAME (NAME may be dotted); `what` names the argument."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{command}: {what} must be MODULE:{what.lstrip('-').upper()} "
                         f"(got {spec!r})")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{command}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{command}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{command}: {spec} is not callable")
    return obj


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
    try:
        from .planner import Graph  # validates and writes the canonical JSON
    except ImportError:
        Graph = None
    if args.out:
        if Graph is not None:
            Graph.from_dict(graph, source=args.out).save(args.out)
        else:
            from .probe import _atomic_write_json
            _atomic_write_json(args.out, graph)
        if not args.quiet:
            print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(json.dumps(graph, indent=2))
    return 0


def _probe(args) -> int:
    from .probe import DEFAULT_SIZES, probe

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
    from .calibration import calibrate

    if args.warmup < 0 or args.repeats < 3 or args.batch < 1:
        raise ValueError(f"calibrate: need --warmup >= 0, --repeats >= 3 and --batch >= 1 (got "
                         f"{args.warmup}, {args.repeats}, {args.batch})")
    cluster = calibrate(graph_path=args.graph, model=args.model, batch=args.batch, out=args.out,
                        name=args.name, warmup=args.warmup, repeats=args.repeats,
                        timeout_s=args.timeout_s)
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
    from .validation import markdown, validate

    if min(args.devices, args.plans, args.steps, args.rounds) < 1 or args.warmup < 0:
        raise ValueError(f"validate: need --devices, --plans, --steps, --rounds >= 1 and "
                         f"--warmup >= 0 (got {args.devices}, {args.plans}, {args.steps}, "
                         f"{args.rounds}, {args.warmup})")
    _load_factory(args.model, "validate", "--model")  # fail here, not in every rank
    result = validate(args.graph, args.cluster, args.model, job=args.job, devices=args.devices,
                      plans=args.plans, steps=args.steps, warmup=args.warmup,
                      timeout_s=args.timeout_s, out_dir=args.out_dir,
                      baseline_cluster=args.baseline_cluster, rounds=args.rounds,
                      recompute=args.recompute, sharding=args.sharding)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(markdown(result, "predicted vs measured"))
        print(f"wrote {args.out_dir}/validate.json, validate.md, scatter.png", file=sys.stderr)
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

    from .gradient_noise import noise_scale
    from .noise_scale_job import critical_batch_job

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
        from .planner import _atomic_write
        _atomic_write(args.out, json.dumps(job, indent=2))
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(json.dumps(job, indent=2))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        command = {"profile": _profile, "probe": _probe, "calibrate": _calibrate,
                   "validate": _validate, "noise-scale": _noise_scale}
        return command[args.command](args)
    except ValueError as exc:
        print(f"python -m hybridplan {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
