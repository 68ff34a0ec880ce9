"""How well does the Python profiler's split of a step add up, and what does profiling cost?

    python3 bench/bench_profiler.py [--batch 8] [--rounds 5] [--steps 6] [--clock thread wall]

For each built-in model (hybridplan.models), one intra-op thread:
- node sum / step: sum over nodes of the profiled forward+backward medians, divided by the
  median of plain (unhooked) forward+backward steps measured right before and after each
  profile; the median over `rounds` profiles. 1.00 means nothing is lost or counted twice; the
  hooks' own cost (a Python call per node per pass) shows as a few percent above 1.
- profile_s: wall seconds of one profile_dict call (tracing, timing, FLOP counting).
- edges: torch.fx edges == forward-hook edges (the fallback path) on the same model, or
  "fx fails: hooks" where torch.fx cannot trace the model and the profiler takes the hooks'.
The "thread" clock is CPU time of this thread (robust on a shared machine); "wall" is
time.perf_counter, which on a busy machine also counts time other processes hold the cores.
The measurement is tests/python/profile_checks.py's node_sum_ratio, which
tests/python/test_profiler.py holds within 15 %.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests" / "python")]

import torch  # noqa: E402

from hybridplan import models  # noqa: E402
from hybridplan.profiler import block_list, dataflow  # noqa: E402
from profile_checks import CLOCKS, node_sum_ratio  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--clock", nargs="+", default=["thread", "wall"], choices=list(CLOCKS))
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(f"## Python profiler: node sum vs whole step (batch {args.batch}, 1 thread, "
          f"{args.rounds} rounds x {args.steps} steps)\n")
    print("| model | clock | nodes | edges | fx == hooks | step ms | node sum / step (min..max)"
          " | profile_s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in sorted(models.MODELS):
        model = models.get(name)
        inputs = model.example_inputs(args.batch)
        nodes = block_list.select_nodes(model)
        flow, _ = dataflow.record_dataflow(model, nodes, inputs)
        try:
            same_edges = flow.edges == dataflow.fx_edges(model, nodes, flow, inputs)
        except Exception:  # untraceable (transformer_lm's torch layers): the profiler uses hooks
            same_edges = "fx fails: hooks"
        for clock in args.clock:
            ratio, lo, hi, node_sum_s, profile_s, graph = node_sum_ratio(
                model, inputs, clock, args.rounds, args.steps)
            print(f"| {name} | {clock} | {len(graph['nodes'])} | {len(graph['edges'])} | "
                  f"{same_edges} | {node_sum_s * 1e3:.2f} | {ratio:.3f} ({lo:.3f}..{hi:.3f}) | "
                  f"{profile_s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
