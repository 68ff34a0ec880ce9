"""`make demo`: the main job end to end on this machine.

1. profile a built-in model (the Inception-style branchy CNN) on the CPU into a Graph;
2. plan it for the `localhost-cpu` preset with 2 devices (the `hybridplan` CLI prints the ranked
   table and writes the best plan);
3. train a few steps under that plan with torchrun (Gloo on loopback), and
4. print the plan's predicted step time next to the measured one.

Everything lands in out/demo/.
"""
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

MODEL = "branchy_cnn"
PROFILE_BATCH = 32
DEVICES = 2
STEPS = 20


def run(cmd, **kwargs):
    print("$", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kwargs)


def main() -> int:
    out = ROOT / "out" / "demo"
    out.mkdir(parents=True, exist_ok=True)
    cli = Path(os.environ.get("HYBRIDPLAN_CLI", ROOT / "build" / "bin" / "hybridplan"))
    torch.set_num_threads(1)  # one thread per rank: the two ranks share this machine's cores

    print(f"== 1. profile {MODEL} at batch {PROFILE_BATCH} on cpu", flush=True)
    module = models.get(MODEL, seed=0)
    graph = hybridplan.profile(module, module.example_inputs(PROFILE_BATCH), verbose=False)
    graph.save(out / "graph.json")
    print(f"   {len(graph.nodes)} nodes -> {out / 'graph.json'}")

    print(f"\n== 2. plan for localhost-cpu with {DEVICES} devices", flush=True)
    run([cli, "plan", "--graph", out / "graph.json", "--cluster", "localhost-cpu",
         "--devices", DEVICES, "--top", 5, "--out", out / "plan.json"])
    plan = hybridplan.load_plan(out / "plan.json")
    processes = plan.dp if plan.mode == "placement" else plan.dp * plan.mp

    print(f"\n== 3. train {STEPS} steps under the plan ({processes} processes, Gloo)", flush=True)
    torchrun = shutil.which("torchrun") or None
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1")
    run(launcher + ["--standalone", "--nproc-per-node", processes, "examples/train.py",
                    "--model", MODEL, "--plan", out / "plan.json", "--steps", STEPS], env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
