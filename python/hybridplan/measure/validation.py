"""Predicted beside measured: runs plans of a model on this machine and compares every term of the
cost model with what the executor really did.

    python -m hybridplan validate --graph g.json --cluster cluster.json \\
        --model hybridplan.models:branchy_cnn [--devices 2] [--plans 8] [--out-dir out/validate]
    hybridplan validate ...            (the same, from the C++ CLI)

For the plans (the search's best and a spread across its ranking: data parallel, placement,
GPipe and 1F1B with few and many micro-batches), each is trained for `steps` steps under
torchrun (`python -m hybridplan.measure.validate_worker`, one process per rank), with the job's
optimizer (the one whose state and step the prediction holds: `sgd` for the default job), and
timed on every rank from the executor's own clock:

    step_s       hp.step() wall time                            (slowest rank, median; the
                                                                 10th-90th percentile of the
                                                                 steps beside it, step_spread)
    compute_s    step start -> the last gradient accumulated    (placement: forward + backward;
                                                                 pipeline: the schedule)
    allreduce_s  the last gradient -> the optimizer starts      (the exposed all-reduce)
    optimizer_s  the optimizer's step
    overhead_s   the rest of the step
    memory       peak tensor bytes of one step per rank, profiled after a profiled warm-up step
                 (torch.profiler's memory timeline; where its analysis rejects the step, FSDP2's
                 zero3 or sequence parallelism, the tensors alive at the step's start plus the
                 peak of its allocation events, which every row also carries), each rank's
                 median over the launches

Each plan runs in `rounds` launches, interleaved (every plan once, then every plan again, ...),
then in extra rounds for only the plans whose median step is not yet known within +-5 % (a
bootstrap 90 % interval of the median of its launches, hybridplan.measure.verdict), up to
`max_launches` (7) in all (a plan still wider then is unsteady on this host: the verdict holds
its prediction to that interval, verdict.decide). Its row is the launch with the median step
time (the lower one of an even count), whole: on a shared host one launch can run slower
throughout (measured here: a 1F1B plan at 42 ms in one launch and 25-30 ms in others, as if
both ranks shared one core), and a median of launches, unlike a median of one launch's steps,
is robust to that. Every launch's step time is kept in the row (`launch_step_s`), and its
interval (`launch_interval_s`, `steady`). Before the first launch and after the last,
calibrate's own shared-core workload is timed again in this process (calibration.host_speed)
and validate says when the host runs it more than 15 % slower or faster than when it was
calibrated: every prediction then carries that difference (`host_speed` in validate.json).

At launch: where the cluster names calibrate's shared-core workload (measured.shared_host.
workload), every launch's ranks also take calibrate's shared-core burst on it right before and
right after their timed steps (validate_worker), and the plan is priced again for that launch
with runtime.shared_host_slowdown rebuilt from those bursts by calibrate's own definition
(launch_prediction, calibration.launch_slowdown_table; row["at_launch"]). The verdict is held
on that comparison (ratios measured / predicted per launch: verdict.launch_matched), since the
host's speed for two ranks together moves more between calibrate and the launches than a
plan's interval is wide; the comparison as calibrated stays beside it (validate.md's columns
"as calibrated" and "at launch"; validate.json verdict_as_calibrated).

The results are written to <out-dir>/validate.json and validate.md (a table per term, the error
of each plan's step, the median and worst, and the verdict: targets met or which missed, the
plans unsteady on this host with their intervals; validate.json's "verdict"), plus scatter.png
(predicted vs measured step time) and, for the first pipeline plan, timeline.png (per-stage
predicted schedule beside the measured forward/backward actions). Every plan's predicted and
measured step is also written as a trace for Perfetto or chrome://tracing,
trace-<row>-<kind>.json (hybridplan.trace; the row's `trace` names it).

Precision (`precision`, the Job's: "fp32", "bf16", "fp16"; validate --precision sets it): the
planner's candidates are then the plans it makes for that precision (compute divided by the
cluster's device.compute_speedup for the dtype, activations and messages at its bytes), and
each rank applies the plan's precision as hybridplan.apply does (executor/precision.py). The
speed-up must be calibrate's own measurement on this machine (measured.compute_speedup_step_s,
its fp32 over its 16-bit forward+backward time; calibrated_speedup), never a figure from
elsewhere; it is reported with the workload it was measured on, and validate says when that is
not the validated model. Every row has the dtypes its ranks' matrix products ran in, read by
the worker from the profiled step (`product_dtypes`, `measured_precision`): a plan whose
products did not run in its precision is a miss of the verdict, since its measurement is not
of the plan predicted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import planner
from ..planner import num_processes
from ..trace import comparison_trace, plan_kind, trace_file_name, write_trace
from .verdict import (decide, is_steady, kMaxLaunches, launch_interval, launch_matched,
                      launch_matched_rows, needs_launch, verdict_lines)

# calibration (it imports torch), tqdm (installed with torch) and matplotlib (the plot extra)
# are imported inside the functions that use them: the command line imports this module at its
# start, where torch need not be installed; the ranks validate runs import torch themselves.

__all__ = ["validate", "select_plans", "ValidationResult"]

TERMS = ("step_s", "compute_s", "allreduce_s", "optimizer_s", "overhead_s")


def _family(plan: dict) -> str:
    if int(plan.get("tp", 1)) > 1:
        if plan.get("sequence_parallel"):
            return "sp tp"  # (placement only)
        return "tp" if plan["mp"] == 1 else f"{plan['schedule']} tp"
    if plan["mp"] == 1:
        return "dp"
    return "placement" if plan["mode"] == "placement" else plan["schedule"]


def select_plans(ranked: Sequence[dict], count: int) -> List[dict]:
    """The best plan, then a spread across the ranking: the best of each family (DP, placement,
    each schedule, tensor parallel alone, with sequence parallelism or under each schedule),
    then each pipeline family's fewest and most micro-batches (the model's
    extremes: bubbles vs per-call costs), then every other distinct kind in rank order, then the
    next best, until `count` plans; returned in rank order."""
    ranked = list(ranked)
    wanted: List[int] = []

    def take(i: Optional[int]) -> None:
        if i is not None and i not in wanted and len(wanted) < count:
            wanted.append(i)

    def first(pred) -> Optional[int]:
        return next((i for i, p in enumerate(ranked) if pred(p)), None)

    take(first(lambda p: True))
    families = []
    for p in ranked:
        if _family(p) not in families:
            families.append(_family(p))
    # tensor-parallel families first (stable: rank order otherwise), so that a tensor-parallel
    # plan, which a CPU host ranks late, is measured whatever the count
    families.sort(key=lambda fam: 0 if fam.endswith("tp") else 1)
    for fam in families:
        take(first(lambda p: _family(p) == fam))
    for fam in families:
        ms = sorted({p["num_microbatches"] for p in ranked if _family(p) == fam})
        if fam in ("dp", "placement", "tp", "sp tp") or len(ms) < 2:
            continue
        for m in (ms[0], ms[-1]):
            take(first(lambda p: _family(p) == fam and p["num_microbatches"] == m))
    kinds = {plan_kind(ranked[i]) for i in wanted}
    for i, p in enumerate(ranked):
        if plan_kind(p) not in kinds:
            take(i)
            kinds.add(plan_kind(p))
    for i in range(len(ranked)):
        take(i)
    return [ranked[i] for i in sorted(wanted)]


@dataclasses.dataclass
class ValidationResult:
    rows: List[dict]         # per plan: kind, predicted terms, measured terms, errors
    median_abs_error: float  # of step_s over the plans
    worst_abs_error: float
    best_predicted_rank_measured: int  # where the planner's first plan lands when measured (1 = fastest)
    within_5_percent_of_fastest: bool
    out_dir: str
    baseline_cluster: Optional[str] = None  # the same runs predicted with another cluster
    baseline_median_abs_error: Optional[float] = None
    baseline_worst_abs_error: Optional[float] = None
    # calibration.host_speed before and after the launches: {"before", "after", "warning"}
    host_speed: Optional[dict] = None
    # the median of the signed step errors: a shift every plan shares (the host running faster
    # or slower than when calibrated moves every plan alike), where the spread around it is
    # the cost model's own
    signed_median_error: Optional[float] = None
    # per round of launches, the median over plans of that round's launch over the plan's
    # median launch: the host's speed across the validation (1.00, 1.00, 0.85: the last round
    # ran 15 % faster)
    round_speed: Optional[List[float]] = None
    # how many plans' predicted step lies within the 10th-90th percentile of their median
    # launch's steps (step_spread), of how many have one: a miss inside that range is no larger
    # than the plan's own step-to-step variation on this host
    within_step_spread: Optional[List[int]] = None
    # the targets met or missed, the plans unsteady on this host (verdict.decide), on the
    # comparison at launch where every row has one (its "comparison" says which)
    verdict: Optional[dict] = None
    # the job's precision: {"name"} for fp32; a 16-bit one also with the cluster's
    # compute_speedup for it and where calibrate measured it (calibrated_speedup)
    precision: Optional[dict] = None
    # decide() on the comparison as calibrated (every launch against the one prediction), kept
    # beside the verdict where that is the comparison at launch
    verdict_as_calibrated: Optional[dict] = None
    # the median |step error| and the median signed one at launch (row["at_launch"]["error"])
    at_launch_median_abs_error: Optional[float] = None
    at_launch_signed_median_error: Optional[float] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_worker(plan: dict, worker: str, args: List[str], timeout_s: float, work_dir: Path,
               env: Optional[Dict[str, str]] = None) -> Tuple[subprocess.CompletedProcess, Path]:
    """`python -m <worker> --plan <work_dir>/plan.json --out <work_dir>/measured.json <args>`
    under torchrun (--standalone), one process per rank of `plan`, one thread each, this
    package first on PYTHONPATH: how validate and time to target launch a plan's ranks.
    Returns the finished process (output captured) and the result path (absent if the worker
    wrote none)."""
    plan_path, result_path = work_dir / "plan.json", work_dir / "measured.json"
    plan_path.write_text(json.dumps(plan))
    if result_path.exists():
        result_path.unlink()
    launcher = [shutil.which("torchrun")] if shutil.which("torchrun") else [
        sys.executable, "-m", "torch.distributed.run"]
    cmd = launcher + ["--standalone", "--nproc-per-node", str(num_processes(plan)), "-m", worker,
                      "--plan", str(plan_path), "--out", str(result_path), *args]
    package = str(Path(__file__).resolve().parents[2])  # the folder that holds hybridplan/
    child_env = dict(os.environ, OMP_NUM_THREADS="1",
                     PYTHONPATH=os.pathsep.join(p for p in (package, os.environ.get(
                         "PYTHONPATH", "")) if p), **(env or {}))
    done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout_s)
    return done, result_path


def run_plan(plan: dict, model: str, steps: int, warmup: int, timeout_s: float,
             work_dir: Path, env: Optional[Dict[str, str]] = None, optimizer: str = "sgd",
             host_workload: Optional[dict] = None) -> dict:
    """Trains the model under `plan` with torchrun, with the Job's `optimizer` (the one its
    prediction holds state for), and returns the worker's measurements. `host_workload` (the
    calibration's measured.shared_host.workload, {"model", "batch"}): the ranks also take
    calibrate's shared-core bursts on it around the timed steps (shared_host_bursts)."""
    host = ([] if not host_workload else
            ["--host-workload", host_workload["model"], "--host-batch",
             str(int(host_workload["batch"]))])
    done, result_path = run_worker(
        plan, "hybridplan.measure.validate_worker",
        ["--model", model, "--steps", str(steps), "--warmup", str(warmup), "--timeout-s",
         str(timeout_s), "--optimizer", optimizer, *host], timeout_s + 60 * steps, work_dir, env)
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"validate: the {plan_kind(plan)} plan failed (exit {done.returncode}"
                           f"{'' if result_path.exists() else ', no measurements written'}); "
                           f"what the ranks printed:\n{rank_output(done.stdout + done.stderr)}")
    return json.loads(result_path.read_text())


# Launches of one plan before validate gives up on it: a rank can die inside the step whose peak
# memory torch.profiler measures (`free(): invalid pointer` after "profiler_stop"), and for the
# zero-bubble plans that was not rare: branchy_cnn's ZB-V M=2 plan died in 3 of 18 launches
# (never in 12 launches without the profiled step), and two failures in a row ended a
# three-family validation. validate_worker now meets at a barrier before the profiler stops
# (0 of 18 died); the attempts stay for what that does not cover.
kLaunchAttempts = 3


def run_plan_retrying(plan: dict, model: str, steps: int, warmup: int, timeout_s: float,
                      work_dir: Path, optimizer: str = "sgd",
                      attempts: int = kLaunchAttempts,
                      host_workload: Optional[dict] = None) -> dict:
    """run_plan, launched again when it fails, up to `attempts` launches in all: the measured
    step's peak memory comes from torch.profiler's memory timeline, and a rank sometimes dies
    inside that profiled step (SIGSEGV after "profiler_start", `free(): invalid pointer` after
    "profiler_stop"; torch.profiler has known races between its record queue and other
    threads' allocations, and Gloo's threads allocate; the timed steps before it never died
    here). Each failed launch's error (the ranks' own output) is kept under
    `failed_launches`, never dropped; a plan that fails every attempt fails validation."""
    failed: List[str] = []
    while True:
        try:
            measured = run_plan(plan, model, steps, warmup, timeout_s, work_dir,
                                optimizer=optimizer, host_workload=host_workload)
        except RuntimeError as error:
            failed.append(str(error))
            if len(failed) >= attempts:
                raise RuntimeError(f"{error}\n(every one of {attempts} launches failed; "
                                   "validate stops here)") from error
            continue
        if failed:
            measured["failed_launches"] = failed
        return measured


def run_launches(count: int, launch: Callable[[int], dict], rounds: int,
                 max_launches: int = kMaxLaunches) -> List[List[dict]]:
    """Per plan (0..count-1), its launches' measurements (`launch(i)` runs plan i once):
    `rounds` rounds of every plan in turn, then extra rounds of only the plans whose median step
    is not yet known within +-5 % (verdict.needs_launch), each still in turn, until every plan's
    is or it ran `max_launches` launches. The rounds stay interleaved so that a slow spell of the
    host falls on several plans' launches, not on one plan's."""
    launches: List[List[dict]] = [[] for _ in range(count)]
    for _ in range(rounds):
        for i in range(count):
            launches[i].append(launch(i))
    while True:
        wanted = [i for i in range(count)
                  if needs_launch([m["step_s"] for m in launches[i]], max_launches)]
        if not wanted:
            return launches
        for i in wanted:
            launches[i].append(launch(i))


def median_launch(launches: Sequence[dict]) -> dict:
    """The launch whose step time is the median of the launches' (the lower middle one of an even
    count: a real launch, so that its terms and per-rank timelines stay one run's), with every
    launch's step time under launch_step_s. Peak memory is each rank's median over the launches
    (the lower middle), every launch's kept under launch_memory_bytes: a plan whose collectives
    run on Gloo's threads peaks higher in a launch where those threads drop a buffer late (on
    transformer_lm's sequence-parallel plan, 30.1-35.0 MiB on one rank across five launches),
    so one launch's figure is one draw of a quantity that varies, not the plan's."""
    if not launches:
        raise ValueError("median_launch: no launches")
    ordered = sorted(launches, key=lambda m: m["step_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["launch_step_s"] = [m["step_s"] for m in launches]
    chosen["failed_launches"] = [e for m in launches for e in m.get("failed_launches", [])]
    for key in ("memory_bytes", "memory_allocations_bytes"):
        per_launch = [m[key] for m in launches if m.get(key)]
        if per_launch and len({len(r) for r in per_launch}) == 1:
            chosen[key] = [sorted(rank)[(len(rank) - 1) // 2] for rank in zip(*per_launch)]
    if any(m.get("memory_bytes") for m in launches):
        chosen["launch_memory_bytes"] = [m.get("memory_bytes", []) for m in launches]
    return chosen


def step_spread(step_samples_s: Sequence[float]) -> Optional[List[float]]:
    """[10th, 90th] percentile of one launch's timed steps (each step's slowest rank; the
    exclusive method of statistics.quantiles), or None for fewer than 2 steps. On this project's
    2-core host one plan's steps can fall into two clusters whose shares drift from minute to
    minute (docs/calibration.md "A step time that is two clusters"), and the median moves with
    them; the spread shows how far."""
    if len(step_samples_s) < 2:
        return None
    cuts = statistics.quantiles(step_samples_s, n=10)
    return [cuts[0], cuts[-1]]


def rank_output(text: str, limit: int = 4000) -> str:
    """A torchrun's output without the launcher's log lines (glog style, "E1201 09:07:06.157000
    ..."), which would otherwise fill the tail and hide why a rank died (e.g. "terminate called
    ..."); the last `limit` characters."""
    own = [line for line in text.splitlines() if not re.match(r"[IWE]\d{4} \d\d:\d\d:\d\d", line)]
    return "\n".join(own)[-limit:]


def measured_precision(product_dtypes: Sequence[Dict[str, int]]) -> Optional[dict]:
    """The dtype most of the measured step's matrix products ran in over every rank
    (validate_worker._product_dtypes: per rank, {dtype: count}), with its share of them:
    {"dtype": "bf16", "share": 1.0, "products": 96}; None where no product was recorded."""
    counts: Dict[str, int] = {}
    for rank in product_dtypes or []:
        for dtype, n in (rank or {}).items():
            counts[dtype] = counts.get(dtype, 0) + n
    total = sum(counts.values())
    if not total:
        return None
    dtype = max(sorted(counts), key=lambda d: counts[d])
    return {"dtype": dtype, "share": counts[dtype] / total, "products": total}


def calibrated_speedup(cluster: dict, precision: str, model: str,
                       source: str = "cluster") -> dict:
    """The cluster's device.compute_speedup for a 16-bit `precision` as calibrate measured it,
    with where: {"name", "compute_speedup", "fp32_step_s", "step_s", "workload": {"model",
    "batch"}} and "warning" when the workload is not `model`. ValueError naming `source` where
    the figure is missing or is not calibrate's measurement on this machine (its
    measured.compute_speedup_step_s, fp32 over the dtype's time): validate holds a 16-bit
    plan's predicted compute to a speed-up this host measured, not one copied from elsewhere."""
    speedup = (cluster.get("device", {}).get("compute_speedup") or {}).get(precision)
    seconds = cluster.get("measured", {}).get("compute_speedup_step_s") or {}
    how = (f"calibrate measures it on its workload: torchrun --nproc-per-node 2 -m hybridplan "
           f"calibrate --model {model} --batch B --graph G --out {source}")
    if speedup is None:
        raise ValueError(f"{source}: validate --precision {precision} needs the cluster's "
                         f"device.compute_speedup.{precision}, which it lacks; {how}")
    if not seconds.get("fp32") or not seconds.get(precision):
        raise ValueError(f"{source}: device.compute_speedup.{precision} = {speedup} was not "
                         f"measured by calibrate (no measured.compute_speedup_step_s.fp32 and "
                         f".{precision}); validate holds the prediction to a speed-up measured "
                         f"on this machine: {how}")
    ratio = seconds["fp32"] / seconds[precision]
    if abs(ratio / speedup - 1) > 1e-9:
        raise ValueError(f"{source}: device.compute_speedup.{precision} = {speedup} is not "
                         f"calibrate's measurement (measured.compute_speedup_step_s: fp32 "
                         f"{seconds['fp32']:.6g} s / {precision} {seconds[precision]:.6g} s = "
                         f"{ratio:.6g}); validate holds the prediction to a speed-up measured "
                         f"on this machine: {how}")
    workload = dict(cluster.get("measured", {}).get("shared_host", {}).get("workload") or {})
    out = {"name": precision, "compute_speedup": speedup, "fp32_step_s": seconds["fp32"],
           "step_s": seconds[precision], "workload": workload}
    if workload.get("model") != model:
        out["warning"] = (f"the cluster's compute_speedup.{precision} ({speedup:.3f}) was "
                          f"measured on {workload.get('model', 'an unnamed workload')}, not on "
                          f"{model}: a model whose mix of operations differs runs at another "
                          f"ratio ({how})")
    return out


def _error(predicted: float, measured: float) -> Optional[float]:
    return None if not measured else predicted / measured - 1


def compare(plan: dict, measured: dict) -> dict:
    """One row: the plan's predicted terms, the measured ones and the relative errors. A sharded
    plan's all-gathers and reduce-scatters run between its compute on the step's own thread
    (CPU ranks), and FSDP sets the sharded gradients without the hook that marks the last one:
    its predicted sharding_s is compared inside compute_s."""
    predicted = dict(plan["predicted"])
    predicted["compute_s"] = predicted.get("compute_s", 0.0) + predicted.get("sharding_s", 0.0)
    steps = measured.get("step_samples_s", [])  # each timed step's slowest rank
    row = {"kind": plan_kind(plan), "dp": plan["dp"], "mp": plan["mp"], "mode": plan["mode"],
           "schedule": plan["schedule"], "num_microbatches": plan["num_microbatches"],
           "per_replica_batch": plan["per_replica_batch"],
           # the plan's precision, and the dtypes its ranks' matrix products ran in
           "precision": plan.get("precision", "fp32"),
           "product_dtypes": measured.get("product_dtypes", []),
           "measured_precision": measured_precision(measured.get("product_dtypes", [])),
           "predicted": {t: predicted.get(t, 0.0) for t in TERMS},
           "measured": {t: measured[t] for t in TERMS},
           "predicted_memory_bytes": predicted.get("memory_bytes", []),
           "measured_memory_bytes": measured.get("memory_bytes", []),
           # the same peak from allocation events (the worker's _peak_tensor_bytes)
           "measured_memory_allocations_bytes": measured.get("memory_allocations_bytes", []),
           "measured_per_rank": measured.get("per_rank", []),
           "launch_step_s": measured.get("launch_step_s", [measured["step_s"]]),
           "launch_memory_bytes": measured.get("launch_memory_bytes",
                                               [measured.get("memory_bytes", [])]),
           "failed_launches": measured.get("failed_launches", []),
           "step_samples_s": steps,
           "step_spread_s": step_spread(steps)}
    # the median launch's step known within +-5 %? (verdict.py; None for one launch)
    row["launch_interval_s"] = launch_interval(row["launch_step_s"])
    row["steady"] = is_steady(row["launch_step_s"])
    row["errors"] = {t: _error(row["predicted"][t], row["measured"][t]) for t in TERMS}
    mem_p, mem_m = max(row["predicted_memory_bytes"] or [0]), max(row["measured_memory_bytes"] or [0])
    row["memory_error"] = _error(mem_p, mem_m)
    return row


def launch_prediction(plan: dict, bursts: Sequence[dict], graph, cluster: dict, job) -> dict:
    """The plan priced for one launch: the planner's evaluation (planner.evaluate, as every
    prediction of validate) with the cluster's runtime.shared_host_slowdown rebuilt from the
    shared-core bursts that launch's ranks took (calibration.launch_slowdown_table: calibrate's
    own definition, relative to the same graph sum). {"step_s", "compute_s" (sharding_s within
    it, as compare's), "shared_host_slowdown": the table, "factor": the bursts' together / alone,
    "burst_factors"}."""
    from .calibration import launch_slowdown_table

    shared_host = cluster.get("measured", {}).get("shared_host", {})
    table, merged = launch_slowdown_table(list(bursts), shared_host, cluster["devices_per_node"])
    at_launch = dict(cluster, runtime=dict(cluster.get("runtime", {}),
                                           shared_host_slowdown=table))
    predicted = planner.evaluate(graph, at_launch, plan, job)
    return {"step_s": predicted["step_s"],
            "compute_s": predicted.get("compute_s", 0.0) + predicted.get("sharding_s", 0.0),
            "shared_host_slowdown": table, "factor": merged["factor"],
            "burst_factors": merged["burst_factors"]}


def add_at_launch(row: dict, predictions: Sequence[dict],
                  bursts: Optional[Sequence[List[dict]]] = None) -> None:
    """The row's comparison at launch: `predictions` (launch_prediction's, one per launch in
    the order of launch_step_s) beside the launches' measured steps, as verdict.launch_matched
    reads them, under row["at_launch"] with the per-launch predictions and tables (and the
    launches' raw `bursts`, where given)."""
    matched = launch_matched(row["launch_step_s"], [p["step_s"] for p in predictions])
    row["at_launch"] = dict(matched, predicted_step_s=[p["step_s"] for p in predictions],
                            predicted_compute_s=[p["compute_s"] for p in predictions],
                            shared_host_slowdown=[p["shared_host_slowdown"] for p in predictions],
                            factor=[p["factor"] for p in predictions])
    if bursts is not None:
        row["at_launch"]["bursts"] = [list(b) for b in bursts]


def add_baseline(row: dict, baseline_step_s: float) -> None:
    """The same measured plan as predicted by another (e.g. uncalibrated) cluster."""
    row["baseline_step_s"] = baseline_step_s
    row["baseline_error"] = _error(baseline_step_s, row["measured"]["step_s"])


def summarize(rows: List[dict], out_dir: str, baseline_cluster: Optional[str] = None,
              host_speed: Optional[dict] = None) -> ValidationResult:
    signed = [r["errors"]["step_s"] for r in rows if r["errors"]["step_s"] is not None]
    errors = [abs(e) for e in signed]
    base = [abs(r["baseline_error"]) for r in rows if r.get("baseline_error") is not None]
    measured = [r["measured"]["step_s"] / max(1, r["dp"] * r["per_replica_batch"]) for r in rows]
    fastest = min(measured)
    # rows are in the planner's order: rows[0] is its first choice; rank by measured s/sample
    order = sorted(range(len(rows)), key=lambda i: measured[i])
    spread = [r for r in rows if r.get("step_spread_s")]
    within = sum(1 for r in spread
                 if r["step_spread_s"][0] <= r["predicted"]["step_s"] <= r["step_spread_s"][1])
    as_calibrated = decide(rows)
    as_calibrated["comparison"] = "as calibrated"
    result = ValidationResult(rows, statistics.median(errors), max(errors), order.index(0) + 1,
                              measured[0] <= 1.05 * fastest, out_dir,
                              baseline_cluster if base else None,
                              statistics.median(base) if base else None,
                              max(base) if base else None, host_speed, statistics.median(signed),
                              round_speed(rows), [within, len(spread)] if spread else None,
                              as_calibrated)
    # The verdict is held on the comparison at launch where every plan has one (the launches
    # took shared-core bursts): see verdict.py's docstring for why.
    if rows and all(r.get("at_launch") for r in rows):
        result.verdict = decide(launch_matched_rows(rows))
        result.verdict["comparison"] = "at launch"
        result.verdict_as_calibrated = as_calibrated
        at_launch = [r["at_launch"]["error"] for r in rows]
        result.at_launch_median_abs_error = statistics.median(abs(e) for e in at_launch)
        result.at_launch_signed_median_error = statistics.median(at_launch)
    return result


def round_speed(rows: Sequence[dict]) -> Optional[List[float]]:
    """Per round of launches (launch_step_s[k] of every row), the median over the rows of that
    launch's step over the row's median launch step; None without launches to compare."""
    launches = [r["launch_step_s"] for r in rows if len(r.get("launch_step_s") or []) > 1]
    if not launches:
        return None
    medians = [statistics.median(t) for t in launches]
    rounds = min(len(t) for t in launches)
    return [statistics.median(t[k] / m for t, m in zip(launches, medians))
            for k in range(rounds)]


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def _precision_cell(row: dict) -> str:
    """"bf16 (bf16 100 %)": the plan's precision and the dtype most of its measured step's
    matrix products ran in, with their share."""
    ran = row.get("measured_precision")
    return (f"{row.get('precision', 'fp32')} "
            + ("(-)" if not ran else f"({ran['dtype']} {100 * ran['share']:.0f} %)"))


def _spread(spread: Optional[List[float]]) -> str:
    return "-" if not spread else f"{_ms(spread[0])}-{_ms(spread[1])}"


def markdown(result: ValidationResult, title: str) -> str:
    base = result.baseline_cluster is not None
    lines = [f"# {title}", "",
             "Times in ms (slowest rank, median of the timed steps, of the plan's median launch; "
             "every launch's step under launches); peak memory is each rank's median over the "
             "launches; error = predicted / measured - 1. The first row is the planner's "
             "choice. Step predicted two ways: as calibrated (the cluster as calibrate measured "
             "it, one prediction for every launch) and at launch (the plan priced again for "
             "each launch with the shared-core slowdown that launch's own bursts measured, one "
             "per launch in the order of launches; its error is 1 / the median over launches of "
             "measured / predicted - 1: see \"At launch\" below).", "",
             "| plan | batch | precision (products ran in) | step pred (as calibrated) | "
             "step pred (at launch) | step meas | "
             "steps p10-p90 | launches | error (as calibrated) | error (at launch) | "
             "compute pred | "
             "compute meas | "
             "all-reduce pred | all-reduce meas | optimizer pred | optimizer meas | overhead pred "
             "| overhead meas | peak mem pred | peak mem meas | mem error |"
             + (f" step pred ({result.baseline_cluster}) | its error |" if base else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
             "---|" + ("---|---|" if base else "")]
    for r in result.rows:
        p, m, at = r["predicted"], r["measured"], r.get("at_launch")
        mem_p = max(r["predicted_memory_bytes"] or [0]) / 2**20
        mem_m = max(r["measured_memory_bytes"] or [0]) / 2**20
        lines.append(
            f"| {r['dp']}x{r['mp']} {r['kind']} | {r['per_replica_batch']} | "
            f"{_precision_cell(r)} | {_ms(p['step_s'])} | "
            f"{' / '.join(_ms(t) for t in at['predicted_step_s']) if at else '-'} | "
            f"{_ms(m['step_s'])} | {_spread(r.get('step_spread_s'))} | "
            f"{' / '.join(_ms(t) for t in r.get('launch_step_s', []))} | "
            f"{_pct(r['errors']['step_s'])} | {_pct(at['error']) if at else '-'} | "
            f"{_ms(p['compute_s'])} | "
            f"{_ms(m['compute_s'])} | {_ms(p['allreduce_s'])} | {_ms(m['allreduce_s'])} | "
            f"{_ms(p['optimizer_s'])} | {_ms(m['optimizer_s'])} | {_ms(p['overhead_s'])} | "
            f"{_ms(m['overhead_s'])} | {mem_p:.1f} MiB | {mem_m:.1f} MiB | "
            f"{_pct(r['memory_error'])} |"
            + (f" {_ms(r['baseline_step_s'])} | {_pct(r['baseline_error'])} |" if base else ""))
    lines += ["", f"step-time error: median |error| {100 * result.median_abs_error:.1f} %, worst "
              f"{100 * result.worst_abs_error:.1f} %; the planner's first plan is measured "
              f"#{result.best_predicted_rank_measured} of {len(result.rows)} by time per sample "
              f"({'within' if result.within_5_percent_of_fastest else 'not within'} 5 % of the "
              f"fastest)", ""]
    if result.within_step_spread:
        inside, count = result.within_step_spread
        lines[-1:-1] = [f"{inside} of {count} predicted steps lie within the 10th-90th "
                        "percentile of their plan's timed steps (steps p10-p90, of the median "
                        "launch): a miss there is no larger than the plan's own step-to-step "
                        "variation"]
    if result.signed_median_error is not None:
        lines[-1:-1] = [f"median signed error {_pct(result.signed_median_error)} (a shift every "
                        "plan shares: the host faster or slower than when calibrated)"
                        + ("" if not result.round_speed else
                           "; each round's launches ran at "
                           + ", ".join(f"{x:.2f}" for x in result.round_speed)
                           + " of their plan's median launch (the host's speed across the "
                           "launches)")]
    failed = sum(len(r.get("failed_launches", [])) for r in result.rows)
    if failed:
        lines[-1:-1] = [f"{failed} launch(es) failed and ran again (the ranks' output: "
                        "validate.json, rows[].failed_launches)"]
    speed = result.host_speed
    if speed:
        from .calibration import kHostSpeedTolerance

        ratios = " and ".join(f"{100 * (m['ratio'] - 1):+.0f} %" for m in (speed["before"],
                                                                          speed["after"]))
        lines[-1:-1] = [speed["warning"] or (
            f"the host ran the calibration's workload within "
            f"{100 * kHostSpeedTolerance:.0f} % of its calibrated time before and after the "
            f"launches ({ratios})")]
    if base:
        lines[-1:-1] = [f"the same runs predicted with {result.baseline_cluster}: median |error| "
                        f"{100 * result.baseline_median_abs_error:.1f} %, worst "
                        f"{100 * result.baseline_worst_abs_error:.1f} %"]
    prec = result.precision
    if prec and prec.get("compute_speedup") is not None:
        work = prec.get("workload") or {}
        lines[-1:-1] = [f"precision {prec['name']}: compute predicted at the cluster's "
                        f"compute_speedup.{prec['name']} {prec['compute_speedup']:.3f}, "
                        f"calibrate's measurement (forward+backward of "
                        f"{work.get('model', '?')} at batch {work.get('batch', '?')}: fp32 "
                        f"{_ms(prec['fp32_step_s'])} ms, {prec['name']} {_ms(prec['step_s'])} "
                        "ms)" + (f"; {prec['warning']}" if prec.get("warning") else "")
                        + (f"; {prec['baseline_left_out']}" if prec.get("baseline_left_out")
                           else "")]
    lines += _at_launch_section(result)
    if result.verdict:
        lines += ["## Verdict", ""] + verdict_lines(result.verdict) + [""]
        if result.verdict_as_calibrated:
            lines += ["The same targets on the comparison as calibrated (not the verdict: "
                      "each launch against the one prediction the calibration's table gave, "
                      "measured minutes before the launches):", ""] + [
                "    " + line for line in verdict_lines(result.verdict_as_calibrated)] + [""]
    return "\n".join(lines)


def _interval(interval: Optional[Sequence[float]]) -> str:
    return "-" if not interval else f"{interval[0]:.3f}-{interval[1]:.3f}"


def _at_launch_section(result: ValidationResult) -> List[str]:
    """validate.md's "At launch": per plan, each launch's host (its bursts' shared-core
    table entry for the plan's processes, together over the graph's sum) and its ratio measured
    / predicted at launch, their median, the 90 % interval of the median and the error; and
    which comparison the verdict is held on, and why."""
    rows = [r for r in result.rows if r.get("at_launch")]
    if not rows:
        return ["## At launch", "",
                "The launches took no shared-core bursts (the cluster names no "
                "measured.shared_host.workload: a preset, or calibrated before it did): the "
                "verdict is held on the comparison as calibrated.", ""]
    lines = ["## At launch", "",
             "Each launch's ranks ran calibrate's shared-core burst on the calibration's own "
             "workload right before and right after their timed steps (each rank alone, then "
             "both together); the plan is priced again for that launch with the cluster's "
             "runtime.shared_host_slowdown rebuilt from those bursts by calibrate's own "
             "definition. The verdict is held on this comparison: the calibration is measured "
             "minutes before the launches, and this host's speed for two ranks together moves "
             "10-40 % within an hour, so the one prediction carries the host of another moment "
             "into every launch, while a plan's interval from its launches is a few percent "
             "wide. host: the bursts' table entry for the largest process count (wall time "
             "together over the graph's own sum where calibrate's table was relative to it); "
             "ratio: measured / predicted at launch.", "",
             "| plan | host per launch | ratio per launch | median ratio | 90 % interval | "
             "steady | error (at launch) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        at = r["at_launch"]
        steady = {True: "yes", False: "no", None: "one launch"}[at["steady"]]
        lines.append(f"| {r['dp']}x{r['mp']} {r['kind']} | "
                     f"{' / '.join(f'{t[-1][1]:.3f}' for t in at['shared_host_slowdown'])} | "
                     f"{' / '.join(f'{x:.3f}' for x in at['ratios'])} | "
                     f"{at['median_ratio']:.3f} | {_interval(at['ratio_interval'])} | {steady} | "
                     f"{_pct(at['error'])} |")
    if result.at_launch_median_abs_error is not None:
        lines += ["", f"step-time error at launch: median |error| "
                      f"{100 * result.at_launch_median_abs_error:.1f} %, median signed "
                      f"{_pct(result.at_launch_signed_median_error)}"]
    return lines + [""]


def scatter(result: ValidationResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    xs = [r["measured"]["step_s"] * 1e3 for r in result.rows]
    ys = [r["predicted"]["step_s"] * 1e3 for r in result.rows]
    ax.scatter(xs, ys)
    for r, x, y in zip(result.rows, xs, ys):
        ax.annotate(r["kind"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    top = max(xs + ys) * 1.1
    ax.plot([0, top], [0, top], "--", color="gray", label="predicted = measured")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def timeline(plan: dict, measured: dict, predicted: List[List[dict]], path: Path) -> None:
    """Per pipeline rank (= stage, unless the schedule runs several stages per rank): the cost
    model's schedule (top) and the executor's actions (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = len(predicted)
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.9 * stages))
    # forward, backward; a zero-bubble schedule's backward split into input and weight passes
    colors = {"F": "tab:blue", "B": "tab:orange", "I": "tab:orange", "W": "tab:green"}
    ranks = measured["per_rank"]
    # Each rank timed its step from its own barrier exit; the ranks share the host's monotonic
    # clock, so shifting by each rank's start puts all of them on the earliest one's time axis.
    starts = [r.get("last_step_start_s") for r in ranks]
    first = min(starts) if starts and None not in starts else None
    for s in range(stages):
        for a in predicted[s]:
            ax.broken_barh([(a["start_s"] * 1e3, (a["end_s"] - a["start_s"]) * 1e3)],
                           (2 * s + 1.05, 0.8), color=colors[a["kind"]], alpha=0.9)
        actions = ranks[s].get("actions", []) if s < len(ranks) else []
        shift_ms = 0.0 if first is None else (starts[s] - first) * 1e3
        for a in actions:
            ax.broken_barh([(a["start_s"] * 1e3 + shift_ms, (a["end_s"] - a["start_s"]) * 1e3)],
                           (2 * s + 0.15, 0.8), color=colors[a["kind"]], alpha=0.5)
    ax.set_yticks([2 * s + 0.55 for s in range(stages)] + [2 * s + 1.45 for s in range(stages)])
    what = "rank" if plan.get("virtual_stages", 1) > 1 else "stage"
    ax.set_yticklabels([f"{what} {s} measured" for s in range(stages)] +
                       [f"{what} {s} predicted" for s in range(stages)])
    ax.set_xlabel("ms from the step's start (forward blue, backward orange, weight gradients "
                  "green)")
    ax.set_title(f"{plan_kind(plan)}: predicted vs measured schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def validate(graph, cluster, model: str, job=None, devices: int = 2, plans: int = 8,
             steps: int = 20, warmup: int = 5, timeout_s: float = 120.0,
             out_dir: str = "out/validate", progress: bool = True,
             baseline_cluster=None, rounds: int = 3, recompute: bool = False,
             sharding: bool = False, max_launches: Optional[int] = None,
             precision: Optional[str] = None) -> ValidationResult:
    """Runs `plans` plans of `model` (MODULE:FACTORY, whose module has example_inputs /
    example_target and, optionally, loss) on `devices` local ranks and compares each with its
    prediction; see the module docstring. `graph`, `cluster`, `job`: objects, dicts or paths.
    `baseline_cluster`: also predict each measured plan with this cluster (e.g. the
    uncalibrated preset), so the errors before and after calibration stand side by side on the
    same measurements. `rounds`: launches per plan, interleaved; each row is the median launch
    (see the module docstring). `max_launches` (default 7, or `rounds` if more): launches of a
    plan, in extra rounds, until its median step is known within +-5 % (run_launches).
    `recompute`: also run the first data-parallel and the first pipeline plan chosen with every
    node recomputed (planner.with_recompute), fully and, where the graph measured it,
    selectively, so activation checkpointing's time and memory are measured beside the same
    plans without it.
    `sharding`: also run the first data-parallel plan (mp = 1) chosen as zero2 and as zero3,
    and the first pipeline plan with dp >= 2 as zero2 (planner.with_sharding), each beside the
    same plan unsharded (docs/sharding.md).
    `precision` ("fp32", "bf16", "fp16"; None: the job's): the job's precision, so the plans
    are the planner's for it and the ranks run each in it; a 16-bit one needs the cluster's
    compute_speedup for it as calibrate measured it (calibrated_speedup)."""
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    g, c = planner.as_graph(graph), planner.as_cluster(cluster)
    baseline = None if baseline_cluster is None else planner.as_cluster(baseline_cluster)
    j = with_precision(planner.as_job(job), precision)
    precision = "fp32" if j is None else j.to_dict().get("precision", "fp32")
    precision_info = {"name": precision}
    if precision != "fp32":
        precision_info = calibrated_speedup(
            c.to_dict(), precision, model,
            cluster if isinstance(cluster, (str, os.PathLike)) else c.name)
        if progress and precision_info.get("warning"):
            print(f"validate: {precision_info['warning']}", file=sys.stderr)
        if baseline is not None and (baseline.to_dict()["device"].get("compute_speedup")
                                     or {}).get(precision) is None:
            # a preset without the dtype's speed-up cannot price the plan: no baseline column
            precision_info["baseline_left_out"] = (
                f"{baseline.name} has no compute_speedup.{precision}: it cannot price the "
                f"plans in {precision}, and its column is left out")
            if progress:
                print(f"validate: {precision_info['baseline_left_out']}", file=sys.stderr)
            baseline = None
    ranked = planner.search(g, c, j, devices=devices, top_k=1000).plans
    chosen = select_plans([p.to_dict() for p in ranked], plans)
    if recompute:
        for mode in ("placement", "pipeline"):
            first = next((p for p in chosen if p["mode"] == mode), None)
            if first is not None:
                chosen.append(planner.with_recompute(first, g, c, j))
                if all(n.get("selective_saved_bytes") is not None
                       for n in g.to_dict()["nodes"]):
                    chosen.append(planner.with_recompute(first, g, c, j, selective=True))
    if sharding:
        base = [p for p in chosen if p.get("sharding", "none") == "none"]
        dp = next((p for p in base if p["mp"] == 1 and p["dp"] >= 2), None)
        pipe = next((p for p in base if p["mode"] == "pipeline" and p["dp"] >= 2), None)
        for plan, kinds in ((dp, ("zero2", "zero3")), (pipe, ("zero2",))):
            for kind in kinds if plan is not None else ():
                if not any(p.get("sharding") == kind and p["mp"] == plan["mp"]
                           and p["mode"] == plan["mode"] for p in chosen):
                    chosen.append(planner.with_sharding(plan, kind, g, c, j))
    if rounds < 1:
        raise ValueError(f"validate: rounds must be >= 1 (got {rounds})")
    max_launches = max(kMaxLaunches, rounds) if max_launches is None else max_launches
    if max_launches < rounds:
        raise ValueError(f"validate: max_launches must be >= rounds ({rounds}) "
                         f"(got {max_launches})")
    # the ranks train with the optimizer the predictions hold state for: the job's
    optimizer = (j if j is not None else planner.Job.from_dict(
        {"schema_version": 1, "kind": "hybridplan.job"})).to_dict()["optimizer"]
    from .calibration import host_speed

    shared_host = c.to_dict().get("measured", {}).get("shared_host", {})
    speed_before = host_speed(shared_host)
    with tempfile.TemporaryDirectory(prefix="hybridplan-validate-") as tmp, \
            tqdm(total=rounds * len(chosen), desc="validate", unit="run",
                 disable=not progress) as bar:
        def launch(i: int) -> dict:
            if bar.n >= bar.total:  # a launch of the extra rounds, unknown in advance
                bar.total += 1
            measured = run_plan_retrying(chosen[i], model, steps, warmup, timeout_s, Path(tmp),
                                         optimizer, host_workload=shared_host.get("workload"))
            bar.update()
            return measured

        launches = run_launches(len(chosen), launch, rounds, max_launches)
    speed = None
    if speed_before is not None:  # the worse of the two is what the launches may have seen
        speed_after = host_speed(shared_host)
        worst = max((speed_before, speed_after), key=lambda m: abs(m["ratio"] - 1))
        speed = {"before": speed_before, "after": speed_after, "warning": worst["warning"]}
        if worst["warning"] and progress:
            print(f"validate: {worst['warning']}", file=sys.stderr)
    rows, drew_timeline, traces = [], False, []
    cluster_dict = c.to_dict()
    for plan, runs in zip(chosen, launches):
        measured = median_launch(runs)
        rows.append(compare(plan, measured))
        if all(m.get("shared_host_bursts") for m in runs):  # the plan priced for each launch
            add_at_launch(rows[-1], [launch_prediction(plan, m["shared_host_bursts"], g,
                                                       cluster_dict, j) for m in runs],
                          [m["shared_host_bursts"] for m in runs])
        rows[-1]["trace"] = trace_file_name(len(rows) - 1, plan)
        traces.append((rows[-1]["trace"], plan, measured))
        if baseline is not None:  # the plan as if made for the baseline cluster
            as_baseline = dict(plan, cluster=dict(plan["cluster"], name=baseline.name))
            add_baseline(rows[-1], planner.evaluate(g, baseline, as_baseline, j)["step_s"])
        if not drew_timeline and plan["mode"] == "pipeline":
            predicted = json.loads(planner._C.pipeline_timeline(
                g.to_json(), c.to_json(), None if j is None else j.to_json(),
                json.dumps(plan)))
            timeline(plan, measured, predicted, out / "timeline.png")
            drew_timeline = True
    result = summarize(rows, str(out), None if baseline is None else baseline.name, speed)
    result.precision = precision_info
    (out / "validate.json").write_text(json.dumps(result.to_dict(), indent=2))
    (out / "validate.md").write_text(markdown(result, f"{g.name} on {c.name}, {precision}: "
                                                      "predicted vs measured"))
    scatter(result, out / "scatter.png")
    write_traces(out, traces, g, c, j)
    return result


def with_precision(job, precision: Optional[str]):
    """`job` (a planner.Job or None, the default job) with its precision set to `precision`
    (None: `job` unchanged); the older "mixed_precision" flag is dropped for it."""
    if precision is None:
        return job
    d = (job.to_dict() if job is not None
         else {"schema_version": 1, "kind": "hybridplan.job"})
    d = dict(d, precision=precision)
    d.pop("mixed_precision", None)
    return planner.Job.from_dict(d, "job")


def write_traces(out: Path, traces: Sequence[tuple], graph, cluster, job) -> None:
    """Per plan, (file name, plan, measured): its predicted and measured step as one trace
    (hybridplan.trace.comparison_trace) in <out>/<file name>, trace-<row>-<kind>.json. The
    trace files of an earlier run in the same folder are removed first, so every trace there
    is one of this run's rows. Written after validate.json: a trace that cannot be drawn
    leaves the measurements saved."""
    for old in out.glob("trace-*.json"):
        if re.fullmatch(r"trace-\d+-.+\.json", old.name):
            old.unlink()
    for name, plan, measured in traces:
        write_trace(out / name, comparison_trace(
            plan, measured, graph, cluster, job,
            source=f"validate: the {plan_kind(plan)} plan's measurements"))
