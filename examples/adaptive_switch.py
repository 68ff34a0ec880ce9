"""The adaptive mode on a real task: the plan switches in process to a bigger global batch as
the measured critical batch grows (docs/checkpoints.md, "Switching plans while the job runs").

    torchrun --nproc-per-node 2 examples/adaptive_switch.py      # ~1 minute on a 2-core CPU

The digits CNN (hybridplan.models.digits_cnn) trains on scikit-learn's handwritten digits
(hybridplan.datasets.digits; examples/digits-task.json) on 2 CPU ranks. Rank 0 profiles the
model (hybridplan.profile; or --graph), every rank plans it on the localhost-cpu preset for a
job whose convergence model is the critical batch, guessed small at the start, and applies the
plan with the gradient noise scale measured online and an adaptive policy
(hybridplan.Adapt(graph, cluster, job, ...)): every `--every` steps rank 0 prices
the running plan and the best plan with the measured critical batch (AppliedPlan.switch_advice)
and, once `--min-interval` steps have passed since the last switch, switches when the advice
says so. The noise scale grows as the loss falls, so the best global batch grows with it.

The learning rate is the task's rule (Adam, 0.002 at batch 32, scaled with the square root of
the batch): a switch does not rescale it, so on_switch does (and after parallelize, for the
batch planned first). Rank 0 prints the switch lines (stderr) and a summary (stdout; --out
writes it as JSON).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import hybridplan  # noqa: E402
from hybridplan import datasets, models  # noqa: E402
from hybridplan.executor.switching import describe  # noqa: E402
from hybridplan.front_door import choose_plan  # noqa: E402

CLUSTER = "localhost-cpu"

BASE_LR, BASE_BATCH = 0.002, 32  # examples/digits-task.json's lr_rule (sqrt scaling)


def lr_for(global_batch: int) -> float:
    return BASE_LR * math.sqrt(global_batch / BASE_BATCH)


def job_for(samples_per_epoch: int, critical_batch: float) -> dict:
    """The job the run is planned with: time to train under a critical-batch convergence model
    whose critical batch is a (small) guess; the search picks the global batch in 8..1024."""
    return {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": samples_per_epoch,
            "optimizer": "adam", "global_batch": {"min": 8, "max": 1024},
            "convergence": {"model": "critical_batch", "epochs_min": 5,
                            "critical_batch": critical_batch}}


def graph_of(model, data, path, rank):
    """The model's Graph: from `path`, else profiled on rank 0 (hybridplan.profile, on a copy)
    and broadcast, so every rank plans with the same one."""
    box = [None]
    if path:
        box[0] = hybridplan.load_graph(path).to_json()
    elif rank == 0:
        example, target = data.train_inputs[:16], data.train_targets[:16]
        box[0] = hybridplan.profile(copy.deepcopy(model), (example,), loss_fn=model.loss,
                                    target=target, verbose=False).to_json()
    dist.broadcast_object_list(box, src=0)
    return hybridplan.Graph.from_json(box[0], "graph")


class Batches:
    """The same stream of global batches on every rank: a seeded permutation per epoch."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, seed: int):
        self.inputs, self.targets = inputs, targets
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.position = torch.randperm(len(targets), generator=self.generator), 0

    def next(self, size: int):
        picked = []
        while size > 0:
            if self.position == len(self.order):
                self.order = torch.randperm(len(self.targets), generator=self.generator)
                self.position = 0
            take = self.order[self.position:self.position + size]
            self.position += len(take)
            size -= len(take)
            picked.append(take)
        index = torch.cat(picked)
        return self.inputs[index], self.targets[index]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--critical-batch", type=float, default=8.0,
                        help="the job's initial guess of the critical batch")
    parser.add_argument("--every", type=int, default=20, help="check the advice every N steps")
    parser.add_argument("--min-interval", type=int, default=60,
                        help="steps between switches (and before the first)")
    parser.add_argument("--decay", type=float, default=0.98,
                        help="the noise-scale moving averages' weight per measured step")
    parser.add_argument("--verbose", action="store_true",
                        help="log every check of the advice, not only the switches")
    parser.add_argument("--graph", default=None,
                        help="a Graph JSON of digits_cnn at batch 16 (default: profile it)")
    parser.add_argument("--out", default=None, help="write the summary as JSON here (rank 0)")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # ours: apply() leaves it alone, we destroy it at the end
    rank, world = dist.get_rank(), dist.get_world_size()
    data = datasets.digits()
    model = models.digits_cnn(seed=0)
    job = job_for(data.num_train, args.critical_batch)
    cluster = hybridplan.load_cluster(CLUSTER)
    graph = graph_of(model, data, args.graph, rank)
    plan = choose_plan(graph, cluster, hybridplan.Job.from_dict(job, "job"), world,
                       modes=("placement",)).plan
    log = []

    def rescale_lr(hp, record):
        for group in hp.optimizer.param_groups:
            group["lr"] = lr_for(hp.plan.global_batch)
        log.append(dict(record, lr=lr_for(hp.plan.global_batch)))

    policy = hybridplan.Adapt(graph, cluster, job, every=args.every,
                              min_interval_steps=args.min_interval, modes=("placement",),
                              on_switch=rescale_lr, verbose=args.verbose)
    hp = hybridplan.apply(plan, model, graph=graph, timeout_s=60,
                          optimizer=functools.partial(torch.optim.Adam, lr=BASE_LR),
                          measure_noise_scale=1, noise_scale_decay=args.decay, adapt=policy)
    rescale_lr(hp, {"step": 0, "to": describe(hp.plan), "reason": "planned"})
    if rank == 0:
        print(f"planned with critical batch {args.critical_batch:g}: {describe(hp.plan)}",
              file=sys.stderr, flush=True)
    batches = Batches(data.train_inputs, data.train_targets, seed=1)
    started = time.monotonic()
    global_batches, losses, noise = [], [], []
    for step in range(args.steps):
        size = hp.plan.global_batch  # the plan in force now: it may have switched
        inputs, target = batches.next(size)
        loss = hp.step(*hp.shard(inputs, target))
        global_batches.append(size)
        losses.append(float(loss))
        if (step + 1) % args.every == 0:
            est = hp.noise_scale()
            noise.append((step + 1, est.b_simple if est else None, est.stderr if est else None))
            if rank == 0 and est is not None:
                print(f"step {step + 1}: loss {sum(losses[-args.every:]) / args.every:.3f}, "
                      f"global batch {size}, noise scale {est.b_simple:.1f} +- "
                      f"{est.stderr:.1f}", flush=True)
    elapsed = time.monotonic() - started
    with torch.no_grad():
        model_state = hp.state_dict()
        evaluator = models.digits_cnn(seed=0)
        evaluator.load_state_dict(model_state)
        accuracy = float((evaluator(data.eval_inputs).argmax(1) == data.eval_targets)
                         .float().mean())
    summary = {"steps": args.steps, "seconds": round(elapsed, 1),
               "samples": sum(global_batches),
               "global_batches": [b for i, b in enumerate(global_batches)
                                  if i == 0 or b != global_batches[i - 1]],
               "switches": hp.switches, "lr_log": log, "noise_scale": noise,
               "final_loss": sum(losses[-20:]) / min(20, len(losses)),
               "eval_accuracy": accuracy}
    if rank == 0:
        print(f"{args.steps} steps in {elapsed:.1f} s, {summary['samples']} samples; global "
              f"batch {' -> '.join(map(str, summary['global_batches']))}; "
              f"{len(hp.switches)} switch(es); final loss {summary['final_loss']:.3f}, held-out "
              f"accuracy {accuracy:.3f}", flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(summary, f, indent=1, default=str)
    hp.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
