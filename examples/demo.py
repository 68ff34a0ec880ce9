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

`--precision bf16` (or `fp32 bf16`, each in turn) plans and validates the job in that precision
on the same profile and calibration (calibrate measures the model's own bf16 and fp16
speed-up, which the planner prices; `--quick` measures it on calibrate's default workload):
fp32 lands in out/demo/ as before, another precision in out/demo/<precision>/. `--plans` and
`--max-launches` bound a validation (8 plans, up to 7 launches each, by default).
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
    parser.add_argument("--precision", nargs="+", default=["fp32"],
                        choices=("fp32", "bf16", "fp16"),
                        help="the job's precision, each validated in turn (fp32 into --out-dir, "
                             "another into --out-dir/<precision>)")
    parser.add_argument("--plans", type=int, help=f"plans to validate (default {PLANS})")
    parser.add_argument("--max-launches", type=int,
                        help="launches of a plan at most (validate's default 7)")
    parser.add_argument("--quick", action="store_true",
                        help="every step at its smallest size (a smoke run: the figures it "
                             "prints are not measurements)")
    args = parser.parse_args(argv)
    model_name, out, quick = args.model, Path(args.out_dir), args.quick
    batch = QUICK["batch"] if quick else PROFILE_BATCH
    plans, steps = (QUICK["plans"], QUICK["steps"]) if quick else (PLANS, STEPS)
    plans = args.plans or plans
    precisions = list(dict.fromkeys(args.precision))  # each once, in the order given
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

    for precision in precisions:
        validate(precision, out if precision == "fp32" else out / precision, out, cli, env,
                 model_name, plans, steps, quick, args.max_launches)
    return 0


def validate(precision: str, where: Path, out: Path, cli: Path, env: dict, model_name: str,
             plans: int, steps: int, quick: bool, max_launches) -> None:
    """Steps 3 and 4 for the job in `precision`: plan, then validate into `where`."""
    where.mkdir(parents=True, exist_ok=True)
    job = []
    if precision != "fp32":  # the default job in that precision
        (where / "job.json").write_text(json.dumps(
            {"schema_version": 1, "kind": "hybridplan.job", "precision": precision}) + "\n")
        job = ["--job", where / "job.json"]
    print(f"\n== 3. plan on {DEVICES} devices of the calibrated cluster ({precision})",
          flush=True)
    run([cli, "plan", "--graph", out / "graph.json", "--cluster", out / "cluster.json",
         "--devices", DEVICES, "--top", 5, "--out", where / "plan.json"] + job)

    launches = 1 if quick else (max_launches or 7)
    if quick:
        print(f"\n== 4. train the best plan for {steps} steps in one launch ({precision}): "
              "predicted vs measured (--quick: not a measurement)", flush=True)
    else:
        print(f"\n== 4. train {plans} plans across the ranking and the sharded data-parallel "
              f"ones in {precision}, {steps} steps each, in 3 interleaved launches, up to "
              f"{launches} for a plan whose median step is not yet known within +-5 % (each "
              "plan's median launch): predicted vs measured", flush=True)
    run([cli, "validate", "--graph", out / "graph.json", "--cluster", out / "cluster.json",
         "--model", f"hybridplan.models:{model_name}", "--devices", DEVICES, "--plans", plans,
         "--steps", steps, "--out-dir", where, "--baseline-cluster", "localhost-cpu",
         "--precision", precision]
        + (["--warmup", 1, "--rounds", 1, "--max-launches", 1] if quick else
           ["--sharding"] + (["--rounds", min(3, launches), "--max-launches", launches]
                             if max_launches else [])),
        env=env)

    verdict = json.loads((where / "validate.json").read_text())["verdict"]
    print(f"\n== the verdict ({precision}" + (", --quick: not a measurement)" if quick else ")"))
    print("\n".join(verdict_lines(verdict)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
