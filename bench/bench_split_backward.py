"""The zero-bubble schedules' split backward (autograd.split_backward: I, the inputs' gradients,
then W, the parameters') against one plain backward, on one process and one thread (not a timed
test):

    python bench/bench_split_backward.py [--steps 16 32 64 128] [--layers 4] [--repeats 7]

Two workloads: a projected nn.LSTM (width 32, projection 16, batch 2) at each sequence length of
`--steps` (run step by step, it records a weight-gradient product per step, and every step's
gates add the same bias), and `--layers` TransformerEncoderLayers (d 256, 8 heads, 8 x 64
tokens). Per workload, prints the median milliseconds of the plain backward, of I and of W, each
workload's three measured in turn, and checks that I + W gave the plain backward's gradients.
W's time should grow with the LSTM's steps as the plain backward does, not with their square.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from hybridplan.autograd.split_backward import backward_input, backward_weight  # noqa: E402


def timed(module: torch.nn.Module, x: torch.Tensor, repeats: int):
    """(plain, I, W) median seconds, and the largest |difference| of the split's parameter and
    input gradients from the plain backward's."""
    params = [p for p in module.parameters() if p.requires_grad]

    def forward():
        out = module(x.clone())
        out = out[0] if isinstance(out, tuple) else out
        return out, torch.ones_like(out)

    took = {"plain": [], "I": [], "W": []}
    worst = 0.0
    for _ in range(repeats + 1):  # the first round warms up
        for p in params:
            p.grad = None
        x.grad = None
        out, grad = forward()
        start = time.perf_counter()
        torch.autograd.backward([out], [grad])
        took["plain"].append(time.perf_counter() - start)
        want = [p.grad.clone() for p in params] + [x.grad.clone()]
        for p in params:
            p.grad = None
        out, grad = forward()
        start = time.perf_counter()
        (dx,), state = backward_input([out], [grad], [x], params)
        middle = time.perf_counter()
        backward_weight(state)
        took["I"].append(middle - start)
        took["W"].append(time.perf_counter() - middle)
        got = [p.grad for p in params] + [dx]
        worst = max(worst, max(float((a - b).abs().max()) for a, b in zip(got, want)))
    return tuple(statistics.median(took[k][1:]) for k in ("plain", "I", "W")), worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("one thread; median ms per backward")
    print("| workload | plain backward | I | W | I + W over plain | max abs difference |")
    print("|---|---|---|---|---|---|")
    rows = []
    for steps in args.steps:
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(32, 32, proj_size=16, batch_first=True)
        x = torch.randn(2, steps, 32, requires_grad=True)
        rows.append((f"LSTM, {steps} steps", *timed(lstm, x, args.repeats)))
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(
        256, 8, 1024, dropout=0.0, batch_first=True) for _ in range(args.layers)])
    x = torch.randn(8, 64, 256, requires_grad=True)
    rows.append((f"{args.layers} transformer layer{'s' if args.layers > 1 else ''}",
                 *timed(layers, x, args.repeats)))
    failed = False
    for name, (plain, i, w), worst in rows:
        print(f"| {name} | {1e3 * plain:.1f} | {1e3 * i:.1f} | {1e3 * w:.1f} | "
              f"{(i + w) / plain:.2f}x | {worst:.1e} |", flush=True)
        failed |= worst > 1e-4
    if failed:
        print("the split's gradients differ from the plain backward's", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
