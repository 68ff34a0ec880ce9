"""How long each 2-stage pipeline plan of a `validate` run waited between a stage's action and
the next stage's action that needed its result: the measured per-action timelines in
validate.json, per plan. A forward wait is stage 1's forward of micro-batch i starting after
both stage 0's forward of i and stage 1's previous action ended; a backward wait is the same
for stage 0's backward after stage 1's. The cost model's share of that wait is the p2p
transfer (Cluster intra_node bandwidth and latency) plus the runtime's cost per action.

    python bench/pipeline_waits.py out/bench/validate/branchy_cnn-1/validate.json
"""

import json
import statistics
import sys


def _find(actions, kind, microbatch):
    return next(a for a in actions if a["kind"] == kind and a["microbatch"] == microbatch)


def _wait(start, sent_end, own_actions, offset):
    """start - max(the sender's end, this stage's previous action's end), in the receiver's
    clock; `offset` moves the sender's times into it."""
    before = [a["end_s"] for a in own_actions if a["end_s"] <= start]
    return start - max(sent_end + offset, max(before, default=float("-inf")))


def waits(row):
    ranks = {r["rank"]: r for r in row["measured_per_rank"]}
    first, second = ranks[0], ranks[1]
    offset = first["last_step_start_s"] - second["last_step_start_s"]  # rank 0 -> rank 1 clock
    forward, backward = [], []
    for i in range(row["num_microbatches"]):
        f1 = _find(second["actions"], "F", i)
        forward.append(_wait(f1["start_s"], _find(first["actions"], "F", i)["end_s"],
                             second["actions"], offset))
        b0 = _find(first["actions"], "B", i)
        backward.append(_wait(b0["start_s"], _find(second["actions"], "B", i)["end_s"],
                              first["actions"], -offset))
    return statistics.median(forward), statistics.median(backward)


def main(path):
    result = json.load(open(path))
    print("| plan | compute pred ms | compute meas ms | forward wait ms | backward wait ms |")
    print("|---|---|---|---|---|")
    for row in result["rows"]:
        if row["mode"] != "pipeline" or row["mp"] != 2 or row["dp"] != 1:
            continue
        forward, backward = waits(row)
        print(f"| {row['kind']} | {row['predicted']['compute_s'] * 1e3:.2f} | "
              f"{row['measured']['compute_s'] * 1e3:.2f} | {forward * 1e3:.2f} | "
              f"{backward * 1e3:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
