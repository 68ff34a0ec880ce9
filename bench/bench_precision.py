"""Mixed precision (docs/training_step.md "Precision"), three measurements:

    python bench/bench_precision.py equality [--kinds KIND[:fp16] ...] [--steps 20]
        every 2-rank plan kind in bf16 (default; --kinds names others, the 4-rank ones of
        test_precision.WORLD included, KIND:fp16 in fp16 with the loss scaler) against one
        process in the same precision under the same policy (tests/python/test_precision.py's
        cases and reference), one launch per world size: the table plan kind -> max
        |difference| of the trained state, its bound (4u x the update, u = 2^-8), the largest
        relative loss difference; then the loss curves side by side. Exits 1 outside the bound.
    python bench/bench_precision.py speedup [--model transformer_lm] [--batch 8]
        this CPU's rate in bf16 and fp16 against fp32, one process, one thread: torch.matmul
        at the model's Linear shapes (a token model: M = batch x sequence rows), and the model's
        forward+backward under torch.autocast (measure.calibration.compute_speedup, what
        `hybridplan calibrate` records as device.compute_speedup).
    python bench/bench_precision.py predict [--model transformer_lm] [--batch 8] [--devices 2]
        the model profiled in fp32 and planned for this machine's cluster (localhost-cpu with
        the compute_speedup measured above) in fp32 and in bf16: the best plan and its
        predicted step in each, and the terms that moved.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python"), os.path.join(HERE, "..", "tests", "python")]


def equality(args) -> int:
    import test_precision as t
    from dist_harness import run_cases
    by_world = {}
    for name in args.kinds:
        kind, _, precision = name.partition(":")
        by_world.setdefault(t.WORLD.get(kind, 2), []).append(
            {"id": name.replace(":", "-"), "kind": kind, "steps": args.steps,
             "precision": precision or "bf16"})
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out_dir:
        loaded, failures = run_cases("test_precision:train_cases", by_world, out_dir,
                                     timeout_s=args.timeout)
    print(f"launches ({', '.join(f'{w} ranks' for w in by_world)}): "
          f"{time.perf_counter() - started:.0f} s")
    if failures:
        print("\n".join(failures.values()))
        return 1
    ok = True
    rows = ["| plan kind | ranks | precision | policy | max abs difference | "
            "bound (4u x update) | max loss difference (relative) |",
            "|---|---|---|---|---|---|---|"]
    curves = {}
    for cases in by_world.values():
        for case in cases:
            kind, precision, outs = case["kind"], case["precision"], loaded[case["id"]]
            _, losses = t.reference(kind, args.steps, precision)
            diff, bound, loss_diff = t.compare(outs, kind, args.steps, precision)
            ok &= diff <= bound and loss_diff <= t.TOLERANCE and all(
                str(t.DTYPES[precision]) in out["saved"] for out in outs)
            policy = "MixedPrecisionPolicy" if kind in t.FSDP_POLICY else "autocast"
            rows.append(f"| {kind} | {len(outs)} | {precision} | {policy} | {diff:.2e} | "
                        f"{bound:.2e} | {loss_diff:.2e} |")
            curves[case["id"]] = (t.global_losses(outs), losses)
    print("\n".join(rows))
    print("\nloss on the global batch per step, plan / one process:")
    header = "| step | " + " | ".join(curves) + " |"
    print(header + "\n" + "|---" * (len(curves) + 1) + "|")
    for step in range(args.steps):
        cells = [f"{a[step]:.4f} / {b[step]:.4f}" for a, b in curves.values()]
        print(f"| {step} | " + " | ".join(cells) + " |")
    print("within the bounds" if ok else "OUTSIDE the bounds")
    return 0 if ok else 1


def _model(name, batch):
    from hybridplan import models
    module = models.get(name)
    inputs = tuple(module.example_inputs(batch))
    loss_fn, target = models.loss_and_target(module, batch)
    return module, inputs, loss_fn, target


def _median_s(fn, repeats=15, warmup=3):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_speedup(name, batch):
    """(rows of matmul shape -> seconds per dtype, model step seconds per precision, the
    compute_speedup dict)."""
    from hybridplan.measure.calibration import compute_speedup
    from hybridplan.profiler.block_timing import backward_roots
    torch.set_num_threads(1)
    module, inputs, loss_fn, target = _model(name, batch)
    shapes = []
    if not inputs[0].is_floating_point():  # token ids: a Linear's M is the batch's tokens
        shapes = sorted({(inputs[0].numel(), m.in_features, m.out_features)
                         for m in module.modules() if isinstance(m, torch.nn.Linear)})
    matmuls = []
    for m, k, n in shapes:
        times = {}
        for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16),
                             ("fp16", torch.float16)):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            times[dname] = _median_s(lambda: torch.matmul(a, b))
        matmuls.append(((m, k, n), times))

    def step():
        module.zero_grad(set_to_none=True)
        output = module(*inputs)
        roots = backward_roots(output, lambda o: loss_fn(o, target))
        torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
    speedup, seconds = compute_speedup(step, torch.device("cpu"), 3, 15)
    return matmuls, seconds, speedup


def speedup(args) -> int:
    matmuls, seconds, ratio = measure_speedup(args.model, args.batch)
    print(f"{args.model} at batch {args.batch}, one thread ({torch.__version__})")
    print("| matmul M x K x N | fp32 | bf16 | fp16 | fp32/bf16 | fp32/fp16 |\n|---|---|---|---|---|---|")
    for (m, k, n), t in matmuls:
        print(f"| {m} x {k} x {n} | {t['fp32'] * 1e6:.0f} us | {t['bf16'] * 1e6:.0f} us | "
              f"{t['fp16'] * 1e6:.0f} us | {t['fp32'] / t['bf16']:.2f} | "
              f"{t['fp32'] / t['fp16']:.2f} |")
    print("model forward+backward: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in
                                                  seconds.items()))
    print("device.compute_speedup = " + json.dumps({k: round(v, 3) for k, v in ratio.items()}))
    return 0


def predict(args) -> int:
    import hybridplan
    from hybridplan import planner
    from hybridplan.front_door import describe
    from hybridplan.planner import Cluster, Job
    _, _, ratio = measure_speedup(args.model, args.batch)
    module, inputs, loss_fn, target = _model(args.model, args.batch)
    graph = hybridplan.profile(module, inputs, loss_fn=loss_fn, target=target, verbose=False)
    cluster_dict = Cluster.preset("localhost-cpu").to_dict()
    cluster_dict["device"]["compute_speedup"] = ratio
    cluster = Cluster.from_dict(cluster_dict)
    print(f"{args.model} profiled in fp32 at batch {args.batch}; localhost-cpu with "
          f"compute_speedup {json.dumps({k: round(v, 3) for k, v in ratio.items()})}")
    print("| precision | best plan | step | compute | all-reduce | sharding | memory/device |\n"
          "|---|---|---|---|---|---|---|")
    for precision in ("fp32", "bf16"):
        job = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                             "optimizer": "adam", "precision": precision,
                             "per_replica_batch": args.batch})
        best = planner.plan(graph, cluster, job=job, devices=args.devices)
        p = best.predicted
        print(f"| {precision} | {describe(best)} | {p['step_s'] * 1e3:.2f} ms | "
              f"{p['compute_s'] * 1e3:.2f} ms | {p['allreduce_s'] * 1e3:.2f} ms | "
              f"{p.get('sharding_s', 0) * 1e3:.2f} ms | {max(p['memory_bytes']) / 2**20:.1f} MiB |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    eq = sub.add_parser("equality")
    eq.add_argument("--kinds", nargs="+", default=None)
    eq.add_argument("--steps", type=int, default=20)
    eq.add_argument("--timeout", type=float, default=1200)
    for name in ("speedup", "predict"):
        p = sub.add_parser(name)
        p.add_argument("--model", default="transformer_lm")
        p.add_argument("--batch", type=int, default=8)
        p.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    if args.what == "equality":
        import test_precision as t
        args.kinds = args.kinds or list(t.FULL_KINDS)
        return equality(args)
    return speedup(args) if args.what == "speedup" else predict(args)


if __name__ == "__main__":
    sys.exit(main())
