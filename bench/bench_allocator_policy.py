"""One model's forward+backward step, one intra-op thread, under glibc's default allocator and
under the executor's policy (freed memory kept in the process: profiler.block_timing.
retain_freed_memory, which the executor, the profiler, calibrate and validate's host-speed check
all set), each in fresh processes taken in turn, so a slow spell of the host falls on both.
glibc returns a freed block of 128 KiB or more to the kernel by default, and the next step
page-faults on it again: a model whose step frees large blocks (BigLSTM's vocabulary-sized
activations) runs much slower, and less steadily, without the policy.

    python bench/bench_allocator_policy.py [--models biglstm branchy_cnn transformer_lm]
                                           [--pairs 4] [--steps 15] [--batch 32]

Needs a quiet machine. Prints, per model, each process's median step under each policy and the
ratio of the medians (default / kept).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("default", "kept")


def one_process(model: str, policy: str, steps: int, batch: int) -> float:
    """The median step (seconds) of `steps` steps after one warm-up, in this process."""
    import torch

    from hybridplan.measure.calibration import _workload
    from hybridplan.measure.timing import timed_samples
    from hybridplan.profiler.block_timing import retain_freed_memory

    if policy == "kept":
        retain_freed_memory()
    torch.set_num_threads(1)
    _, step = _workload(f"hybridplan.models:{model}", batch)
    return statistics.median(timed_samples(step, torch.device("cpu"), warmup=1, repeats=steps))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["biglstm", "branchy_cnn", "transformer_lm"])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a child: one process, one policy
        print(json.dumps(one_process(args.one[0], args.one[1], args.steps, args.batch)))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "python"),
                                                         os.environ.get("PYTHONPATH")])))
    print("| model | default allocator: median step per process (ms) | kept: (ms) "
          "| default / kept |")
    print("|---|---|---|---|")
    for model in args.models:
        medians = {policy: [] for policy in POLICIES}
        for _ in range(args.pairs):
            for policy in POLICIES:
                done = subprocess.run(
                    [sys.executable, __file__, "--one", model, policy, "--steps", str(args.steps),
                     "--batch", str(args.batch)], env=env, capture_output=True, text=True,
                    timeout=600)
                if done.returncode:
                    raise SystemExit(f"{model} ({policy}): {done.stderr[-2000:]}")
                medians[policy].append(json.loads(done.stdout.strip().splitlines()[-1]))
        ratio = statistics.median(medians["default"]) / statistics.median(medians["kept"])
        cells = [" ".join(f"{1e3 * t:.1f}" for t in medians[p]) for p in POLICIES]
        print(f"| {model} | {cells[0]} | {cells[1]} | {ratio:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
