"""hybridplan.trace: a plan's predicted step, and validate's measured one beside it, as Chrome
trace-event JSON for Perfetto and chrome://tracing. Plans come from the planner on the tiny
example graph; the measured side is synthetic, in the shape hybridplan.measure.validate_worker
writes, so nothing here needs torch or torchrun."""

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from hybridplan import planner, trace
from hybridplan.measure import validation

ROOT = Path(__file__).resolve().parents[2]
GRAPH = planner.load_graph(ROOT / "examples/graph-tiny.json")
TOLERANCE_US = 1e-3  # the events are written in whole nanoseconds


def _first(cluster: str, devices: int, pick, **search) -> dict:
    c = planner.Cluster.preset(cluster)
    plans = planner.search(GRAPH, c, devices=devices, top_k=500, **search).plans
    return next(p.to_dict() for p in plans if pick(p))


@pytest.fixture(scope="module")
def pipeline_plan() -> dict:
    return _first("localhost-cpu", 2, lambda p: p.mode == "pipeline", modes=("pipeline",),
                  schedules=("1f1b",))


@pytest.fixture(scope="module")
def dp_plan() -> dict:
    return _first("localhost-cpu", 2, lambda p: p.mp == 1, dp_only=True)


def _load(tmp_path, name, t) -> dict:
    path = tmp_path / name
    trace.write_trace(path, t)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []  # atomic
    return json.loads(path.read_text())


def _spans(t, pid):
    return [e for e in t["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


def _names(t, what, pid=None):
    """process_name / thread_name metadata: {pid: name} or {tid: name} of one pid."""
    return {(e["pid"] if what == "process_name" else e["tid"]): e["args"]["name"]
            for e in t["traceEvents"] if e["ph"] == "M" and e["name"] == what
            and (pid is None or e["pid"] == pid)}


def _check_structure(t, pids, ranks):
    assert isinstance(t["traceEvents"], list)
    for e in t["traceEvents"]:
        assert e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e), e
            assert isinstance(e["name"], str) and e["name"]
            assert e["dur"] >= 0 and e["ts"] >= 0
    assert set(_names(t, "process_name")) == set(pids)
    for pid in pids:
        assert set(_names(t, "thread_name", pid)) == set(range(ranks))
        assert {e["tid"] for e in _spans(t, pid)} == set(range(ranks))


def _check_no_overlap(t, pid):
    threads = defaultdict(list)
    for e in _spans(t, pid):
        threads[e["tid"]].append(e)
    for tid, events in threads.items():
        events.sort(key=lambda e: e["ts"])
        for a, b in zip(events, events[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - TOLERANCE_US, (tid, a, b)


def _end_us(events) -> float:
    return max(e["ts"] + e["dur"] for e in events)


# ---- predicted -------------------------------------------------------------------------------

def test_a_pipeline_plans_predicted_schedule(tmp_path, pipeline_plan):
    cluster = planner.Cluster.preset("localhost-cpu")
    t = _load(tmp_path, "pipe.json", trace.predicted_trace(pipeline_plan, GRAPH, cluster))
    ranks = pipeline_plan["dp"] * pipeline_plan["mp"]
    _check_structure(t, [trace.PREDICTED_PID], ranks)
    assert _names(t, "process_name")[trace.PREDICTED_PID].startswith("predicted: 1x2 1f1b")
    assert _names(t, "thread_name", trace.PREDICTED_PID) == {0: "rank 0 (stage 0)",
                                                            1: "rank 1 (stage 1)"}
    _check_no_overlap(t, trace.PREDICTED_PID)
    spans = _spans(t, trace.PREDICTED_PID)
    step_s = planner.evaluate(GRAPH, cluster, pipeline_plan)["step_s"]
    assert _end_us(spans) == pytest.approx(step_s * 1e6, abs=TOLERANCE_US)
    assert t["otherData"]["predicted_step_s"] == pytest.approx(step_s)
    # every stage runs every micro-batch forward and backward, named as the executor's actions
    m = pipeline_plan["num_microbatches"]
    for stage in range(pipeline_plan["mp"]):
        mine = [e for e in spans if e["tid"] == stage and e["cat"] != "step"]
        assert sorted(e["name"] for e in mine if e["name"][0] == "F") == sorted(
            f"F{i} s{stage}" for i in range(m))
        assert len(mine) == 2 * m
        assert all(e["args"]["stage"] == stage and 0 <= e["args"]["microbatch"] < m
                   for e in mine)
    # the stage 1 forward of micro-batch 0 waits for stage 0's
    f0 = {e["tid"]: e for e in spans if e["name"].startswith("F0 ")}
    assert f0[1]["ts"] >= f0[0]["ts"] + f0[0]["dur"]


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zbv"])
def test_multi_stage_schedules_with_replicas(schedule):
    """Two stages per rank and two replicas: every rank is a thread, its passes never overlap,
    and the step's exposed all-reduce and optimizer follow the last pass."""
    cluster = planner.Cluster.preset("dgx-a100")
    plan = _first("dgx-a100", 4, lambda p: p.mode == "pipeline" and p.dp == 2,
                  modes=("pipeline",), schedules=(schedule,))
    assert plan.get("virtual_stages", 1) == 2
    t = trace.predicted_trace(plan, GRAPH, cluster)
    _check_structure(t, [trace.PREDICTED_PID], 4)
    _check_no_overlap(t, trace.PREDICTED_PID)
    assert "stages" in _names(t, "thread_name", trace.PREDICTED_PID)[0]
    spans = _spans(t, trace.PREDICTED_PID)
    predicted = planner.evaluate(GRAPH, cluster, plan)
    assert _end_us(spans) == pytest.approx(predicted["step_s"] * 1e6, abs=TOLERANCE_US)
    tail = [e for e in spans if e["tid"] == 3 and e["cat"] == "step"]
    assert [e["name"] for e in tail][:1] == ["all-reduce (exposed)"]
    assert tail[0]["ts"] == pytest.approx(predicted["compute_s"] * 1e6, abs=TOLERANCE_US)
    # replica 1 is predicted as replica 0
    assert ([(e["name"], e["ts"]) for e in spans if e["tid"] == 2]
            == [(e["name"], e["ts"]) for e in spans if e["tid"] == 0])


def test_a_data_parallel_plans_predicted_terms(tmp_path, dp_plan):
    """Without graph and cluster a placement plan is drawn from its own predicted terms."""
    t = _load(tmp_path, "dp.json", trace.predicted_trace(dp_plan))
    _check_structure(t, [trace.PREDICTED_PID], dp_plan["dp"])
    _check_no_overlap(t, trace.PREDICTED_PID)
    p = dp_plan["predicted"]
    for rank in range(dp_plan["dp"]):
        mine = sorted((e for e in _spans(t, trace.PREDICTED_PID) if e["tid"] == rank),
                      key=lambda e: e["ts"])
        assert mine[0]["name"] == "compute" and mine[0]["ts"] == 0
        assert mine[0]["dur"] == pytest.approx(p["compute_s"] * 1e6, abs=TOLERANCE_US)
        assert [e["name"] for e in mine[1:]] == [
            name for key, name in (("allreduce_s", "all-reduce (exposed)"),
                                   ("sharding_s", "sharding collectives (exposed)"),
                                   ("optimizer_s", "optimizer"), ("overhead_s", "overhead"))
            if p[key] > 0]
        for a, b in zip(mine, mine[1:]):  # consecutive
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=TOLERANCE_US)
        assert _end_us(mine) == pytest.approx(p["step_s"] * 1e6, abs=TOLERANCE_US)


def test_a_pipeline_plan_needs_the_graph_and_cluster(pipeline_plan):
    with pytest.raises(ValueError, match="pipeline plan's predicted schedule .* give the graph"):
        trace.predicted_trace(pipeline_plan)
    with pytest.raises(ValueError, match="a cluster needs the graph too"):
        trace.predicted_trace(pipeline_plan, cluster="localhost-cpu")


# ---- predicted beside measured -----------------------------------------------------------------

def _measured_pipeline(plan, cluster, offsets=(0.0, 0.0005), scale=1.25):
    """What the worker writes for a pipeline plan: per rank its last step's actions (here the
    predicted schedule stretched by `scale`), its terms, and where that step started on the
    host's clock (rank r `offsets[r]` later than rank 0)."""
    timeline = json.loads(planner._C.pipeline_timeline(GRAPH.to_json(), cluster.to_json(), None,
                                                       json.dumps(plan)))
    per_rank = []
    for rank, passes in enumerate(timeline):
        actions = [dict(a, start_s=a["start_s"] * scale, end_s=a["end_s"] * scale)
                   for a in passes]
        compute = max(a["end_s"] for a in actions)
        per_rank.append({"rank": rank, "actions": actions, "step_s": compute + 0.002,
                         "compute_s": compute, "allreduce_s": 0.0, "optimizer_s": 0.0015,
                         "overhead_s": 0.0005, "last_step_start_s": 100.0 + offsets[rank],
                         "memory_bytes": 1})
    slowest = max(per_rank, key=lambda r: r["step_s"])
    return dict({t: slowest[t] for t in validation.TERMS}, per_rank=per_rank)


def test_predicted_and_measured_pipeline_on_one_axis(tmp_path, pipeline_plan):
    cluster = planner.Cluster.preset("localhost-cpu")
    measured = _measured_pipeline(pipeline_plan, cluster)
    t = _load(tmp_path, "both.json",
              trace.comparison_trace(pipeline_plan, measured, GRAPH, cluster))
    pids = [trace.PREDICTED_PID, trace.MEASURED_PID]
    _check_structure(t, pids, 2)
    names = _names(t, "process_name")
    assert names[trace.PREDICTED_PID].startswith("predicted: ")
    assert names[trace.MEASURED_PID].startswith("measured: ")
    assert names[trace.PREDICTED_PID][len("predicted: "):] == names[trace.MEASURED_PID][
        len("measured: "):]
    _check_no_overlap(t, trace.MEASURED_PID)
    spans = _spans(t, trace.MEASURED_PID)
    # each recorded action, at its rank's start on the earliest rank's axis, in microseconds
    for rank in measured["per_rank"]:
        shift_us = (rank["last_step_start_s"] - 100.0) * 1e6
        for a in rank["actions"]:
            e = next(e for e in spans if e["tid"] == rank["rank"]
                     and e["name"] == f"{a['kind']}{a['microbatch']} s{a['stage']}")
            assert e["ts"] == pytest.approx(a["start_s"] * 1e6 + shift_us, abs=TOLERANCE_US)
            assert e["dur"] == pytest.approx((a["end_s"] - a["start_s"]) * 1e6,
                                             abs=TOLERANCE_US)
            assert e["args"]["stage"] == a["stage"]
            assert e["args"]["microbatch"] == a["microbatch"]
        # then its optimizer and overhead (medians of the timed steps), after the last action
        tail = [e for e in spans if e["tid"] == rank["rank"] and e["cat"] == "step"]
        assert [e["name"] for e in tail] == ["optimizer", "overhead"]
        last = max(a["end_s"] for a in rank["actions"]) * 1e6 + shift_us
        assert tail[0]["ts"] == pytest.approx(last, abs=TOLERANCE_US)
    assert t["otherData"]["measured_step_s"] == measured["step_s"]


def test_predicted_and_measured_data_parallel(tmp_path, dp_plan):
    measured = {"step_s": 0.06, "per_rank": [
        {"rank": r, "actions": [], "step_s": 0.06, "compute_s": 0.05, "allreduce_s": 0.004,
         "optimizer_s": 0.001, "overhead_s": 0.005, "last_step_start_s": 7.0 + r}
        for r in range(dp_plan["dp"])]}
    t = _load(tmp_path, "dp-both.json", trace.comparison_trace(dp_plan, measured))
    _check_structure(t, [trace.PREDICTED_PID, trace.MEASURED_PID], dp_plan["dp"])
    _check_no_overlap(t, trace.MEASURED_PID)
    for rank in range(dp_plan["dp"]):
        mine = [e for e in _spans(t, trace.MEASURED_PID) if e["tid"] == rank]
        assert [(e["name"], e["ts"], e["dur"]) for e in mine] == [
            ("compute", 0.0, 50000.0), ("all-reduce (exposed)", 50000.0, 4000.0),
            ("optimizer", 54000.0, 1000.0), ("overhead", 55000.0, 5000.0)]


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("per_rank"), r"measured: \$.per_rank must be a list"),
    (lambda m: m["per_rank"].pop(), r"must have every rank of the plan's 2 processes "
                                    r"\(missing rank 1\)"),
    (lambda m: m["per_rank"][1].update(rank=0), r"\$.per_rank\[1\].rank must name each rank "
                                                r"once"),
    (lambda m: m["per_rank"][1].update(rank=2), r"\$.per_rank\[1\].rank must be < 2"),
    (lambda m: m["per_rank"][0]["actions"][3].update(kind="X"),
     r"\$.per_rank\[0\].actions\[3\].kind must be one of F, B, I, W \(got 'X'\)"),
    (lambda m: m["per_rank"][0]["actions"][0].update(end_s=-1.0),
     r"\$.per_rank\[0\].actions\[0\].end_s must be >= start_s"),
    (lambda m: m["per_rank"][1]["actions"][0].update(stage=2),
     r"\$.per_rank\[1\].actions\[0\].stage must be < 2"),
    (lambda m: m["per_rank"][0].update(optimizer_s=float("nan")),
     r"\$.per_rank\[0\].optimizer_s must be a finite number"),
])
def test_bad_measurements_name_the_field(pipeline_plan, change, message):
    cluster = planner.Cluster.preset("localhost-cpu")
    measured = _measured_pipeline(pipeline_plan, cluster)
    change(measured)
    with pytest.raises(ValueError, match=message):
        trace.comparison_trace(pipeline_plan, measured, GRAPH, cluster)


def test_validate_writes_a_trace_per_plan(tmp_path, pipeline_plan, dp_plan):
    """validate's writer: one trace-<row>-<kind>.json per row, an earlier run's removed."""
    cluster = planner.Cluster.preset("localhost-cpu")
    (tmp_path / "trace-7-old-plan.json").write_text("{}")
    (tmp_path / "trace-notes.json").write_text("{}")  # not one of validate's: kept
    measured_dp = {"per_rank": [{"rank": r, "compute_s": 0.05, "step_s": 0.05}
                                for r in range(dp_plan["dp"])]}
    traces = [(trace.trace_file_name(0, pipeline_plan), pipeline_plan,
               _measured_pipeline(pipeline_plan, cluster)),
              (trace.trace_file_name(1, dp_plan), dp_plan, measured_dp)]
    validation.write_traces(tmp_path, traces, GRAPH, cluster, None)
    assert traces[0][0] == "trace-0-1x2-1f1b-M{}-b{}.json".format(
        pipeline_plan["num_microbatches"], pipeline_plan["per_replica_batch"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [traces[0][0], traces[1][0], "trace-notes.json"])
    for name, _, _ in traces:
        t = json.loads((tmp_path / name).read_text())
        assert set(_names(t, "process_name")) == {trace.PREDICTED_PID, trace.MEASURED_PID}


# ---- the command line -------------------------------------------------------------------------

def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT / "python"), os.environ.get("PYTHONPATH", "")) if p))


def test_explain_trace_from_python_and_the_cli(tmp_path, pipeline_plan, hybridplan_cli):
    plan_path = tmp_path / "plan.json"
    planner.Plan.from_dict(pipeline_plan).save(plan_path)
    args = [str(plan_path), "--graph", str(ROOT / "examples/graph-tiny.json"),
            "--cluster", "localhost-cpu"]
    text = subprocess.run([hybridplan_cli, "explain"] + args, capture_output=True, text=True,
                          check=True).stdout
    for command, out in (([sys.executable, "-m", "hybridplan", "explain"], "py.json"),
                         ([hybridplan_cli, "explain"], "cli.json")):
        done = subprocess.run(command + args + ["--trace", str(tmp_path / out)],
                              capture_output=True, text=True, env=_env(), timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout == text  # the same explanation, and the trace
        assert f"wrote {tmp_path / out}" in done.stderr
    py, cli = (json.loads((tmp_path / f).read_text()) for f in ("py.json", "cli.json"))
    assert py == cli
    _check_structure(py, [trace.PREDICTED_PID], 2)
    # a pipeline plan's trace needs its schedule simulated: bad input, exit 2, says so
    done = subprocess.run([sys.executable, "-m", "hybridplan", "explain", str(plan_path),
                           "--trace", str(tmp_path / "x.json")], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 2
    assert "--trace of a pipeline plan needs --graph and --cluster" in done.stderr
