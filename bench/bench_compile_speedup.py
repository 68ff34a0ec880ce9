"""Each graph node of a small model compiled by torch.compile (inductor, one graph per block, as
apply(compile=True) runs it) against eager: the per-node speed-ups `hybridplan calibrate
--compile-graph` records, what the planner then predicts for the model's step compiled, and
the trained parameters of the whole model compiled against eager.

    python bench/bench_compile_speedup.py [--model hybridplan.models:digits_cnn] [--batch 32]
        [--repeats 11] [--backend inductor]

One process, this machine's CPU (OMP threads as set). Prints a Markdown table per node and the
largest difference of the parameters after 2 SGD steps of the model with every block compiled
from the same steps eager (the tolerance torch.compile allows: rtol 1e-4, atol 1e-5).
"""

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hybridplan.models:digits_cnn")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--backend", default="inductor")
    args = ap.parse_args()
    import hybridplan
    from hybridplan import models
    from hybridplan.executor.compiling import compile_blocks
    from hybridplan.factories import load_factory
    from hybridplan.measure.compile_speedup import compile_speedups, with_compile_speedups
    from hybridplan.measure.timing import timed_samples
    from hybridplan.planner import Graph, Job

    torch.manual_seed(0)
    module = load_factory(args.model)()
    inputs = tuple(module.example_inputs(args.batch))
    loss_fn, target = models.loss_and_target(module, args.batch)
    graph = hybridplan.profile(module, inputs, loss_fn=loss_fn, target=target,
                               verbose=False).to_dict()
    names = [n["name"] for n in graph["nodes"]]
    options = {"backend": args.backend}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured = compile_speedups(module, inputs, names, torch.device("cpu"), args.warmup,
                                    args.repeats, options)
    took = time.perf_counter() - start
    print(f"{args.model} at batch {args.batch}, backend {args.backend}, {len(names)} nodes "
          f"({took:.0f} s with compilation)\n")
    print("| node | eager fwd+bwd ms | compiled fwd+bwd ms | speed-up forward | "
          "speed-up backward | compiled |")
    print("|---|---|---|---|---|---|")
    for name in names:
        m = measured.get(name)
        if m is None:
            continue
        print(f"| {name} | {m['eager_s'] * 1e3:.3f} | {m['compiled_s'] * 1e3:.3f} | "
              f"{m['forward']:.2f} | {m['backward']:.2f} | {'yes' if m['compiled'] else 'eager'} |")
    for w in caught:
        if "hybridplan compile" in str(w.message):
            print(f"\n{w.message}")
    written = Graph.from_dict(with_compile_speedups(graph, measured), "graph")
    for compile_flag in (False, True):
        job = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                             "per_replica_batch": args.batch, "compile": compile_flag}, "job")
        best = hybridplan.plan(written, "localhost-cpu", job, devices=1)
        print(f"\npredicted step at batch {args.batch} on one CPU rank, "
              f"{'compiled' if compile_flag else 'eager'}: {best.predicted['step_s'] * 1e3:.2f} ms")
    # the whole model, every block compiled, 2 SGD steps against eager; then its step timed
    eager, compiled = copy.deepcopy(module), copy.deepcopy(module)
    compile_blocks(compiled, names, options)
    steps = {}
    for label, model in (("eager", eager), ("compiled", compiled)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(model=model, opt=opt):
            opt.zero_grad()
            out = model(*inputs)
            loss = loss_fn(out, target) if loss_fn is not None else out.float().mean()
            loss.backward()
            opt.step()
        for _ in range(2):
            step()
        steps[label] = step
    diff = max((a - b).abs().max().item()
               for a, b in zip(eager.parameters(), compiled.parameters()))
    close = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
                for a, b in zip(eager.parameters(), compiled.parameters()))
    for label, step in steps.items():
        seconds = statistics.median(timed_samples(step, torch.device("cpu"), args.warmup,
                                                  args.repeats))
        print(f"measured step (forward, backward, SGD) at batch {args.batch}, {label}: "
              f"{seconds * 1e3:.2f} ms")
    print(f"\nparameters after 2 steps, every block compiled vs eager: largest difference "
          f"{diff:.3g} ({'within' if close else 'OUTSIDE'} rtol 1e-4, atol 1e-5)")
    return 0 if close else 1


if __name__ == "__main__":
    sys.exit(main())
