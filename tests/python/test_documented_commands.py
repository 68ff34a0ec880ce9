"""The commands the README and the documents it links to tell people to run, each run here in a
reduced form, so that a command that stops working fails `make test` instead of its first user.

Where each documented command is proven (this file adds the ones nothing else ran):

  README "Quick start" (train.py under torchrun)   here: the README's own code, 3 steps
  examples/train_parallelize.py, python -m hybridplan run   test_parallelize.py
  make demo (examples/demo.py)          here: demo.py --quick (every step at its smallest size)
  make paper (reproductions/pal2019/reproduce.py) here: every model and every sensitivity variant on one
                                        DGX-1 (--max-devices 8), and the one-device baseline
  make bench (bench/run_all.py)         here: run_all.py --quick on the benchmarks that run in
                                        one process (the torchrun ones take ~10-30 s each here)
  C++ flow (docs/cpp.md: train_mlp --write-graph, hybridplan plan, torchrun --no-python
  train_mlp)                            here, with the documented arguments
  hybridplan plan/evaluate/explain/sweep/presets/import-pipedream, the PipeDream example
                                        tests/cpp/planner/test_cli.cc (planner_tests)
  hybridplan plan --over-run, examples/plan_over_run.py   test_plan_over_run.py
  examples/adaptive_switch.py (docs/checkpoints.md)      test_switch.py
  python -m hybridplan profile          test_profiler.py;  noise-scale: test_noise_scale.py
  calibrate / validate (torchrun -m hybridplan ...)       test_validation.py
  probe                                 test_probe.py
  pip install ., cmake --install + find_package           make test-install

None of these checks a timing: the figures a reduced run prints are not measurements.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HYBRIDPLAN_BIN_DIR", ROOT / "build" / "bin"))


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME="lo", **extra)


def _run(cmd, timeout, cwd=ROOT, **env):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(**env), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}: exit {done.returncode}\n" \
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not built (make build)")
    return path


# ---- README: Quick start -----------------------------------------------------------------------

def test_readme_quick_start_trains_under_torchrun(tmp_path):
    """The README's Quick start block, as written, saved as train.py and run with torchrun on 2
    ranks, for 3 steps instead of 100 (--standalone: a free port on a shared machine)."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"## Quick start\n.*?```python\n(.*?)```", readme, re.S)
    assert found, "README.md: no ```python block under ## Quick start"
    code = found.group(1)
    assert "range(100)" in code, "the Quick start's loop changed: update this test's step cut"
    (tmp_path / "train.py").write_text(code.replace("range(100)", "range(3)"))
    torchrun = ([shutil.which("torchrun")] if shutil.which("torchrun")
                else [sys.executable, "-m", "torch.distributed.run"])
    done = subprocess.run(torchrun + ["--standalone", "--nproc-per-node", "2", "train.py"],
                          cwd=tmp_path, env=_env(HYBRIDPLAN_CACHE_DIR=str(tmp_path / "cache")),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hybridplan: dp=" in done.stdout + done.stderr  # the plan it chose, said once


# ---- make paper ---------------------------------------------------------------------------------

def _paper():
    sys.path.insert(0, str(ROOT / "reproductions" / "pal2019"))
    try:
        import reproduce
    finally:
        sys.path.remove(str(ROOT / "reproductions" / "pal2019"))
    return reproduce


def test_make_paper_runs_every_model_and_variant(tmp_path):
    """`make paper` on one DGX-1: the same code path as the full run (every model whose inputs
    are here, every sensitivity variant, the tables, the figure), at N = 8 only."""
    out = tmp_path / "paper"
    text = _run([sys.executable, ROOT / "reproductions" / "pal2019" / "reproduce.py", "--max-devices", "8",
                 "--out", out], timeout=300)
    reproduce = _paper()
    ran = [m for m in reproduce.MODELS if f"skipping {m.name}" not in text]
    assert any(m.name == "biglstm" for m in ran)  # needs no PipeDream profile
    for m in ran:
        assert f"{m.title}: paper >=" in text
        assert (out / f"{m.name}.best_plan.json").exists()
    for name in ("results.md", "results.csv", "speedup.png", "sensitivity.md"):
        assert (out / name).stat().st_size > 0
    results = (out / "results.md").read_text()
    assert results.count("one device (the speedup baseline)") == len(ran)
    sensitivity = (out / "sensitivity.md").read_text()
    for variant in reproduce.VARIANTS:
        assert f"| {variant.name} |" in sensitivity


def test_paper_baseline_takes_the_jobs_batches_when_a_variant_fixes_one_that_does_not_fit():
    """The one-device baseline is one device at its best batch among the job's candidates, also
    under a variant that fixes the compared plans' batch at one a single device cannot hold
    (Inception-V3 at 64 on a 16 GB V100 was such a case, and stopped `make paper`)."""
    reproduce = _paper()
    biglstm = next(m for m in reproduce.MODELS if m.name == "biglstm")
    graph = biglstm.graph()
    fixed = next(v for v in reproduce.VARIANTS if v.name == "batch fixed")
    too_big = dataclasses.replace(biglstm, reference_batch=65536)  # ~120 GiB on one device
    cluster, job = reproduce.cluster_and_job(too_big, fixed)
    alone, why = reproduce.best_plan(graph, reproduce.cluster_for(cluster, 1), job, 1, "dp",
                                     fixed)
    assert alone is None and "no plan fits" in why  # the fixed batch itself does not fit
    single = reproduce.baseline(too_big, graph, fixed)
    candidates = reproduce.Job.load(reproduce.HERE / "biglstm.job.json").to_dict()
    assert single.per_replica_batch in candidates["per_replica_batch"]
    assert single.world_size == 1 and single.dp == 1 and single.mp == 1
    # the same baseline as the default variant's: one normaliser per model and cost model
    default = reproduce.baseline(biglstm, graph, reproduce.VARIANTS[0])
    assert single.per_replica_batch == default.per_replica_batch
    assert single.predicted["time_to_train_s"] == pytest.approx(
        default.predicted["time_to_train_s"])


# ---- make bench ---------------------------------------------------------------------------------

# One-process benchmarks, a second or a few each at --quick sizes. The others start torchrun
# (2 ranks) and take 10-30 s each here; their code is exercised by test_cpp_ddp.py,
# test_cpp_profile_agreement.py and the demo below, and `run_all.py --quick` runs them all.
QUICK_BENCHMARKS = ["bench_search", "bench_at_scale.py", "bench_profiler.py",
                    "bench_stage_code.py"]


def test_make_bench_quick_runs_and_reports(tmp_path):
    _need(BIN / "bench_search")
    report = tmp_path / "bench" / "results.md"
    _run([sys.executable, ROOT / "bench" / "run_all.py", "--quick", "--build-dir", BIN.parent,
          "--out", report, "--only"] + QUICK_BENCHMARKS, timeout=300)
    text = report.read_text()
    assert "--quick" in text
    for name in QUICK_BENCHMARKS:
        assert f"| {name} | ok |" in text
    assert (tmp_path / "bench" / "at_scale").is_dir()  # written beside the report, not in out/


def test_run_all_refuses_an_unknown_benchmark(tmp_path):
    done = subprocess.run([sys.executable, ROOT / "bench" / "run_all.py", "--only", "no_such",
                           "--out", tmp_path / "r.md"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "no such benchmark no_such" in done.stderr


# ---- make demo ----------------------------------------------------------------------------------

def test_make_demo_quick_runs_every_step(tmp_path, hybridplan_cli):
    """examples/demo.py --quick: profile, calibrate (torchrun), plan (the CLI), validate (the
    CLI, which launches the plan with torchrun), each at its smallest size."""
    out = tmp_path / "demo"
    text = _run([sys.executable, ROOT / "examples" / "demo.py", "--quick", "--out-dir", out],
                timeout=400, HYBRIDPLAN_CLI=hybridplan_cli)
    for step in ("== 1.", "== 2.", "== 3.", "== 4."):
        assert step in text
    for name in ("graph.json", "cluster.json", "plan.json", "validate.md", "validate.json"):
        assert (out / name).stat().st_size > 0, name


# ---- the C++ flow (docs/cpp.md) -----------------------------------------------------------------

def test_cpp_flow_with_the_documented_arguments(tmp_path, hybridplan_cli):
    """build/bin/train_mlp --write-graph mlp.json
    build/bin/hybridplan plan --graph mlp.json --cluster localhost-cpu --devices 2 --out plan.json
    torchrun --standalone --no-python --nproc-per-node 2 build/bin/train_mlp \\
        --plan plan.json --graph mlp.json --cluster localhost-cpu --steps 20"""
    train_mlp = _need(BIN / "train_mlp")
    _run([train_mlp, "--write-graph", "mlp.json"], timeout=120, cwd=tmp_path)
    _run([hybridplan_cli, "plan", "--graph", "mlp.json", "--cluster", "localhost-cpu",
          "--devices", "2", "--out", "plan.json"], timeout=120, cwd=tmp_path)
    torchrun = ([shutil.which("torchrun")] if shutil.which("torchrun")
                else [sys.executable, "-m", "torch.distributed.run"])
    text = _run(torchrun + ["--standalone", "--no-python", "--nproc-per-node", "2", train_mlp,
                            "--plan", "plan.json", "--graph", "mlp.json", "--cluster",
                            "localhost-cpu", "--steps", "20"], timeout=300, cwd=tmp_path)
    assert "rank 0 step 19" in text and "rank 1 step 19" in text


# ---- calibrate, as the quick demo runs it ------------------------------------------------------

def test_calibrate_fits_the_shard_latencies_on_the_models_own_runs():
    """_fit_shard_latencies: given the model's dp step unsharded, as zero2 and as zero3, the
    fitted gather and reduce-scatter latencies make evaluate() reproduce both measured
    differences (a unit's collectives, exactly), the bandwidths kept; and runs faster
    sharded leave the latency at zero, never negative."""
    from hybridplan.measure import calibration
    from hybridplan.planner import Cluster, Graph

    graph = calibration._tiny_graph()
    cluster = Cluster.preset("localhost-cpu").to_dict()
    for level in ("intra_node", "inter_node"):
        cluster[level]["allgather"] = {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4}
        cluster[level].pop("reduce_scatter", None)  # priced on the all-reduce link's bandwidth

    def runs(steps):
        out = []
        for kind in calibration.kShardKinds:
            plan = calibration._hand_plan("placement", 2, 1, per_replica_batch=2)
            plan["graph"]["sha256"] = Graph.from_dict(graph).sha256
            plan["assignment"] = [{"node": n["id"], "name": n["name"], "device": 0}
                                  for n in graph["nodes"]]
            if kind != "none":
                plan["sharding"] = kind
            out += [{"sharding": kind, "per_replica_batch": 2, "step_s": steps[kind],
                     "plan": plan}] * 2
        return out

    steps = {"none": 0.010, "zero2": 0.020, "zero3": 0.024}
    fit = calibration._fit_shard_latencies(graph, json.loads(json.dumps(cluster)), runs(steps))
    assert fit["allgather"]["latency_s"] > 1e-4 and fit["reduce_scatter"]["latency_s"] > 0
    predicted = fit["predicted_step_s"]
    assert predicted["zero3"] - predicted["zero2"] == pytest.approx(0.004, rel=1e-6)
    assert predicted["zero2"] - predicted["none"] == pytest.approx(0.010, rel=1e-6)
    fitted = json.loads(json.dumps(cluster))
    calibration._fit_shard_latencies(graph, fitted, runs(steps))
    assert fitted["intra_node"]["allgather"]["bandwidth_bytes_per_s"] == 1e9
    assert fitted["inter_node"]["reduce_scatter"]["latency_s"] == \
        fit["reduce_scatter"]["latency_s"]
    flat = calibration._fit_shard_latencies(graph, json.loads(json.dumps(cluster)),
                                            runs({"none": 0.05, "zero2": 0.01, "zero3": 0.005}))
    assert flat["allgather"]["latency_s"] == 0 and flat["reduce_scatter"]["latency_s"] == 0


def test_calibrate_tells_the_sharded_slowdown_from_the_latencies_at_two_batches():
    """Runs at two per-replica batches: steps the cost model itself predicts with known gather
    and reduce-scatter latencies and a known sharded compute slowdown are fitted back to those
    three values; at one batch the slowdown cannot be told from the latency and stays 0."""
    from hybridplan.measure import calibration
    from hybridplan.planner import Cluster, Graph, evaluate

    graph = calibration._tiny_graph()
    base = Cluster.preset("localhost-cpu").to_dict()
    for level in ("intra_node", "inter_node"):
        base[level]["allgather"] = {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4}
        base[level]["reduce_scatter"] = {"bandwidth_bytes_per_s": 5e8, "latency_s": 1e-4}
    truth = json.loads(json.dumps(base))
    for level in ("intra_node", "inter_node"):
        truth[level]["allgather"]["latency_s"] = 2e-3
        truth[level]["reduce_scatter"]["latency_s"] = 1e-3
    truth.setdefault("runtime", {})["sharded_compute_slowdown"] = 0.3
    runs = []
    for batch in (2, 64):
        for kind in calibration.kShardKinds:
            plan = calibration._hand_plan("placement", 2, 1, per_replica_batch=batch)
            plan["graph"]["sha256"] = Graph.from_dict(graph).sha256
            plan["assignment"] = [{"node": n["id"], "name": n["name"], "device": 0}
                                  for n in graph["nodes"]]
            if kind != "none":
                plan["sharding"] = kind
            step_s = evaluate(Graph.from_dict(graph), Cluster.from_dict(truth), plan)["step_s"]
            runs += [{"sharding": kind, "per_replica_batch": batch, "step_s": step_s,
                      "plan": plan}] * 2
    fitted = json.loads(json.dumps(base))
    fit = calibration._fit_shard_latencies(graph, fitted, runs)
    assert fit["per_replica_batches"] == [2, 64]
    assert fitted["intra_node"]["allgather"]["latency_s"] == pytest.approx(2e-3, rel=1e-6)
    assert fitted["inter_node"]["reduce_scatter"]["latency_s"] == pytest.approx(1e-3, rel=1e-6)
    assert fitted["runtime"]["sharded_compute_slowdown"] == pytest.approx(0.3, rel=1e-6)
    one = json.loads(json.dumps(base))
    fit = calibration._fit_shard_latencies(graph, one, [r for r in runs
                                                       if r["per_replica_batch"] == 64])
    assert one["runtime"]["sharded_compute_slowdown"] == 0 and "note" in \
        fit["sharded_compute_slowdown"]
    assert calibration.model_shard_batches(32) == [8, 64]
    assert calibration.model_shard_batches(2) == [1, 4]


def test_calibrate_leaves_a_sharded_collective_uncalibrated_when_no_cost_shows():
    """On a busy host with few repeats every sharded unit can time no slower than unsharded;
    there is then no bandwidth to derive, and calibrate leaves that collective to the
    all-reduce link instead of dividing by zero."""
    from hybridplan.measure import calibration

    fits = {}
    flat = [(4 << 10, 0.0), (1 << 20, 0.0), (4 << 20, 0.0)]
    assert calibration.shard_collective_link(flat, 2, fits, "allgather") is None
    assert "not calibrated" in fits["allgather"]["note"]
    rising = [(4 << 10, 1e-4), (1 << 20, 1e-3), (4 << 20, 4e-3)]
    link = calibration.shard_collective_link(rising, 2, fits, "reduce_scatter")
    assert link["bandwidth_bytes_per_s"] > 0 and link["latency_s"] >= 0


# ---- the documents' links -------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _relative_links(page: Path):
    """(line number, target) of each relative markdown link outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in _LINK.findall(line):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            yield number, target.split("#", 1)[0]


def test_every_relative_link_in_the_docs_and_records_resolves():
    """A page or record moved without its links fixed sends readers to nothing; links are
    relative to the page that holds them, as GitHub resolves them."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "benchmarks").glob("*.md"))]
    assert len(pages) > 20 and (ROOT / "benchmarks" / "README.md") in pages
    broken = [f"{page.relative_to(ROOT)}:{number}: {target}"
              for page in pages for number, target in _relative_links(page)
              if not (page.parent / target).exists()]
    assert not broken, "links to no file:\n" + "\n".join(broken)


def test_docs_hold_no_dated_records():
    """docs/ explains each subject with its current figures; dated series and logs are records
    in benchmarks/ (the docs link them), so no heading in docs/ is a date and no log lives there."""
    dated = re.compile(r"^#+ .*20\d\d-[01]\d-[0-3]\d", re.MULTILINE)
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert [p.name for p in pages if dated.search(p.read_text())] == []
    assert sorted(p.name for p in (ROOT / "docs").glob("*.log")) == []
