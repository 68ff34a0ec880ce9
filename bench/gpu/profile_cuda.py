"""Profiles the built-in models on CUDA (on a machine with a GPU; exits 0 with SKIPPED without CUDA).

    python3 bench/gpu/profile_cuda.py [--batch 64] [--repeats 20] [--out-dir out/gpu-graphs]

For each model in hybridplan.models: hybridplan profile on cuda:0 with CUDA-event timing, the
node sum of forward+backward against whole plain steps timed with CUDA events (median of
`repeats`), and the graph written to --out-dir (or $OUT when set) as <model>.cuda.graph.json.
A ratio near 1 says the per-node split holds on the GPU too; well above 1 means per-node event
records and hook calls cost more than the kernels (small models at small batch).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import torch  # noqa: E402


def plain_steps_s(model, inputs, steps):
    """CUDA-event seconds of unhooked forward+backward steps (all-ones output gradient)."""
    samples = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        out = model(*inputs)
        torch.autograd.backward(out, torch.ones_like(out))
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "out/gpu-graphs"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: bench/gpu/profile_cuda.py needs CUDA (torch.cuda.is_available() is "
              "False on this machine); run it on a machine with a GPU")
        return 0

    from hybridplan import models
    from hybridplan.profiler import profile_dict

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda", 0)
    print(f"## Python profiler on {torch.cuda.get_device_name(device)} (batch {args.batch}, "
          f"median of {args.repeats}, CUDA events)\n")
    print("| model | nodes | edges | node sum ms | plain step ms | ratio | profile_s |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(models.MODELS):
        model = models.get(name)
        inputs = model.example_inputs(args.batch)
        start = time.perf_counter()
        graph = profile_dict(model, inputs, device=device, warmup=5, repeats=args.repeats,
                             verbose=False, name=name)
        profile_s = time.perf_counter() - start
        inputs = tuple(x.to(device) for x in inputs)  # profile_dict moved the model
        plain_s = statistics.median(plain_steps_s(model, inputs, args.repeats + 5)[5:])
        node_sum_s = sum(n["forward_s"] + n["backward_s"] for n in graph["nodes"])
        (out_dir / f"{name}.cuda.graph.json").write_text(json.dumps(graph, indent=2) + "\n")
        print(f"| {name} | {len(graph['nodes'])} | {len(graph['edges'])} | "
              f"{node_sum_s * 1e3:.3f} | {plain_s * 1e3:.3f} | {node_sum_s / plain_s:.3f} | "
              f"{profile_s:.1f} |", flush=True)
    print(f"\ngraphs in {out_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
