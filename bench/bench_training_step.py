"""The training step's equality matrix beyond the test's 2 ranks (not a timed benchmark):
clipping and accumulation under the plan kinds that need 4 ranks, against one process on the
same global batch (tests/python/test_training_step.py's cases and reference):

    python bench/bench_training_step.py [--kinds hybrid_z2 dp_tp pp_tp] [--features clip accum all]

    hybrid_z2  a 1F1B pipeline dp=2 x mp=2 sharded zero2 (FSDP2 per stage: accumulation's
               post-backward without reduction, the tied copies' shards summed once)
    dp_tp      placement dp=2 x tp=2 (FSDP2 replicate over TP DTensors)
    pp_tp      a 1F1B pipeline mp=2 x tp=2 (each TP rank's pipeline: slices' norms reduced
               over TP, then the p-th powers over the pipeline)

Prints a markdown table: max |difference| of the trained state from one process and the
largest relative difference of the returned norms; exits 1 when a cell is outside the test's
tolerances (state: allclose(rtol=1e-4, atol=1e-6); norms: 1e-6 relative).
"""

import argparse
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python"), os.path.join(HERE, "..", "tests", "python")]
from dist_harness import run_cases  # noqa: E402
import test_training_step as t  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["hybrid_z2", "dp_tp", "pp_tp"])
    parser.add_argument("--features", nargs="+", default=list(t.FEATURES))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    cases = [{"id": f"{k}-{f}", "kind": k, "feature": f}
             for k in args.kinds for f in args.features]
    with tempfile.TemporaryDirectory() as out_dir:
        loaded, failures = run_cases("test_training_step:train_cases", {4: cases}, out_dir,
                                     timeout_s=args.timeout)
    if failures:
        print(failures[4])
        return 1
    ok = True
    rows = ["| feature | " + " | ".join(args.kinds) + " |", "|---" * (len(args.kinds) + 1) + "|"]
    for feature in args.features:
        cells = []
        for kind in args.kinds:
            outs = loaded[f"{kind}-{feature}"]
            want, norms, _ = t.expected_for(kind, feature)
            diff = max(t.max_difference(out["state"], want) for out in outs)
            ok &= all(torch.allclose(out["state"][k], v, rtol=t.RTOL, atol=t.ATOL)
                      for out in outs for k, v in want.items())
            cell = f"{diff:.1e}"
            if norms:
                rel = max(abs(g - r) / r for out in outs for g, r in zip(out["norms"], norms))
                ok &= rel <= t.NORM_RTOL and all(len(out["norms"]) == len(norms) for out in outs)
                cell += f" (norm {rel:.1e})"
            cells.append(cell)
        rows.append(f"| {feature} | " + " | ".join(cells) + " |")
    print("\n".join(rows))
    print("within the tolerances" if ok else "OUTSIDE the tolerances")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
