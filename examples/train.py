"""Trains a built-in model under a plan in a torch.distributed job and reports the measured step
time next to the plan's predicted step time.

    # a plan from the planner (its dp, mp and mode fix the number of processes):
    torchrun --nproc-per-node 4 examples/train.py --model branchy_cnn --plan plan.json
    # or a plan written by hand (leaves split evenly over mp devices/stages):
    torchrun --nproc-per-node 4 examples/train.py --model gnmt_lstm \\
        --mode pipeline --dp 2 --mp 2 --schedule 1f1b --microbatches 4
    # two machines (here: two launches on one), rendezvous at 127.0.0.1:29500:
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port 29500 examples/train.py --model branchy_cnn --mode pipeline --dp 2 --mp 2

Every rank builds the same model and draws the same global batch per step (the model's
example data, seeded by the step); each replica trains on its 1/dp share. Rank 0 prints.
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

try:
    import hybridplan
except ImportError:  # run from a source checkout without PYTHONPATH=python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import hybridplan
import hybridplan.models as models


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(models.MODELS), default="branchy_cnn")
    p.add_argument("--model-kwargs", type=json.loads, default={},
                   help='JSON keyword arguments of the model factory, e.g. \'{"width": 8}\'')
    p.add_argument("--plan", help="plan JSON (hybridplan plan --out); else a hand plan:")
    p.add_argument("--mode", choices=["placement", "pipeline"], default="pipeline")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--mp", type=int, default=2)
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--global-batch", type=int,
                   help="samples per step over all replicas (default: the plan's global_batch)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3, help="steps left out of the timing")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--save-state", help="rank 0 saves the trained state_dict here (torch.save)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    model = models.get(args.model, seed=0, **args.model_kwargs)
    if args.plan:
        plan = hybridplan.planner.Plan.load(args.plan) if _has_planner() else args.plan
    else:
        per_replica = (args.global_batch or 8 * args.dp) // args.dp
        plan = hybridplan.hand_plan(model, mode=args.mode, dp=args.dp, mp=args.mp,
                         schedule=args.schedule if args.mode == "pipeline" else "none",
                         num_microbatches=args.microbatches, per_replica_batch=per_replica,
                         name=args.model)
    plan_dict = (plan.to_dict() if hasattr(plan, "to_dict")
                 else plan if isinstance(plan, dict) else _read_json(plan))
    global_batch = args.global_batch or plan_dict["per_replica_batch"] * plan_dict["dp"]
    # a pipeline plan's stages are traced at one replica batch (public API: example_inputs)
    example = model.example_inputs(global_batch // plan_dict["dp"], seed=0)
    hp = hybridplan.apply(plan, model, timeout_s=args.timeout_s, example_inputs=example,
                          optimizer=functools.partial(torch.optim.SGD, lr=args.lr,
                                                      momentum=args.momentum))
    spec = hp.plan
    rank0 = dist.get_rank() == 0
    if rank0:
        print(f"train: {args.model} under a {spec.mode} plan dp={spec.dp} x mp={spec.mp} "
              f"(schedule {spec.schedule}, {spec.num_microbatches} micro-batches), "
              f"world {dist.get_world_size()}, global batch {global_batch}", flush=True)
    step_s = []
    for step in range(args.steps):
        inputs = model.example_inputs(global_batch, seed=step)
        target = model.example_target(global_batch, seed=10_000 + step)
        started = time.perf_counter()
        loss = hp.step(*hp.shard(inputs, target))
        step_s.append(time.perf_counter() - started)
        if rank0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  {step_s[-1] * 1e3:.1f} ms", flush=True)
    timed = step_s[args.warmup_steps:] or step_s
    # the job is as fast as its slowest rank
    measured = torch.tensor([statistics.median(timed)], dtype=torch.float64)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)
    state = hp.state_dict()
    if rank0:
        predicted = spec.predicted_step_s
        shown = (f"{predicted * 1e3:.2f} ms" if predicted == predicted and predicted > 0
                 else "none (hand-written plan, not evaluated)")
        print(f"measured step time: {measured.item() * 1e3:.2f} ms (median of {len(timed)} "
              f"steps, slowest rank)")
        print(f"predicted step time: {shown}")
        if args.save_state:
            torch.save(state, args.save_state)
    dist.destroy_process_group()
    return 0


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _has_planner() -> bool:
    try:
        import hybridplan.planner  # noqa: F401  (needs the compiled hybridplan._C)
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
