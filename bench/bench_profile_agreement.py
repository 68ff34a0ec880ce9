"""Do the C++ and Python profilers agree? Per node of each C++ built-in model and its Python twin
(same layers, qualified names and shapes), the ratio of forward+backward seconds, Python / C++.

    python3 bench/bench_profile_agreement.py [--models mlp biglstm small_cnn] [--batch 32]
                                             [--repeats 21] [--clock thread|wall]

The C++ side is `profile_model` (examples/cpp/profile_model.cc; found in $HYBRIDPLAN_BIN_DIR,
else build/bin). Both sides run with one intra-op thread and, by default, the "thread" clock (CPU
time of the profiling thread), so other processes on a shared CPU do not enter the times.

The two profilers time differently, so small nodes need not agree: the C++ one times each block
alone on its recorded input (torch::autograd::grad of its output); the Python one times one whole
forward+backward step with hooks and charges each interval to a node, hook overhead (tens of
microseconds per node) included. Nodes with parameters carry the work and are compared;
parameter-free nodes (ReLU, pooling: microseconds) are listed but not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

TOLERANCE = 0.20  # |python - cpp| / cpp per compared node


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
    """hybridplan's Python profile of `model`'s twin (one thread; the caller's count restored)."""
    from hybridplan.profiler import profile_dict

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        module, inputs = TWINS[model](batch)
        return profile_dict(module, inputs, repeats=repeats, verbose=False, name=model,
                            clock=clock)
    finally:
        torch.set_num_threads(saved)


def structure(graph: dict) -> dict:
    """Everything but the times: what must be identical across the two languages."""
    names = {n["id"]: n["name"] for n in graph["nodes"]}
    return {
        "profiled": graph["profiled"],
        "nodes": [(n["name"], n["op"], n["param_bytes"], n["output_bytes"])
                  for n in graph["nodes"]],
        "edges": sorted((names[e["src"]], names[e["dst"]], e["bytes"]) for e in graph["edges"]),
    }


def node_ratios(cpp: dict, python: dict) -> List[dict]:
    """Per node (matched by name): C++ and Python forward+backward seconds, python / cpp, and
    whether the node is judged (it has parameters)."""
    py_nodes = {n["name"]: n for n in python["nodes"]}
    rows = []
    for node in cpp["nodes"]:
        twin = py_nodes[node["name"]]
        cpp_s = node["forward_s"] + node["backward_s"]
        py_s = twin["forward_s"] + twin["backward_s"]
        rows.append({"name": node["name"], "op": node["op"], "cpp_s": cpp_s, "python_s": py_s,
                     "ratio": py_s / cpp_s if cpp_s > 0 else float("inf"),
                     "judged": node["param_bytes"] > 0})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(TWINS), choices=sorted(TWINS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--clock", default="thread", choices=["thread", "wall"])
    args = parser.parse_args()
    if not (bin_dir() / "profile_model").exists():
        print(f"bench_profile_agreement: {bin_dir() / 'profile_model'} not built "
              "(make build, or set HYBRIDPLAN_BIN_DIR)")
        return 1
    print(f"# C++ vs Python profile, batch {args.batch}, {args.repeats} repeats, "
          f"{args.clock} clock, 1 thread; judged: nodes with parameters, within "
          f"{TOLERANCE:.0%}")
    worst = 0.0
    for model in args.models:
        cpp = cpp_profile(model, args.batch, args.repeats, args.clock)
        python = python_profile(model, args.batch, args.repeats, args.clock)
        same = structure(cpp) == structure(python)
        print(f"\n{model}: structure {'identical' if same else 'DIFFERS'}")
        print(f"  {'node':<12} {'op':<12} {'cpp ms':>9} {'python ms':>10} {'py/cpp':>7}")
        for row in node_ratios(cpp, python):
            mark = "" if row["judged"] else "  (not judged)"
            print(f"  {row['name']:<12} {row['op']:<12} {row['cpp_s'] * 1e3:>9.3f} "
                  f"{row['python_s'] * 1e3:>10.3f} {row['ratio']:>7.3f}{mark}")
            if row["judged"]:
                worst = max(worst, abs(row["ratio"] - 1))
    print(f"\nworst judged deviation: {worst:.1%} (tolerance {TOLERANCE:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
