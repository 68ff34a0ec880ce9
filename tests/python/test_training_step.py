"""The training step people expect (executor/stepping.py, docs/training_step.md): gradient
clipping by global norm, gradient accumulation and learning-rate schedules under every plan
kind equal one process training on the same global batch with torch's own
clip_grad_norm_, no accumulation and the same scheduler.

One 2-rank launch runs every case in turn (GPT-2 from a tiny config: its wte and lm_head are
tied, so the pipeline's tied copies lie on both stages):

    kind      dp        placement dp=2 (DDP)
              zero3     placement dp=2, FSDP2 fully_shard
              pipeline  1F1B mp=2, 2 micro-batches (the tied copies on both stages)
              tp        placement tp=2 (DTensor slices, replicated parameters)
    feature   clip      apply(clip_grad_norm=CLIP): the returned norms within 1e-6 relative of
                        clip_grad_norm_'s, the state within the equality tolerances
              accum     apply(accumulation_steps=2), one process on a batch twice as large
              all       clip + accumulation + warmup_cosine, driven by hand (zero_grad,
                        forward_backward x 2, clip_grad_norm, optimizer_step): dp, pipeline

and the scheduler's state through checkpoints and a switch: 2 steps under dp, saved
(consolidated and sharded), switched to zero3 for 2 more; a pipeline resumed from the
consolidated file and a zero3 plan from the sharded one each train 2 more: all three equal one
process's 4 steps, the learning rate included. `pytest -s -k equality_table` prints the table
docs/training_step.md holds.
"""

import math
import os

import pytest
import torch

from dist_harness import outputs_of, run_cases
from plan_builders import pipeline_plan, placement_plan, share
from user_models import call

BATCH, STEPS, CLIP, K = 4, 3, 0.5, 2
KINDS = ("dp", "zero3", "pipeline", "tp")
# kind -> replicas; the 4-rank kinds (a zero2 pipeline dp=2 x mp=2, dp=2 x tp=2, a pipeline
# mp=2 x tp=2) run in bench/bench_training_step.py, not here
DP = {"dp": 2, "zero3": 2, "pipeline": 1, "tp": 1, "hybrid_z2": 2, "dp_tp": 2, "pp_tp": 1}
FEATURES = ("clip", "accum", "all")
CASES = [(kind, feature) for kind in KINDS for feature in FEATURES
         if feature != "all" or kind in ("dp", "pipeline")]
SCHEDULE = (2, 6, 0.1)  # warmup_cosine's warmup_steps, total_steps, min_lr_ratio
# the checkpoint and switch case's: 4 steps, resumed after 2 at a rate (0.775 x) that neither
# the optimizer's nor a fresh schedule's first (both 1 x) is
RESUME_SCHEDULE = (1, 4, 0.1)
RTOL, ATOL = 1e-4, 1e-6  # the executor's equality tolerances (test_user_models)
NORM_RTOL = 1e-6


def gpt2():
    from test_tensor_parallel import gpt2 as build
    return build()


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def options(feature):
    """apply's options for a feature."""
    import hybridplan
    clip = CLIP if feature in ("clip", "all") else None
    accumulation = K if feature in ("accum", "all") else 1
    schedule = hybridplan.warmup_cosine(*SCHEDULE) if feature == "all" else None
    return dict(clip_grad_norm=clip, accumulation_steps=accumulation, lr_scheduler=schedule)


def plan_of(kind, per_replica_batch=BATCH):
    from test_tensor_parallel import with_tp
    model, batch, _ = gpt2()
    if kind in ("pipeline", "hybrid_z2", "pp_tp"):
        plan = pipeline_plan(model, dp=DP[kind], mp=2, schedule="1f1b", num_microbatches=2,
                             per_replica_batch=per_replica_batch,
                             example_inputs=batch(per_replica_batch, 0)[0])
        if kind == "pp_tp":
            return with_tp(plan, 2)
        return dict(plan, sharding="zero2") if kind == "hybrid_z2" else plan
    if kind in ("tp", "dp_tp"):
        return with_tp(placement_plan(model, dp=DP[kind], mp=1,
                                      per_replica_batch=per_replica_batch), 2)
    plan = placement_plan(model, dp=2, mp=1, per_replica_batch=per_replica_batch)
    return dict(plan, sharding="zero3") if kind == "zero3" else plan


# ---- rank side --------------------------------------------------------------------------------

def _train(hp, batch, feature, steps, first=0):
    """`steps` steps from step `first`: hp.step, or for "all" the loop by hand; the norms and
    learning rates of each step."""
    norms, lrs = [], []
    for step in range(first, first + steps):
        lrs.append(hp.optimizer.param_groups[0]["lr"])
        inputs, target = hp.shard(*batch(hp.global_batch, 100 + step))
        if feature == "all":
            hp.zero_grad()
            for j in range(hp.accumulation_steps):  # this replica's micro-batches
                hp.forward_backward(share(inputs, K, j), share(target, K, j))
            norms.append(hp.clip_grad_norm(CLIP).item())
            hp.optimizer_step()
        else:
            hp.step(inputs, target)
            if hp.last_grad_norm is not None:
                norms.append(hp.last_grad_norm.item())
    return norms, lrs


def train_cases(cases_file, out_dir):
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # one job, the cases applied in turn
    for case in torch.load(cases_file):
        if case["id"] == "resume":
            result = _resume_and_switch(out_dir)
        elif case["id"] == "misuse":
            result = _misuse()
        else:
            model, batch, loss_fn = gpt2()
            plan = plan_of(case["kind"])
            hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                                  example_inputs=batch(BATCH, 0)[0], **options(case["feature"]))
            norms, lrs = _train(hp, batch, case["feature"], STEPS)
            result = {"state": hp.state_dict(), "norms": norms, "lrs": lrs,
                      "global_batch": hp.global_batch}
            hp.close()
        torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
    destroy_groups()


def _resume_and_switch(out_dir):
    import hybridplan
    _, batch, loss_fn = gpt2()
    schedule = hybridplan.warmup_cosine(*RESUME_SCHEDULE)
    common = dict(loss_fn=loss_fn, optimizer=sgd, timeout_s=120, clip_grad_norm=CLIP,
                  lr_scheduler=schedule)
    consolidated = os.path.join(out_dir, "resume.pt")
    sharded = os.path.join(out_dir, "resume-sharded")
    report = {}
    hp = hybridplan.apply(plan_of("dp"), gpt2()[0], **common)
    _train(hp, batch, "clip", 2)
    hp.save_checkpoint(consolidated)
    hp.save_sharded(sharded)
    hp.switch(plan_of("zero3"), module=gpt2()[0])
    report["switch_lr"] = hp.optimizer.param_groups[0]["lr"]
    _train(hp, batch, "clip", 2, first=2)
    report["switched"] = hp.state_dict()
    hp.close()
    pipe_plan = plan_of("pipeline", per_replica_batch=2 * BATCH)  # the same global batch
    for what, plan, source, example in (
            ("pipeline_from_consolidated", pipe_plan, consolidated, batch(2 * BATCH, 0)[0]),
            ("zero3_from_sharded", plan_of("zero3"), sharded, None)):
        hp = hybridplan.apply(plan, gpt2()[0], resume_from=source, example_inputs=example,
                              **common)
        report[what + "_lr"] = hp.optimizer.param_groups[0]["lr"]
        _train(hp, batch, "clip", 2, first=2)
        report[what] = hp.state_dict()
        hp.close()
    return report


def _misuse():
    """The errors a hand-driven loop gets for calls out of order (accumulation_steps=2)."""
    import hybridplan
    model, batch, loss_fn = gpt2()
    hp = hybridplan.apply(plan_of("dp"), model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                          accumulation_steps=K)
    inputs, target = hp.shard(*batch(hp.global_batch, 0))
    parts = [(share(inputs, K, j), share(target, K, j)) for j in range(K)]
    errors = {}
    hp.forward_backward(*parts[0])
    for what, call_it in (("optimizer_step", hp.optimizer_step),
                          ("clip_grad_norm", lambda: hp.clip_grad_norm(1.0))):
        try:
            call_it()
        except RuntimeError as e:
            errors[what] = str(e)
    hp.forward_backward(*parts[1])
    try:
        hp.forward_backward(*parts[0])
    except RuntimeError as e:
        errors["forward_backward"] = str(e)
    try:
        hp.step(*hp.shard(*batch(hp.global_batch - 2, 0)))  # not K x per_replica_batch
    except ValueError as e:
        errors["step"] = str(e)
    hp.close()
    return errors


# ---- test side --------------------------------------------------------------------------------

def reference(global_batch, steps, clip=None, schedule=None):
    """One process on the global batch: torch's clip_grad_norm_ and the scheduler; the final
    state, each step's norm and learning rate."""
    torch.set_num_threads(1)
    model, batch, loss_fn = gpt2()
    opt = sgd(model.parameters())
    scheduler = schedule(opt) if schedule is not None else None
    norms, lrs = [], []
    for step in range(steps):
        inputs, target = batch(global_batch, 100 + step)
        opt.zero_grad()
        loss_fn(call(model, inputs), target).backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return model.state_dict(), norms, lrs


def expected_for(kind, feature):
    import hybridplan
    dp = DP[kind]
    accumulation = K if feature in ("accum", "all") else 1
    return reference(dp * BATCH * accumulation, STEPS,
                     CLIP if feature in ("clip", "all") else None,
                     hybridplan.warmup_cosine(*SCHEDULE) if feature == "all" else None)


def max_difference(state, want):
    assert list(state) == list(want)
    return max((state[k].float() - v.float()).abs().max().item() for k, v in want.items())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    out_dir = tmp_path_factory.mktemp("training_step")
    cases = [{"id": f"{kind}-{feature}", "kind": kind, "feature": feature}
             for kind, feature in CASES] + [{"id": "resume"}, {"id": "misuse"}]
    loaded, _ = run_cases("test_training_step:train_cases", {2: cases}, out_dir,
                          timeout_s=600)
    return loaded


@pytest.mark.parametrize("kind,feature", CASES, ids=[f"{k}-{f}" for k, f in CASES])
def test_step_trains_like_one_process(trained, kind, feature):
    outs = outputs_of(trained, f"{kind}-{feature}")
    want, norms, lrs = expected_for(kind, feature)
    initial = gpt2()[0].state_dict()
    assert any(not torch.equal(want[k], initial[k]) for k in initial)  # it trained
    if norms:  # the clipping was active: every step's norm above max_norm
        assert min(norms) > CLIP, norms
    for out in outs:
        assert out["global_batch"] == DP[kind] * BATCH * (
            K if feature in ("accum", "all") else 1)
        assert len(out["norms"]) == len(norms)
        for got, ref in zip(out["norms"], norms):
            assert abs(got - ref) <= NORM_RTOL * ref, (out["norms"], norms)
        assert out["lrs"] == pytest.approx(lrs, rel=1e-12)
        for key, value in want.items():
            assert torch.allclose(out["state"][key], value, rtol=RTOL, atol=ATOL), (
                f"{kind}-{feature}: {key} differs by "
                f"{(out['state'][key] - value).abs().max().item():.3g}")
    assert outs[0]["norms"] == outs[1]["norms"]  # the same on every rank


def test_scheduler_state_moves_through_checkpoints_and_switches(trained):
    import hybridplan
    outs = outputs_of(trained, "resume")
    want, _, lrs = reference(2 * BATCH, 4, CLIP, hybridplan.warmup_cosine(*RESUME_SCHEDULE))
    assert lrs[2] == pytest.approx(0.05 * 0.775)  # not 0.05: a restore that failed shows
    for out in outs:
        for what in ("switched", "pipeline_from_consolidated", "zero3_from_sharded"):
            diff = max_difference(out[what], want)
            assert diff <= 1e-5, f"{what}: differs by {diff:.3g}"
        for what in ("switch_lr", "pipeline_from_consolidated_lr", "zero3_from_sharded_lr"):
            assert out[what] == pytest.approx(lrs[2], rel=1e-12), (what, out[what], lrs)


def test_calls_out_of_order_are_refused(trained):
    for out in outputs_of(trained, "misuse"):
        assert "optimizer_step() after 1 of accumulation_steps=2" in out["optimizer_step"]
        assert "clip_grad_norm() after 1 of accumulation_steps=2" in out["clip_grad_norm"]
        assert "forward_backward called 3 times" in out["forward_backward"]
        assert "accumulation_steps=2" in out["step"] and "equal micro-steps" in out["step"]


def test_equality_table(trained):
    """feature x plan kind -> max |difference| of the trained state from one process, and the
    largest relative difference of the returned norms (`pytest -s -k equality_table`)."""
    rows = ["| feature | " + " | ".join(KINDS) + " |", "|---" * (len(KINDS) + 1) + "|"]
    for feature in FEATURES:
        cells = []
        for kind in KINDS:
            if (kind, feature) not in CASES:
                cells.append("")
                continue
            outs = outputs_of(trained, f"{kind}-{feature}")
            want, norms, _ = expected_for(kind, feature)
            diff = max(max_difference(out["state"], want) for out in outs)
            cell = f"{diff:.1e}"
            if norms:
                rel = max(abs(g - r) / r for out in outs for g, r in zip(out["norms"], norms))
                cell += f" (norm {rel:.1e})"
            cells.append(cell)
        rows.append(f"| {feature} | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(rows))


# ---- one process, no launch -------------------------------------------------------------------

def test_options_are_checked_with_the_rule():
    from hybridplan.executor.checks import check_step_options as check_options
    k_rule = r"accumulation_steps must be None \(the plan's\) or an integer >= 1"
    for bad, words in (((0, 1, None), "clip_grad_norm must be"),
                       ((float("nan"), 1, None), "clip_grad_norm must be"),
                       ((None, 0, None), k_rule),
                       ((None, 2.0, None), k_rule),
                       ((None, 1, "cosine"), "lr_scheduler must be a factory")):
        with pytest.raises(ValueError, match=words):
            check_options(*bad)
    opt = sgd([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="lr_scheduler must be a factory"):
        check_options(None, 1, torch.optim.lr_scheduler.StepLR(opt, 2))
    check_options(1.0, 4, lambda o: torch.optim.lr_scheduler.StepLR(o, 2))


def test_warmup_cosine_is_the_convergence_rules_warmup_then_hugging_faces_cosine():
    import hybridplan
    from hybridplan.convergence.tradeoff import LrRule
    warmup, total, ratio = 4, 20, 0.1
    schedule = hybridplan.warmup_cosine(warmup, total, ratio)
    rule = LrRule(base_lr=1.0, base_batch=1, scaling="none", warmup_samples=warmup)
    for step in range(warmup):  # one sample per step: the same warm-up
        assert schedule.factor(step) == rule.lr(1, step) == (step + 1) / warmup
    opt = sgd([torch.nn.Parameter(torch.zeros(1))])
    scheduler = schedule(opt)
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    lrs = []
    for _ in range(total + 3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert lrs[:warmup] == pytest.approx([0.05 * (s + 1) / warmup for s in range(warmup)])
    assert lrs[warmup] == pytest.approx(0.05) and lrs[total:] == pytest.approx([0.005] * 3)
    transformers = pytest.importorskip("transformers")
    opt2 = sgd([torch.nn.Parameter(torch.zeros(1))])
    theirs = transformers.get_cosine_with_min_lr_schedule_with_warmup(
        opt2, warmup, total, min_lr_rate=ratio)
    for step in range(total + 1):  # after the warm-up the two are one curve (to total_steps;
        if step >= warmup:           # theirs rises again after it)
            assert lrs[step] == pytest.approx(opt2.param_groups[0]["lr"], rel=1e-12)
        opt2.step()
        theirs.step()
    for bad in ((5, 4, 0.0), (-1, 4, 0.0), (1, 4, 1.5)):
        with pytest.raises(ValueError, match="warmup_cosine"):
            hybridplan.warmup_cosine(*bad)
    assert math.isclose(schedule.factor(10 ** 6), ratio)
