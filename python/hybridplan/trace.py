"""A plan's step as a trace for Perfetto (ui.perfetto.dev) and chrome://tracing: the Chrome
trace-event JSON format that torch.profiler's traces use, so the predicted schedule of a plan and
what the executor measured open in the viewers people already read profiles in.

    trace = predicted_trace(plan, graph, cluster)        # the cost model's schedule
    trace = comparison_trace(plan, measured, graph, cluster)   # predicted and measured
    write_trace("out/plan.trace.json", trace)

    python -m hybridplan explain plan.json --graph g.json --cluster c.json --trace out.json
    hybridplan explain plan.json --graph g.json --cluster c.json --trace out.json

`hybridplan validate` writes one comparison per plan it ran (<out-dir>/trace-<row>-<kind>.json).

Layout (docs/formats.md, "Trace"): the predicted schedule is process 1 ("pid": 1), the measured
one process 2, on one time axis whose 0 is the step's start; each rank is a thread ("tid": the
process rank). A pipeline rank's events are its forward and backward passes of each
micro-batch ("F3 s1": micro-batch 3 through stage 1; "B", or under a zero-bubble schedule "I" and
"W" for the backward's input and weight passes), then the step's remaining terms (exposed
all-reduce, exposed sharding collectives, optimizer, overhead). A placement (or data-parallel)
rank's events are the step's terms one after another, compute first. Times are microseconds
("ts", "dur"); every event is complete ("ph": "X"), and "M" events name processes and threads.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional

from . import planner
from .files import write_text_atomic

__all__ = ["predicted_trace", "comparison_trace", "write_trace", "trace_file_name", "plan_kind",
           "PREDICTED_PID", "MEASURED_PID"]

PREDICTED_PID = 1
MEASURED_PID = 2
MAX_PREDICTED_REPLICAS = 64  # replicas the predicted process draws (all of them up to this)

KINDS = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)"}
# chrome://tracing's reserved colour names (Perfetto colours by name): forward blue, backward
# orange, weight gradients green, as timeline.png draws them.
_ACTION_COLOURS = {"F": "thread_state_runnable", "B": "thread_state_iowait",
                   "I": "thread_state_iowait", "W": "thread_state_running"}
# The step's terms after compute, in the order they are drawn: (key, event name, colour).
_TAIL_TERMS = (("allreduce_s", "all-reduce (exposed)", "bad"),
               ("sharding_s", "sharding collectives (exposed)", "terrible"),
               ("optimizer_s", "optimizer", "olive"),
               ("overhead_s", "overhead", "grey"))
_MEASURED_TERMS = ("step_s", "compute_s", "allreduce_s", "optimizer_s", "overhead_s")


# ---- events --------------------------------------------------------------------------------

def _span(name: str, pid: int, tid: int, start_s: float, end_s: float, cat: str,
          cname: Optional[str], args: Dict[str, Any]) -> dict:
    # Whole nanoseconds written as microseconds: a viewer reading "ts" and "dur" back into
    # nanoseconds (Perfetto rounds each to ns) gets this event's end exactly at the next one's
    # start, where unrounded floats could overlap by a nanosecond and nest the next in this one.
    begin_ns = round(start_s * 1e9)
    end_ns = max(begin_ns, round(end_s * 1e9))
    event = {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
             "ts": begin_ns / 1000, "dur": (end_ns - begin_ns) / 1000, "args": args}
    if cname:
        event["cname"] = cname
    return event


def _action(a: dict, pid: int, tid: int, shift_s: float) -> dict:
    return _span(f"{a['kind']}{a['microbatch']} s{a['stage']}", pid, tid,
                 a["start_s"] + shift_s, a["end_s"] + shift_s, KINDS[a["kind"]],
                 _ACTION_COLOURS[a["kind"]],
                 {"kind": KINDS[a["kind"]], "stage": a["stage"], "microbatch": a["microbatch"]})


def _tail(terms: Dict[str, float], pid: int, tid: int, start_s: float,
          note: Optional[str] = None) -> List[dict]:
    """The step's terms after compute, consecutive from `start_s`; zero terms are left out."""
    events, at = [], start_s
    for key, name, colour in _TAIL_TERMS:
        seconds = terms.get(key, 0.0)
        if seconds > 0:
            args = {"seconds": seconds, **({"note": note} if note else {})}
            events.append(_span(name, pid, tid, at, at + seconds, "step", colour, args))
            at += seconds
    return events


def _metadata(pid: int, process: str, sort_index: int, threads: Dict[int, str]) -> List[dict]:
    events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
               "args": {"name": process}},
              {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
               "args": {"sort_index": sort_index}}]
    for tid, name in sorted(threads.items()):
        events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": name}},
                   {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"sort_index": tid}}]
    return events


# ---- the plan's ranks ----------------------------------------------------------------------

def _ranks_per_replica(plan: dict) -> int:
    return 1 if plan["mode"] == "placement" else plan["mp"]


def _predicted_ranks(plan: dict) -> int:
    """Ranks the predicted process draws: every rank, or the first MAX_PREDICTED_REPLICAS
    replicas' (the cost model predicts every replica alike, so a plan of thousands of devices
    does not write a trace of thousands of identical threads)."""
    return min(plan["dp"], MAX_PREDICTED_REPLICAS) * _ranks_per_replica(plan)


def _thread_names(plan: dict, ranks: int) -> Dict[int, str]:
    """Rank -> what it runs, for ranks 0..ranks-1: rank = replica * mp + pipeline rank
    (docs/formats.md, Processes)."""
    names = {}
    for rank in range(ranks):
        if plan["mode"] == "placement":
            devices = f", {plan['mp']} devices" if plan["mp"] > 1 else ""
            names[rank] = f"rank {rank} (replica {rank}{devices})"
            continue
        replica, k = divmod(rank, plan["mp"])
        stages = [s for s, owner in enumerate(planner.stage_ranks(
            plan["schedule"], plan["mp"], plan.get("virtual_stages", 1))) if owner == k]
        what = (f"stage {stages[0]}" if len(stages) == 1
                else "stages " + ", ".join(str(s) for s in stages))
        names[rank] = (f"rank {rank} ({what})" if plan["dp"] == 1
                       else f"rank {rank} (replica {replica}, {what})")
    return names


def plan_kind(plan: dict) -> str:
    """What a plan (dict) runs, in a few words: "dp b=32", "placement b=8 zero2",
    "1f1b M=4 b=32 recompute", "dp b=32 selective recompute", "tp2 b=32" (tensor parallel,
    mp = 1), "tp2 sp b=32" (with sequence parallelism), "1f1b M=4 tp2 b=32" (the rows of `hybridplan validate` and the traces' names)."""
    tp = int(plan.get("tp", 1))
    if plan["mp"] == 1:
        kind = "dp" if tp == 1 else f"tp{tp}" + (" sp" if plan.get("sequence_parallel") else "")
    elif plan["mode"] == "placement":
        kind = "placement"
    else:
        kind = f"{plan['schedule']} M={plan['num_microbatches']}" + (f" tp{tp}" if tp > 1 else "")
    how = {a.get("recompute") for a in plan.get("assignment", [])} - {None, False}
    recomputed = (" selective recompute" if how == {"selective"} else
                  " recompute" if how else "")
    sharding = plan.get("sharding", "none")
    return (f"{kind} b={plan['per_replica_batch']}" + (f" {sharding}" if sharding != "none" else "")
            + recomputed)


def _label(plan: dict) -> str:
    tp = int(plan.get("tp", 1))
    return f"{plan['dp']}x{plan['mp']}" + (f"x{tp}" if tp > 1 else "") + f" {plan_kind(plan)}"


# ---- predicted -----------------------------------------------------------------------------

def _prediction(plan: dict, plan_object: "planner.Plan", graph, cluster, job) -> Dict[str, Any]:
    """The plan's predicted terms and, for a pipeline, the cost model's schedule per pipeline
    rank. With graph and cluster the plan is checked against them and evaluated again (as
    `hybridplan explain` does); without them its own `predicted` is taken. `plan` is
    `plan_object`'s dict: the object goes to the core as it is (its text, not parsed again)."""
    if cluster is not None and graph is None:
        raise ValueError("trace: a cluster needs the graph too (got cluster without graph)")
    if graph is None or cluster is None:
        if plan["mode"] == "pipeline":
            raise ValueError("trace: a pipeline plan's predicted schedule is simulated by the "
                             "cost model: give the graph and the cluster")
        predicted = plan.get("predicted")
        if not isinstance(predicted, dict) or "step_s" not in predicted:
            raise ValueError("trace: plan: $.predicted.step_s is missing: give the graph and "
                             "the cluster to evaluate the plan")
        return {"terms": predicted, "timeline": None}
    g, c, j = planner.as_graph(graph), planner.as_cluster(cluster), planner.as_job(job)
    terms = planner.evaluate(g, c, plan_object, j)
    timeline = None
    if plan["mode"] == "pipeline":
        timeline = json.loads(planner._C.pipeline_timeline(
            g.to_json(), c.to_json(), None if j is None else j.to_json(), plan_object.to_json()))
    return {"terms": terms, "timeline": timeline}


def _predicted_events(plan: dict, prediction: Dict[str, Any], pid: int) -> List[dict]:
    terms, timeline = prediction["terms"], prediction["timeline"]
    compute_s = terms.get("compute_s", 0.0)
    events = []
    for rank in range(_predicted_ranks(plan)):
        if timeline is None:
            events.append(_span("compute", pid, rank, 0.0, compute_s, "step", "generic_work",
                                {"seconds": compute_s}))
        else:  # every replica runs its pipeline rank's simulated passes
            events += [_action(a, pid, rank, 0.0) for a in timeline[rank % plan["mp"]]]
        # the rest of the step starts when the last pass of any rank ends (compute_s)
        events += _tail(terms, pid, rank, compute_s)
    return events


def _trace(plan: dict, processes: List[List[dict]], other: Dict[str, Any]) -> dict:
    events = [e for p in processes for e in p]
    meta = [e for e in events if e["ph"] == "M"]
    spans = sorted((e for e in events if e["ph"] == "X"),
                   key=lambda e: (e["pid"], e["tid"], e["ts"]))
    return {"traceEvents": meta + spans, "displayTimeUnit": "ms",
            "otherData": dict({"generator": "hybridplan", "plan": _label(plan),
                               "time_axis": "microseconds from the step's start"}, **other)}


def predicted_trace(plan, graph=None, cluster=None, job=None) -> dict:
    """The plan's predicted step as a trace dict (Chrome trace-event JSON): one process, each rank
    a thread. A pipeline plan needs the graph and the cluster (its schedule is simulated); a
    placement plan without them is drawn from its own `predicted` terms. With graph and cluster
    the plan is checked against them and evaluated again (the terms `hybridplan explain`
    prints). `plan`, `graph`, `cluster`, `job`: values, dicts or paths (cluster: or a preset)."""
    plan = planner.as_plan(plan)
    p = plan.to_dict()
    prediction = _prediction(p, plan, graph, cluster, job)
    names = _thread_names(p, _predicted_ranks(p))
    return _trace(p, [_metadata(PREDICTED_PID, f"predicted: {_label(p)}", 0, names),
                      _predicted_events(p, prediction, PREDICTED_PID)],
                  _other(p, prediction))


def _other(plan: dict, prediction: Dict[str, Any]) -> Dict[str, Any]:
    other = {"predicted_step_s": prediction["terms"]["step_s"]}
    if _predicted_ranks(plan) < planner.num_processes(plan):
        other["predicted_ranks_drawn"] = (f"replicas 0..{MAX_PREDICTED_REPLICAS - 1} of "
                                          f"{plan['dp']} (the others are predicted alike)")
    return other


# ---- measured ------------------------------------------------------------------------------

def _number(value: Any, where: str, minimum: Optional[float] = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number (got {value!r})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where} must be >= {minimum:g} (got {value!r})")
    return float(value)


def _index(value: Any, where: str, below: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where} must be an integer >= 0 (got {value!r})")
    if below is not None and value >= below:
        raise ValueError(f"{where} must be < {below} (got {value!r})")
    return value


def _checked_measured(plan: dict, measured: Any, source: str) -> List[dict]:
    """measured["per_rank"] (the shape hybridplan.measure.validate_worker writes) checked field
    by field, one entry per rank of the plan, in rank order."""
    if not isinstance(measured, dict):
        raise ValueError(f"{source}: $ must be an object with per_rank (got "
                         f"{type(measured).__name__})")
    if not isinstance(measured.get("per_rank"), list):
        raise ValueError(f"{source}: $.per_rank must be a list of the ranks' measurements (got "
                         f"{type(measured.get('per_rank')).__name__})")
    count = planner.num_processes(plan)
    stages = plan["mp"] * plan.get("virtual_stages", 1) if plan["mode"] == "pipeline" else 1
    ranks: Dict[int, dict] = {}
    for i, entry in enumerate(measured["per_rank"]):
        at = f"{source}: $.per_rank[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be an object (got {type(entry).__name__})")
        rank = _index(entry.get("rank"), f"{at}.rank", count)
        if rank in ranks:
            raise ValueError(f"{at}.rank must name each rank once (got {rank} again)")
        terms = {t: _number(entry[t], f"{at}.{t}", 0.0) for t in _MEASURED_TERMS if t in entry}
        start = entry.get("last_step_start_s")
        actions = entry.get("actions", [])
        if not isinstance(actions, list):
            raise ValueError(f"{at}.actions must be a list (got {type(actions).__name__})")
        checked = []
        for j, a in enumerate(actions):
            where = f"{at}.actions[{j}]"
            if not isinstance(a, dict):
                raise ValueError(f"{where} must be an object (got {type(a).__name__})")
            if a.get("kind") not in KINDS:
                raise ValueError(f"{where}.kind must be one of {', '.join(KINDS)} "
                                 f"(got {a.get('kind')!r})")
            begin = _number(a.get("start_s"), f"{where}.start_s")
            end = _number(a.get("end_s"), f"{where}.end_s")
            if end < begin:
                raise ValueError(f"{where}.end_s must be >= start_s ({begin!r}) (got {end!r})")
            checked.append({"kind": a["kind"], "start_s": begin, "end_s": end,
                            "stage": _index(a.get("stage"), f"{where}.stage", stages),
                            "microbatch": _index(a.get("microbatch"), f"{where}.microbatch")})
        if not checked and "compute_s" not in terms:
            raise ValueError(f"{at} needs actions or the step's terms (compute_s, ...) to draw")
        ranks[rank] = {"rank": rank, "terms": terms, "actions": checked,
                       "start_s": None if start is None else
                       _number(start, f"{at}.last_step_start_s")}
    missing = [r for r in range(count) if r not in ranks]
    if missing:
        raise ValueError(f"{source}: $.per_rank must have every rank of the plan's {count} "
                         f"processes (missing rank {', '.join(map(str, missing))})")
    return [ranks[r] for r in range(count)]


def _measured_events(ranks: List[dict], pid: int) -> List[dict]:
    """Each rank's recorded actions of its last timed step, then its terms after the last one
    (the terms are medians over the timed steps); a rank without actions (placement) draws its
    terms one after another. The ranks timed their step from their own barrier exit on one
    monotonic clock: shifting each by its start puts them on the earliest rank's axis."""
    starts = [r["start_s"] for r in ranks if r["actions"]]
    first = min(starts) if starts and None not in starts else None
    note = "median of the timed steps"
    events = []
    for r in ranks:
        tid, terms = r["rank"], r["terms"]
        if r["actions"]:
            shift = 0.0 if first is None else r["start_s"] - first
            events += [_action(a, pid, tid, shift) for a in r["actions"]]
            events += _tail(terms, pid, tid, shift + max(a["end_s"] for a in r["actions"]), note)
        else:
            compute_s = terms.get("compute_s", 0.0)
            events.append(_span("compute", pid, tid, 0.0, compute_s, "step", "generic_work",
                                {"seconds": compute_s, "note": note}))
            events += _tail(terms, pid, tid, compute_s, note)
    return events


def comparison_trace(plan, measured: dict, graph=None, cluster=None, job=None,
                     source: str = "measured") -> dict:
    """predicted_trace's process beside the measured one (process 2) on the same time axis.
    `measured`: what hybridplan.measure.validate_worker writes ({"per_rank": [{"rank", "actions":
    [{"kind", "stage", "microbatch", "start_s", "end_s"}], "step_s", "compute_s",
    "allreduce_s", "optimizer_s", "overhead_s", "last_step_start_s"}, ...], "step_s": ...});
    `source` names it in error messages."""
    plan = planner.as_plan(plan)
    p = plan.to_dict()
    ranks = _checked_measured(p, measured, source)
    prediction = _prediction(p, plan, graph, cluster, job)
    label = _label(p)
    other = _other(p, prediction)
    if isinstance(measured.get("step_s"), (int, float)):
        other["measured_step_s"] = measured["step_s"]  # the slowest rank's median
    return _trace(p, [_metadata(PREDICTED_PID, f"predicted: {label}", 0,
                                _thread_names(p, _predicted_ranks(p))),
                      _metadata(MEASURED_PID, f"measured: {label}", 1,
                                _thread_names(p, planner.num_processes(p))),
                      _predicted_events(p, prediction, PREDICTED_PID),
                      _measured_events(ranks, MEASURED_PID)], other)


# ---- files ---------------------------------------------------------------------------------

def trace_file_name(index: int, plan: dict) -> str:
    """`trace-<index>-<dp>x<mp>-<kind>.json`, e.g. trace-3-1x2-1f1b-M4-b32.json."""
    kind = f"{plan['dp']}x{plan['mp']} {plan_kind(plan)}".replace("=", "")
    return f"trace-{index}-{re.sub(r'[^A-Za-z0-9.]+', '-', kind).strip('-')}.json"


def write_trace(path, trace: dict) -> None:
    """Writes `trace` to `path` atomically (a reader sees the old file or the new one)."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"write_trace: trace must be a dict with a traceEvents list (got "
                         f"{type(trace).__name__})")
    write_text_atomic(path, json.dumps(trace, separators=(",", ":")) + "\n")
