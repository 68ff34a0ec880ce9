"""One rank of a time-to-target run: trains a convergence task (hybridplan.convergence) under a
plan to the held-out target, and times an uninterrupted run of that length. Run under torchrun
by hybridplan.measure.time_to_target:

    torchrun --nproc-per-node N -m hybridplan.measure.time_to_target_worker \\
        --plan plan.json --task task.json --seed 0 --out result.json

The data stream, learning-rate rule and evaluation schedule are tradeoff.py's, so a run
under any plan takes the same samples in the same order as the one-process runs of
`python -m hybridplan convergence` (training under a plan equals one-process training, so its
steps to target are theirs up to floating-point order).

Two passes, each from the model's initialisation under the plan (apply() twice):
  1. find the steps: train with the evaluation schedule (the state at each step it picks kept
     with hp.state_dict(), evaluated on rank 0 a few at a time, the verdict broadcast so every
     rank stops together) until the target holds: S steps;
  2. the timed run: train exactly S steps with no evaluation in between, each hp.step() timed
     from a barrier to its return, then evaluate once: the final state must meet the target
     (`verified`; training is deterministic, so it does).
Time to target is the timed run's steps summed per rank, the slowest rank's sum. Evaluating in
the run that is timed perturbed it: a rank waiting in the evaluation's broadcast ran the next
step slower, and these runs are only tens to hundreds of steps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..convergence import tradeoff as cv
from ..executor import apply
from ..files import write_text_atomic

# Kept states evaluated at a time in the first pass: at most FLUSH_EVERY - 1 steps are run past
# the target before it is seen (not counted).
FLUSH_EVERY = 8


class _Run:
    """The plan applied to a fresh model of the task, and its training loop."""

    def __init__(self, plan: dict, task, seed: int, timeout_s: float, noise_every: int = 0):
        self.task, self.seed, self.plan = task, seed, plan
        self.global_batch = plan["global_batch"]
        torch.manual_seed(seed)  # as convergence.train_to_target
        data = task.data
        example = ((data.train_inputs[:plan["per_replica_batch"]],)
                   if plan["mode"] == "pipeline" else None)
        rule, b = task.lr_rule, self.global_batch
        self.hp = apply(plan, task.model(seed), loss_fn=task.loss_fn,
                        timeout_s=timeout_s, example_inputs=example,
                        measure_noise_scale=noise_every,
                        optimizer=lambda params: task.optimizer(params, rule.lr(b, 0)))
        self.samples = 0
        self.step_times: List[float] = []

    def step(self, timed: bool) -> None:
        data, b = self.task.data, self.global_batch
        idx = cv.sample_indices(int(data.train_targets.shape[0]), self.seed, self.samples, b)
        shard = self.hp.shard((data.train_inputs[idx],), data.train_targets[idx])
        for group in self.hp.optimizer.param_groups:
            group["lr"] = self.task.lr_rule.lr(b, self.samples)
        if timed:  # not measure.timing: each step takes the stream's next batch and learning rate
            dist.barrier()
            start = time.perf_counter()
            self.hp.step(*shard)
            self.step_times.append(time.perf_counter() - start)
        else:
            self.hp.step(*shard)
        self.samples += b


def _evaluate_on_rank0(states: List[Tuple[int, Dict[str, Any]]], evaluator, task
                       ) -> Tuple[Optional[int], List[tuple], bool]:
    """(the first step whose state meets the target or None, the curve points, diverged): rank 0
    evaluates the states in order and broadcasts its verdict."""
    verdict: List[Any] = [None]
    if dist.get_rank() == 0:
        points, found, diverged = [], None, False
        for step, state in states:
            evaluator.load_state_dict(state)
            loss, accuracy = cv.evaluate(evaluator, task.loss_fn, task.data.eval_inputs,
                                         task.data.eval_targets)
            points.append((step, loss, accuracy))
            if not math.isfinite(loss):
                diverged = True
                break
            if task.target.reached(loss, accuracy):
                found = step
                break
        verdict = [(found, points, diverged)]
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def find_steps(run: _Run, evaluator) -> Tuple[Optional[int], List[tuple], int, float]:
    """Pass 1: (steps to target or None, the evaluation curve, steps run, evaluation seconds)."""
    task = run.task
    limit = int(task.max_epochs * task.data.train_targets.shape[0])
    step, last_eval, eval_s = 0, 0, 0.0
    curve: List[tuple] = []
    pending: List[Tuple[int, Dict[str, Any]]] = []
    while run.samples < limit:
        run.step(timed=False)
        step += 1
        begin = time.perf_counter()
        if cv.eval_due(step, last_eval):
            last_eval = step
            pending.append((step, run.hp.state_dict()))
        if len(pending) >= FLUSH_EVERY or (pending and run.samples >= limit):
            found, points, diverged = _evaluate_on_rank0(pending, evaluator, task)
            curve += points
            pending = []
            if found is not None or diverged:
                eval_s += time.perf_counter() - begin
                return found, curve, step, eval_s
        eval_s += time.perf_counter() - begin
    return None, curve, step, eval_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--measure-noise-scale", type=int, default=0,
                   help="N > 0: the executor's online noise scale every N steps of the first "
                        "(untimed) pass, read when the target holds (dp >= 2)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    with open(args.task) as f:
        task = cv.task_from_spec(json.load(f), args.task)
    with open(args.plan) as f:
        plan = json.load(f)
    n = int(task.data.train_targets.shape[0])

    first = _Run(plan, task, args.seed, args.timeout_s, args.measure_noise_scale)
    rank = dist.get_rank()
    evaluator = task.model(args.seed) if rank == 0 else None
    steps, curve, steps_run, eval_s = find_steps(first, evaluator)
    noise = first.hp.noise_scale() if args.measure_noise_scale else None
    first.hp.close()

    timed = _Run(plan, task, args.seed, args.timeout_s)
    for _ in range(steps or 0):
        timed.step(timed=True)
    verified = None
    if steps:
        found, points, _ = _evaluate_on_rank0([(steps, timed.hp.state_dict())], evaluator, task)
        verified = {"reached": found == steps, "loss": points[0][1], "accuracy": points[0][2]}
    times = timed.step_times
    mine = {"rank": rank, "train_s": sum(times),
            "median_step_s": statistics.median(times) if times else 0.0,
            "first_step_s": times[0] if times else 0.0, "step_times_s": times}
    ranks: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        slowest = max(ranks, key=lambda r: r["train_s"])
        b = plan["global_batch"]
        steps_counted = steps if steps else steps_run
        out = {"reached": steps is not None, "verified": verified, "steps": steps_counted,
               "samples": steps_counted * b, "epochs": steps_counted * b / n,
               "steps_run": steps_run, "train_s": slowest["train_s"],
               "median_step_s": slowest["median_step_s"],
               "first_step_s": slowest["first_step_s"], "eval_s": eval_s, "curve": curve,
               "per_rank": ranks, "seed": args.seed, "global_batch": b,
               "noise_scale": None if noise is None else {
                   "b_simple": noise.b_simple, "stderr": noise.stderr,
                   "effective_steps": noise.effective_steps}}
        write_text_atomic(args.out, json.dumps(out))
    timed.hp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
