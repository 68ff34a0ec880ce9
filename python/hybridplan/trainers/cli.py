"""`python -m hybridplan export`, `evaluate-config` and `plan --for`: the trainers'
configurations from the command line (docs/trainers.md).

    python -m hybridplan export plan.json --to torchtitan [--graph g.json] [--out job.toml]
    python -m hybridplan evaluate-config --from megatron args.txt --graph g.json \
        --cluster dgx-h100 [--job job.json] [--world-size N]
    python -m hybridplan plan --graph g.json --cluster dgx-h100 [--job job.json] \
        [--devices N] [--for TRAINER] [--out plan.json] [--config-out FILE]

export exits 0 and warns on stderr for each thing of the plan the trainer cannot express, and
exits 3 when the trainer can run none of the plan's parallel axes (every axis of degree > 1 is
lost: its file would describe a different job). plan and evaluate-config exit 3 when nothing
the trainer runs fits.
"""

from __future__ import annotations

import sys
from typing import List

from .. import planner
from ..files import write_text_atomic
from . import TRAINERS, best_for, plan_from, reduce, _write

EXIT_NOTHING_EXPRESSED = 3


def add_parsers(sub) -> None:
    exp = sub.add_parser("export", help="write a plan as a trainer's own configuration "
                                        "(torchtitan TOML, Megatron-LM arguments, DeepSpeed JSON, "
                                        "Accelerate YAML)")
    exp.add_argument("plan", help="Plan JSON")
    exp.add_argument("--to", required=True, choices=sorted(TRAINERS), dest="trainer")
    exp.add_argument("--graph", help="the plan's Graph JSON: its layer count sets the "
                                     "trainers' per-stage layer settings and its dtype the "
                                     "precision")
    exp.add_argument("--job", help="Job JSON (its precision sets the precision of a plan "
                                   "without one)")
    exp.add_argument("--out", help="write here instead of standard output")
    ev = sub.add_parser("evaluate-config", help="price a trainer's configuration on a graph "
                                                "and cluster, beside the best one that trainer "
                                                "can run")
    ev.add_argument("--from", required=True, choices=sorted(TRAINERS), dest="trainer")
    ev.add_argument("config", help="the trainer's configuration file")
    ev.add_argument("--graph", required=True, help="Graph JSON")
    ev.add_argument("--cluster", required=True, help="Cluster JSON or preset name")
    ev.add_argument("--job", help="Job JSON (a convergence model prices time to accuracy)")
    ev.add_argument("--world-size", type=int,
                    help="the devices the job is launched on (Megatron-LM takes it from "
                         "torchrun; the other trainers' files say it, and it is checked)")
    ev.add_argument("--out", help="write the better configuration here")
    pl = sub.add_parser("plan", help="the best plan for a graph and cluster; with --for, the "
                                     "best that trainer can run, and its configuration")
    pl.add_argument("--graph", required=True, help="Graph JSON")
    pl.add_argument("--cluster", required=True, help="Cluster JSON or preset name")
    pl.add_argument("--job", help="Job JSON (a convergence model plans for time to accuracy)")
    pl.add_argument("--devices", type=int, help="devices to use (default: the cluster's)")
    pl.add_argument("--for", choices=sorted(TRAINERS), dest="trainer",
                    help="search only what this trainer runs (its schedules, sharding kinds, "
                         "tensor parallelism, one recompute mode for every layer), each "
                         "candidate priced as the trainer would run it")
    pl.add_argument("--out", help="write the Plan JSON here")
    pl.add_argument("--config-out", help="with --for: write the trainer's configuration here "
                                         "(default: standard output)")


def export_command(args) -> int:
    plan = planner.Plan.load(args.plan)
    graph = None if args.graph is None else planner.Graph.load(args.graph)
    job = None if args.job is None else planner.Job.load(args.job)
    reduced = reduce(plan, args.trainer, graph, job)
    text = _write(args.trainer, reduced.layout, graph, plan)
    if args.out:
        write_text_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    name = TRAINERS[args.trainer].CAPABILITIES.name
    for what in reduced.unexpressed:
        print(f"python -m hybridplan export: warning: {what}", file=sys.stderr)
    axes = [a for a, degree in (("dp", plan.dp), ("mp", plan.mp), ("tp", plan.tp)) if degree > 1]
    if axes and set(axes) <= set(reduced.lost_axes):
        print(f"python -m hybridplan export: error: {name} can run none of the plan's "
              f"parallelism ({', '.join(axes)})", file=sys.stderr)
        return EXIT_NOTHING_EXPRESSED
    return 0


_TERMS = ("step_s", "compute_s", "bubble_s", "allreduce_s", "sharding_s", "transfer_s",
          "optimizer_s", "tp_comm_s", "time_to_train_s")


def _describe(plan: planner.Plan) -> str:
    parts = [f"dp {plan.dp}", f"tp {plan.tp}"]
    if plan.mode == "pipeline":
        parts += [f"pp {plan.mp} {plan.schedule} x{plan.num_microbatches} micro-batches"]
        if plan.virtual_stages > 1:
            parts.append(f"{plan.virtual_stages} stages/rank")
    if plan.sharding != "none":
        parts.append(plan.sharding + (f" (shard groups of {plan.dp_shard})"
                                      if plan.dp_shard < plan.dp else ""))
    kinds = {"selective" if n in plan.selective else "full" for n in plan.recompute}
    parts.append("recompute " + ("/".join(sorted(kinds)) if kinds else "none"))
    parts.append(f"global batch {plan.global_batch}")
    return ", ".join(parts)


def _table(yours: planner.Plan, best: planner.Plan) -> List[str]:
    a, b = yours.predicted, best.predicted
    rows = ["| term | yours | best | difference |", "| --- | ---: | ---: | ---: |"]
    for term in _TERMS:
        if a.get(term) or b.get(term):
            x, y = a.get(term, 0.0), b.get(term, 0.0)
            rows.append(f"| {term} | {x:.4g} | {y:.4g} | {y - x:+.4g} |")
    mem = lambda p: max(p.get("memory_bytes") or [0]) / 2 ** 30  # noqa: E731
    rows.append(f"| max memory per device (GiB) | {mem(a):.3g} | {mem(b):.3g} | "
                f"{mem(b) - mem(a):+.3g} |")
    rows.append(f"| samples/s | {a.get('samples_per_s', 0):.4g} | "
                f"{b.get('samples_per_s', 0):.4g} | |")
    return rows


def evaluate_command(args) -> int:
    graph = planner.Graph.load(args.graph)
    cluster = planner.Cluster.load(args.cluster)
    job = None if args.job is None else planner.Job.load(args.job)
    try:
        with open(args.config, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"{args.config}: cannot be read ({e.strerror})") from None
    yours = plan_from(args.trainer, text, graph, cluster, job, source=args.config,
                      world_size=args.world_size)
    name = TRAINERS[args.trainer].CAPABILITIES.name
    print(f"your {name} configuration ({yours.world_size} devices): {_describe(yours)}")
    try:
        best, best_text = best_for(args.trainer, graph, cluster, job, devices=yours.world_size)
    except planner.InfeasibleError as e:
        pred = yours.predicted
        print(f"predicted step {pred['step_s']:.4g} s, {pred['samples_per_s']:.4g} samples/s, "
              f"max memory per device {max(pred.get('memory_bytes') or [0]) / 2 ** 30:.3g} GiB")
        print(f"python -m hybridplan evaluate-config: infeasible: nothing {name} can run fits "
              f"on {yours.world_size} devices: {e}", file=sys.stderr)
        return EXIT_NOTHING_EXPRESSED
    print(f"best {name} can run on them: {_describe(best)}")
    print()
    print("\n".join(_table(yours, best)))
    key = "time_to_train_s" if yours.predicted.get("time_to_train_s") else None
    if key:
        gain = yours.predicted[key] / best.predicted[key]
        print(f"\ntime to accuracy {yours.predicted[key]:.4g} s -> {best.predicted[key]:.4g} s "
              f"({gain:.3g}x)")
    else:
        rate = lambda p: p.predicted["samples_per_s"]  # noqa: E731
        print(f"\nthroughput {rate(yours):.4g} -> {rate(best):.4g} samples/s "
              f"({rate(best) / rate(yours):.3g}x)")
    if not yours.predicted.get("feasible", True):
        print("your configuration does not fit in memory under the model")
    if args.out:
        write_text_atomic(args.out, best_text)
        print(f"-> {args.out}")
    else:
        print(f"\nthe better configuration:\n{best_text}")
    return 0


def plan_command(args) -> int:
    graph = planner.Graph.load(args.graph)
    cluster = planner.Cluster.load(args.cluster)
    job = None if args.job is None else planner.Job.load(args.job)
    if args.devices is not None and args.devices < 1:
        raise ValueError(f"--devices must be >= 1 (got {args.devices})")
    if args.config_out and not args.trainer:
        raise ValueError("--config-out needs --for TRAINER (the configuration is a trainer's)")
    try:
        if args.trainer:
            best, text = best_for(args.trainer, graph, cluster, job, devices=args.devices)
        else:
            best = planner.search(graph, cluster, job, devices=args.devices, top_k=1).plans[0]
    except planner.InfeasibleError as e:
        print(f"python -m hybridplan plan: infeasible: {e}", file=sys.stderr)
        return EXIT_NOTHING_EXPRESSED
    who = f"best {TRAINERS[args.trainer].CAPABILITIES.name} can run" if args.trainer \
        else "best plan"
    pred = best.predicted
    print(f"{who} on {best.world_size} devices: {_describe(best)}")
    line = f"step {pred['step_s']:.4g} s, {pred['samples_per_s']:.4g} samples/s"
    if pred.get("time_to_train_s"):
        line += f", time to accuracy {pred['time_to_train_s']:.4g} s"
    mem = max(pred.get("memory_bytes") or [0]) / 2 ** 30
    print(f"{line}, max memory per device {mem:.3g} GiB")
    if args.out:
        best.save(args.out)
        print(f"-> {args.out}")
    if args.trainer:
        if args.config_out:
            write_text_atomic(args.config_out, text)
            print(f"-> {args.config_out}")
        else:
            print(f"\n{text}", end="")
    return 0


COMMANDS = {"export": export_command, "evaluate-config": evaluate_command, "plan": plan_command}
