"""What a forward saves for backward under the executor's two bf16 policies, node by node and
by the op that produced each saved tensor, against the bytes the planner prices for a bf16 job
(the fp32 profile's saved_bytes x 2 / 4: csrc/planner/costs/precision_cost.cc, in_job_precision).

    PYTHONPATH=python OMP_NUM_THREADS=1 python bench/bench_autocast_saved.py \
        [--batch 32] [--graph out/bench/validate-precision/transformer_lm-1/graph.json]
    PYTHONPATH=python OMP_NUM_THREADS=1 python bench/bench_autocast_saved.py \
        --predict out/bench/validate-precision/transformer_lm-1 [--launch]

One process, hybridplan.models:transformer_lm, three forwards (and the loss) of the same model:

  fp32       as profiled
  autocast   torch.autocast("cpu", dtype=torch.bfloat16) around the forward and the loss, the
             parameters fp32 (the executor's policy for every plan but FSDP2's)
  bf16 params  the parameters cast to bf16, no autocast: the compute dtype FSDP2's
             MixedPrecisionPolicy(param_dtype=bf16) all-gathers its units in

Saved tensors are counted by the profiler's own counting, block_timing.saved_under_autocast
(what a profile records as autocast_saved_bytes and autocast_weight_copy_bytes; dataflow's
_SavedBytes): torch.autograd.graph.saved_tensors_hooks, each storage once at its whole size,
the parameters excluded, a tensor charged to the graph node running when it is saved (between
nodes, and the loss, to the last node that ran). The op that produced each one comes from a
TorchDispatchMode here that notes, per storage, the last non-view op that wrote it (_to_copy
split into the casts of parameters, autocast's per-step weight copies, and of activations). The
loss's backward peak is block_timing.loss_backward_bytes (torch.profiler's allocation events)
in each mode.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from typing import Dict, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hybridplan.models import loss_and_target, transformer_lm
from hybridplan.profiler.block_timing import saved_under_autocast

Rows = Dict[Tuple[str, str, str], int]  # (node, op, dtype) -> bytes


def run(mode: str, batch: int, names: List[str]) -> Tuple[Rows, int]:
    m = transformer_lm()
    if mode == "bf16 params":
        m = m.to(torch.bfloat16)
    loss_fn, target = loss_and_target(m, batch)
    (tokens,) = m.example_inputs(batch)
    nodes = {n: mod for n, mod in m.named_modules() if n in names}
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    producer: Dict[int, str] = {}

    class Producers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__)
            if name == "_to_copy" and isinstance(args[0], torch.Tensor):
                name += ("(weight)" if args[0].untyped_storage().data_ptr() in params
                         else "(activation)")
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and not func.is_view:
                    producer[t.untyped_storage().data_ptr()] = name
            return out

    rows: Rows = collections.defaultdict(int)

    def observe(node, t: torch.Tensor, nbytes: int, weight_copy: bool) -> None:
        dtype = str(t.dtype).replace("torch.", "")
        key = t.untyped_storage().data_ptr()
        rows[(node or names[0], producer.get(key, "input"), dtype)] += nbytes

    # the profiler's counting (block_timing.saved_under_autocast: the one definition)
    with Producers():
        got = saved_under_autocast(m, nodes, (tokens,), None, lambda out: loss_fn(out, target),
                                   torch.bfloat16 if mode == "autocast" else None, observe)
    assert sum(rows.values()) == sum(got.saved.values()) + sum(got.weight_copies.values())
    return rows, got.loss_backward_bytes


def predict(run_dir: str, launch: bool, steps: int) -> None:
    """--predict: the graph of a `validate --precision bf16` run (its graph.json, cluster.json,
    and bf16/plan.json, the dp plan), given the profiler's autocast recording (profile.py
    _add_autocast_saved, at the graph's batch), planned in bf16: each plan's predicted peak
    memory without the recording (halved, as before) and with it, against the peak the
    validate worker measures (a fresh 2-rank launch with --launch, else the run's
    bf16/validate.json)."""
    import copy
    import os
    import sys
    import tempfile
    from pathlib import Path

    from hybridplan import planner
    from hybridplan.measure.validation import run_plan
    from hybridplan.profiler.profile import _add_autocast_saved

    with open(os.path.join(run_dir, "graph.json")) as f:
        halved = json.load(f)
    with open(os.path.join(run_dir, "cluster.json")) as f:
        cluster = json.load(f)
    with open(os.path.join(run_dir, "bf16", "plan.json")) as f:
        dp = json.load(f)
    job = {"schema_version": 1, "kind": "hybridplan.job", "precision": "bf16"}
    batch = halved["profiled"]["batch_size"]
    torch.manual_seed(0)
    m = transformer_lm()
    loss_fn, target = loss_and_target(m, batch)
    modules = dict(m.named_modules())
    recorded = copy.deepcopy(halved)
    _add_autocast_saved(recorded, m, {n["name"]: modules[n["name"]] for n in halved["nodes"]},
                        m.example_inputs(batch), None, lambda out: loss_fn(out, target),
                        lambda msg: print(msg, file=sys.stderr))
    def of_graph(plan: dict, graph: dict) -> dict:  # the plan names the graph it prices
        return dict(plan, graph=dict(plan["graph"], sha256=planner.Graph.from_dict(graph).sha256))

    plans = {"dp": of_graph(dp, recorded)}
    for sharding in ("zero2", "zero3"):
        plans[sharding] = planner.with_sharding(plans["dp"], sharding, recorded, cluster, job)
    measured_before: Dict[str, List[int]] = {}
    if not launch:
        with open(os.path.join(run_dir, "bf16", "validate.json")) as f:
            for row in json.load(f)["rows"]:
                kind = "dp" if row["kind"] == "dp b=32" else row["kind"].split()[-1]
                measured_before[kind] = row["measured_memory_bytes"]
    mib = 2 ** 20
    print(f"transformer_lm at batch {batch}, bf16, {dp['dp']} ranks; MiB, the larger rank's\n")
    print("| plan | predicted, halved | predicted, autocast recorded | measured | error before "
          "| error now | memory model |")
    print("|---|---|---|---|---|---|---|")
    for kind, plan in plans.items():
        before = max(planner.evaluate(halved, cluster, of_graph(plan, halved), job)["memory_bytes"])
        now = planner.evaluate(recorded, cluster, plan, job)
        if launch:
            with tempfile.TemporaryDirectory() as tmp:
                got = run_plan(plan, "hybridplan.models:transformer_lm", steps, 1, 300.0,
                               Path(tmp))
            measured = max(got["memory_bytes"])
        else:
            measured = max(measured_before[kind])
        print(f"| {kind} | {before / mib:.2f} | {max(now['memory_bytes']) / mib:.2f} | "
              f"{measured / mib:.2f} | {(before - measured) / measured:+.1%} | "
              f"{(max(now['memory_bytes']) - measured) / measured:+.1%} | "
              f"{now.get('memory_model', '')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--graph", default=None,
                    help="a profiled graph.json: its node names (default: every named module)")
    ap.add_argument("--predict", default=None, metavar="RUN_DIR",
                    help="a validate --precision bf16 run's directory: predicted peak memory "
                         "with and without the autocast recording against measured (predict())")
    ap.add_argument("--launch", action="store_true",
                    help="with --predict: measure each plan in a fresh 2-rank launch")
    ap.add_argument("--steps", type=int, default=3, help="with --launch: timed steps")
    args = ap.parse_args()
    if args.predict:
        predict(args.predict, args.launch, args.steps)
        return
    if args.graph:
        with open(args.graph) as f:
            names = [n["name"] for n in json.load(f)["nodes"]]
    else:
        names = [n for n, _ in transformer_lm().named_modules() if n]
    modes = ("fp32", "autocast", "bf16 params")
    runs = {mode: run(mode, args.batch, names) for mode in modes}

    def per_node(rows: Rows) -> Dict[str, Dict[str, int]]:
        out: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
        for (n, _, dt), b in rows.items():
            out[n][dt] += b
        return out

    nodes = {mode: per_node(runs[mode][0]) for mode in modes}
    print(f"transformer_lm, batch {args.batch}, torch {torch.__version__}\n")
    print("| node | fp32 | planner's bf16 (fp32 / 2) | autocast: bf16 + fp32 + int64 | "
          "autocast / planner | bf16 params / planner |")
    print("|---|---|---|---|---|---|")
    total = collections.defaultdict(int)
    for n in names:
        f = sum(nodes["fp32"][n].values())
        if not f and not sum(nodes["autocast"][n].values()):
            continue
        a = nodes["autocast"][n]
        at, p = sum(a.values()), sum(nodes["bf16 params"][n].values())
        planner = round(f / 2)
        total["fp32"] += f
        total["planner"] += planner
        total["autocast"] += at
        total["bf16 params"] += p
        for dt in ("bfloat16", "float32", "int64"):
            total["autocast " + dt] += a.get(dt, 0)
        print(f"| {n} | {f} | {planner} | {at}: {a.get('bfloat16', 0)} + {a.get('float32', 0)} + "
              f"{a.get('int64', 0)} | {at / planner:.2f} | {p / planner:.2f} |")
    print(f"| all | {total['fp32']} | {total['planner']} | {total['autocast']}: "
          f"{total['autocast bfloat16']} + {total['autocast float32']} + "
          f"{total['autocast int64']} | {total['autocast'] / total['planner']:.3f} | "
          f"{total['bf16 params'] / total['planner']:.3f} |")

    print("\nBy node (layers.N collapsed: the sum over the layers), the op that produced each "
          "saved tensor and its dtype (bytes):\n")
    agg: Dict[Tuple[str, str, str], Dict[str, int]] = collections.defaultdict(dict)
    order: List[str] = []
    for mode in modes:
        for (n, op, dt), b in runs[mode][0].items():
            key = re.sub(r"layers\.\d+\.", "layers.*.", n)
            if key not in order:
                order.append(key)
            agg[(key, op, dt)][mode] = agg[(key, op, dt)].get(mode, 0) + b
    order.sort(key=lambda k: names.index(k.replace("*", "0")))
    print("| node | op | dtype | fp32 | autocast | bf16 params |")
    print("|---|---|---|---|---|---|")
    for (n, op, dt) in sorted(agg, key=lambda k: (order.index(k[0]), k[2] != "float32", k[1])):
        v = agg[(n, op, dt)]
        print(f"| {n} | {op} | {dt} | " + " | ".join(str(v.get(mode, "")) for mode in modes) + " |")

    print("\nThe loss's backward peak (loss_backward_bytes), bytes: "
          + ", ".join(f"{mode} {runs[mode][1]}" for mode in modes)
          + f"; the planner's bf16 {round(runs['fp32'][1] / 2)}")
    mib = 2 ** 20
    print(f"Saved, MiB: fp32 {total['fp32'] / mib:.3f}, planner's bf16 {total['planner'] / mib:.3f}, "
          f"autocast {total['autocast'] / mib:.3f} ({(total['autocast'] - total['planner']) / mib:+.3f}), "
          f"bf16 params {total['bf16 params'] / mib:.3f} "
          f"({(total['bf16 params'] - total['planner']) / mib:+.3f})")


if __name__ == "__main__":
    main()
