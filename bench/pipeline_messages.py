"""When a pipeline's messages are posted, and how long its ranks wait on them: one plan trained
as `validate` trains it (hybridplan.measure.validate_worker, 2 ranks), with torch's pipelining
message calls (`_batch_p2p`, which posts a schedule's sends and receives, and
`_wait_batch_p2p`) timed on the host's one monotonic clock, printed beside the ranks' actions
of the last timed step. It is how docs/calibration.md "Where a pipeline's messages wait" was
measured: Schedule1F1B's receive is posted only when its data is needed and its data moves only
then; a send posted after its receive is written on the sender's thread (its post takes as
long as the transfer).

    python bench/pipeline_messages.py --plan plan.json --model hybridplan.models:branchy_cnn

A pipeline plan of 2 ranks: `hybridplan plan ... --out plan.json`, or a plan of validate's.
"""

import argparse
import json
import os
import runpy
import sys
import tempfile
import time

from torchrun_relaunch import relaunch  # this folder


def _log_messages(path: str) -> None:
    """Wraps torch's _batch_p2p and _wait_batch_p2p to record (what, description, ops, start,
    end) into `path` at exit."""
    import atexit

    import torch.distributed.pipelining.schedules as schedules

    log, descriptions = [], {}
    post, wait = schedules._batch_p2p, schedules._wait_batch_p2p

    def logged_post(ops, desc=None):
        start = time.perf_counter()
        works = post(ops, desc)
        log.append(("post", desc, [(op.op.__name__, list(op.tensor.shape)) for op in ops], start,
                    time.perf_counter()))
        descriptions[id(works)] = desc
        return works

    def logged_wait(works):
        start = time.perf_counter()
        wait(works)
        if works:
            log.append(("wait", descriptions.get(id(works)), len(works), start,
                        time.perf_counter()))

    schedules._batch_p2p, schedules._wait_batch_p2p = logged_post, logged_wait
    def write():
        with open(path, "w") as f:
            json.dump(log, f)

    atexit.register(write)


def _print_last_step(measured: dict, logs: list) -> None:
    ranks = measured["per_rank"]
    events = []
    for r, rank in enumerate(ranks):
        t0 = rank["last_step_start_s"]
        for a in rank.get("actions", []):
            events.append((t0 + a["start_s"], t0 + a["end_s"], r,
                           f'{a["kind"]}{a["microbatch"]} s{a["stage"]}'))
        for what, desc, ops, start, end in logs[r]:
            if what == "post":
                kinds = sorted({name for name, _ in ops})
                events.append((start, end, r, f"post {desc or ''} {len(ops)} x {'/'.join(kinds)}"))
            else:
                events.append((start, end, r, f"wait {desc or ''}"))
    begin = min(rank["last_step_start_s"] for rank in ranks)
    end = begin + max(rank["step_s"] for rank in ranks)
    print(f"last timed step, ms from its start (step {1e3 * measured['step_s']:.2f} ms)")
    print(f"{'start':>8} {'end':>8} {'took':>6}")
    for start, stop, r, name in sorted(events):
        if begin - 1e-4 <= start <= end:
            print(f"{1e3 * (start - begin):8.2f} {1e3 * (stop - begin):8.2f} "
                  f"{1e3 * (stop - start):6.2f}  {'    ' * 8 * r}rank {r} {name}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", required=True)
    p.add_argument("--model", required=True, help="MODULE:FACTORY")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--work-dir", default=None, help="where the ranks write (default: a temp dir)")
    args = p.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="hp-msg-")
    os.makedirs(work, exist_ok=True)
    argv = sys.argv[1:] if args.work_dir else sys.argv[1:] + ["--work-dir", work]
    code = relaunch(__file__, argv)
    if code is not None:  # the launcher: the ranks have finished
        if code == 0:
            def read(name):
                with open(os.path.join(work, name)) as f:
                    return json.load(f)

            _print_last_step(read("measured.json"), [read(f"messages-{r}.json") for r in (0, 1)])
        return code
    _log_messages(os.path.join(work, f"messages-{os.environ['RANK']}.json"))
    sys.argv = ["validate_worker", "--plan", args.plan, "--model", args.model,
                "--steps", str(args.steps), "--warmup", str(args.warmup),
                "--out", os.path.join(work, "measured.json")]
    runpy.run_module("hybridplan.measure.validate_worker", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
