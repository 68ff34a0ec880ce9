"""hybridplan.plan_over_run (the C++ run_phases through _C), the over-the-run case of docs/statistical_efficiency.md
(examples/plan_over_run.py) and the switch advice of a measured critical batch
(gradient_noise.noise_scale_job.switch_advice, AppliedPlan.switch_advice)."""

import dataclasses
import importlib.util
import json
import math
import subprocess
from pathlib import Path

import pytest

import hybridplan
from hybridplan import pipedream
from hybridplan.gradient_noise.noise_scale import estimate_from_norms
from hybridplan.gradient_noise.noise_scale_job import measured_job, switch_advice

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "graph-tiny.json"


def _job(critical_batch, epochs_min=10):
    return {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": 1_000_000,
            "per_replica_batch": 32,
            "convergence": {"model": "critical_batch", "epochs_min": epochs_min,
                            "critical_batch": critical_batch}}


GROWING = _job([[0, 50], [1, 400]])     # tests/cpp/planner/test_run_phases.cc's case


# ---- the binding --------------------------------------------------------------------------------

def test_python_schedule_equals_the_cli_over_run(tmp_path, hybridplan_cli):
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(GROWING))
    result = subprocess.run(
        [hybridplan_cli, "plan", "--graph", str(TINY), "--cluster", "dgx1-v100", "--devices", "8",
         "--job", str(job_path), "--over-run", "--segments", "16", "--switch-s", "60", "--json"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    cli = json.loads(result.stdout)
    schedule = hybridplan.plan_over_run(str(TINY), "dgx1-v100", GROWING, devices=8,
                                        segments=16, switch_s=60)
    assert schedule.to_dict() == cli
    assert len(schedule.phases) == len(cli["phases"]) >= 2
    assert schedule.time_s == cli["time_s"] < schedule.best_single_time_s
    assert schedule.switches == len(schedule.phases) - 1 and schedule.switch_s == 60
    first, last = schedule.phases[0], schedule.phases[-1]
    assert (first.progress_start, last.progress_end) == (0, 1)
    assert first.plan.global_batch < last.plan.global_batch and first.plan.mp > last.plan.mp
    assert first.plan.to_dict() == cli["phases"][0]["plan"]
    assert schedule.best_single.to_dict() == cli["best_single"]


def test_default_switch_price_and_one_phase_for_a_constant_critical_batch():
    flat = hybridplan.plan_over_run(TINY, "dgx1-v100", _job(100), devices=8)
    assert len(flat.phases) == 1 and flat.switches == 0
    assert flat.time_s == pytest.approx(flat.best_single_time_s)
    # default: 30 s restart + parameters and optimizer state written and read at 1 GB/s
    assert flat.switch_s > 30


@pytest.mark.parametrize("kwargs, error, message", [
    ({"job": None}, ValueError, "plan_over_run: job must be given"),
    ({"job": {**_job(100), "convergence": {"model": "table", "points": [[32, 10], [64, 12]]}}},
     ValueError, "job: convergence.model must be critical_batch to plan over the run"),
    ({"segments": 0}, ValueError, "segments must be an integer >= 1 (got 0)"),
    ({"switch_s": -1}, ValueError, "switch_s must be finite and >= 0, or None (got -1)"),
    ({"modes": ("mesh",)}, ValueError, "modes must be a non-empty subset"),
])
def test_bad_arguments(kwargs, error, message):
    args = {"graph": TINY, "cluster": "dgx1-v100", "job": _job(100), "devices": 8, **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        hybridplan.plan_over_run(**args)


# ---- the documented case ----------------------------------------------------------------------------

def _example():
    spec = importlib.util.spec_from_file_location("plan_over_run_example",
                                                  ROOT / "examples" / "plan_over_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_case_is_multi_phase_and_beats_the_best_single_plan(tmp_path):
    if "inception_v3" not in pipedream.available():
        pytest.skip(f"no PipeDream profiles in {pipedream.profiles_dir()}: {pipedream.WHERE_FROM}")
    example = _example()
    assert example.main(["--out", str(tmp_path)]) == 0    # the documented defaults
    _, _, job, schedule = example.build_case()
    trajectory = job["convergence"]["critical_batch"]
    assert trajectory[-1][1] == 8 * trajectory[0][1]
    assert len(schedule.phases) >= 2
    assert schedule.time_s < schedule.best_single_time_s
    batches = [p.plan.global_batch for p in schedule.phases]
    assert batches == sorted(batches) and batches[0] < batches[-1]   # grows with B_crit
    assert json.loads((tmp_path / "schedule.json").read_text()) == schedule.to_dict()
    table = (tmp_path / "over_run.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and " % |" in line]
    assert len(rows) == len(schedule.phases)
    assert (tmp_path / "over_run.png").stat().st_size > 10_000


# ---- switch advice ------------------------------------------------------------------------------

def _estimate(b_simple):
    """A NoiseScale with B_simple = b_simple, stderr 0 (|G|^2 = 1; b = 1, B = 2)."""
    return estimate_from_norms(1, 2, [1 + b_simple] * 2, [1 + b_simple / 2] * 2)


def test_switch_advice_follows_the_measured_critical_batch():
    # test_noise_scale's planning case: on 8 devices DP 8 x 1 wins at a large B_crit (5000;
    # test_noise_scale's 1301 with the one-stage-per-rank schedules: a 4 x 2 interleaved
    # zero-bubble pipeline still wins at 1301, docs/schedules.md), the 2 x 4 pipeline at 51.
    running = hybridplan.plan(TINY, "dgx1-v100", _job(5000), devices=8)
    assert (running.dp, running.mp) == (8, 1)
    advice = switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", _job(5000))
    assert advice.switch and advice.critical_batch == 51.0
    assert (advice.best.dp, advice.best.mp, advice.best.mode) == (2, 4, "pipeline")
    measured = _job(51.0)
    assert advice.job["convergence"] == measured["convergence"]
    assert advice.job["noise_scale"]["b_simple"] == 51.0
    current = hybridplan.evaluate(TINY, "dgx1-v100", running, measured)["time_to_train_s"]
    best = hybridplan.plan(TINY, "dgx1-v100", measured, devices=8)
    assert advice.current_time_s == current
    assert advice.best_time_s == best.predicted["time_to_train_s"]
    assert advice.gain == pytest.approx(current / advice.best_time_s - 1) and advice.gain > 0.5
    assert "switch to dp 2 x mp 4 pipeline" in str(advice)
    assert advice.stderr == 0 and advice.gain_range == pytest.approx((advice.gain, advice.gain))
    # the same estimate, but so noisy that B_crit may as well be 5000: no switch
    noisy = dataclasses.replace(_estimate(51.0), stderr=1000.0)
    unsure = switch_advice(running, noisy, TINY, "dgx1-v100", _job(5000))
    assert unsure.gain == pytest.approx(advice.gain) and unsure.gain_range[0] == -math.inf
    assert not unsure.switch and "keep the running plan" in str(unsure)
    # a moderate stderr: the 2 x 4 pipeline still wins across B_crit 51 -+ 2 stderr
    sure = switch_advice(running, dataclasses.replace(_estimate(51.0), stderr=5.0), TINY,
                         "dgx1-v100", _job(5000))
    assert sure.switch
    assert sure.gain_range[0] < sure.gain < sure.gain_range[1]
    # measured where it was planned: keep it
    keep = switch_advice(running, _estimate(5000.0), TINY, "dgx1-v100", _job(5000))
    assert not keep.switch and keep.gain == pytest.approx(0, abs=1e-12)
    assert "keep the running plan" in str(keep)


def test_switch_advice_for_a_table_job_and_bad_jobs():
    table = {**_job(100), "convergence": {"model": "table", "points": [[64, 12], [256, 20]]}}
    running = hybridplan.plan(TINY, "dgx1-v100", table, devices=8)
    advice = switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", table)
    # epochs_min follows from the running plan's point of the table: E(B) = e (1 + B / 51)
    epochs = hybridplan.evaluate(TINY, "dgx1-v100", running, table)["epochs"]
    assert advice.job["convergence"]["epochs_min"] == pytest.approx(
        epochs / (1 + running.global_batch / 51.0))
    assert advice.current["epochs"] == pytest.approx(epochs)   # the running plan's point holds
    no_model = {k: v for k, v in _job(100).items() if k != "convergence"}
    with pytest.raises(ValueError, match="job: convergence must be given for switch advice"):
        switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", no_model)
    with pytest.raises(ValueError, match=r"min_gain must be finite and >= 0 \(got -1\)"):
        switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", table, min_gain=-1)
    with pytest.raises(ValueError, match="b_simple must be finite and > 0"):
        measured_job(_job(100), estimate_from_norms(1, 2, [2.0, 2.0], [1.0, 1.0]))


def test_applied_plan_switch_advice_uses_its_plan_and_estimate():
    running = hybridplan.plan(TINY, "dgx1-v100", _job(1301), devices=8)

    class _Meter:
        def estimate(self):
            return _estimate(51.0)

    class _Stub(hybridplan.AppliedPlan):
        def __init__(self, meter):
            self._noise, self.plan = meter, running

    advice = _Stub(_Meter()).switch_advice(TINY, "dgx1-v100", _job(1301))
    assert advice.switch and (advice.best.dp, advice.best.mp) == (2, 4)

    class _Nothing:
        def estimate(self):
            return None
    assert _Stub(_Nothing()).switch_advice(TINY, "dgx1-v100", _job(1301)) is None
