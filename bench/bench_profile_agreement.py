"""Do the C++ and Python profilers agree? Per node of each C++ built-in model and its Python twin
(same layers, qualified names and shapes), the ratio of forward+backward seconds, Python / C++.

    python3 bench/bench_profile_agreement.py [--models mlp biglstm small_cnn] [--batch 32]
                                             [--repeats 31] [--rounds 7] [--clock thread|wall]

The C++ side is `profile_model` (examples/cpp/profile_model.cc; found in $HYBRIDPLAN_BIN_DIR,
else build/bin). Both sides run with one intra-op thread and, by default, the "thread" clock (CPU
time of the profiling thread), so other processes on a shared CPU do not enter the times. The
two sides alternate for `rounds` rounds and each node's time is its median over the rounds, so
a slow spell of the machine does not fall on one side only.

Both profilers measure the same way: whole training steps, each split among the nodes at the
points where each node's forward returns and where its output's gradient is ready (Python: module
hooks and autograd pre-hooks; C++: the blocks' return points and Tensor::register_hook), with
glibc keeping freed memory (retain_freed_memory) so that page faults do not enter op times.

Judging rule: a node that takes at least JUDGED_SHARE of the step (the nodes a plan is made of)
must agree within TOLERANCE relative; every other node within ABSOLUTE_S absolute. The small
nodes cannot agree relatively: the Python interpreter and the profiler's hooks add about 0.1 ms
per node (module call, autograd pre-hook; more for the last node, which also carries
torch.autograd.backward's Python wrapper) that a C++ step does not spend.
Exit status 1 when the rule is not met.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

TOLERANCE = 0.20  # |python - cpp| / cpp, per judged node
JUDGED_SHARE = 0.05  # a node is judged relatively from this share of the C++ step's time
ABSOLUTE_S = 0.5e-3  # |python - cpp| of every other node (the Python per-node overhead, 5x)


def _mlp_twin(batch: int) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    """csrc/models/mlp.h mlp({1024, 2048, 2048, 1024}) as builtin_models.cc builds it."""
    widths = [1024, 2048, 2048, 1024]
    layers: List[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers), (torch.randn(batch, widths[0]),)


def _small_cnn_twin(batch: int) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    """csrc/models/small_cnn.h small_cnn() with its default options."""
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    return net, (torch.randn(batch, 3, 32, 32),)


def _biglstm_twin(batch: int) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    """hybridplan.models.biglstm, whose C++ twin is csrc/models/biglstm.h."""
    from hybridplan import models

    model = models.biglstm()
    return model, model.example_inputs(batch)


# C++ built-in model name -> builds its Python twin and example inputs at a batch size.
TWINS: Dict[str, Callable[[int], Tuple[nn.Module, Tuple[torch.Tensor, ...]]]] = {
    "mlp": _mlp_twin, "small_cnn": _small_cnn_twin, "biglstm": _biglstm_twin}


def bin_dir() -> Path:
    return Path(os.environ.get("HYBRIDPLAN_BIN_DIR", ROOT / "build" / "bin"))


def cpp_profile(model: str, batch: int, repeats: int, clock: str) -> dict:
    """The Graph JSON `profile_model` writes for `model` (one thread)."""
    binary = bin_dir() / "profile_model"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{model}.json"
        subprocess.run([str(binary), "--model", model, "--batch", str(batch), "--out", str(out),
                        "--threads", "1", "--clock", clock, "--repeats", str(repeats)],
                       check=True, capture_output=True, text=True, timeout=600)
        return json.loads(out.read_text())


def python_profile(model: str, batch: int, repeats: int, clock: str) -> dict:
    """hybridplan's Python profile of `model`'s twin, taken in a fresh process (one thread), as
    the C++ one is: a profile's times depend on its process's history (what the allocator
    holds and where), which in one long-lived process would fall on the Python side only."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{model}.json"
        subprocess.run([sys.executable, __file__, "--python-profile", model, "--batch",
                        str(batch), "--repeats", str(repeats), "--clock", clock, "--out",
                        str(out)], check=True, capture_output=True, text=True, timeout=600)
        return json.loads(out.read_text())


def python_profile_here(model: str, batch: int, repeats: int, clock: str) -> dict:
    """The Python profile in this process (one intra-op thread from here on)."""
    from hybridplan.profiler import profile_dict

    torch.set_num_threads(1)
    torch.manual_seed(0)
    module, inputs = TWINS[model](batch)
    return profile_dict(module, inputs, repeats=repeats, verbose=False, name=model, clock=clock)


def structure(graph: dict) -> dict:
    """Everything but the times: what must be identical across the two languages."""
    names = {n["id"]: n["name"] for n in graph["nodes"]}
    return {
        "profiled": graph["profiled"],
        "nodes": [(n["name"], n["op"], n["param_bytes"], n.get("param_tensors"),
                   n["output_bytes"]) for n in graph["nodes"]],
        "edges": sorted((names[e["src"]], names[e["dst"]], e["bytes"]) for e in graph["edges"]),
    }


def node_seconds(graph: dict) -> Dict[str, float]:
    return {n["name"]: n["forward_s"] + n["backward_s"] for n in graph["nodes"]}


def compare(cpp_graphs: List[dict], python_graphs: List[dict], tolerance: float = TOLERANCE,
            absolute_s: float = ABSOLUTE_S) -> List[dict]:
    """Per node (matched by name): the median over rounds of C++ and Python forward+backward
    seconds, python / cpp, whether the node is judged relatively, and whether it is within
    `tolerance` (judged) or `absolute_s` (the others)."""
    def median_per_node(graphs):
        per_round = [node_seconds(g) for g in graphs]
        return {name: statistics.median(r[name] for r in per_round) for name in per_round[0]}

    cpp_s, py_s = median_per_node(cpp_graphs), median_per_node(python_graphs)
    step_s = sum(cpp_s.values())
    rows = []
    for name, c in cpp_s.items():
        p = py_s[name]
        judged = c >= JUDGED_SHARE * step_s
        ok = abs(p - c) <= tolerance * c if judged else abs(p - c) <= absolute_s
        rows.append({"name": name, "cpp_s": c, "python_s": p,
                     "ratio": p / c if c > 0 else float("inf"), "judged": judged, "ok": ok})
    return rows


def profile_both(model: str, batch: int, repeats: int, rounds: int, clock: str):
    """`rounds` C++ and Python profiles of `model`, alternating."""
    cpp, python = [], []
    for _ in range(rounds):
        cpp.append(cpp_profile(model, batch, repeats, clock))
        python.append(python_profile(model, batch, repeats, clock))
    return cpp, python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(TWINS), choices=sorted(TWINS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clock", default="thread", choices=["thread", "wall"])
    parser.add_argument("--python-profile", choices=sorted(TWINS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.python_profile:  # the Python side of one round, in its own process
        graph = python_profile_here(args.python_profile, args.batch, args.repeats, args.clock)
        Path(args.out).write_text(json.dumps(graph))
        return 0
    if not (bin_dir() / "profile_model").exists():
        print(f"bench_profile_agreement: {bin_dir() / 'profile_model'} not built "
              "(make build, or set HYBRIDPLAN_BIN_DIR)")
        return 1
    print(f"# C++ vs Python profile, batch {args.batch}, {args.repeats} steps, median of "
          f"{args.rounds} alternating rounds, {args.clock} clock, 1 thread; nodes of "
          f">= {JUDGED_SHARE:.0%} of the step within {TOLERANCE:.0%}, the rest within "
          f"{ABSOLUTE_S * 1e3:.1f} ms")
    worst, failed = 0.0, 0
    for model in args.models:
        cpp, python = profile_both(model, args.batch, args.repeats, args.rounds, args.clock)
        same = structure(cpp[0]) == structure(python[0])
        print(f"\n{model}: structure {'identical' if same else 'DIFFERS'}")
        print(f"  {'node':<12} {'cpp ms':>9} {'python ms':>10} {'py/cpp':>7}  judged")
        for row in compare(cpp, python):
            how = (f"relative{'' if row['ok'] else ' FAIL'}" if row["judged"] else
                   f"absolute{'' if row['ok'] else ' FAIL'}")
            print(f"  {row['name']:<12} {row['cpp_s'] * 1e3:>9.3f} "
                  f"{row['python_s'] * 1e3:>10.3f} {row['ratio']:>7.3f}  {how}")
            if row["judged"]:
                worst = max(worst, abs(row["ratio"] - 1))
            failed += (not row["ok"]) + (not same)
    print(f"\nworst judged deviation: {worst:.1%} (tolerance {TOLERANCE:.0%}); "
          f"{failed} node(s) outside the rule")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
