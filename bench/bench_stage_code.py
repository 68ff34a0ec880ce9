"""Pipeline stage overhead: the executor's cut stages (torch.distributed.pipelining's split, run
with the graph's generated code, stage_split._run_generated_code) against the same stages run by
torch.fx.Interpreter (torch's default for the outlined modules) and against eager forward +
backward of the whole module, on one process and one thread (not a timed test):

    python bench/bench_stage_code.py [--model branchy_cnn] [--batches 1 8 32] [--repeats 30]

Per batch size, prints the median milliseconds of one forward + backward through both stages,
measured interleaved (one of each in turn, so load from other processes hits all alike).
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hybridplan.models as models  # noqa: E402
from hybridplan.profiler import block_list, stage_split  # noqa: E402


def stage_step(cut, flat):
    """One forward + backward through the cut's stages, each receiving detached leaves as from a
    p2p recv and sending its inputs' gradients back, as the pipeline runtime does."""
    def step():
        values, runs = flat, []
        for stage in cut.stages:
            received = [v.detach().requires_grad_(v.is_floating_point()) for v in values]
            values = stage(*received)
            runs.append((received, values))
        grads = [torch.ones_like(v) for v in values]
        for received, sent in reversed(runs):
            torch.autograd.backward([o for o, g in zip(sent, grads) if g is not None],
                                    [g for g in grads if g is not None])
            grads = [r.grad for r in received]
    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(models.MODELS), default="branchy_cnn")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    model = models.get(args.model, seed=0)
    names = list(block_list.select_nodes(model))
    stage_of = {n: 0 if i < len(names) // 2 else 1 for i, n in enumerate(names)}
    print(f"{args.model}: {len(names)} nodes, 2 stages, one thread; median ms per forward+backward")
    print("| batch | eager module | stages, generated code | stages, fx Interpreter |")
    print("|---|---|---|---|")
    for b in args.batches:
        inputs = model.example_inputs(b)
        fast = stage_split.split(model, inputs, {}, stage_of, 2)
        slow = stage_split.split(model, inputs, {}, stage_of, 2)
        for st in slow.stages:
            for m in st.modules():
                if hasattr(m, "_run_with_interpreter"):
                    m._run_with_interpreter = True

        def eager():
            model.zero_grad(set_to_none=True)
            model(*inputs).sum().backward()
        steps = {"eager": eager,
                 "generated": stage_step(fast, fast.flatten_inputs(inputs, {})),
                 "interpreter": stage_step(slow, slow.flatten_inputs(inputs, {}))}
        times = {k: [] for k in steps}
        for i in range(5 + args.repeats):
            for k, f in steps.items():
                start = time.perf_counter()
                f()
                if i >= 5:
                    times[k].append(time.perf_counter() - start)
        ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"| {b} | {ms['eager']:.2f} | {ms['generated']:.2f} | {ms['interpreter']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
