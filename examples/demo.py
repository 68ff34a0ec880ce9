"""`make demo`: the main job end to end on this machine.

1. profile a built-in model (the Inception-style branchy CNN) on the CPU into a Graph, each node
   at several batch sizes;
2. calibrate this machine (what the executor pays: links, all-reduce, the pipeline runtime's
   costs measured on the model's own stages, ranks sharing cores) into a Cluster;
3. plan it on 2 devices of the calibrated cluster (the `hybridplan` CLI prints the ranked table
   and writes the best plan);
4. train the best plan and a spread across the ranking (DP, GPipe and 1F1B with their fewest
   and most micro-batches), and the data-parallel plan sharded as zero2 and zero3 (FSDP2), for
   a few steps each with torchrun (Gloo on loopback) and print every
   term of the cost model predicted beside measured (`hybridplan validate`), with the step time
   the uncalibrated preset `localhost-cpu` predicts for the same runs beside it, and the
   verdict: the targets met or which missed, and the plans whose median step this host could
   not pin down within +-5 % in 7 launches (unsteady, each with its interval).

Everything lands in out/demo/. `--model` runs the same job on another built-in model (the cost
model's other families: transformer_lm, biglstm) and `--out-dir` puts it elsewhere;
bench/bench_validate_families.py runs it on each family. `--quick` runs every step at its
smallest size, a smoke run of the same four commands that the tests use (its
predicted-vs-measured figures mean nothing): batch 8 profiled at that one batch size, a short
calibration without the model's own pipeline runs (links and the built-in tiny workload only:
those runs take most of a calibration), the planner's first plan for 3 steps in one launch (so
its steadiness is unknown), the sharded plans left out.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402

import hybridplan  # noqa: E402
from hybridplan import models  # noqa: E402
from hybridplan.measure.verdict import verdict_lines  # noqa: E402

MODEL = "branchy_cnn"
PROFILE_BATCH = 32
DEVICES = 2
PLANS = 8
STEPS = 20
# --quick: the fewest of each that still runs every step of the job
QUICK = {"batch": 8, "plans": 1, "steps": 3}


def run(cmd, **kwargs):
    print("$", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, choices=sorted(models.MODELS))
    parser.add_argument("--out-dir", default=str(ROOT / "out" / "demo"))
    parser.add_argument("--quick", action="store_true",
                        help="every step at its smallest size (a smoke run: the figures it "
                             "prints are not measurements)")
    args = parser.parse_args(argv)
    model_name, out, quick = args.model, Path(args.out_dir), args.quick
    batch = QUICK["batch"] if quick else PROFILE_BATCH
    plans, steps = (QUICK["plans"], QUICK["steps"]) if quick else (PLANS, STEPS)
    out.mkdir(parents=True, exist_ok=True)
    cli = Path(os.environ.get("HYBRIDPLAN_CLI", ROOT / "build" / "bin" / "hybridplan"))
    torch.set_num_threads(1)  # one thread per rank: the two ranks share this machine's cores
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1")
    launcher = [shutil.which("torchrun")] if shutil.which("torchrun") else [
        sys.executable, "-m", "torch.distributed.run"]

    print(f"== 1. profile {model_name} at batch {batch} on cpu", flush=True)
    module = models.get(model_name, seed=0)
    loss_fn, target = models.loss_and_target(module, batch)  # a real training step
    sizes = dict(batch_sizes=(), warmup=1, repeats=2) if quick else {}
    graph = hybridplan.profile(module, module.example_inputs(batch), verbose=False,
                               clock="thread", loss_fn=loss_fn, target=target, **sizes)
    graph.save(out / "graph.json")
    print(f"   {len(graph.nodes)} nodes, each measured at batch sizes "
          f"{[p['batch_size'] for p in graph.nodes[0].get('batch_times', [])] + [batch]}"
          f" -> {out / 'graph.json'}")

    print(f"\n== 2. calibrate this machine ({DEVICES} ranks)", flush=True)
    workload = (["--warmup", 1, "--repeats", 3] if quick else
                ["--model", f"hybridplan.models:{model_name}", "--batch", batch])
    run(launcher + ["--standalone", "--nproc-per-node", DEVICES, "-m", "hybridplan", "calibrate",
                    "--graph", out / "graph.json", "--out", out / "cluster.json"] + workload,
        env=env)

    print(f"\n== 3. plan on {DEVICES} devices of the calibrated cluster", flush=True)
    run([cli, "plan", "--graph", out / "graph.json", "--cluster", out / "cluster.json",
         "--devices", DEVICES, "--top", 5, "--out", out / "plan.json"])

    if quick:
        print(f"\n== 4. train the best plan for {steps} steps in one launch: predicted vs "
              "measured (--quick: not a measurement)", flush=True)
    else:
        print(f"\n== 4. train {plans} plans across the ranking and the sharded data-parallel "
              f"ones, {steps} steps each, in 3 interleaved launches, up to 7 for a plan whose "
              "median step is not yet known within +-5 % (each plan's median launch): predicted "
              "vs measured", flush=True)
    run([cli, "validate", "--graph", out / "graph.json", "--cluster", out / "cluster.json",
         "--model", f"hybridplan.models:{model_name}", "--devices", DEVICES, "--plans", plans,
         "--steps", steps, "--out-dir", out, "--baseline-cluster", "localhost-cpu"]
        + (["--warmup", 1, "--rounds", 1, "--max-launches", 1] if quick else ["--sharding"]),
        env=env)

    verdict = json.loads((out / "validate.json").read_text())["verdict"]
    print("\n== " + ("the verdict (--quick: not a measurement)" if quick else "the verdict"))
    print("\n".join(verdict_lines(verdict)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
