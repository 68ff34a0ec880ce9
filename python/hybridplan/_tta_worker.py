"""One rank of a time-to-target run: trains a convergence task (hybridplan.convergence) under a
plan until the held-out target holds, timing every training step on the executor's own clock.
Run under torchrun by hybridplan.time_to_accuracy:

    torchrun --nproc-per-node N -m hybridplan._tta_worker --plan plan.json --task task.json \\
        --seed 0 --out result.json

The data stream, learning-rate rule and evaluation schedule are convergence.py's, so a run
under any plan takes the same samples in the same order as the one-process runs of
`python -m hybridplan convergence` (training under a plan equals one-process training, so its
steps to target are theirs up to floating-point order). Timed: each hp.step() from a barrier
to its return, summed per rank up to the step at which the target first held; the run's
training time is the slowest rank's sum. Not timed: the evaluations (the whole model kept with
hp.state_dict() at each step the evaluation schedule picks, evaluated on rank 0 a few at a time
and the verdict broadcast, so every rank stops at the same step; see FLUSH_EVERY).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.distributed as dist


# Evaluations are deferred: the state at each step the schedule picks is kept (hp.state_dict(),
# a copy, or a gather across a pipeline's ranks), and every FLUSH_EVERY of them rank 0
# evaluates the kept states in order while the others wait. Evaluating after every step instead
# (every step up to 100) left one rank idle in a broadcast before nearly every step, and the
# step after such a wait ran slower (branchy digits_cnn dp b=8: median step 3.0 ms without
# evaluations, 3.7-4.2 ms with one before each step, on this 2-core host). The steps run past
# the target (at most FLUSH_EVERY - 1) are neither counted nor timed.
FLUSH_EVERY = 8


def _first_reached(pending, evaluator, task, rank):
    """(step at which the target first holds or None, curve points, diverged) over the kept
    states in order; rank 0 evaluates and broadcasts its verdict."""
    from hybridplan import convergence as cv

    verdict = [None]
    if rank == 0:
        points, found = [], None
        for step, state in pending:
            evaluator.load_state_dict(state)
            loss, accuracy = cv.evaluate(evaluator, task.loss_fn, task.data.eval_inputs,
                                         task.data.eval_targets)
            points.append((step, loss, accuracy))
            if not math.isfinite(loss) or task.target.reached(loss, accuracy):
                found = step if math.isfinite(loss) else None
                break
        verdict = [(found, points, not math.isfinite(points[-1][1]) if points else False)]
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--measure-noise-scale", type=int, default=0,
                   help="N > 0: the executor's online noise scale every N steps (dp >= 2)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import hybridplan
    from hybridplan import convergence as cv
    from hybridplan.files import write_text_atomic

    torch.set_num_threads(1)
    with open(args.task) as f:
        task = cv.task_from_spec(json.load(f), args.task)
    with open(args.plan) as f:
        plan = json.load(f)
    data, rule, seed = task.data, task.lr_rule, args.seed
    n = int(data.train_targets.shape[0])
    global_batch = plan["global_batch"]
    torch.manual_seed(seed)  # as convergence.train_to_target
    module = task.model(seed)
    example = (data.train_inputs[:plan["per_replica_batch"]],) if plan["mode"] == "pipeline" else None
    hp = hybridplan.apply(plan, module, loss_fn=task.loss_fn, timeout_s=args.timeout_s,
                          example_inputs=example, measure_noise_scale=args.measure_noise_scale,
                          optimizer=lambda params: task.optimizer(params, rule.lr(global_batch, 0)))
    rank = dist.get_rank()
    evaluator = task.model(seed) if rank == 0 else None
    samples, step, last_eval, reached, at = 0, 0, 0, False, None
    step_times, curve, eval_s, pending = [], [], 0.0, []
    limit = int(task.max_epochs * n)
    while samples < limit and not reached:
        idx = cv.sample_indices(n, seed, samples, global_batch)
        shard = hp.shard((data.train_inputs[idx],), data.train_targets[idx])
        for group in hp.optimizer.param_groups:
            group["lr"] = rule.lr(global_batch, samples)
        dist.barrier()
        start = time.perf_counter()
        hp.step(*shard)
        step_times.append(time.perf_counter() - start)
        step += 1
        samples += global_batch
        if cv.eval_due(step, last_eval):
            last_eval = step
            begin = time.perf_counter()
            pending.append((step, hp.state_dict()))
            eval_s += time.perf_counter() - begin
        if len(pending) < FLUSH_EVERY and samples < limit:
            continue
        begin = time.perf_counter()
        at, evaluated, diverged = _first_reached(pending, evaluator, task, rank)
        reached = at is not None
        curve += evaluated
        pending = []
        eval_s += time.perf_counter() - begin
        if diverged:
            break  # a loss that is not finite never reaches the target
    steps = at if reached else step
    step_times = step_times[:steps]
    mine = {"rank": rank, "train_s": sum(step_times),
            "median_step_s": statistics.median(step_times) if step_times else 0.0,
            "first_step_s": step_times[0] if step_times else 0.0, "step_times_s": step_times}
    if args.measure_noise_scale:
        est = hp.noise_scale()
        mine["noise_scale"] = None if est is None else {"b_simple": est.b_simple,
                                                         "stderr": est.stderr}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        slowest = max(ranks, key=lambda r: r["train_s"])
        out = {"reached": reached, "steps": steps, "samples": steps * global_batch,
               "epochs": steps * global_batch / n, "steps_run": step,
               "train_s": slowest["train_s"], "median_step_s": slowest["median_step_s"],
               "first_step_s": slowest["first_step_s"], "eval_s": eval_s, "curve": curve,
               "per_rank": ranks, "seed": seed, "global_batch": global_batch,
               "noise_scale": ranks[0].get("noise_scale")}
        write_text_atomic(args.out, json.dumps(out))
    hp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
