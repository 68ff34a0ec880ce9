"""How close is the fake profile (fake tensors, priced by a device model) to a real one? Per
model family, the real profile and the fake profile priced for the same device, node by node.

    python3 bench/bench_fake_profile.py [--models branchy_cnn transformer_lm biglstm]
                                        [--batch 16] [--repeats 10] [--device cpu|cuda]
                                        [--device-model auto|cpu|H100|dgx-h100|...]

Per family: the median and worst relative error of a node's forward + backward seconds
(|fake - real| / real), the same over the nodes that make up 90 % of the real step (the small
ones are mostly fixed per-op cost, which is where a shape-only model is weakest), the whole
step's error, and whether the planner ranks the plans alike: hybridplan.search's top plans on
`--cluster` (default localhost-cpu) with `--devices` devices from each graph.

On a CPU both run with one intra-op thread and the device model is this CPU measured the same
way (device_model.measure_cpu: a float32 matmul's rate, a copy's bandwidth, a one-element op's
cost): the rates a calibrated cluster gives it. On CUDA, `--device-model auto` takes the GPU's
name ("H100" in "NVIDIA H100 80GB HBM3") from from_config's table. Neither profile carries
tensor-parallel fields or other batch sizes here (the fake one cannot know the first; both
would only add time), so the two graphs differ in their times alone.

`--by-op` adds, per family, where the difference comes from: one real training step run under
a dispatch mode that times every aten op on this thread's clock (CPU) and prices the same op,
at the same arguments, with the device model; ops are grouped by name and the groups that
account for most of the real step are printed with their real and priced totals. Each op is
timed on its own (its inputs produced by the real step), so what the table shows is the op's
cost against its price, not an attribution between nodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python")]

import torch  # noqa: E402
import torch.utils._python_dispatch  # noqa: E402

from hybridplan import models  # noqa: E402
from hybridplan.planner import search  # noqa: E402
from hybridplan.profiler import device_model as dm_lib, profile_dict  # noqa: E402
from hybridplan.profiler.from_config import DEVICES  # noqa: E402

kMajorShare = 0.9  # "major nodes": the largest nodes that together make this share of the step


def _device_model(spec: str, device: str):
    if spec != "auto":
        return dm_lib.device_model(spec)
    if device == "cpu":
        return dm_lib.measure_cpu()
    name = torch.cuda.get_device_name(0).upper()
    key = next((k for k in DEVICES if k in name), None)
    if key is None:
        raise SystemExit(f"bench_fake_profile: no device model for {name!r}; pass "
                         f"--device-model with a preset (known GPUs: {sorted(DEVICES)})")
    return dm_lib.device_model(key)


def _errors(real: dict, fake: dict) -> dict:
    times = {n["name"]: n["forward_s"] + n["backward_s"] for n in real["nodes"]}
    priced = {n["name"]: n["forward_s"] + n["backward_s"] for n in fake["nodes"]}
    if sorted(times) != sorted(priced):
        raise SystemExit(f"bench_fake_profile: {real['name']}: the two graphs' nodes differ")
    error = {n: abs(priced[n] - t) / t for n, t in times.items() if t > 0}
    step = sum(times.values())
    major, share = [], 0.0
    for n in sorted(times, key=times.get, reverse=True):
        if share >= kMajorShare * step:
            break
        major.append(n)
        share += times[n]
    worst = max(error, key=error.get)
    return {"nodes": len(times), "median": statistics.median(error.values()),
            "worst": error[worst], "worst_node": worst,
            "major_nodes": len(major), "major_median": statistics.median(error[n] for n in major),
            "major_worst": max(error[n] for n in major),
            "real_step_s": step, "fake_step_s": sum(priced.values())}


class _OpTimer(torch.utils._python_dispatch.TorchDispatchMode):
    """Times each aten op (the thread clock: one intra-op thread) and prices it with each
    device model of `dms`."""

    def __init__(self, dms):
        super().__init__()
        self.dms, self.ops = dms, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        started = time.thread_time()
        out = func(*args, **kwargs)
        real = time.thread_time() - started
        priced = [dm.op_s(func, args, kwargs, out) for dm in self.dms]
        name = func.overloadpacket.__name__
        count, r, p = self.ops.get(name, (0, 0.0, [0.0] * len(self.dms)))
        self.ops[name] = (count + 1, r + real, [a + b for a, b in zip(p, priced)])
        return out


def _by_op(model, inputs, loss, target, dms, steps: int = 3) -> dict:
    """{op name: (calls, real s, [priced s by each of dms])} per step, the last of `steps`
    steps (warm)."""
    for _ in range(steps):
        timer = _OpTimer(dms)
        with timer:
            out = model(*inputs)
            value = loss(out, target) if loss else out.sum()
            value.backward()
        model.zero_grad(set_to_none=True)
    return timer.ops


def _print_by_op(name: str, ops: dict, share: float = 0.9) -> None:
    real = sum(r for _, r, _ in ops.values())
    n_models = len(next(iter(ops.values()))[2])
    priced = [sum(p[i] for _, _, p in ops.values()) for i in range(n_models)]
    print(f"\n{name}: ops of one step, real {real * 1e3:.1f} ms, priced "
          f"{' / '.join(f'{p * 1e3:.1f}' for p in priced)} ms (the groups that make "
          f"{share:.0%} of the real):\n")
    columns = ["priced ms", "real / priced"] if len(priced) == 1 else [
        "priced ms", "real / priced", "without: priced ms", "without: real / priced"]
    print("| op | calls | real ms | " + " | ".join(columns) + " |")
    print("|---" * (3 + len(columns)) + "|")
    seen = 0.0
    for op, (count, r, ps) in sorted(ops.items(), key=lambda kv: -kv[1][1]):
        if seen >= share * real:
            break
        seen += r
        cells = [c for p in ps for c in (f"{p * 1e3:.2f}", f"{r / p:.1f}" if p > 0 else "-")]
        print(f"| {op} | {count} | {r * 1e3:.2f} | " + " | ".join(cells) + " |")


def _plan_key(plan) -> tuple:
    p = plan.to_dict()
    return " ".join(f"{k}={p[k]}" for k in ("mode", "dp", "mp", "tp", "sharding", "schedule",
                                            "num_microbatches") if p.get(k) is not None)


kZeroBubbleFields = ("weight_backward_fraction", "split_backward_extra_s", "split_held_bytes")


def _without_split_backward(graph: dict) -> dict:
    """`graph` without the zero-bubble split's measured fields, which a fake profile lacks."""
    return {**graph, "nodes": [{k: v for k, v in n.items() if k not in kZeroBubbleFields}
                               for n in graph["nodes"]]}


def _ranking(graph: dict, cluster: str, devices: int, top_k: int) -> list:
    return [_plan_key(p) for p in search(graph, cluster, devices=devices, top_k=top_k).plans]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["branchy_cnn", "transformer_lm", "biglstm"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--device-model", default="auto")
    parser.add_argument("--cluster", default="localhost-cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--by-op", action="store_true",
                        help="also time and price every aten op of one real step (CPU only)")
    parser.add_argument("--without", nargs="*", default=[], metavar="FIELD",
                        help="also price each family with these DeviceModel terms left out "
                             "(e.g. attention step_bandwidth), against the same real profile")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # the thread clock measures one thread's work
    dm = _device_model(args.device_model, args.device)
    print(f"device model: {dm.name}: {dm.source}")
    without = dataclasses.replace(dm, **{f.name: f.default for f in dataclasses.fields(dm)
                                         if f.name in args.without})
    if args.without:
        print(f"rows marked 'without': the same device model less {', '.join(args.without)}")
    print()
    print("| model | nodes | median error | worst error (node) | major nodes | major median "
          "| major worst | step real / fake (ms) | same top plan | same top-k order | "
          "same top-k, zero-bubble fields dropped | fake profile (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    by_op = {}
    for name in args.models:
        torch.manual_seed(0)
        model = models.get(name)
        inputs = model.example_inputs(args.batch)
        loss, target = models.loss_and_target(model, args.batch)
        common = dict(verbose=False, batch_sizes=(), loss_fn=loss, target=target)
        real = profile_dict(model, inputs, device=args.device, repeats=args.repeats,
                            clock="thread" if args.device == "cpu" else "auto",
                            tensor_parallel=False, **common)
        started = time.monotonic()
        fake = profile_dict(model, inputs, mode="fake", device_model=dm, tensor_parallel=False,
                            **common)
        fake_s = time.monotonic() - started
        rank_real = _ranking(real, args.cluster, args.devices, args.top_k)
        rank_plain = _ranking(_without_split_backward(real), args.cluster, args.devices,
                              args.top_k)
        rows = [(name, fake)]
        if args.without:
            rows.append((f"{name} without", profile_dict(
                model, inputs, mode="fake", device_model=without, tensor_parallel=False,
                **common)))
        for label, graph in rows:
            e = _errors(real, graph)
            rank_fake = _ranking(graph, args.cluster, args.devices, args.top_k)
            print(f"| {label} | {e['nodes']} | {e['median']:.0%} | {e['worst']:.0%} "
                  f"({e['worst_node']}) | {e['major_nodes']} | {e['major_median']:.0%} | "
                  f"{e['major_worst']:.0%} | {e['real_step_s'] * 1e3:.1f} / "
                  f"{e['fake_step_s'] * 1e3:.1f} | {rank_real[0] == rank_fake[0]} | "
                  f"{rank_real == rank_fake} | {rank_plain == rank_fake} | {fake_s:.1f} |",
                  flush=True)
            if rank_real != rank_fake:
                print(f"  real top plans: {rank_real}\n  fake top plans: {rank_fake}",
                      flush=True)
        if args.by_op and args.device == "cpu":
            by_op[name] = _by_op(model, inputs, loss, target,
                                 [dm, without] if args.without else [dm])
    for name, ops in by_op.items():
        _print_by_op(name, ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
