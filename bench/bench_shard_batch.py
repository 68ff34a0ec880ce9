"""Does sharded data parallelism's per-unit cost grow with the batch? (not a timed test)

`calibrate --model` fits FSDP2's gather and reduce-scatter latencies on the model's own
data-parallel step at a quarter of `--batch` per replica, and the cost model then charges a
unit's collectives the same at every batch (they move parameter bytes). This measures that
claim: the same runs `calibrate` makes (`calibration._model_shard_runs`: the model's dp=2 step
unsharded, as zero2 and as zero3), at each per-replica batch, the batches interleaved round by
round, and prints per batch the median step of each kind and the two differences the fit uses
(zero2 - unsharded: a gather and a reduce-scatter per unit in place of DDP's all-reduce;
zero3 - zero2: one more gather per unit). docs/sharding.md "Calibrated" has a run.

    python bench/bench_shard_batch.py [--model hybridplan.models:branchy_cnn]
                                      [--batches 4,8,16,32,64] [--rounds 2] [--graph G.json]

--graph: the model's graph (`hybridplan profile`); only its node names are read, so without it
rank 0 profiles the model once, untimed. Runs itself under torchrun with 2 local processes, one
intra-op thread each.
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
    args = p.parse_args(argv)
    try:
        args.batch_list = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches: comma-separated positive integers (got {args.batches!r})")
    if not args.batch_list or min(args.batch_list) < 1 or args.rounds < 1:
        p.error("--batches and --rounds must be positive")
    if args.graph is not None and not args.graph.is_file():
        p.error(f"--graph: no such file: {args.graph}")
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
    for _ in range(args.rounds):
        for b in args.batch_list:
            for run in calibration._model_shard_runs(
                    args.model, graph, b * calibration.kModelShardBatchDivisor,
                    torch.device("cpu"), 2, 3, 15, args.timeout_s, rounds=1):
                steps[b][run["sharding"]].append(run["step_s"] * 1e3)
    if dist.get_rank() == 0:
        print(f"{args.model}: median step (ms) of {args.rounds} interleaved runs per batch")
        print("| per-replica batch | unsharded | zero2 | zero3 | zero2 - unsharded | "
              "zero3 - zero2 | zero2 runs |")
        print("|---|---|---|---|---|---|---|")
        for b in args.batch_list:
            m = {k: statistics.median(v) for k, v in steps[b].items()}
            runs = " / ".join(f"{x:.1f}" for x in steps[b]["zero2"])
            print(f"| {b} | {m['none']:.1f} | {m['zero2']:.1f} | {m['zero3']:.1f} | "
                  f"{m['zero2'] - m['none']:.1f} | {m['zero3'] - m['zero2']:.1f} | {runs} |")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
