"""The gradient noise scale measured online by the executor (executor/noise.py,
apply(..., measure_noise_scale=N), AppliedPlan.noise_scale()) and the advice it feeds
(gradient_noise.noise_scale_job.switch_advice).

The reference problem is test_noise_scale's linear least squares with Gaussian label noise at
sigma = 1, whose B_simple = tr(Sigma) / |G|^2 = 101 exactly (derivation there). With dp = 2 the
online estimator's batches are b and 2b; at b = 128 and 400 steps its relative standard error
is about 2 % (simulated: 1.0-2.6 % for 300-1000 steps at b = 64-128), so 10 % is five of them.
The learning rate is 0 where an estimate is compared with a closed form or with the offline
estimator, so every step measures the same weights.
"""

import json
import math
import os

import pytest
import torch
from torch import nn

import hybridplan
from dist_harness import format_results, run_ranks
from hybridplan import models
from hybridplan.executor import noise
from hybridplan.gradient_noise.noise_scale import estimate_from_norms, noise_scale
from plan_builders import pipeline_plan, placement_plan
from test_noise_scale import (b_simple_exact, half_squared_error, least_squares_data,
                              least_squares_module)

LS_BATCH, LS_STEPS = 128, 400          # per replica; global batch 256
GNMT_KWARGS = {"vocab_size": 64, "hidden_size": 16, "src_len": 5, "tgt_len": 5}
GNMT_BATCH, GNMT_STEPS = 64, 100


# ---- the weighted estimator (the offline math with EMA weights) ------------------------------

def test_equal_weights_are_the_offline_estimate():
    small, big = [5.0, 7.0, 6.5, 9.0], [3.0, 5.0, 3.5, 4.0]
    plain = estimate_from_norms(2, 4, small, big)
    weighted = estimate_from_norms(2, 4, small, big, weights=[3.0] * 4)
    for field in ("g_squared", "trace_sigma", "b_simple", "stderr", "g_squared_stderr",
                  "trace_sigma_stderr", "effective_steps"):
        assert getattr(weighted, field) == pytest.approx(getattr(plain, field), rel=1e-12), field
    assert plain.effective_steps == 4


def test_decaying_weights_are_separate_moving_averages():
    # b = 2, B = 4 (as test_estimate_from_norms_is_the_ratio_of_mean_estimates):
    #   step 0: g = 1, s = 8;  step 1: g = 3, s = 8;  step 2: |G_b|^2 = 9, |G_B|^2 = 5 -> g = 1,
    #   s = 16. Weights 0.25, 0.5, 1 (decay 0.5), normalised /1.75:
    #   g = (0.25 + 1.5 + 1) / 1.75 = 11/7, s = (2 + 4 + 16) / 1.75 = 88/7, ratio 8.
    est = estimate_from_norms(2, 4, [5, 7, 9], [3, 5, 5], weights=[0.25, 0.5, 1.0])
    assert est.g_squared == pytest.approx(11 / 7) and est.trace_sigma == pytest.approx(88 / 7)
    assert est.b_simple == pytest.approx(8.0)
    # the mean of per-step ratios (8, 8/3, 16) weighted alike would be 10.1: not what we report
    w = [0.25 / 1.75, 0.5 / 1.75, 1 / 1.75]
    assert est.effective_steps == pytest.approx(1 / sum(x * x for x in w))
    # delta method with reliability weights: residuals s - 8 g = [0, -16, 8]
    r = [0.0, -16.0, 8.0]
    m = sum(wi * ri for wi, ri in zip(w, r))
    w2 = sum(x * x for x in w)
    var = w2 * sum(wi * (ri - m) ** 2 for wi, ri in zip(w, r)) / (1 - w2)
    assert est.stderr == pytest.approx(math.sqrt(var) / (11 / 7))


@pytest.mark.parametrize("weights, message", [
    ([1.0, 1.0], "weights must have one entry per step (got 2 for 3 steps)"),
    ([1.0, -1.0, 1.0], "weights must be finite, >= 0 and not all 0"),
    ([0.0, 0.0, 0.0], "weights must be finite, >= 0 and not all 0"),
    ([0.0, 0.0, 1.0], "at least two steps a weight > 0"),
])
def test_bad_weights(weights, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        estimate_from_norms(2, 4, [5, 7, 9], [3, 5, 5], weights=weights)


@pytest.mark.parametrize("every, decay, dp, message", [
    (-1, 0.99, 2, "measure_noise_scale must be an integer >= 0"),
    (1.5, 0.99, 2, "measure_noise_scale must be an integer >= 0"),
    (1, 0.0, 2, "noise_scale_decay must be in (0, 1] (got 0.0)"),
    (1, 1.5, 2, "noise_scale_decay must be in (0, 1] (got 1.5)"),
    (1, 0.99, 1, "plan.json: measure_noise_scale needs dp >= 2"),
])
def test_bad_options(every, decay, dp, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        noise.check_options(every, decay, dp, "plan.json")
    noise.check_options(0, 0.99, 1, "plan.json")   # off: any dp


# ---- rank side (runs in the processes dist_harness starts) ------------------------------------

def _sequential_least_squares():
    return nn.Sequential(least_squares_module())    # a graph node "0" to place


def _gnmt():
    return models.gnmt_lstm(seed=0, **GNMT_KWARGS)


def _gnmt_data(batch_size, step):
    """The offline estimator's data(batch_size, step); the online run shards data(2 b, step)."""
    model = _gnmt()
    return model.example_inputs(batch_size, seed=1000 + step), \
        model.example_target(batch_size, seed=5000 + step)


def _write(out_dir, name, hp, extra=None):
    est = hp.noise_scale()
    record = {"rank": hp.rank, "b_simple": est.b_simple, "stderr": est.stderr,
              "g_squared": est.g_squared, "trace_sigma": est.trace_sigma,
              "small_batch": est.small_batch, "big_batch": est.big_batch,
              "effective_steps": est.effective_steps, "measured": hp._noise.measured}
    record.update(extra or {})
    with open(os.path.join(out_dir, f"{name}-{hp.rank}.json"), "w") as f:
        json.dump(record, f)


def least_squares_rank(out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    module = _sequential_least_squares()
    plan = placement_plan(module, dp=2, mp=1, per_replica_batch=LS_BATCH)
    hp = hybridplan.apply(plan, module, loss_fn=half_squared_error, timeout_s=60,
                          optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
                          measure_noise_scale=1, noise_scale_decay=1.0)
    assert hp.noise_scale() is None                  # nothing measured yet
    data = least_squares_data(1.0)
    for step in range(LS_STEPS):
        hp.step(*hp.shard(*data(2 * LS_BATCH, step)))
    _write(out_dir, "ls", hp)
    # The hook leaves training as it was: 3 SGD steps with and without measuring.
    states = []
    for every in (1, 0):
        m = _sequential_least_squares()
        h = hybridplan.apply(plan, m, loss_fn=half_squared_error, timeout_s=60,
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                             measure_noise_scale=every)
        for step in range(3):
            h.step(*h.shard(*data(2 * LS_BATCH, step)))
        states.append(h.state_dict())
    assert torch.equal(states[0]["0.weight"], states[1]["0.weight"])
    assert not torch.equal(states[0]["0.weight"], module.state_dict()["0.weight"])
    dist.destroy_process_group()


def gnmt_rank(out_dir: str, mode: str, steps: int, every: int) -> None:
    import torch.distributed  # noqa: F401  (destroy_process_group below)

    torch.set_num_threads(1)
    module = _gnmt()
    if mode == "placement":
        plan = placement_plan(module, dp=2, mp=1, per_replica_batch=GNMT_BATCH)
        extra = {}
    else:
        example = module.example_inputs(GNMT_BATCH)
        plan = pipeline_plan(module, dp=2, mp=2, schedule="1f1b", num_microbatches=2,
                             per_replica_batch=GNMT_BATCH, example_inputs=example)
        extra = {"example_inputs": example}
    hp = hybridplan.apply(plan, module, timeout_s=120,
                          optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
                          measure_noise_scale=every, noise_scale_decay=1.0, **extra)
    for step in range(steps):
        inputs, target = _gnmt_data(2 * GNMT_BATCH, step)
        hp.step(*hp.shard(inputs, target))
    _write(out_dir, f"gnmt-{mode}-{steps}", hp)
    hp.state_dict()   # waits for the last stage's loss broadcast (as every executor test ends)
    torch.distributed.destroy_process_group()


def _records(tmp_path, name, n):
    return [json.loads((tmp_path / f"{name}-{r}.json").read_text()) for r in range(n)]


# ---- the tests --------------------------------------------------------------------------------

def test_online_estimate_recovers_the_closed_form_noise_scale(tmp_path):
    results = run_ranks("test_noise_online:least_squares_rank", 2, {"out_dir": str(tmp_path)},
                        timeout_s=240)
    assert all(r.returncode == 0 for r in results), format_results(results)
    r0, r1 = _records(tmp_path, "ls", 2)
    assert r0 == {**r1, "rank": 0}                   # every rank holds the same estimate
    exact = b_simple_exact(1.0)
    assert (r0["small_batch"], r0["big_batch"], r0["measured"]) == (LS_BATCH, 2 * LS_BATCH,
                                                                    LS_STEPS)
    assert r0["b_simple"] == pytest.approx(exact, rel=0.10)
    assert r0["g_squared"] == pytest.approx(1.0, rel=0.10)      # |delta|^2
    assert r0["trace_sigma"] == pytest.approx(exact, rel=0.10)
    assert r0["stderr"] < 0.04 * exact and abs(r0["b_simple"] - exact) < 4 * r0["stderr"]


def test_online_and_offline_agree_on_a_built_in_model(tmp_path):
    # gnmt_lstm (small) at its initial weights: the offline estimator at b = 64, B = 128 over
    # the same data stream (its B_simple is a few hundred); the online one on 2 replicas of 64.
    results = run_ranks("test_noise_online:gnmt_rank", 2,
                        {"out_dir": str(tmp_path), "mode": "placement", "steps": GNMT_STEPS,
                         "every": 1},
                        timeout_s=240)
    assert all(r.returncode == 0 for r in results), format_results(results)
    online = _records(tmp_path, f"gnmt-placement-{GNMT_STEPS}", 2)[0]
    module = _gnmt()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)    # as the ranks run: OpenMP threads on 2 shared cores cost 5x
    try:
        offline = noise_scale(module, _gnmt_data, module.loss, GNMT_BATCH, 2 * GNMT_BATCH,
                              steps=GNMT_STEPS)
    finally:
        torch.set_num_threads(threads)
    assert online["measured"] == GNMT_STEPS
    combined = math.hypot(online["stderr"], offline.stderr)
    assert math.isfinite(combined) and combined < 0.5 * offline.b_simple   # resolved at all
    assert abs(online["b_simple"] - offline.b_simple) < 3 * combined


def test_pipeline_replicas_sum_their_stages(tmp_path):
    # The same weights and batches under placement (dp 2) and a 2-stage pipeline (dp 2 x mp 2,
    # 2 micro-batches): the same gradients, so the same estimate up to float reassociation.
    for mode, world in (("placement", 2), ("pipeline", 4)):
        results = run_ranks("test_noise_online:gnmt_rank", world,
                            {"out_dir": str(tmp_path), "mode": mode, "steps": 20, "every": 2},
                            timeout_s=240)
        assert all(r.returncode == 0 for r in results), format_results(results)
    placement = _records(tmp_path, "gnmt-placement-20", 2)[0]
    pipeline = _records(tmp_path, "gnmt-pipeline-20", 4)
    for r in pipeline:          # every stage of every replica holds the replica-wide figures
        assert (r["b_simple"], r["stderr"]) == (pipeline[0]["b_simple"], pipeline[0]["stderr"])
    assert pipeline[0]["measured"] == placement["measured"] == 10
    for field in ("g_squared", "trace_sigma", "b_simple", "stderr"):
        assert pipeline[0][field] == pytest.approx(placement[field], rel=1e-4), field


def test_noise_scale_needs_measuring_switched_on():
    class _Stub(hybridplan.AppliedPlan):
        def __init__(self):
            self._noise = None
    with pytest.raises(ValueError, match=r"noise_scale\(\) needs apply\(\.\.\., "
                                         r"measure_noise_scale=N\)"):
        _Stub().noise_scale()
