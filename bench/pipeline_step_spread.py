"""How much one pipeline plan's step time moves from step to step and from apply to apply: the
model's two-stage pipeline (calibrate's own even cut, `calibration.timed_model_pipeline`) applied
`--applies` times in one 2-rank job, each apply timed over `--steps` steps as calibrate times its
pipeline runs (slowest rank per step, a barrier before each step; `--no-barrier`: back to back,
as validate's worker times them). Prints every apply's steps, sorted, its median and how many
steps took over `--slow-ms`. `--placement` sets where each rank's threads run once the plan is
applied (all of them, its plan's Gloo threads included): `free` (default, as the executor runs:
the scheduler places them), `rank-core` (all of a rank's threads on the core of its local
rank), `split` (the rank's main thread, which computes, on that core and its other threads on
the other cores). Several placements, comma-separated, take turns apply by apply.

    python bench/pipeline_step_spread.py --graph graph.json --model hybridplan.models:branchy_cnn \
        --schedule 1f1b --microbatches 32

It is how docs/calibration.md "A step time that is two clusters" was measured: at 32 one-sample
micro-batches, branchy_cnn's 1F1B steps fall into a fast cluster and a slow one within a single
apply, and the slow share drifts between applies, which moves the median by up to 1.4x, with a
barrier or without. Under `split` every step is as slow as the slow cluster; under `rank-core`
fewer steps are slow, but some still are.
"""

import argparse
import json
import os
import sys
import threading

from torchrun_relaunch import relaunch  # this folder


kPlacements = ("free", "rank-core", "split")


def _place_threads(placement: str, core: int, cores) -> None:
    """Every thread of this process where `placement` puts it; this (the main) thread computes."""
    main = threading.get_native_id()
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        if placement == "free":
            allowed = set(cores)
        elif placement == "rank-core" or tid == main:
            allowed = {core}
        else:  # split: the rank's other threads anywhere but its main thread's core
            allowed = set(cores) - {core} or set(cores)
        try:
            os.sched_setaffinity(tid, allowed)
        except ProcessLookupError:  # a thread that ended since the listing
            pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", required=True, help="the model's Graph JSON")
    p.add_argument("--model", required=True, help="MODULE:FACTORY")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--microbatches", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--applies", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--placement", default="free",
                   help="where each rank's threads run, comma-separated to take turns: free, "
                        "rank-core, split (see above)")
    p.add_argument("--slow-ms", type=float, default=80.0,
                   help="count the steps slower than this (the slow cluster)")
    p.add_argument("--no-barrier", action="store_true",
                   help="time steps back to back, as validate does (default: a barrier before "
                        "each step, as calibrate times its pipeline runs)")
    args = p.parse_args()
    code = relaunch(__file__, sys.argv[1:])
    if code is not None:
        return code

    import statistics

    import torch
    import torch.distributed as dist

    from hybridplan.measure import calibration

    torch.set_num_threads(1)
    placements = args.placement.split(",")
    for placement in placements:
        if placement not in kPlacements:
            p.error(f"--placement: {placement!r} is not one of {', '.join(kPlacements)}")
    cores = sorted(os.sched_getaffinity(0))
    core = cores[int(os.environ["LOCAL_RANK"]) % len(cores)]
    with open(args.graph, encoding="utf-8") as f:
        graph = json.load(f)
    stages = 4 if args.schedule in calibration.kMultiStageSchedules else 2
    cuts = calibration._even_cuts(graph, stages)
    dist.init_process_group("gloo")
    try:
        for i in range(args.applies):
            placement = placements[i % len(placements)]
            _, samples = calibration.timed_model_pipeline(
                args.model, graph, args.schedule, args.microbatches, args.batch, cuts,
                torch.device("cpu"), args.warmup, args.steps, 60.0, barrier=not args.no_barrier,
                applied=lambda: _place_threads(placement, core, cores))
            _place_threads("free", core, cores)
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, list(samples))
            if dist.get_rank() == 0:
                median = max(statistics.median(r) for r in ranks)  # calibrate's median_slowest
                slowest = sorted(round(1e3 * max(t)) for t in zip(*ranks))  # per step
                slow = sum(t > args.slow_ms for t in slowest)
                print(f"apply {i} ({placement}): median {1e3 * median:.1f} ms (slowest rank's), "
                      f"{slow} of {len(slowest)} steps over {args.slow_ms:g} ms; each step's "
                      f"slowest rank, sorted, ms: {slowest}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
