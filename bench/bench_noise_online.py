"""Cost of measuring the gradient noise scale online (apply(..., measure_noise_scale=N)): the
executor's step time with and without the measuring DDP comm hook (not a timed test; target
< 2 % of a step at N = 1, every step measured).

Two AppliedPlans of the same built-in model under the same DP-only plan (dp = 2) on the same
ranks, one measuring every step and one not, run alternately step by step so that load from
other processes hits both alike; prints the median step time of each (the slowest rank's) and
the overhead. Runs itself under torchrun with 2 local processes (Gloo on CPU), one run per
`--every`:

    python bench/bench_noise_online.py [--model branchy_cnn] [--steps 60] [--global-batch 32]
        [--every 1 10] [--rounds 3]
"""

import argparse
import os
import sys

from torchrun_relaunch import relaunch  # this folder

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hybridplan  # noqa: E402
import hybridplan.models as models  # noqa: E402
from bench_executor import data, sgd, timed_medians_s  # noqa: E402  (this folder)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(models.MODELS), default="branchy_cnn")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--every", type=int, nargs="+", default=[1, 10])
    p.add_argument("--rounds", type=int, default=3,
                   help="repeat the interleaved comparison; the median round is reported")
    return p.parse_args()


def bench(args, every: int):
    plain_model = models.get(args.model, seed=0)
    plan = hybridplan.hand_plan(plain_model, mode="placement", dp=2, mp=1,
                                per_replica_batch=args.global_batch // 2)
    plain = hybridplan.apply(plan, plain_model, optimizer=sgd)
    measured_model = models.get(args.model, seed=0)
    measured = hybridplan.apply(plan, measured_model, optimizer=sgd, measure_noise_scale=every)

    def step_of(hp, model):
        return lambda i: hp.step(*hp.shard(*data(model, args.global_batch, i)))

    rounds = [timed_medians_s({"plain": step_of(plain, plain_model),
                               "measured": step_of(measured, measured_model)},
                              args.steps, args.warmup_steps) for _ in range(args.rounds)]
    rounds.sort(key=lambda r: r["measured"] / r["plain"])
    return rounds[len(rounds) // 2], measured.noise_scale()


def main():
    args = parse_args()
    code = relaunch(__file__, sys.argv[1:])  # under torchrun with 2 local ranks
    if code is not None:
        return code
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    results = [(every, *bench(args, every)) for every in args.every]
    if dist.get_rank() == 0:
        print(f"bench_noise_online: model {args.model}, global batch {args.global_batch}, DP-only "
              f"plan dp=2 (Gloo, CPU, {torch.get_num_threads()} thread/rank), median of "
              f"{args.steps} interleaved steps, median of {args.rounds} rounds; target < 2 %")
        for every, medians, est in results:
            overhead = medians["measured"] / medians["plain"] - 1
            b = "n/a" if est is None else f"{est.b_simple:.1f} +- {est.stderr:.1f}"
            print(f"measure_noise_scale={every:<3d} step {medians['measured'] * 1e3:8.2f} ms, "
                  f"without {medians['plain'] * 1e3:8.2f} ms: overhead {100 * overhead:+.2f} % "
                  f"({'ok' if overhead < 0.02 else 'ABOVE TARGET'}); B_simple {b}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
