"""Does sharded data parallelism's cost grow with the batch, as the cost model says? (not a
timed test)

`calibrate --model` fits FSDP2's gather and reduce-scatter latencies and the sharded step's
compute slowdown (runtime.sharded_compute_slowdown: the ranks meet at every unit) on the
model's own data-parallel step at two per-replica batches, a quarter of `--batch` and twice it.
This measures that claim: the same runs `calibrate` makes (`calibration._model_shard_runs`: the
model's dp=2 step unsharded, as zero2 and as zero3) at each per-replica batch, the batches
interleaved round by round, and prints per batch the median step of each kind and the two
differences the fit uses (zero2 - unsharded: a gather and a reduce-scatter per unit in place of
DDP's all-reduce, plus the slowdown's share of the compute; zero3 - zero2: one more gather per
unit). With --cluster (a calibrated cluster.json for its links) it then fits as calibrate does
on the runs at the smallest and largest batch only and prints, for every batch, the sharded
steps predicted beside measured: the batches between are ones the fit never saw.
docs/sharding.md "Calibrated" has runs.

    python bench/bench_shard_batch.py [--model hybridplan.models:branchy_cnn]
                                      [--batches 4,8,16,32,64] [--rounds 2] [--graph G.json]
                                      [--cluster cluster.json]

--graph: the model's graph (`hybridplan profile`; needed with --cluster, whose fit evaluates
plans over it); without it rank 0 profiles the model once, untimed. Runs itself under torchrun
with 2 local processes, one intra-op thread each.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from torchrun_relaunch import relaunch  # this folder


def _arguments(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graph", type=Path)
    p.add_argument("--model", default="hybridplan.models:branchy_cnn")
    p.add_argument("--batches", default="4,8,16,32,64",
                   help="per-replica batches, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--cluster", type=Path,
                   help="a calibrated cluster.json: fit on the end batches, predict the others")
    args = p.parse_args(argv)
    try:
        args.batch_list = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches: comma-separated positive integers (got {args.batches!r})")
    if not args.batch_list or min(args.batch_list) < 1 or args.rounds < 1:
        p.error("--batches and --rounds must be positive")
    if args.graph is not None and not args.graph.is_file():
        p.error(f"--graph: no such file: {args.graph}")
    if args.cluster is not None and (args.graph is None or not args.cluster.is_file()):
        p.error("--cluster needs an existing cluster.json and --graph")
    return args


def main(argv=None) -> int:
    args = _arguments(argv)
    code = relaunch(__file__, sys.argv[1:] if argv is None else argv)  # under torchrun with 2 local ranks
    if code is not None:
        return code

    import torch
    import torch.distributed as dist

    from hybridplan.measure import calibration

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    graph = [json.loads(args.graph.read_text()) if args.graph else None]
    if graph[0] is None:  # the structure only: one untimed pass, on rank 0
        if dist.get_rank() == 0:
            from hybridplan.factories import load_factory
            from hybridplan.models import loss_and_target
            from hybridplan.profiler.profile import profile_dict

            module = load_factory(args.model)()
            loss_fn, target = loss_and_target(module, 2)
            graph[0] = profile_dict(module, module.example_inputs(2), warmup=0, repeats=1,
                                    verbose=False, batch_sizes=[1], loss_fn=loss_fn,
                                    target=target)
        dist.broadcast_object_list(graph, src=0)
    graph = graph[0]
    steps = {b: {k: [] for k in calibration.kShardKinds} for b in args.batch_list}
    runs = []
    for _ in range(args.rounds):
        for b in args.batch_list:
            for run in calibration._model_shard_runs(
                    args.model, graph, [b], torch.device("cpu"), 2, 3, 15, args.timeout_s,
                    rounds=1):
                steps[b][run["sharding"]].append(run["step_s"] * 1e3)
                runs.append(run)
    if dist.get_rank() == 0:
        print(f"{args.model}: median step (ms) of {args.rounds} interleaved runs per batch")
        print("| per-replica batch | unsharded | zero2 | zero3 | zero2 - unsharded | "
              "zero3 - zero2 | zero2 runs |")
        print("|---|---|---|---|---|---|---|")
        for b in args.batch_list:
            m = {k: statistics.median(v) for k, v in steps[b].items()}
            line = " / ".join(f"{x:.1f}" for x in steps[b]["zero2"])
            print(f"| {b} | {m['none']:.1f} | {m['zero2']:.1f} | {m['zero3']:.1f} | "
                  f"{m['zero2'] - m['none']:.1f} | {m['zero3'] - m['zero2']:.1f} | {line} |")
        if args.cluster is not None:
            _predict_between(calibration, graph, json.loads(args.cluster.read_text()), runs,
                             steps, args.batch_list)
    dist.destroy_process_group()
    return 0


def _predict_between(calibration, graph, cluster, runs, steps, batches):
    """Fit as calibrate does on the smallest and largest batch's runs, then print every
    batch's sharded steps predicted beside measured."""
    from hybridplan.planner import Cluster, Graph, evaluate

    ends = (min(batches), max(batches))
    fit = calibration._fit_shard_latencies(graph, cluster, [r for r in runs
                                                           if r["per_replica_batch"] in ends])
    g, c = Graph.from_dict(graph, "graph"), Cluster.from_dict(cluster, "cluster")
    print(f"\nfitted on per-replica batches {ends[0]} and {ends[1]}: gather "
          f"{cluster['intra_node']['allgather']['latency_s'] * 1e3:.2f} ms, reduce-scatter "
          f"{cluster['intra_node']['reduce_scatter']['latency_s'] * 1e3:.2f} ms a unit, "
          f"slowdown {cluster['runtime']['sharded_compute_slowdown']:.3f}")
    print("| per-replica batch | kind | predicted | measured | error |")
    print("|---|---|---|---|---|")
    errors = []
    for b in batches:
        plans = {r["sharding"]: r["plan"] for r in runs if r["per_replica_batch"] == b}
        for kind in calibration.kShardKinds:
            predicted = evaluate(g, c, plans[kind])["step_s"] * 1e3
            measured = statistics.median(steps[b][kind])
            error = predicted / measured - 1
            if kind != "none" and b not in ends:
                errors.append(abs(error))
            print(f"| {b} | {kind} | {predicted:.1f} | {measured:.1f} | {error * 100:+.1f} % |")
    if errors:
        print(f"sharded plans at batches the fit never saw: median |error| "
              f"{statistics.median(errors) * 100:.1f} %, worst {max(errors) * 100:.1f} %")
    return fit


if __name__ == "__main__":
    sys.exit(main())
