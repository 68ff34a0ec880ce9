"""Gradient accumulation as a planner axis, on MT-NLG 530B (Smith et al. 2022: 105 layers,
hidden 20480, sequence 2048, global batch 1,920, mixed-precision Adam) on DGX A100 nodes: the
best plan and the planning time with accumulation fixed at 1 (the planner before the axis)
against the default axis (1, 2, 4, ..., 64 tried where memory binds).

    python bench/bench_accumulation.py [--gpus 2240 2800 3360] [--cli build/bin/hybridplan]
        [--out-dir out/bench/accumulation] [--repeats 3]

Then a 1.3B decoder at global batch 512 on one DGX A100 node, data parallelism only, through
the Python planner (data_parallel_only): a case where memory decides.

The graph is bench/run_all.py's (hybridplan.profiler.from_config, the same configuration);
the cluster the dgx-a100 preset with gpus / 8 nodes. Each plan is `hybridplan plan --top 1`;
its time is the median CPU time (user + system) of --repeats runs of the command, with the
plans it evaluated (the count the CLI prints; it does not depend on the host's load).
"""

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))


def write_graph(path: Path) -> None:
    from hybridplan.profiler.from_config import TransformerConfig, graph_from_config
    cfg = TransformerConfig("mt-nlg-530b", 105, 20480, 128, 2048, 51200)
    path.write_text(json.dumps(graph_from_config(cfg, device="A100",
                                                 parallel_cross_entropy=True)))


def describe(plan: dict) -> str:
    p = plan
    text = f"dp={p['dp']} mp={p['mp']} tp={p.get('tp', 1)} {p['mode']}"
    if p["mode"] == "pipeline":
        text += f" {p['schedule']} M={p['num_microbatches']}"
    text += f" b={p['per_replica_batch']} K={p.get('accumulation_steps', 1)}"
    if p.get("sharding", "none") != "none":
        text += f" {p['sharding']}"
    recomputed = sum(1 for a in p["assignment"] if a.get("recompute"))
    if recomputed:
        text += f" recompute {recomputed}/{len(p['assignment'])}"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[2240, 2800, 3360])
    ap.add_argument("--cli", default=str(ROOT / "build" / "bin" / "hybridplan"))
    ap.add_argument("--out-dir", default=str(ROOT / "out" / "bench" / "accumulation"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    graph = out / "mtnlg-530b.graph.json"
    write_graph(graph)
    preset = json.loads((ROOT / "presets" / "dgx-a100.json").read_text())
    jobs = {"K=1": {"accumulation_steps": 1}, "axis": {}}
    print("| GPUs | accumulation | best plan | step s | samples/s | peak GiB | "
          "planning CPU s (median of %d) | plans evaluated |" % args.repeats)
    print("|---|---|---|---|---|---|---|---|")
    for gpus in args.gpus:
        cluster = dict(preset, num_nodes=gpus // preset["devices_per_node"])
        cluster_path = out / f"dgx-a100-{gpus}.json"
        cluster_path.write_text(json.dumps(cluster))
        for label, extra in jobs.items():
            job = {"schema_version": 1, "kind": "hybridplan.job", "global_batch": 1920,
                   "optimizer": "adam", "mixed_precision": True, **extra}
            job_path = out / f"job-{label.replace('=', '')}.json"
            job_path.write_text(json.dumps(job))
            plan_path = out / f"plan-{gpus}-{label.replace('=', '')}.json"
            command = [args.cli, "plan", "--graph", str(graph), "--cluster", str(cluster_path),
                       "--job", str(job_path), "--top", "1", "--out", str(plan_path)]
            seconds = []
            for _ in range(args.repeats):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run(command, capture_output=True, text=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                seconds.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
                found = re.search(r"(\d+) candidates evaluated", done.stdout + done.stderr)
                evaluated = found.group(1) if found else "?"
                if done.returncode != 0:
                    print(f"| {gpus} | {label} | no plan: {done.stderr.strip()[-200:]} |")
                    break
            else:
                plan = json.loads(plan_path.read_text())
                pred = plan["predicted"]
                peak = max(pred["memory_bytes"]) / 2 ** 30
                print(f"| {gpus} | {label} | {describe(plan)} | {pred['step_s']:.2f} | "
                      f"{pred['samples_per_s']:.1f} | {peak:.1f} | "
                      f"{statistics.median(seconds):.2f} | {evaluated} |")
    data_parallel_only(out, args.repeats)
    return 0


def data_parallel_only(out: Path, repeats: int) -> None:
    """A 1.3B decoder (24 layers, hidden 2048, sequence 2048; from_config) at global batch 512
    on one DGX A100 node (8 x 80 GB), data parallelism only (dp_only: a model that cannot be
    cut into pipeline stages or split by tensor parallelism): at K = 1 each replica's 64
    sequences of 2048 tokens, sharded or recomputing, against the axis."""
    from hybridplan.planner import InfeasibleError, search
    from hybridplan.profiler.from_config import TransformerConfig, graph_from_config
    graph = graph_from_config(TransformerConfig("decoder-1.3b", 24, 2048, 16, 2048, 50257),
                              device="A100", parallel_cross_entropy=True)
    preset = json.loads((ROOT / "presets" / "dgx-a100.json").read_text())
    cluster = dict(preset, num_nodes=1)
    print("\n| 1.3B decoder, dp only, 8 x A100-80GB | best plan | step s | samples/s | peak GiB | "
          "planning CPU s (median of %d) | plans evaluated |" % repeats)
    print("|---|---|---|---|---|---|---|")
    for label, extra in {"K=1": {"accumulation_steps": 1}, "axis": {}}.items():
        job = {"schema_version": 1, "kind": "hybridplan.job", "global_batch": 512,
               "optimizer": "adam", "mixed_precision": True, **extra}
        seconds, result, error = [], None, None
        for _ in range(repeats):
            start = time.process_time()
            try:
                result = search(graph, cluster, job, top_k=1, dp_only=True)
            except InfeasibleError as e:
                error = str(e)
            seconds.append(time.process_time() - start)
        cpu = statistics.median(seconds)
        if result is None:
            print(f"| {label} | no plan fits: {error[:160]} | | | | {cpu:.2f} | |")
            continue
        plan = result.plans[0].to_dict()
        pred = plan["predicted"]
        (out / f"plan-1b3-dp-{label.replace('=', '')}.json").write_text(json.dumps(plan))
        print(f"| {label} | {describe(plan)} | {pred['step_s']:.2f} | "
              f"{pred['samples_per_s']:.1f} | {max(pred['memory_bytes']) / 2 ** 30:.1f} | "
              f"{cpu:.2f} | {result.candidates_evaluated} |")


if __name__ == "__main__":
    sys.exit(main())
