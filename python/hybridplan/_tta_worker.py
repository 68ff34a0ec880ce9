"""One rank of a time-to-target run: trains a convergence task (hybridplan.convergence) under a
plan until the held-out target holds, timing every training step on the executor's own clock.
Run under torchrun by hybridplan.time_to_accuracy:

    torchrun --nproc-per-node N -m hybridplan._tta_worker --plan plan.json --task task.json \\
        --seed 0 --out result.json

The data stream, learning-rate rule and evaluation schedule are convergence.py's, so a run
under any plan takes the same samples in the same order as the one-process runs of
`python -m hybridplan convergence` (training under a plan equals one-process training, so its
steps to target are theirs up to floating-point order). Timed: each hp.step() from a barrier
to its return, summed per rank; the run's training time is the slowest rank's sum. Not timed:
the evaluations (the whole model gathered with hp.state_dict(), evaluated on rank 0, the
verdict broadcast so every rank stops at the same step).
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
    samples, step, last_eval, reached = 0, 0, 0, False
    step_times, curve, eval_s = [], [], 0.0
    limit = int(task.max_epochs * n)
    while samples < limit:
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
        if not cv.eval_due(step, last_eval):
            continue
        last_eval = step
        begin = time.perf_counter()
        state = hp.state_dict()
        verdict = [None]
        if rank == 0:
            evaluator.load_state_dict(state)
            loss, accuracy = cv.evaluate(evaluator, task.loss_fn, data.eval_inputs,
                                         data.eval_targets)
            verdict = [(loss, accuracy)]
        dist.broadcast_object_list(verdict, src=0)
        loss, accuracy = verdict[0]
        curve.append((step, loss, accuracy))
        eval_s += time.perf_counter() - begin
        if not math.isfinite(loss):
            break
        if task.target.reached(loss, accuracy):
            reached = True
            break
    mine = {"rank": rank, "train_s": sum(step_times),
            "median_step_s": statistics.median(step_times) if step_times else 0.0,
            "first_step_s": step_times[0] if step_times else 0.0}
    if args.measure_noise_scale:
        est = hp.noise_scale()
        mine["noise_scale"] = None if est is None else {"b_simple": est.b_simple,
                                                         "stderr": est.stderr}
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        slowest = max(ranks, key=lambda r: r["train_s"])
        out = {"reached": reached, "steps": step, "samples": samples, "epochs": samples / n,
               "train_s": slowest["train_s"], "median_step_s": slowest["median_step_s"],
               "first_step_s": slowest["first_step_s"], "eval_s": eval_s, "curve": curve,
               "per_rank": ranks, "seed": seed, "global_batch": global_batch,
               "noise_scale": ranks[0].get("noise_scale")}
        write_text_atomic(args.out, json.dumps(out))
    hp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
