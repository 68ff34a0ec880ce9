"""Plan switches inside a running job (AppliedPlan.switch) and the adaptive mode
(apply(..., adapt=hybridplan.Adapt(...))): executor/switching.py, docs/checkpoints.md.

Each test launches 2 Gloo ranks (dist_harness). A switched run must equal one process trained
on the same global batches (SGD with momentum; rtol 1e-5 / atol 1e-6 absorb float
reassociation, as test_checkpoint's resume-equality does; 1e-4 / 1e-5 over the adaptive
run's 12 steps): DP -> pipeline -> DP with the
global batch changing at each switch, a sharded plan left for DP on a fresh module, and the
adaptive mode switching back and forth on an injected advice. A switch that does not fit is
refused on every rank and the old plan trains on.
"""

import json
import os
import sys
import weakref

import pytest
import torch

from dist_harness import REPO, format_results, run_commands, run_ranks
from plan_builders import pipeline_plan, placement_plan
from test_checkpoint import as_call, make, optimizer

TOL = dict(rtol=1e-5, atol=1e-6)
# 12 steps, 7 of them at a switched batch: DDP's float reassociation accumulates further (the
# switched run is bitwise the run of one DDP plan fed the same batches)
LONG_TOL = dict(rtol=1e-4, atol=1e-5)
MODEL = "branchy_cnn"


def _plans(model):
    """The plans the tests switch between (hand-written: no profiling)."""
    return {
        "dp8": placement_plan(model, dp=2, mp=1, per_replica_batch=4),      # global batch 8
        "dp16": placement_plan(model, dp=2, mp=1, per_replica_batch=8),     # 16
        "pipe16": pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=2,
                                per_replica_batch=16),                      # 16
        "zero2": dict(placement_plan(model, dp=2, mp=1, per_replica_batch=4), sharding="zero2"),
        "dp4x1": placement_plan(model, dp=4, mp=1, per_replica_batch=2),    # 4 processes
    }


def _train(hp, batch, step, batches):
    """One step at hp.plan's global batch; appends it to `batches`."""
    inputs, target = batch(hp.plan.global_batch, step)
    batches.append(hp.plan.global_batch)
    return hp.step(*hp.shard(inputs, target))


def _save(out_dir, name, hp, batches, **extra):
    import torch.distributed as dist
    rank = dist.get_rank()
    torch.save({"state": hp.state_dict(), "batches": batches, "step_count": hp.step_count,
                "switches": hp.switches, **extra},
               os.path.join(out_dir, f"{name}.rank{rank}.pt"))


# ---- rank side --------------------------------------------------------------------------------

def switch_rank(out_dir):
    """DP (batch 8) -> pipeline (16, example derived from the last step) -> DP (8)."""
    import torch.distributed as dist
    import hybridplan
    torch.set_num_threads(1)
    model, batch, loss_fn = make(MODEL)
    plans = _plans(model)
    hp = hybridplan.apply(plans["dp8"], model, loss_fn=loss_fn,
                          optimizer=optimizer("sgd", MODEL), timeout_s=30)
    first_ddp, default_group = weakref.ref(hp.ddp), dist.group.WORLD
    batches, step = [], 0
    for _ in range(2):
        _train(hp, batch, step, batches)
        step += 1
    same = hp.switch(plans["pipe16"])  # no example_inputs: rank 0's last inputs, resized
    assert same is hp and hp.plan.mode == "pipeline" and hp.step_count == 2
    assert first_ddp() is None, "the old plan's DDP wrapper (and its reducer) must be gone"
    assert dist.is_initialized() and dist.group.WORLD is default_group
    for _ in range(2):
        _train(hp, batch, step, batches)
        step += 1
    hp.switch(plans["dp8"])  # the same module wrapped by a new DDP
    for _ in range(2):
        _train(hp, batch, step, batches)
        step += 1
    _save(out_dir, "switch", hp, batches)
    rank = dist.get_rank()
    hp.close()
    with open(os.path.join(out_dir, f"closed.rank{rank}.txt"), "w") as f:
        f.write(str(dist.is_initialized()))  # apply created the default group: close() ends it


def refuse_rank(out_dir):
    """Switches that must be refused on every rank, the old plan training on; then a sharded
    plan, which needs a fresh module, left for DP."""
    import torch.distributed as dist
    import hybridplan
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    model, batch, loss_fn = make(MODEL)
    plans = _plans(model)
    messages = {}
    batches, step = [], 0
    hp = hybridplan.apply(plans["dp8"], model, loss_fn=loss_fn,
                          optimizer=optimizer("sgd", MODEL), timeout_s=30)
    _train(hp, batch, step, batches)
    step += 1
    for name, call in [
            ("world", lambda: hp.switch(plans["dp4x1"])),
            ("optimizer", lambda: hp.switch(
                plans["dp16"], optimizer=torch.optim.SGD(model.parameters(), lr=0.1))),
            ("unknown", lambda: hp.switch(plans["dp16"], resume_from="x.pt"))]:
        try:
            call()
            messages[name] = "accepted"
        except (ValueError, TypeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
        _train(hp, batch, step, batches)  # the old plan trains on
        step += 1
    # a caller holding the old DDP wrapper: its reducer would fire in the new plan's backward,
    # so the switch stops after closing the old plan; the state comes with the error
    kept = hp.ddp
    try:
        hp.switch(plans["dp8"])
        messages["kept_ddp"] = "accepted"
    except RuntimeError as e:
        messages["kept_ddp"] = f"{e} | {e.__notes__}"
        state = e.hybridplan_state
    messages["closed"] = str(hp._closed)
    del kept
    hp = hybridplan.apply(plans["dp8"], model, loss_fn=loss_fn,
                          optimizer=optimizer("sgd", MODEL), timeout_s=30, resume_from=state)
    _train(hp, batch, step, batches)
    step += 1
    _save(out_dir, "refuse", hp, batches, messages=messages)
    hp.close()

    # a sharded plan: the module is FSDP's for good; switch needs module= (a fresh one)
    model, batch, loss_fn = make(MODEL)
    hp = hybridplan.apply(plans["zero2"], model, loss_fn=loss_fn,
                          optimizer=optimizer("sgd", MODEL), timeout_s=30)
    batches, step = [], 0
    _train(hp, batch, step, batches)
    step += 1
    try:
        hp.switch(plans["dp16"])
        messages = {"sharded": "accepted"}
    except ValueError as e:
        messages = {"sharded": str(e)}
    _train(hp, batch, step, batches)
    step += 1
    hp.switch(plans["dp16"], module=make(MODEL)[0])
    for _ in range(2):
        _train(hp, batch, step, batches)
        step += 1
    _save(out_dir, "sharded", hp, batches, messages=messages)
    hp.close()
    assert not dist.is_initialized(), rank


class _Plan:
    def __init__(self, d):
        self._d = d

    def to_dict(self):
        return dict(self._d)


class _Advice:
    """What maybe_adapt reads of a SwitchAdvice."""
    def __init__(self, switch, best):
        self.switch, self.best = switch, _Plan(best)
        self.critical_batch, self.stderr, self.gain, self.gain_range = 40.0, 3.0, 0.25, (0.1, 0.4)

    def __str__(self):
        return f"fake advice: switch={self.switch}"


ADAPT_STEPS, SWITCH_FROM = 12, 5
ADAPT_EVERY, ADAPT_INTERVAL = 2, 3


def adapt_rank(out_dir):
    """The adaptive mode on an injected advice: from step SWITCH_FROM on it says "switch to the
    other plan" (batch 8 <-> 16) at every check; rank 1's advice must never be asked."""
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor.applied import AppliedPlan
    torch.set_num_threads(1)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    model, batch, loss_fn = make(MODEL)
    plans = _plans(model)
    asked, callbacks = [], []

    def fake_switch_advice(self, graph, cluster, job, **kw):
        assert rank == 0, "only rank 0 asks for advice; the others take its decision"
        assert kw["processes"] == 2
        asked.append(self.step_count)
        other = "dp16" if self.plan.per_replica_batch == 4 else "dp8"
        return _Advice(self.step_count >= SWITCH_FROM, plans[other])
    AppliedPlan.switch_advice = fake_switch_advice

    policy = hybridplan.Adapt("graph", "cluster", "job", every=ADAPT_EVERY,
                              min_interval_steps=ADAPT_INTERVAL,
                              on_switch=lambda hp, rec: callbacks.append(
                                  (hp.step_count, hp.plan.global_batch, rec["gain"])))
    hp = hybridplan.apply(plans["dp8"], model, loss_fn=loss_fn, optimizer=optimizer("sgd", MODEL),
                          timeout_s=30, measure_noise_scale=1, adapt=policy)
    batches = []
    for step in range(ADAPT_STEPS):
        _train(hp, batch, step, batches)
    _save(out_dir, "adapt", hp, batches, asked=asked, callbacks=callbacks)
    hp.close()


# ---- test side --------------------------------------------------------------------------------

def reference(batches):
    """One process, one step per entry of `batches` (its global batch)."""
    torch.set_num_threads(1)
    model, batch, loss_fn = make(MODEL)
    opt = optimizer("sgd", MODEL)(model.parameters())
    for step, n in enumerate(batches):
        inputs, target = batch(n, step)
        args, kwargs = as_call(inputs)
        opt.zero_grad()
        loss_fn(model(*args, **kwargs), target).backward()
        opt.step()
    return model.state_dict()


def _run(target, tmp_path, timeout_s=60):
    results = run_ranks(f"test_switch:{target}", 2, {"out_dir": str(tmp_path)},
                        timeout_s=timeout_s)
    assert all(r.returncode == 0 for r in results), format_results(results)
    return results


def _equal_to_reference(tmp_path, name, batches=None, tol=TOL):
    outs = [torch.load(tmp_path / f"{name}.rank{r}.pt", weights_only=False) for r in range(2)]
    assert outs[0]["batches"] == outs[1]["batches"]
    if batches is not None:
        assert outs[0]["batches"] == batches
    expected = reference(outs[0]["batches"])
    initial = make(MODEL)[0].state_dict()
    assert any(not torch.equal(expected[k], initial[k]) for k in expected)
    for rank, out in enumerate(outs):
        assert out["step_count"] == len(out["batches"])
        assert list(out["state"]) == list(expected)
        for key in expected:
            torch.testing.assert_close(out["state"][key], expected[key], **tol,
                                       msg=lambda m, k=key: f"{name} rank {rank} {k}: {m}")
    return outs


def test_dp_pipeline_dp_equals_uninterrupted_training(tmp_path):
    _run("switch_rank", tmp_path)
    outs = _equal_to_reference(tmp_path, "switch", [8, 8, 16, 16, 8, 8])
    switches = outs[0]["switches"]
    assert [(s["step"], s["reason"]) for s in switches] == [(2, "switch()"), (4, "switch()")]
    assert switches[0]["from"] == "dp 2 x mp 1 placement, global batch 8 (4 per replica)"
    assert switches[0]["to"] == ("dp 1 x mp 2 pipeline gpipe M=2, global batch 16 "
                                 "(16 per replica)")
    for rank in range(2):
        assert (tmp_path / f"closed.rank{rank}.txt").read_text() == "False"


def test_refused_switch_raises_on_every_rank_and_the_old_plan_trains_on(tmp_path):
    _run("refuse_rank", tmp_path)
    outs = _equal_to_reference(tmp_path, "refuse", [8, 8, 8, 8, 8])
    for out in outs:
        m = out["messages"]
        assert "DistributedDataParallel wrapper is still referenced" in m["kept_ddp"]
        assert "resume_from=e.hybridplan_state" in m["kept_ddp"] and m["closed"] == "True"
        assert m["world"].startswith("ValueError: hybridplan switch refused"), m["world"]
        assert "needs world size 4" in m["world"] and "running plan is unchanged" in m["world"]
        assert "pass apply(..., optimizer=) a factory" in m["optimizer"], m["optimizer"]
        assert m["unknown"].startswith("TypeError: AppliedPlan.switch() got unexpected "
                                       "options ['resume_from']"), m["unknown"]
        assert out["switches"] == []
    outs = _equal_to_reference(tmp_path, "sharded", [8, 8, 16, 16])
    for out in outs:
        message = out["messages"]["sharded"]
        assert "FSDP2 cannot undo: pass switch(..., module=) a freshly built model" in message
        assert "running plan is unchanged" in message
        assert [s["step"] for s in out["switches"]] == [2]


def test_adaptive_mode_switches_on_advice_at_most_every_interval(tmp_path):
    results = _run("adapt_rank", tmp_path)
    # checks once `every` steps passed since the last and `min_interval_steps` since apply or
    # the last switch: step 3 (advice: keep), 5 (switch), 8 (switch), 11 (switch)
    checks, switches, step, last_check, last_switch = [], [], 0, 0, 0
    for step in range(1, ADAPT_STEPS + 1):
        if step - last_switch >= ADAPT_INTERVAL and step - last_check >= ADAPT_EVERY:
            checks.append(step)
            last_check = step
            if step >= SWITCH_FROM:
                switches.append(step)
                last_switch = step
    assert checks == [3, 5, 8, 11] and switches == [5, 8, 11]
    batches = [8 if sum(1 for s in switches if s < k + 1) % 2 == 0 else 16
               for k in range(ADAPT_STEPS)]
    outs = _equal_to_reference(tmp_path, "adapt", batches, LONG_TOL)
    assert outs[0]["asked"] == checks and outs[1]["asked"] == []
    for out in outs:
        assert [s["step"] for s in out["switches"]] == switches
        assert all(s["reason"] == "adapt" and s["critical_batch"] == 40.0
                   for s in out["switches"])
        assert out["callbacks"] == [(5, 16, 0.25), (8, 8, 0.25), (11, 16, 0.25)]
    lines = [ln for ln in results[0].stderr.splitlines() if ln.startswith("hybridplan adapt:")]
    assert len(lines) == 3, results[0].stderr
    assert lines[0] == ("hybridplan adapt: step 5: measured critical batch 40 +- 3 (1 stderr); "
                        "switching from dp 2 x mp 1 placement, global batch 8 (4 per replica) "
                        "to dp 2 x mp 1 placement, global batch 16 (8 per replica): predicted "
                        "25.0 % faster to train (10.0 to 40.0 % within 2 stderr)")
    assert "hybridplan adapt:" not in results[1].stderr


def test_adapt_options_are_checked():
    import hybridplan
    with pytest.raises(ValueError, match=r"every must be an integer >= 1 \(got 0\)"):
        hybridplan.Adapt(every=0)
    with pytest.raises(ValueError, match="give graph, cluster and job together"):
        hybridplan.Adapt(graph="g.json")
    with pytest.raises(ValueError, match=r"adapt= needs measure_noise_scale=N > 0"):
        hybridplan.apply({}, torch.nn.Linear(1, 1), adapt=hybridplan.Adapt())


EXAMPLE = os.path.join(REPO, "examples", "adaptive_switch.py")


def test_real_adaptive_run_switches_to_a_bigger_batch(tmp_path):
    """examples/adaptive_switch.py, shortened: the digits CNN on 2 ranks, the real noise scale
    and switch advice (the committed profile examples/graph-digits-cnn.json, localhost-cpu);
    the critical batch measured as the loss falls calls for a bigger global batch than the one
    planned with the job's guess (with this graph: 32 -> 64 at step 180)."""
    argv = [sys.executable, EXAMPLE, "--steps", "300", "--out", str(tmp_path / "summary.json"),
            "--graph", os.path.join(REPO, "examples", "graph-digits-cnn.json")]
    results = run_commands([argv] * 2, timeout_s=120)
    assert all(r.returncode == 0 for r in results), format_results(results)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["switches"], results[0].stderr
    first = summary["switches"][0]
    assert first["reason"] == "adapt" and first["gain"] >= 0.05 and first["gain_range"][0] > 0
    assert first["critical_batch"] > 8  # the job's guess
    assert summary["lr_log"][-1]["lr"] > summary["lr_log"][0]["lr"]  # on_switch rescaled it
    assert summary["global_batches"][-1] > summary["global_batches"][0]
    assert any(ln.startswith("hybridplan adapt: step ") for ln in results[0].stderr.splitlines())


def test_switch_advice_only_offers_plans_this_job_can_switch_to():
    """processes=: the candidates run on the job's processes (the adaptive mode passes the world
    size); when none of the search's best does, the advice keeps the running plan."""
    import hybridplan
    from hybridplan.gradient_noise.noise_scale_job import switch_advice
    from test_plan_over_run import TINY, _estimate, _job
    running = hybridplan.plan(TINY, "dgx1-v100", _job(5000), devices=8)
    free = switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", _job(5000))
    fitting = switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", _job(5000),
                            processes=8)
    assert fitting.best.num_processes == 8 and fitting.switch
    assert fitting.best_time_s >= free.best_time_s
    placement = switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", _job(5000),
                              processes=8, modes=("placement",))
    assert placement.best.mode == "placement"
    none = switch_advice(running, _estimate(51.0), TINY, "dgx1-v100", _job(5000), processes=3)
    assert none.best is not None and not none.switch and none.gain == 0
