"""How steady this host's speed is, by kind of work: short windows of four workloads taken in
turn on one thread for `--seconds`, each window's time against that workload's median.

    python bench/bench_host_noise.py [--seconds 60] [--model hybridplan.models:biglstm]

- scalar: a Python loop of dependent integer additions (the interpreter; no vector units, a
  working set in L1);
- simd-mm: torch.mm of two 64x64 float matrices, repeated (vector units; 48 KiB, in L1/L2);
- dram-copy: copying 64 MiB (memory bandwidth);
- model step: calibrate's shared-core workload, the model's forward and backward at `--batch`
  under the executor's allocator policy (calibration._workload), where `--model` is given.

`validate` compares a calibration taken minutes earlier with launches timed now, so a host whose
speed moves within seconds bounds how closely any prediction can be measured on it: the spread
of the model step's windows (p90/p10) is that bound. The four kinds tell whether the host's
changes hit compute, vector units or memory bandwidth. On this project's 2-core virtual machine
every kind moved (2026-12-04: p90/p10 1.92 scalar, 1.56 simd, 1.28 dram, 1.36 BigLSTM's step,
docs/calibration.md) while the guest's CPU accounting showed no steal time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def _scalar() -> None:
    x = 0
    for i in range(200_000):
        x = (x + i) & 0xFFFF


def _workloads(model: str, batch: int) -> dict:
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    src = torch.randn(16 << 20)
    dst = torch.empty_like(src)
    work = {"scalar": _scalar,
            "simd-mm": lambda: [torch.mm(a, b) for _ in range(2000)],
            "dram-copy": lambda: [dst.copy_(src) for _ in range(4)]}
    if model:
        from hybridplan.measure.calibration import _workload, retain_freed_memory

        retain_freed_memory()
        _, step = _workload(model, batch)
        work["model step"] = lambda: [step() for _ in range(3)]
    return work


def _quantile(xs, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--model", default="hybridplan.models:biglstm",
                   help="MODULE:FACTORY of the model step ('' for none)")
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    work = _workloads(args.model, args.batch)
    for fn in work.values():  # warm-up
        fn()
    times = {name: [] for name in work}
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        for name, fn in work.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(f"one thread, {args.seconds:.0f} s, {len(times['scalar'])} windows of each, taken in "
          "turn; each window's time over its workload's median")
    print()
    print("| workload | median window (ms) | p10 | p90 | slowest | p90 / p10 |")
    print("|---|---|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        p10, p90 = _quantile(ts, 0.1) / med, _quantile(ts, 0.9) / med
        print(f"| {name} | {med * 1e3:.1f} | {p10:.2f} | {p90:.2f} | {max(ts) / med:.2f} | "
              f"{p90 / p10:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
