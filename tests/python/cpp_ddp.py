"""C++ data parallelism (hybridplan::Executor on c10d::Reducer, examples/cpp/train_mlp, no Python
in the training processes) beside torch.nn.parallel.DistributedDataParallel in Python, on the
same MLP (twins.mlp), data, initial weights and optimizer (SGD with momentum), 2 Gloo ranks on
127.0.0.1, one intra-op thread each. Shared by tests/python/test_cpp_ddp.py, which holds the C++
training equal to DDP's, and bench/bench_cpp_ddp.py, which times the two.

    paths = prepare(folder, widths, global_batch)            # graph, plan, initial weights
    run_cpp(paths, widths, steps, f"{folder}/cpp")           # <prefix>.rank<r>.json
    run_ddp(paths, widths, global_batch, steps, f"{folder}/ddp")
    max_relative_difference(f"{folder}/cpp.rank0.json", f"{folder}/ddp.rank0.json")
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Sequence

from dist_harness import format_results, run_commands, run_ranks
from twins import bin_dir, mlp

SEED = 0  # train_mlp --seed: weights, and the data of step k from seed * 100003 + 1 + k
LR, MOMENTUM = 0.05, 0.9  # train_mlp's defaults
TIMEOUT_S = 300


def _checked(results, what: str):
    """`results` when every rank exited 0; else RuntimeError with their output."""
    if any(r.returncode != 0 for r in results):
        raise RuntimeError(f"{what} failed:\n{format_results(results)}")
    return results


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
    plan = hand_plan(mlp(widths), mode="placement", dp=2, mp=1,
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
    out = _checked(run_commands(argvs, timeout_s=TIMEOUT_S), "train_mlp")[0].stdout
    return [float(s) for s in re.findall(r"^rank 0 step \d+ .* step_s (\S+)$", out, re.M)]


def run_ddp(paths: Dict[str, str], widths: Sequence[int], global_batch: int, steps: int,
            out_prefix: str) -> List[float]:
    """The same training with torch DDP (default arguments) in 2 Python ranks; same outputs."""
    _checked(run_ranks("cpp_ddp:ddp_rank", 2, {
        "init": paths["init"], "widths": list(widths), "global_batch": global_batch,
        "steps": steps, "out_prefix": out_prefix}, timeout_s=TIMEOUT_S), "DDP")
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
    model = mlp(widths)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(json.loads(Path(init).read_text())["params"][name],
                                 dtype=torch.float64).view_as(p))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    b = global_batch // 2
    times = []
    for step in range(steps):
        # Its own loop, not measure.timing.timed_samples: each step draws train_mlp's batch.
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
