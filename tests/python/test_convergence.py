"""The batch-size trade-off measured directly (hybridplan.convergence) and time to target under
plans (hybridplan.measure.time_to_target), in reduced form: the data stream, the evaluation
schedule and the learning-rate rule; the fit against known curves; the fitted Job read back
through the planner's own convergence model; real training to a target on scikit-learn's digits;
and plans trained to the target with torchrun, whose steps must equal the one-process runs'."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hybridplan
from hybridplan import convergence as cv
from hybridplan import planner
from hybridplan.gradient_noise.noise_scale_job import trajectory_job

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "digits-task.json"


# ---- definitions ------------------------------------------------------------------------------

def test_sample_stream_is_one_permutation_per_epoch_and_independent_of_chunking():
    n = 10
    first = cv.sample_indices(n, seed=3, start=0, count=25)
    assert sorted(first[:10].tolist()) == list(range(10))
    assert sorted(first[10:20].tolist()) == list(range(10))
    assert not torch.equal(first[:10], first[10:20])  # a fresh order per epoch
    chunks = torch.cat([cv.sample_indices(n, 3, s, 5) for s in range(0, 25, 5)])
    assert torch.equal(first, chunks)
    assert not torch.equal(first, cv.sample_indices(n, seed=4, start=0, count=25))


def test_eval_schedule_resolves_steps_to_one_percent():
    evals, last = [], 0
    for step in range(1, 2001):
        if cv.eval_due(step, last):
            evals.append(step)
            last = step
    assert evals[:100] == list(range(1, 101))
    gaps = [(b - a) / a for a, b in zip(evals, evals[1:]) if a >= 100]
    assert max(gaps) <= 0.0101
    assert len(evals) < 2000 / 3


def test_lr_rule_scales_and_warms_up():
    assert cv.LrRule(0.1, 32, "linear").lr(64, 10**6) == pytest.approx(0.2)
    assert cv.LrRule(0.1, 32, "sqrt").lr(128, 10**6) == pytest.approx(0.2)
    assert cv.LrRule(0.1, 32, "none").lr(128, 10**6) == pytest.approx(0.1)
    warm = cv.LrRule(0.1, 32, "none", warmup_samples=100)
    assert warm.lr(10, 0) == pytest.approx(0.01)
    assert warm.lr(10, 90) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="scaling must be one of"):
        cv.LrRule(0.1, 32, "cubic")
    with pytest.raises(ValueError, match="base_lr must be a finite number > 0"):
        cv.LrRule(0.0, 32)


# ---- the fit ----------------------------------------------------------------------------------

def _runs(s_min, e_min, batches, noise=(1.0,)):
    return [cv.Run(b, seed, True, max(1, round((s_min + e_min / b) * f)), 0, 0.0, [])
            for b in batches for seed, f in enumerate(noise)]


def test_fit_recovers_a_known_curve():
    fit = cv.fit_critical_batch(_runs(40, 8000, [8, 16, 32, 64, 128, 256, 512, 1024]))
    assert fit.s_min == pytest.approx(40, rel=0.02)
    assert fit.e_min == pytest.approx(8000, rel=0.02)
    assert fit.critical_batch == pytest.approx(200, rel=0.04)
    assert max(abs(r) for r in fit.residuals) < 0.01


def test_fit_bootstrap_interval_covers_the_truth_with_seed_noise():
    fit = cv.fit_critical_batch(_runs(30, 6000, [8, 32, 128, 512], noise=(0.85, 1.0, 1.15)))
    lo, hi = fit.critical_batch_90
    assert lo <= 200 <= hi
    assert fit.critical_batch_68[0] >= lo and fit.critical_batch_68[1] <= hi


def test_fit_without_a_floor_is_a_table_job():
    fit = cv.fit_critical_batch(_runs(-2, 6400, [8, 16, 32, 64]))  # better than perfect scaling
    assert fit.s_min == 0 and math.isinf(fit.critical_batch)
    job = cv.convergence_job(fit, samples_per_epoch=1000)
    assert job["convergence"]["model"] == "table"
    planner.Job.from_dict(job)
    json.dumps(cv.convergence_job(fit, 1000))  # no infinity in the JSON


def test_fit_needs_two_reached_batches():
    runs = _runs(30, 6000, [8]) + [cv.Run(64, 0, False, 999, 0, 0.0, [])]
    with pytest.raises(ValueError, match=r"two or more batches must reach the target"):
        cv.fit_critical_batch(runs)


def test_the_fitted_job_predicts_the_fitted_steps_through_the_planner():
    """The fit's S(B) and the planner's epochs(B) * samples_per_epoch / B are one model
    (convergence.h): the Job the fit writes gives back the fitted steps at every batch."""
    fit = cv.fit_critical_batch(_runs(25, 3000, [8, 32, 128, 512], noise=(0.9, 1.1)))
    job = cv.convergence_job(fit, samples_per_epoch=1437, per_replica_batch=[8, 16])
    planner.Job.from_dict(job)
    for b in (8, 24, 100, 512, 4096):
        assert cv.predicted_steps(job, b, 1437) == pytest.approx(fit.steps(b), rel=1e-9)


def test_trajectory_job_passes_through_the_measured_point():
    job = trajectory_job([(0.0, 240.0), (0.4, 60.0), (1.0, 150.0)], (8, 1.75), 1437)
    planner.Job.from_dict(job)
    assert planner.epochs_to_target(job, 8) == pytest.approx(1.75)
    assert planner.epochs_to_target(job, 512) > planner.epochs_to_target(job, 64) > 1.75
    assert trajectory_job([(0.0, float("nan"))], (8, 1.0), 100) is None


# ---- the task ---------------------------------------------------------------------------------

def test_task_from_spec_names_the_file_and_field():
    spec = json.loads(TASK.read_text())
    task = cv.task_from_spec(spec, "digits-task.json")
    assert task.target.kind == "loss" and task.lr_rule.scaling == "sqrt"
    for bad, message in ((dict(spec, colour="red"), "colour is not a task field"),
                         ({k: v for k, v in spec.items() if k != "target"}, "target is required"),
                         (dict(spec, optimizer="lion"), "optimizer must be one of"),
                         (dict(spec, lr_rule={"base_lr": 1}), "base_batch"),
                         (dict(spec, target={"kind": "f1", "value": 1}), "kind must be"),
                         (dict(spec, model="nowhere:thing"), "cannot import")):
        with pytest.raises(ValueError, match=message) as e:
            cv.task_from_spec(bad, "digits-task.json")
        assert str(e.value).startswith("digits-task.json")


def _quick_task(target=0.35):
    spec = dict(json.loads(TASK.read_text()), target={"kind": "loss", "value": target})
    return cv.task_from_spec(spec)


def test_digits_train_to_target_more_epochs_and_fewer_steps_at_a_bigger_batch():
    task = _quick_task()
    small, _ = cv.train_to_target(task, 16, seed=0)
    big, _ = cv.train_to_target(task, 256, seed=0)
    assert small.reached and big.reached
    assert big.steps < small.steps and big.epochs > small.epochs
    assert small.curve[-1][1] <= 0.35 < small.curve[-2][1]
    again, _ = cv.train_to_target(task, 16, seed=0)
    assert again.steps == small.steps  # deterministic


def test_branch_from_a_checkpoint_the_executor_wrote(tmp_path):
    """load_start reads the executor's consolidated checkpoint: model, optimizer state by name,
    data position; a branch continues from it to the target."""
    from hybridplan.executor import checkpoint

    task = _quick_task()
    _, state = cv.train_to_target(task, 32, seed=0, stop=cv.Target("loss", 1.0))
    module = task.model(0)
    module.load_state_dict(state["model"])
    optimizer = task.optimizer(module.parameters(), 0.001)
    optimizer.load_state_dict(state["optimizer"])
    names = {id(p): n for n, p in module.named_parameters()}
    plan = {"global_batch": 32}
    ckpt = checkpoint.build(module.state_dict(), checkpoint.optimizer_state_by_name(
        optimizer, names), state["samples"] // 32, json.dumps(plan), "0" * 64)
    checkpoint.write_atomic(ckpt, str(tmp_path / "c.pt"))
    start = cv.load_start(str(tmp_path / "c.pt"), task)
    assert start["samples"] == state["samples"]
    sweep = cv.branched(task, [16, 128], [0], start=start)
    assert all(r.reached and r.start_samples == state["samples"] for r in sweep.runs)


def test_convergence_command_writes_a_job_the_planner_reads(tmp_path):
    spec = dict(json.loads(TASK.read_text()), target={"kind": "loss", "value": 0.35})
    (tmp_path / "task.json").write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "hybridplan", "convergence", "--task", str(tmp_path / "task.json"),
         "--batches", "16,64,256", "--seeds", "0", "--noise", "8,64,4",
         "--per-replica-batch", "8,32", "--out-dir", str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "convergence.json").read_text())
    assert [r["global_batch"] for r in record["sweep"]["runs"]] == [16, 64, 256]
    assert len(record["noise_scale"]) == 3
    job = planner.Job.load(tmp_path / "out" / "job.json")
    assert json.loads(job.to_json())["per_replica_batch"] == [8, 32]
    for f in ("convergence.md", "tradeoff.png"):
        assert (tmp_path / "out" / f).stat().st_size > 0
    bad = subprocess.run([sys.executable, "-m", "hybridplan", "convergence", "--task",
                          str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "missing.json: cannot read the task" in bad.stderr
    # --refit fits the record's runs again without training: the same fit, files rewritten
    refit = subprocess.run(
        [sys.executable, "-m", "hybridplan", "convergence", "--refit",
         str(tmp_path / "out" / "convergence.json"), "--out-dir", str(tmp_path / "again")],
        capture_output=True, text=True, timeout=120)
    assert refit.returncode == 0, refit.stderr[-2000:]
    again = json.loads((tmp_path / "again" / "convergence.json").read_text())
    assert again["fit"]["critical_batch"] == pytest.approx(record["fit"]["critical_batch"])
    assert again["sweep"] == record["sweep"]
    tta = subprocess.run(
        [sys.executable, "-m", "hybridplan", "validate", "--time-to-target", "--graph", "g.json",
         "--cluster", "localhost-cpu", "--task", str(tmp_path / "task.json"), "--job",
         str(tmp_path / "task.json")], capture_output=True, text=True, timeout=120)
    assert tta.returncode == 2 and "convergence is required for --time-to-target" in tta.stderr


# ---- time to target under plans ---------------------------------------------------------------

def test_plans_trained_to_the_target_take_the_one_process_steps(tmp_path):
    """Two plans (the planner's pick and the throughput-optimal one) trained to the target with
    torchrun on 2 ranks: each reaches it in exactly the steps the one-process run at its global
    batch takes (same samples, same order, training equal to one process), and the prediction
    is the plan's step time times the fitted steps."""
    task = _quick_task()
    spec = dict(json.loads(TASK.read_text()), target={"kind": "loss", "value": 0.35})
    (tmp_path / "task.json").write_text(json.dumps(spec))
    runs = []
    for b in (16, 64, 256):
        run, _ = cv.train_to_target(task, b, seed=0)
        runs.append(run)
    fit = cv.fit_critical_batch(runs, resamples=10)
    job = cv.convergence_job(fit, task.data.num_train, per_replica_batch=[8, 32, 128])
    from hybridplan import models
    from hybridplan.measure import time_to_target

    module = models.digits_cnn(0)
    torch.set_num_threads(1)
    graph = hybridplan.profile(module, module.example_inputs(32), verbose=False, clock="thread",
                               loss_fn=module.loss, target=module.example_target(32))
    result = time_to_target.validate_time_to_target(
        graph, "localhost-cpu", str(tmp_path / "task.json"), job, devices=2, seeds=[0],
        out_dir=str(tmp_path / "tta"), max_plans=2, progress=lambda line: None,
        one_process={"sweep": {"runs": [r.to_dict() for r in runs]}})
    assert 1 <= len(result["rows"]) <= 2
    for row in result["rows"]:
        assert row["reached"] == [True]
        one, _ = cv.train_to_target(task, row["global_batch"], seed=0)
        assert row["measured_steps"] == [one.steps]
        assert row["predicted_s"] == pytest.approx(
            row["predicted_step_s"] * fit.steps(row["global_batch"]), rel=1e-6)
        assert row["measured_s"] > 0
    assert (tmp_path / "tta" / "time_to_target.md").read_text().count("\n| ") >= 2
