"""hybridplan.noise_scale (gradient_noise/noise_scale.py) and the Job it writes
(gradient_noise/noise_scale_job.py, `python -m hybridplan noise-scale`).

The reference problem is linear least squares with Gaussian label noise, whose noise scale is
known in closed form. x ~ N(0, I_d), y = w*.x + eps, eps ~ N(0, sigma^2) independent of x,
per-sample loss 0.5 (w.x - y)^2, delta = w - w*. The per-sample gradient is
    g = (w.x - y) x = (delta.x - eps) x.
True gradient: G = E[g] = E[x x^T] delta - E[eps] E[x] = delta.
Second moment: E[g g^T] = E[(delta.x)^2 x x^T] - 2 E[eps] E[(delta.x) x x^T] + E[eps^2] E[x x^T]
    = (|delta|^2 I + 2 delta delta^T) + 0 + sigma^2 I,
using Isserlis for Gaussian x: E[x_i x_j x_k x_l] delta_k delta_l
    = delta_ij |delta|^2 + 2 delta_i delta_j.
Covariance: Sigma = E[g g^T] - G G^T = (|delta|^2 + sigma^2) I + delta delta^T, so
    tr(Sigma) = |delta|^2 (d + 1) + sigma^2 d,   B_simple = tr(Sigma) / |delta|^2.
With |delta| = 1 and d = 50: B_simple = 51 + 50 sigma^2.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import hybridplan
from hybridplan import models, planner
from hybridplan.__main__ import _default_data, main as cli_main
from hybridplan.gradient_noise.noise_scale import NoiseScale, estimate_from_norms, noise_scale
from hybridplan.gradient_noise.noise_scale_job import critical_batch_job, epochs_min_from_point

ROOT = Path(__file__).resolve().parents[2]
D = 50
_g = torch.Generator().manual_seed(0)
W_STAR = torch.randn(D, generator=_g)
DELTA = torch.nn.functional.normalize(torch.randn(D, generator=_g), dim=0)   # |delta| = 1


def b_simple_exact(sigma):
    return (D + 1) + sigma ** 2 * D


def least_squares_module():
    """nn.Linear at w = w* + delta (the CLI's MODULE:FACTORY)."""
    module = nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        module.weight.copy_((W_STAR + DELTA)[None])
    return module


def least_squares_data(sigma):
    """data(batch_size, step): a fresh sample per step; the small batch is the first rows of the
    big one (as a replica's local batch is part of the global one)."""
    def data(batch_size, step):
        x = torch.randn(batch_size, D, generator=torch.Generator().manual_seed(2 * step))
        eps = torch.randn(batch_size, generator=torch.Generator().manual_seed(2 * step + 1))
        return x, x @ W_STAR + sigma * eps
    return data


quiet_labels = least_squares_data(0.0)    # B_simple = 51
noisy_labels = least_squares_data(5.0)    # B_simple = 1301


def half_squared_error(output, y):
    return 0.5 * ((output.squeeze(-1) - y) ** 2).mean()


# ---- the estimator as a pure function ----------------------------------------------------------

def test_estimate_from_norms_is_the_ratio_of_mean_estimates():
    # b = 2, B = 4. Per step: |G|^2 ~ (4 |G_B|^2 - 2 |G_b|^2) / 2,
    #                         tr(S) ~ (|G_b|^2 - |G_B|^2) / (1/2 - 1/4)
    #   step 0: |G_b|^2 = 5, |G_B|^2 = 3 -> g = (12 - 10) / 2 = 1, s = 2 / 0.25 = 8
    #   step 1: |G_b|^2 = 7, |G_B|^2 = 5 -> g = (20 - 14) / 2 = 3, s = 2 / 0.25 = 8
    # ratio of means 8 / 2 = 4 (the mean of per-step ratios, (8 + 8/3) / 2 = 5.33, is biased).
    # delta method: residuals s - 4 g = [4, -4], sample variance 32, stderr sqrt(32 / 2) / 2 = 2.
    est = estimate_from_norms(2, 4, [5, 7], [3, 5])
    assert est.g_squared_samples == (1.0, 3.0) and est.trace_sigma_samples == (8.0, 8.0)
    assert (est.g_squared, est.trace_sigma, est.b_simple) == (2.0, 8.0, 4.0)
    assert est.stderr == pytest.approx(2.0)
    assert est.g_squared_stderr == pytest.approx(1.0)     # sqrt(2 / 2)
    assert est.trace_sigma_stderr == 0.0
    assert est.steps == 2 and (est.small_batch, est.big_batch) == (2, 4)


def test_estimate_without_gradient_signal_is_infinite():
    # |G_B|^2 = |G_b|^2 / 2 at B = 2 b: pure noise, |G|^2 estimate (2*1 - 1*2) / 1 = 0.
    est = estimate_from_norms(1, 2, [2.0, 2.0], [1.0, 1.0])
    assert est.g_squared == 0.0 and math.isinf(est.b_simple) and math.isinf(est.stderr)


@pytest.mark.parametrize("args, message", [
    ((0, 4, [1, 2], [1, 2]), "small_batch must be an integer >= 1 (got 0)"),
    ((4, 4, [1, 2], [1, 2]), "big_batch must be an integer > small_batch 4 (got 4)"),
    ((2, 4, [1], [1]), "steps must be an integer >= 2 for a standard error (got 1)"),
    ((2, 4, [1, 2], [1]), "one entry per step each (got 2 and 1)"),
])
def test_estimate_from_norms_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        estimate_from_norms(*args)


# ---- measuring a module ------------------------------------------------------------------------

def test_recovers_the_closed_form_noise_scale_of_least_squares():
    # sigma = 1: tr(Sigma) = 51 + 50 = 101, |G|^2 = 1, B_simple = 101. 600 steps at b = 16,
    # B = 512 give a relative standard error of about 2.5 % (the delta method's figure matched
    # the spread of 200 repeated estimates within 10 % in trials), so 10 % is four of them.
    torch.manual_seed(0)
    exact = b_simple_exact(1.0)
    est = noise_scale(least_squares_module(), least_squares_data(1.0), half_squared_error,
                      small_batch=16, big_batch=512, steps=600)
    assert est.b_simple == pytest.approx(exact, rel=0.10)
    assert est.g_squared == pytest.approx(1.0, rel=0.10)
    assert est.trace_sigma == pytest.approx(exact, rel=0.10)
    # and each within four of its own standard errors: |G|^2 is known to ~0.8 %, so a
    # wrong coefficient in an estimator (a few %) shows even where 10 % would hide it
    assert est.stderr < 0.04 * exact
    assert abs(est.b_simple - exact) < 4 * est.stderr
    assert abs(est.g_squared - 1.0) < 4 * est.g_squared_stderr < 0.04
    assert abs(est.trace_sigma - exact) < 4 * est.trace_sigma_stderr < 0.10 * exact
    assert len(est.small_sq_norms) == len(est.big_sq_norms) == 600


class _Probe(nn.Module):
    """Linear -> BatchNorm1d -> Dropout -> Linear, with one frozen layer and mixed modes."""

    def __init__(self):
        super().__init__()
        self.fc1, self.norm = nn.Linear(4, 8), nn.BatchNorm1d(8)
        self.drop, self.fc2 = nn.Dropout(0.5), nn.Linear(8, 1)
        self.frozen = nn.Linear(1, 1)
        self.frozen.requires_grad_(False)
        self.modes_seen = []

    def forward(self, x):
        self.modes_seen.append(self.norm.training)
        return self.frozen(self.fc2(self.drop(self.norm(self.fc1(x)))))


def _probe_data(batch_size, step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch_size, 4, generator=g), torch.randn(batch_size, generator=g)


def test_leaves_weights_buffers_grads_and_modes_untouched():
    module = _Probe()
    module.eval()
    module.fc2.train()                       # mixed flags must come back as they were
    module.fc1.weight.grad = torch.full_like(module.fc1.weight, 7.0)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    flags = [m.training for m in module.modules()]
    est = noise_scale(module, _probe_data, half_squared_error, 2, 8, steps=3)
    assert math.isfinite(est.g_squared)
    assert module.modes_seen == [True] * 6   # gradients taken in training mode
    for k, v in module.state_dict().items():  # weights and BatchNorm running statistics
        assert torch.equal(v, before[k]), k
    assert [m.training for m in module.modules()] == flags
    assert torch.equal(module.fc1.weight.grad, torch.full_like(module.fc1.weight, 7.0))
    assert module.fc2.weight.grad is None and module.norm.weight.grad is None


@pytest.mark.parametrize("change, message", [
    ({"small_batch": 0}, "small_batch must be an integer >= 1 (got 0)"),
    ({"small_batch": 2.0}, "small_batch must be an integer >= 1 (got 2.0)"),
    ({"big_batch": 2}, "big_batch must be an integer > small_batch 2 (got 2)"),
    ({"big_batch": 1}, "big_batch must be an integer > small_batch 2 (got 1)"),
    ({"steps": 1}, "steps must be an integer >= 2 for a standard error (got 1)"),
    ({"module": "linear"}, "module must be a torch.nn.Module (got str)"),
    ({"module": nn.ReLU()}, "module must have a parameter that requires grad (got none)"),
    ({"data": 3}, "data must be callable (got int)"),
    ({"loss_fn": None}, "loss_fn must be callable (got NoneType)"),
    ({"loss_fn": lambda out, y: (out.squeeze(-1) - y) ** 2},
     "loss_fn must return a scalar tensor (got (2,))"),
])
def test_bad_arguments_raise_value_error_naming_them(change, message):
    args = {"module": least_squares_module(), "data": quiet_labels,
            "loss_fn": half_squared_error, "small_batch": 2, "big_batch": 8, "steps": 3}
    args.update(change)
    with pytest.raises(ValueError, match="noise_scale: " + message.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        noise_scale(**args)


def test_built_in_models_example_data_feeds_it():
    # the CLI's default data: a model's example_inputs (a tuple of two id tensors for
    # gnmt_lstm) and example_target seeded by step; the small batch is the big one's first rows
    module = models.gnmt_lstm(vocab_size=50, hidden_size=8, src_len=3, tgt_len=3)
    data = _default_data(module, "cpu")
    (src2, tgt2), y2 = data(2, step=5)
    (src8, _), y8 = data(8, step=5)
    assert torch.equal(src2, src8[:2]) and torch.equal(y2, y8[:2])
    assert not torch.equal(data(2, step=6)[0][0], src2)
    est = noise_scale(module, data, module.loss, small_batch=2, big_batch=8, steps=2)
    assert all(math.isfinite(n) and n > 0 for n in est.small_sq_norms + est.big_sq_norms)


def test_is_exported_from_the_package():
    assert hybridplan.noise_scale is noise_scale and hybridplan.NoiseScale is NoiseScale
    assert hybridplan.critical_batch_job is critical_batch_job


# ---- the Job ------------------------------------------------------------------------------------

def _estimate(b_simple):
    """A NoiseScale with B_simple exactly `b_simple`: |G|^2 = 1, tr(Sigma) = b_simple (b=1, B=2:
    |G_b|^2 = 1 + b_simple, |G_B|^2 = 1 + b_simple / 2)."""
    return estimate_from_norms(1, 2, [1 + b_simple] * 2, [1 + b_simple / 2] * 2)


def test_epochs_min_from_a_point_inverts_the_planners_convergence_model():
    # One definition of epochs(B) lives in csrc/planner/run/convergence.cc; planning at the fixed
    # global batch B = 256 must read back the E = 90 the inverse was given.
    job = critical_batch_job(_estimate(1000.0), 1281167, epochs_at=(256, 90), global_batch=256)
    assert job["convergence"]["epochs_min"] == pytest.approx(90 / (1 + 256 / 1000))
    graph = planner.Graph.load(ROOT / "examples" / "graph-tiny.json")
    best = hybridplan.plan(graph, "dgx1-v100", job, devices=8)
    assert best.global_batch == 256 and best.predicted["epochs"] == pytest.approx(90)


def test_critical_batch_job_records_provenance_and_rejects_bad_input():
    job = critical_batch_job(_estimate(500.0), 1000, epochs_min=12, per_replica_batch=32,
                             model="m:f")
    assert job["convergence"] == {"model": "critical_batch", "epochs_min": 12.0,
                                  "critical_batch": 500.0}
    record = job["noise_scale"]
    assert record["b_simple"] == 500.0 and record["epochs_min_from"] == {"given": 12.0}
    assert (record["small_batch"], record["big_batch"], record["steps"]) == (1, 2, 2)
    assert record["model"] == "m:f" and record["date"][:2] == "20"
    with pytest.raises(ValueError, match="exactly one of epochs_min and epochs_at"):
        critical_batch_job(_estimate(500.0), 1000)
    with pytest.raises(ValueError, match=r"b_simple must be finite and > 0 .*got inf"):
        critical_batch_job(estimate_from_norms(1, 2, [2.0, 2.0], [1.0, 1.0]), 1000, epochs_min=1)
    with pytest.raises(ValueError, match=r"epochs_at: epochs must be finite and > 0 \(got -1\)"):
        epochs_min_from_point(256, -1, 500.0)
    with pytest.raises(ValueError, match=r"samples_per_epoch must be >= 1 \(got 0\)"):
        critical_batch_job(_estimate(500.0), 0, epochs_min=12)


# ---- the CLI, end to end ------------------------------------------------------------------------

def _cli(tmp_path, data_name, name, *extra):
    out = tmp_path / f"{name}.json"
    argv = ["noise-scale", "test_noise_scale:least_squares_module",
            "--data", f"test_noise_scale:{data_name}",
            "--loss", "test_noise_scale:half_squared_error",
            "--small-batch", "64", "--big-batch", "4096", "--steps", "40",
            "--samples-per-epoch", "1281167", "--per-replica-batch", "32",
            "--out", str(out), *extra]
    assert cli_main(argv) == 0
    return out


def _plan_with_cli(cli, job_path):
    import subprocess
    result = subprocess.run(
        [cli, "plan", "--graph", str(ROOT / "examples" / "graph-tiny.json"),
         "--cluster", "dgx1-v100", "--devices", "8", "--job", str(job_path), "--json",
         # the one-stage-per-rank schedules the trade-off below is priced with (interleaved
         # ones shorten the 4 x 2 pipeline's step, widening its window: docs/schedules.md)
         "--schedules", "gpipe,1f1b"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)
    return plans[0] if isinstance(plans, list) else plans


def test_cli_job_matches_the_python_estimate(tmp_path):
    job = json.loads(_cli(tmp_path, "quiet_labels", "job", "--epochs-at", "256:90").read_text())
    est = noise_scale(least_squares_module(), quiet_labels, half_squared_error, 64, 4096, 40)
    assert job["convergence"]["critical_batch"] == est.b_simple
    assert job["convergence"]["epochs_min"] == pytest.approx(90 / (1 + 256 / est.b_simple))
    assert job["noise_scale"]["stderr"] == est.stderr
    assert job["noise_scale"]["epochs_min_from"] == {"global_batch": 256.0, "epochs": 90.0}
    assert job["noise_scale"]["model"] == "test_noise_scale:least_squares_module"
    assert job["per_replica_batch"] == 32 and job["optimizer"] == "sgd_momentum"


def test_cli_jobs_plan_end_to_end_and_the_plan_follows_the_critical_batch(tmp_path,
                                                                          hybridplan_cli):
    # examples/graph-tiny.json on 8 devices of dgx1-v100, 32 samples per replica, as the
    # planner prices the two contenders (step_s from its cost model):
    #   DP 8 x 1:              B = 256, step 0.0536 s (all of fwd+bwd 0.052 s, plus all-reduce)
    #   pipeline 2 x 4 (1F1B): B = 64,  step 0.0189 s
    # time_to_train ~ epochs_min (1 + B / Bc) * S / B * step_s (ceil(S / B) ~ S / B), so per
    # epochs_min * S:  DP (1/256 + 1/Bc) 0.0536,  2 x 4 (1/64 + 1/Bc) 0.0189.
    #   Bc = 51 (sigma = 0):    DP 0.00126 > 2 x 4 0.00067   -> the hybrid wins
    #   Bc = 1301 (sigma = 5):  DP 0.00025 < 2 x 4 0.00031   -> DP wins
    # (4 x 2 pipeline, B = 128, step 0.0308 s, wins in between: Bc from ~220 to ~740.) 40 steps
    # at b = 64, B = 4096 measure 42 +- 5 and 1175 +- 85: far from those edges.
    small = _cli(tmp_path, "quiet_labels", "small", "--epochs-min", "10")
    large = _cli(tmp_path, "noisy_labels", "large", "--epochs-min", "10")
    bc_small = json.loads(small.read_text())["convergence"]["critical_batch"]
    bc_large = json.loads(large.read_text())["convergence"]["critical_batch"]
    assert bc_small == pytest.approx(b_simple_exact(0.0), rel=0.25)
    assert bc_large == pytest.approx(b_simple_exact(5.0), rel=0.25)
    hybrid, dp_only = (_plan_with_cli(hybridplan_cli, small),
                       _plan_with_cli(hybridplan_cli, large))
    assert (hybrid["dp"], hybrid["mp"], hybrid["mode"]) == (2, 4, "pipeline")
    assert (dp_only["dp"], dp_only["mp"]) == (8, 1)
    assert hybrid["predicted"]["epochs"] == pytest.approx(10 * (1 + 64 / bc_small))


@pytest.mark.parametrize("argv, message", [
    (["--epochs-min", "10", "--epochs-at", "256:90"], "not allowed with argument"),
    ([], "one of the arguments --epochs-min --epochs-at is required"),
    (["--epochs-at", "256"], "must be GLOBAL_BATCH:EPOCHS, both > 0 (got '256')"),
    (["--epochs-min", "10", "--data", "test_noise_scale"], "--data must be MODULE:DATA"),
    (["--epochs-min", "-1"], "--epochs-min: must be finite and > 0 (got '-1')"),
    (["--epochs-min", "1"], "b_simple must be finite and > 0 for a critical batch (got inf;"),
])
def test_cli_bad_input_exits_2(argv, message, capsys):
    base = ["noise-scale", "test_noise_scale:least_squares_module", "--data",
            "test_noise_scale:quiet_labels", "--loss", "test_noise_scale:half_squared_error",
            "--steps", "2", "--small-batch", "2", "--big-batch", "4", "--samples-per-epoch", "100"]
    try:
        rc = cli_main(base + argv)
    except SystemExit as exc:       # argparse's own errors
        rc = exc.code
    assert rc == 2
    assert message in capsys.readouterr().err
