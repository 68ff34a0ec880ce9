"""C++ data parallelism (hybridplan::Executor on c10d::Reducer, examples/cpp/train_mlp, no Python
in the training processes) against torch.nn.parallel.DistributedDataParallel in Python, on the
same MLP, data, initial weights and optimizer (SGD with momentum), 2 Gloo ranks on 127.0.0.1,
one intra-op thread each:

    python bench/bench_cpp_ddp.py [--widths 256,1024,1024,256] [--global-batch 64] [--steps 40]
                                  [--rounds 5]

Runs the two jobs alternately, `rounds` times each, and prints the median step time of each side
(median over rounds of each job's median step after `--warmup-steps`), the ratio C++ / torch
(1.0 = same speed; above 1 = the C++ executor is slower) and how far the trained parameters of
the two sides are apart. tests/python/test_cpp_ddp.py uses the same functions to hold the C++
training equal to DDP's. The binary is found in $HYBRIDPLAN_BIN_DIR, else build/bin.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

SEED = 0  # train_mlp --seed: weights, and the data of step k from seed * 100003 + 1 + k
LR, MOMENTUM = 0.05, 0.9  # train_mlp's defaults
TIMEOUT_S = 300


def bin_dir() -> Path:
    return Path(os.environ.get("HYBRIDPLAN_BIN_DIR", ROOT / "build" / "bin"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world: int, port: int) -> Dict[str, str]:
    env = dict(os.environ)
    env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])})
    return env


def _run_ranks(argvs: List[List[str]]) -> List[subprocess.CompletedProcess]:
    """Runs one process per argv as ranks 0..n-1 of a job; raises with their output on failure."""
    port = _free_port()
    procs = [subprocess.Popen(argv, env=_rank_env(r, len(argvs), port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r, argv in enumerate(argvs)]
    deadline = time.monotonic() + TIMEOUT_S
    results = []
    for argv, proc in zip(argvs, procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results.append(subprocess.CompletedProcess(argv, proc.returncode, out, ""))
    failed = [r for r in results if r.returncode != 0]
    if failed:
        raise RuntimeError("\n".join(f"{r.args}: exit {r.returncode}\n{r.stdout[-3000:]}"
                                     for r in failed))
    return results


def python_mlp(widths: Sequence[int]):
    """The same module as the C++ models::mlp(widths): Linear, ReLU, ..., Linear."""
    from torch import nn
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def prepare(folder: Path, widths: Sequence[int], global_batch: int) -> Dict[str, str]:
    """The model's graph (C++ profiler), a DP-only plan for 2 ranks over it, and the initial
    weights (train_mlp --reference --steps 0), all in `folder`."""
    from hybridplan.hand_plans import hand_plan
    from hybridplan.planner import Graph

    exe = str(bin_dir() / "train_mlp")
    w = ",".join(map(str, widths))
    paths = {k: str(folder / f"{k}.json") for k in ("graph", "plan", "init")}
    subprocess.run([exe, "--widths", w, "--write-graph", paths["graph"], "--global-batch",
                    str(global_batch)], check=True, capture_output=True)
    subprocess.run([exe, "--widths", w, "--reference", "--steps", "0", "--seed", str(SEED),
                    "--out", paths["init"]], check=True, capture_output=True)
    graph = Graph.load(paths["graph"])
    plan = hand_plan(python_mlp(widths), mode="placement", dp=2, mp=1,
                     per_replica_batch=global_batch // 2)
    plan["graph"] = {"name": graph.name, "sha256": graph.sha256}
    Path(paths["plan"]).write_text(json.dumps(plan))
    return paths


def run_cpp(paths: Dict[str, str], widths: Sequence[int], steps: int, out_prefix: str,
            extra_args: Sequence[str] = ()) -> List[float]:
    """Trains `steps` steps with 2 train_mlp ranks (plus train_mlp's `extra_args`); writes
    <out_prefix>.rank<r>.json (trained parameters); returns rank 0's step times (s)."""
    argvs = [[str(bin_dir() / "train_mlp"), "--widths", ",".join(map(str, widths)),
              "--plan", paths["plan"], "--graph", paths["graph"], "--steps", str(steps),
              "--seed", str(SEED), "--timeout-s", "60", "--out", f"{out_prefix}.rank{r}.json",
              *extra_args]
             for r in range(2)]
    out = _run_ranks(argvs)[0].stdout
    return [float(s) for s in re.findall(r"^rank 0 step \d+ .* step_s (\S+)$", out, re.M)]


def run_ddp(paths: Dict[str, str], widths: Sequence[int], global_batch: int, steps: int,
            out_prefix: str) -> List[float]:
    """The same training with torch DDP (default arguments) in 2 Python ranks; same outputs."""
    argvs = [[sys.executable, __file__, "--ddp-rank", "--init", paths["init"],
              "--widths", ",".join(map(str, widths)), "--global-batch", str(global_batch),
              "--steps", str(steps), "--out-prefix", out_prefix] for _ in range(2)]
    _run_ranks(argvs)
    return json.loads(Path(f"{out_prefix}.rank0.times.json").read_text())


def ddp_rank(init: str, widths: Sequence[int], global_batch: int, steps: int,
             out_prefix: str) -> None:
    """One rank of run_ddp (launched by it with the torchrun environment)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hybridplan.executor import destroy_groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = python_mlp(widths)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(json.loads(Path(init).read_text())["params"][name],
                                 dtype=torch.float64).view_as(p))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    b = global_batch // 2
    times = []
    for step in range(steps):
        torch.manual_seed(SEED * 100003 + 1 + step)  # train_mlp's batch_at
        x, y = torch.randn(global_batch, widths[0]), torch.randn(global_batch, widths[-1])
        x, y = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    params = {k: v.detach().double().reshape(-1).tolist() for k, v in model.named_parameters()}
    Path(f"{out_prefix}.rank{rank}.json").write_text(json.dumps({"params": params}))
    Path(f"{out_prefix}.rank{rank}.times.json").write_text(json.dumps(times))
    del ddp, opt  # then collect and destroy while Python is alive: see destroy_groups
    destroy_groups()


def max_relative_difference(a_path: str, b_path: str, atol: float = 1e-7) -> float:
    """max over all parameter values of |a - b| / (atol + |b|); inf if the keys differ."""
    a = json.loads(Path(a_path).read_text())["params"]
    b = json.loads(Path(b_path).read_text())["params"]
    if a.keys() != b.keys():
        return float("inf")
    return max(abs(x - y) / (atol + abs(y)) for k in a for x, y in zip(a[k], b[k]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="256,1024,1024,256")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ddp-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--out-prefix", help=argparse.SUPPRESS)
    a = p.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    if a.ddp_rank:
        ddp_rank(a.init, widths, a.global_batch, a.steps, a.out_prefix)
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = prepare(Path(tmp), widths, a.global_batch)
        medians = {"cpp": [], "ddp": []}
        for r in range(a.rounds):  # alternate, so drifts in machine load hit both sides alike
            cpp = run_cpp(paths, widths, a.steps, f"{tmp}/cpp")
            ddp = run_ddp(paths, widths, a.global_batch, a.steps, f"{tmp}/ddp")
            medians["cpp"].append(statistics.median(cpp[a.warmup_steps:]))
            medians["ddp"].append(statistics.median(ddp[a.warmup_steps:]))
            print(f"round {r}: C++ {medians['cpp'][-1] * 1e3:.2f} ms, "
                  f"DDP {medians['ddp'][-1] * 1e3:.2f} ms", flush=True)
        cpp_s, ddp_s = statistics.median(medians["cpp"]), statistics.median(medians["ddp"])
        diff = max_relative_difference(f"{tmp}/cpp.rank0.json", f"{tmp}/ddp.rank0.json")
    print(f"\nMLP {a.widths}, global batch {a.global_batch}, 2 Gloo ranks, {a.rounds} alternating "
          f"rounds of {a.steps} steps (median after {a.warmup_steps})")
    print(f"| C++ executor (c10d::Reducer) | torch DDP | ratio |\n|---|---|---|\n"
          f"| {cpp_s * 1e3:.2f} ms | {ddp_s * 1e3:.2f} ms | {cpp_s / ddp_s:.3f} |")
    print(f"trained parameters, C++ vs DDP: max |a-b| / (1e-7 + |b|) = {diff:.2e}")


if __name__ == "__main__":
    main()
