"""Executor overhead against PyTorch's own machinery on the same ranks (not a timed test):

  1. DP-only plan (placement, dp=2 x mp=1) vs torch.nn.parallel.DistributedDataParallel
  2. pipeline plan (dp=1 x mp=2, 1F1B) vs torch.distributed.pipelining used directly on the same
     stages: pipeline() with a split point where the plan's stage 1 begins, Pipe.build_stage,
     Schedule1F1B (the executor runs the same cut through its own stage modules)

Prints the median step time of each and the ratio executor / torch (1.0 = same speed; above 1 =
the executor is slower). Runs itself under torchrun with 2 local processes (Gloo on CPU):

    python bench/bench_executor.py [--model branchy_cnn] [--steps 30] [--global-batch 32]
"""

import argparse
import os
import statistics
import sys
import time

from torchrun_relaunch import relaunch  # this folder

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import hybridplan  # noqa: E402
from hybridplan.executor import destroy_groups  # noqa: E402
import hybridplan.models as models  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(models.MODELS), default="branchy_cnn")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    return p.parse_args()


def timed_medians_s(steps_by_name, steps: int, warmup: int):
    """Median wall time per step of each step function, the slowest rank's. They alternate step
    by step, so that load from other processes on the machine hits all alike. Shared by the
    benchmarks in this folder (bench_noise_online imports it)."""
    times = {name: [] for name in steps_by_name}
    for i in range(warmup + steps):
        for name, step in steps_by_name.items():
            dist.barrier()
            started = time.perf_counter()
            step(i)
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
    medians = torch.tensor([statistics.median(times[n]) for n in steps_by_name],
                           dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    return dict(zip(steps_by_name, medians.tolist()))


def data(model, global_batch, i):
    return model.example_inputs(global_batch, seed=i), model.example_target(global_batch, seed=7 + i)


def sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def bench_dp(args):
    """Executor under a DP-only plan vs torch DDP: same model, data, optimizer."""
    model = models.get(args.model, seed=0)
    plan = hybridplan.hand_plan(model, mode="placement", dp=2, mp=1,
                     per_replica_batch=args.global_batch // 2)
    hp = hybridplan.apply(plan, model, optimizer=sgd)

    def executor_step(i):
        hp.step(*hp.shard(*data(model, args.global_batch, i)))

    ref = models.get(args.model, seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    opt = sgd(ddp.parameters())

    def ddp_step(i):
        inputs, target = hp.shard(*data(ref, args.global_batch, i))
        opt.zero_grad(set_to_none=True)
        ref.loss(ddp(*inputs), target).backward()
        opt.step()

    t = timed_medians_s({"a": executor_step, "b": ddp_step}, args.steps, args.warmup_steps)
    return t["a"], t["b"]


def bench_pipeline(args):
    """Executor under a 2-stage 1F1B plan vs Schedule1F1B on torch's own cut at the same point."""
    from torch.distributed.pipelining import SplitPoint, pipeline
    from torch.distributed.pipelining import Schedule1F1B
    model = models.get(args.model, seed=0)
    example = model.example_inputs(args.global_batch)
    plan = hybridplan.hand_plan(model, mode="pipeline", dp=1, mp=2, schedule="1f1b",
                                num_microbatches=args.microbatches,
                                per_replica_batch=args.global_batch, example_inputs=example)
    hp = hybridplan.apply(plan, model, optimizer=sgd, example_inputs=example)

    def executor_step(i):
        inputs, target = data(model, args.global_batch, i)
        hp.step(inputs, target)

    ref = models.get(args.model, seed=0)
    boundary = next(a["name"] for a in plan["assignment"] if a["device"] == 1)
    micro = tuple(t[: args.global_batch // args.microbatches] for t in example)
    pipe = pipeline(ref, micro, split_spec={boundary: SplitPoint.BEGINNING})
    rank = dist.get_rank()
    stage = pipe.build_stage(rank, torch.device("cpu"))
    schedule = Schedule1F1B(stage, args.microbatches, loss_fn=ref.loss)
    opt = sgd(stage.submod.parameters())

    def torch_step(i):
        inputs, target = data(ref, args.global_batch, i)
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(*inputs)
        else:
            schedule.step(target=target, losses=[])
        opt.step()

    t = timed_medians_s({"a": executor_step, "b": torch_step}, args.steps, args.warmup_steps)
    return t["a"], t["b"]


def main():
    args = parse_args()
    code = relaunch(__file__, sys.argv[1:])  # under torchrun with 2 local ranks
    if code is not None:
        return code
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    dp_exec_s, ddp_s = bench_dp(args)
    pipe_exec_s, pipe_torch_s = bench_pipeline(args)
    if dist.get_rank() == 0:
        print(f"bench_executor: model {args.model}, global batch {args.global_batch}, "
              f"2 ranks (Gloo, CPU, {torch.get_num_threads()} thread/rank), median of "
              f"{args.steps} steps")
        print(f"DP-only plan (dp=2):        executor {dp_exec_s * 1e3:8.2f} ms  "
              f"torch DDP     {ddp_s * 1e3:8.2f} ms  ratio {dp_exec_s / ddp_s:.3f}")
        print(f"pipeline plan (mp=2, 1F1B, {args.microbatches} mb): executor "
              f"{pipe_exec_s * 1e3:8.2f} ms  Schedule1F1B {pipe_torch_s * 1e3:8.2f} ms  "
              f"ratio {pipe_exec_s / pipe_torch_s:.3f}")
    destroy_groups()  # the DDP baseline's wrapper is gone: collect, then destroy
    return 0


if __name__ == "__main__":
    sys.exit(main())
