"""C++ data parallelism (hybridplan::Executor on c10d::Reducer, examples/cpp/train_mlp, no Python
in the training processes) against torch.nn.parallel.DistributedDataParallel in Python, on the
same MLP, data, initial weights and optimizer (SGD with momentum), 2 Gloo ranks on 127.0.0.1,
one intra-op thread each:

    python bench/bench_cpp_ddp.py [--widths 256,1024,1024,256] [--global-batch 64] [--steps 40]
                                  [--rounds 5]

Runs the two jobs alternately, `rounds` times each, and prints the median step time of each side
(median over rounds of each job's median step after `--warmup-steps`), the ratio C++ / torch
(1.0 = same speed; above 1 = the C++ executor is slower) and how far the trained parameters of
the two sides are apart. The runs are tests/python/cpp_ddp.py's, with which
tests/python/test_cpp_ddp.py holds the C++ training equal to DDP's. The binary is found in
$HYBRIDPLAN_BIN_DIR, else build/bin.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests" / "python")]

from cpp_ddp import max_relative_difference, prepare, run_cpp, run_ddp  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default="256,1024,1024,256")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
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
