"""Do the C++ and Python profilers agree? Per node of each C++ built-in model and its Python twin
(same layers, qualified names and shapes), the ratio of forward+backward seconds, Python / C++.

    python3 bench/bench_profile_agreement.py [--models mlp biglstm small_cnn] [--batch 32]
                                             [--repeats 31] [--rounds 7] [--clock thread|wall]

The C++ side is `profile_model` (examples/cpp/profile_model.cc; found in $HYBRIDPLAN_BIN_DIR,
else build/bin). Both sides run with one intra-op thread and, by default, the "thread" clock (CPU
time of the profiling thread), so other processes on a shared CPU do not enter the times. The
two sides alternate for `rounds` rounds and each node's time is its median over the rounds, so
a slow spell of the machine does not fall on one side only.

The twins, the two profiles and the judging rule are tests/python's (twins.py,
profile_checks.py: how both profilers measure, and why the small nodes are judged absolutely),
which tests/python/test_cpp_profile_agreement.py holds with a looser bound.
Exit status 1 when the rule is not met.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests" / "python")]

from profile_checks import (ABSOLUTE_S, JUDGED_SHARE, TOLERANCE, compare,  # noqa: E402
                            profile_both, structure)
from twins import TWINS, bin_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(TWINS), choices=sorted(TWINS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clock", default="thread", choices=["thread", "wall"])
    args = parser.parse_args()
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
