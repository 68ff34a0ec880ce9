"""What the Python profiler's times are held against, shared by the tests and the benchmarks
(bench/bench_profile_agreement.py, bench/bench_profiler.py):

  - the C++ profiler on the same model (profile_model, examples/cpp/profile_model.cc, against
    the model's Python twin, twins.py): identical structure, and per-node times within a rule;
  - the plain steps of the model: the profiled nodes' forward+backward sum over a whole
    unhooked step (node_sum_ratio).

Both profilers measure the same way: whole training steps, each split among the nodes at the
points where each node's forward returns and where its output's gradient is ready (Python: module
hooks and autograd pre-hooks; C++: the blocks' return points and Tensor::register_hook), with
glibc keeping freed memory (retain_freed_memory) so that page faults do not enter op times.

Judging rule: a node that takes at least JUDGED_SHARE of the step (the nodes a plan is made of)
must agree within TOLERANCE relative; every other node within ABSOLUTE_S absolute. The small
nodes cannot agree relatively: the Python interpreter and the profiler's hooks add about 0.1 ms
per node (module call, autograd pre-hook; more for the last node, which also carries
torch.autograd.backward's Python wrapper) that a C++ step does not spend.

As a script, the Python side of one round in a process of its own (python_profile runs it):
    python profile_checks.py MODEL --batch B --repeats R --clock thread --out graph.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch

from twins import ROOT, TWINS, bin_dir

TOLERANCE = 0.20  # |python - cpp| / cpp, per judged node
JUDGED_SHARE = 0.05  # a node is judged relatively from this share of the C++ step's time
ABSOLUTE_S = 0.5e-3  # |python - cpp| of every other node (the Python per-node overhead, 5x)

CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}


# ---- the C++ profiler against the Python one ---------------------------------------------------

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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH", "")) if p))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{model}.json"
        subprocess.run([sys.executable, __file__, model, "--batch", str(batch), "--repeats",
                        str(repeats), "--clock", clock, "--out", str(out)],
                       check=True, capture_output=True, text=True, timeout=600, env=env)
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
    """`rounds` C++ and Python profiles of `model`, alternating, so that a slow spell of the
    machine does not fall on one side only."""
    cpp, python = [], []
    for _ in range(rounds):
        cpp.append(cpp_profile(model, batch, repeats, clock))
        python.append(python_profile(model, batch, repeats, clock))
    return cpp, python


# ---- the profiled nodes against plain steps ---------------------------------------------------

def plain_steps_s(model, inputs, steps: int, now) -> List[float]:
    """Seconds (clock `now`) of `steps` unhooked forward+backward steps."""
    samples = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        start = now()
        out = model(*inputs)
        torch.autograd.backward(out, torch.ones_like(out))
        samples.append(now() - start)
    return samples


def node_sum_ratio(model, inputs, clock: str, rounds: int, steps: int):
    """Per round, the profiled nodes' forward+backward sum over the median plain step measured
    right before and after that profile; returns (median ratio, min, max, median node sum,
    median seconds of one profile_dict call, the last graph)."""
    from hybridplan.profiler import block_timing, profile_dict

    now = CLOCKS[clock]
    block_timing.retain_freed_memory()  # the profiler's allocator policy, for plain steps too
    plain_steps_s(model, inputs, 2, now)
    before = plain_steps_s(model, inputs, steps, now)
    ratios, node_sums, profile_s = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        graph = profile_dict(model, inputs, warmup=1, repeats=steps, verbose=False, clock=clock)
        profile_s.append(time.perf_counter() - start)
        after = plain_steps_s(model, inputs, steps, now)
        node_sum = sum(n["forward_s"] + n["backward_s"] for n in graph["nodes"])
        node_sums.append(node_sum)
        ratios.append(node_sum / statistics.median(before + after))
        before = after
    return (statistics.median(ratios), min(ratios), max(ratios), statistics.median(node_sums),
            statistics.median(profile_s), graph)


def _main() -> int:
    parser = argparse.ArgumentParser(description="the Python side of one profile round")
    parser.add_argument("model", choices=sorted(TWINS))
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--clock", choices=sorted(CLOCKS), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    graph = python_profile_here(args.model, args.batch, args.repeats, args.clock)
    Path(args.out).write_text(json.dumps(graph))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
