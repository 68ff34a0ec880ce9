"""Mixed precision under every plan kind (executor/precision.py, docs/training_step.md
"Precision"): a plan with "precision": "bf16" trains as one process does in bf16 under the same
policy, on the same global batch:

    autocast kinds   dp (DDP), tp (DTensor), pipelines, placement mp=2, recompute: one process
                     with torch.autocast("cpu", bfloat16) around forward and loss, fp32
                     parameters (the master copies), SGD with momentum on them
    FSDP2 kinds      zero2, zero3: one process whose parameters are cast to bf16 for the
                     forward and backward (MixedPrecisionPolicy(param_dtype=bf16)), the bf16
                     gradients cast to fp32 onto fp32 master parameters (reduce_dtype=fp32),
                     the optimizer on those

Tolerance (TOLERANCE below): bf16 keeps 8 significant bits, so a value rounds to within
u = 2^-8 of itself, relatively. The executor's ranks compute the same samples in other
groupings (half the batch per replica, micro-batches, a stage boundary's activations sent in
bf16), so a bf16 result may round to the neighbouring value (one ulp, 2u relative) where the
reference's did not, and the gradients, averaged in fp32 over the replicas, differ by a few u
of their size. Over the steps each such difference moves a parameter by at most lr x its share
of the update, so the trained parameters may differ from the reference by a small multiple of
u times the update they took: max |theta - theta_ref| <= 4u x max |theta_ref - theta_0|
(4u = 2^-6 ~ 1.6 %); the losses per step agree to 4u relative to the loss. For this small model
fp32 training lies within that bound of the bf16 reference too (its matrix products are too
small for bf16's rounding to move the training much: 1.1u of the update after 4 steps), so
equality alone cannot tell that the plan computed in bf16: every rank also records the dtypes
of the tensors autograd saves during a step (saved_tensors_hooks), which must include bfloat16
under bf16 and must not under fp32.

One 2-rank launch runs dp, zero3, a 1F1B pipeline and tp in bf16, dp in fp32 and the pipeline in
fp16 for STEPS steps each, and the fp16 loss scale through checkpoints and plan switches
(_resume_fp16);
the `full` form runs every 2-rank kind (zero2, placement dp=2 x mp=2, recompute, GPipe, interleaved
1F1B, ZB-V too) for 20 steps, and one 4-rank launch the compositions of FOUR_RANK_KINDS in bf16
and FOUR_RANK_FP16_KINDS in fp16 for 20 steps; `python bench/bench_precision.py equality`
prints the table and the loss curves side by side.
"""

import functools
import os

import pytest
import torch

from dist_harness import outputs_of, run_cases
from plan_builders import pipeline_plan, placement_plan
from user_models import call

BATCH, STEPS, FULL_STEPS = 4, 3, 20
LR, MOMENTUM = 0.05, 0.9
U = 2.0 ** -8                 # bf16's unit roundoff
TOLERANCE = 4 * U             # of the update's size (module doc)
QUICK_KINDS = ("dp", "zero3", "pipeline", "tp")
FP16_KINDS = ("pipeline",)           # the loss scaler over a pipeline's stages
FULL_FP16_KINDS = ("dp", "zero3", "pipeline", "tp")
FULL_KINDS = ("dp", "zero2", "zero3", "placement", "recompute", "tp", "pipeline", "gpipe",
              "interleaved", "zbv")
# on 4 ranks: tp-dp = dp=2 x tp=2, pp-dp = dp=2 x a 2-stage 1F1B pipeline, hsdp = dp=4 with
# zero3 over shard groups of 2 (a (2, 2) mesh), dp-4 and zero2-4 = dp=4 (DDP, FSDP2)
FOUR_RANK_KINDS = ("tp-dp", "pp-dp", "hsdp")
FOUR_RANK_FP16_KINDS = ("dp-4", "zero2-4", "tp-dp", "pp-dp", "hsdp")
FSDP_KINDS = ("zero2", "zero3")   # FSDP2's MixedPrecisionPolicy; the others autocast
FSDP_POLICY = FSDP_KINDS + ("hsdp", "zero2-4")   # every kind under FSDP2's policy
DP = {"dp": 2, "zero2": 2, "zero3": 2, "placement": 2, "recompute": 2, "tp": 1,
      "pipeline": 1, "gpipe": 1, "interleaved": 1, "zbv": 1,
      "tp-dp": 2, "pp-dp": 2, "hsdp": 4, "dp-4": 4, "zero2-4": 4}
WORLD = {kind: 4 for kind in FOUR_RANK_FP16_KINDS}   # the ranks a kind runs on (else 2)


def gpt2():
    from test_tensor_parallel import gpt2 as build
    return build()


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def plan_of(kind, precision="bf16", per_replica=BATCH):
    from test_tensor_parallel import with_tp
    model, batch, _ = gpt2()
    example = batch(per_replica, 0)[0]
    pipelines = {"pipeline": ("1f1b", 1), "gpipe": ("gpipe", 1),
                 "interleaved": ("interleaved-1f1b", 2), "zbv": ("zbv", 2)}
    if kind in pipelines:
        schedule, virtual = pipelines[kind]
        plan = pipeline_plan(model, dp=1, mp=2, schedule=schedule, num_microbatches=2,
                             per_replica_batch=per_replica, example_inputs=example,
                             virtual_stages=virtual)
    elif kind == "pp-dp":
        plan = pipeline_plan(model, dp=2, mp=2, schedule="1f1b", num_microbatches=2,
                             per_replica_batch=per_replica, example_inputs=example)
    elif kind in ("tp", "tp-dp"):
        plan = with_tp(placement_plan(model, dp=DP[kind], mp=1,
                                      per_replica_batch=per_replica), 2)
    elif kind in ("hsdp", "dp-4", "zero2-4"):
        plan = placement_plan(model, dp=4, mp=1, per_replica_batch=per_replica)
        if kind == "hsdp":
            plan.update(sharding="zero3", dp_shard=2)
        elif kind == "zero2-4":
            plan["sharding"] = "zero2"
    elif kind == "placement":  # two replicas, each of two devices (run one after another)
        plan = placement_plan(model, dp=2, mp=2, per_replica_batch=per_replica)
    else:
        plan = placement_plan(model, dp=2, mp=1, per_replica_batch=per_replica)
        if kind in FSDP_KINDS:
            plan["sharding"] = kind
        if kind == "recompute":
            plan["assignment"] = [dict(a, recompute=True) for a in plan["assignment"]]
    return dict(plan, precision=precision)


# ---- rank side --------------------------------------------------------------------------------

def train_cases(cases_file, out_dir):
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for case in torch.load(cases_file):
        if case["id"] in ("parallelize", "fp16-resume"):
            result = _parallelize() if case["id"] == "parallelize" else _resume_fp16(out_dir)
            torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
            continue
        model, batch, loss_fn = gpt2()
        plan = plan_of(case["kind"], case.get("precision", "bf16"))
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                              example_inputs=batch(BATCH, 0)[0])
        losses, saved = [], set()

        def pack(t):
            saved.add(str(t.dtype))
            return t
        for step in range(case["steps"]):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                losses.append(hp.step(*hp.shard(*batch(hp.global_batch, 100 + step))).item())
        result = {"state": hp.state_dict(), "losses": losses, "saved": sorted(saved),
                  "dims": list(hp.layout.dims),
                  "dtypes": sorted({str(v.dtype) for v in hp.state_dict().values()})}
        hp.close()
        torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
    destroy_groups()


SPEEDUP = {"bf16": 0.6}  # a cluster's measured device.compute_speedup (any figure will do here)


def _parallelize():
    """hybridplan.parallelize(..., precision="bf16"): the job's precision, planned (with a
    cluster that has a bf16 compute_speedup) and applied; without one, the error."""
    import hybridplan
    model, batch, loss_fn = gpt2()
    inputs, target = batch(BATCH, 0)
    cluster = hybridplan.Cluster.preset("localhost-cpu").to_dict()
    common = dict(example_target=target, loss_fn=loss_fn, optimizer=sgd, cache_dir=False,
                  verbose=False, timeout_s=120, precision="bf16")
    report = {}
    try:
        hybridplan.parallelize(model, inputs, cluster=cluster, **common)
    except ValueError as e:
        report["error"] = str(e)
    hp = hybridplan.parallelize(model, inputs, cluster=dict(
        cluster, device=dict(cluster["device"], compute_speedup=SPEEDUP)), **common)
    saved = set()

    def pack(t):
        saved.add(str(t.dtype))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hp.step(*hp.shard(*batch(hp.global_batch, 100)))
    report.update(plan=hp.plan.to_dict(), job=hp.parallelized.job.to_dict(), saved=sorted(saved))
    hp.close()
    return report


# fp16's loss scale across checkpoints and plans: the loss is multiplied by RESUME_FACTOR (the
# learning rate divided by it, so the updates are the usual ones) so that fp16's backward
# overflows at the scaler's initial 2^16 and the scale halves over the first steps (8192 after
# 3 on one process); the checkpoints are taken after SAVED_AT steps, RESUMED steps follow.
RESUME_FACTOR, SAVED_AT, RESUMED = 32, 4, 3
RESUME_GLOBAL = 2 * BATCH   # every plan of the resume case trains this global batch
# run name -> (plan kind, what it resumes from, the plan it switches to right after)
RESUMES = {"tp": ("tp", "consolidated", None), "pipeline": ("pipeline", "sharded", None),
           "dp-sharded": ("dp", "sharded", None), "dp-to-tp": ("dp", "consolidated", "tp")}


def _resume_fp16(out_dir):
    """One fp16 run of SAVED_AT + RESUMED steps under dp that saves a consolidated and a
    sharded checkpoint after SAVED_AT (the uninterrupted run), then fresh applies resuming
    each (RESUMES), each training RESUMED steps: every run's loss scaler state after each step,
    its losses and its final state."""
    import hybridplan
    root = os.path.join(out_dir, "fp16-resume")
    os.makedirs(root, exist_ok=True)

    def run(kind, steps, resume_from=None, switch_to=None, save=False):
        model, batch, loss_fn = gpt2()
        per_replica = RESUME_GLOBAL // DP[kind]
        hp = hybridplan.apply(
            plan_of(kind, "fp16", per_replica), model,
            loss_fn=lambda output, target: loss_fn(output, target) * RESUME_FACTOR,
            optimizer=lambda params: torch.optim.SGD(params, lr=LR / RESUME_FACTOR,
                                                     momentum=MOMENTUM),
            timeout_s=120, example_inputs=batch(per_replica, 0)[0], resume_from=resume_from)
        out = {"resumed": hp.grad_scaler.state_dict(), "losses": [], "scalers": []}
        if switch_to is not None:
            per_replica = RESUME_GLOBAL // DP[switch_to]
            hp.switch(plan_of(switch_to, "fp16", per_replica),
                      example_inputs=batch(per_replica, 0)[0])
            out["switched"] = hp.grad_scaler.state_dict()
        first = hp.step_count
        for step in range(first, first + steps):
            loss = hp.step(*hp.shard(*batch(hp.global_batch, 100 + step)))
            out["losses"].append(loss.item() / RESUME_FACTOR)
            out["scalers"].append(hp.grad_scaler.state_dict())
            if save and hp.step_count == SAVED_AT:
                hp.save_checkpoint(os.path.join(root, "ckpt.pt"))
                out["sharded"] = hp.save_sharded(os.path.join(root, "sharded"))
        out["state"] = hp.state_dict()
        hp.close()
        return out

    result = {"uninterrupted": run("dp", SAVED_AT + RESUMED, save=True)}
    sources = {"consolidated": os.path.join(root, "ckpt.pt"),
               "sharded": result["uninterrupted"]["sharded"]}
    for name, (kind, source, switch_to) in RESUMES.items():
        result[name] = run(kind, RESUMED, sources[source], switch_to)
    return result


# ---- the reference: one process ---------------------------------------------------------------

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@functools.lru_cache(maxsize=None)
def reference(kind, steps, precision="bf16"):
    """One process on the global batch under `kind`'s policy (the module doc), fp16 with
    torch.amp.GradScaler: the final state and each step's loss."""
    torch.set_num_threads(1)
    model, batch, loss_fn = gpt2()
    master = list(model.parameters())
    opt = sgd(master)
    dtype = DTYPES.get(precision)
    fsdp = kind in FSDP_POLICY and dtype is not None
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    compute = model
    if fsdp:  # a copy whose parameters are in the dtype: FSDP2's param_dtype
        import copy
        compute = copy.deepcopy(model)
        for p in compute.parameters():
            p.data = p.data.to(dtype)
    losses = []
    for step in range(steps):
        inputs, target = batch(DP[kind] * BATCH, 100 + step)
        opt.zero_grad()
        if fsdp:
            with torch.no_grad():
                for c, m in zip(compute.parameters(), master):
                    c.copy_(m)
                    c.grad = None
            loss = loss_fn(call(compute, inputs), target)
        elif dtype is not None:
            with torch.autocast("cpu", dtype=dtype):
                loss = loss_fn(call(model, inputs), target)
        else:
            loss = loss_fn(call(model, inputs), target)
        (loss if scaler is None else scaler.scale(loss)).backward()
        if fsdp:
            for c, m in zip(compute.parameters(), master):
                m.grad = c.grad.float()  # reduce_dtype=fp32
        losses.append(loss.item())
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
    return model.state_dict(), losses


def max_difference(state, want):
    assert list(state) == list(want)
    return max((state[k].float() - v.float()).abs().max().item() for k, v in want.items())


def update_size(want):
    initial = gpt2()[0].state_dict()
    return max((want[k] - initial[k]).abs().max().item() for k in want)


def global_losses(outs):
    """Each step's loss on the global batch: the mean of the ranks' (a rank returns its
    replica's mean loss; the replicas' shares are equal, and a replica's ranks return the
    same)."""
    return [sum(step) / len(step) for step in zip(*(out["losses"] for out in outs))]


def compare(outs, kind, steps, precision="bf16"):
    """(max |difference| of any rank's state, its bound, max relative difference of the
    global batch's loss) against the reference."""
    want, losses = reference(kind, steps, precision)
    diff = max(max_difference(out["state"], want) for out in outs)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(global_losses(outs), losses))
    return diff, TOLERANCE * update_size(want), loss_diff


def launch(kinds, steps, out_dir, extra=()):
    """Each case ({"id", "kind", "steps", "precision"}; `kinds` in bf16) launched on the ranks
    its kind runs on (WORLD), one launch per world size."""
    by_world = {}
    for case in [{"id": kind, "kind": kind, "steps": steps} for kind in kinds] + list(extra):
        by_world.setdefault(WORLD.get(case.get("kind"), 2), []).append(case)
    loaded, _ = run_cases("test_precision:train_cases", by_world, out_dir, timeout_s=900)
    return loaded


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    return launch(QUICK_KINDS, STEPS, tmp_path_factory.mktemp("precision"),
                  extra=[{"id": "dp-fp32", "kind": "dp", "steps": STEPS, "precision": "fp32"},
                         {"id": "parallelize"}, {"id": "fp16-resume"}] +
                  [{"id": f"{kind}-fp16", "kind": kind, "steps": STEPS, "precision": "fp16"}
                   for kind in FP16_KINDS])


@pytest.mark.parametrize("kind", QUICK_KINDS)
def test_bf16_trains_like_one_process_in_bf16(quick, kind):
    outs = outputs_of(quick, kind)
    for out in outs:
        assert out["dtypes"] == ["torch.float32"]  # fp32 master weights
        assert "torch.bfloat16" in out["saved"], out["saved"]  # it computed in bf16
    diff, bound, loss_diff = compare(outs, kind, STEPS)
    assert diff <= bound, f"{kind}: differs by {diff:.3g} (bound {bound:.3g})"
    assert loss_diff <= TOLERANCE, (kind, global_losses(outs), loss_diff)


def test_parallelize_plans_and_applies_the_precision(quick):
    """parallelize(precision="bf16"): the job's precision, the plan's, priced with the cluster's
    compute_speedup, applied (bf16 tensors saved); a cluster without one is refused, naming
    the field."""
    for out in outputs_of(quick, "parallelize"):
        assert "device.compute_speedup.bf16 is needed to plan the job's precision" in \
            out["error"], out["error"]
        assert out["job"]["precision"] == "bf16" and out["plan"]["precision"] == "bf16"
        assert "torch.bfloat16" in out["saved"], out["saved"]


def test_fp32_computes_nothing_in_bf16(quick):
    """The same dp plan in fp32: no bf16 tensor saved, and the fp32 one-process result."""
    fp32_ref, _ = reference("dp", STEPS, precision="fp32")
    for out in outputs_of(quick, "dp-fp32"):
        assert "torch.bfloat16" not in out["saved"], out["saved"]
        assert max_difference(out["state"], fp32_ref) <= 1e-5


@pytest.mark.parametrize("kind", FP16_KINDS)
def test_fp16_trains_like_one_process_with_a_loss_scaler(quick, kind):
    """fp16: the same policies with torch's loss scaler, against one process with
    torch.amp.GradScaler; the tolerance is the bf16 one (fp16 rounds finer: u = 2^-11)."""
    outs = outputs_of(quick, f"{kind}-fp16")
    for out in outs:
        assert out["dtypes"] == ["torch.float32"]
        assert "torch.float16" in out["saved"], out["saved"]
    diff, bound, loss_diff = compare(outs, kind, STEPS, "fp16")
    assert diff <= bound, f"{kind}: differs by {diff:.3g} (bound {bound:.3g})"
    assert loss_diff <= TOLERANCE, (kind, global_losses(outs), loss_diff)


def test_fp16_loss_scale_is_checkpointed_and_resumed_under_other_plans(quick):
    """The fp16 loss scaler's state (scale, growth tracker) is in the consolidated and the
    sharded checkpoint and is restored on resume, under another plan kind too (tp from the
    consolidated file, the 1F1B pipeline from the sharded one) and through a switch (dp
    resumed, then switched to tp: the state handed over in memory): each resumed run starts from the saved scale and its
    steps scale, skip and grow as the uninterrupted run's did; its losses and parameters agree
    with the uninterrupted run's within the module's tolerance, and exactly when it resumes
    the same plan (dp from the sharded checkpoint). A resumed scaler back at 2^16 would skip
    the next steps, whose backward overflows there."""
    outs = outputs_of(quick, "fp16-resume")
    whole = [out["uninterrupted"] for out in outs]
    saved = whole[0]["scalers"][SAVED_AT - 1]
    assert saved["scale"] < 2.0 ** 16, whole[0]["scalers"]  # the scale changed before the save
    assert all(w["scalers"] == whole[0]["scalers"] for w in whole)  # one scale on every rank
    after = whole[0]["scalers"][SAVED_AT:]
    want = whole[0]["state"]
    want_losses = global_losses([{"losses": w["losses"][SAVED_AT:]} for w in whole])
    bound = TOLERANCE * update_size(want)
    for name, (_, _, switch_to) in RESUMES.items():
        runs = [out[name] for out in outs]
        for run in runs:
            assert run["resumed"] == saved, (name, run["resumed"], saved)
            if switch_to:
                assert run["switched"] == saved, (name, run["switched"], saved)
            assert run["scalers"] == after, (name, run["scalers"], after)
        losses = global_losses(runs)
        diff = max(max_difference(run["state"], want) for run in runs)
        if name == "dp-sharded":  # the same plan: the uninterrupted run's steps exactly
            assert losses == want_losses and diff == 0, (name, losses, want_losses, diff)
        loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
        assert loss_diff <= TOLERANCE, (name, losses, want_losses)
        assert diff <= bound, f"{name}: differs by {diff:.3g} (bound {bound:.3g})"


@pytest.mark.full
def test_bf16_every_kind_over_twenty_steps(tmp_path):
    pytest.importorskip("transformers")
    loaded = launch(FULL_KINDS, FULL_STEPS, tmp_path,
                    extra=[{"id": f"{kind}-fp16", "kind": kind, "steps": FULL_STEPS,
                            "precision": "fp16"} for kind in FULL_FP16_KINDS])
    for kind in FULL_FP16_KINDS:
        outs = outputs_of(loaded, f"{kind}-fp16")
        assert all("torch.float16" in out["saved"] for out in outs), kind
        diff, bound, loss_diff = compare(outs, kind, FULL_STEPS, "fp16")
        assert diff <= bound, f"{kind} fp16: differs by {diff:.3g} (bound {bound:.3g})"
        assert loss_diff <= TOLERANCE, (kind, "fp16", loss_diff)
    for kind in FULL_KINDS:
        outs = outputs_of(loaded, kind)
        assert all("torch.bfloat16" in out["saved"] for out in outs), kind
        diff, bound, loss_diff = compare(outs, kind, FULL_STEPS)
        assert diff <= bound, f"{kind}: differs by {diff:.3g} (bound {bound:.3g})"
        assert loss_diff <= TOLERANCE, (kind, loss_diff)


@pytest.mark.full
def test_16bit_on_four_ranks_over_twenty_steps(tmp_path):
    """The 4-rank compositions in bf16 (tp-dp, pp-dp, hsdp) and in fp16 with the loss scaler
    over the job (those and dp, zero2 over 4 replicas), each against one process on the same
    global batch under the same policy, held to the module's bound."""
    pytest.importorskip("transformers")
    loaded = launch(FOUR_RANK_KINDS, FULL_STEPS, tmp_path,
                    extra=[{"id": f"{kind}-fp16", "kind": kind, "steps": FULL_STEPS,
                            "precision": "fp16"} for kind in FOUR_RANK_FP16_KINDS])
    for case, kind, precision in ([(k, k, "bf16") for k in FOUR_RANK_KINDS] +
                                  [(f"{k}-fp16", k, "fp16") for k in FOUR_RANK_FP16_KINDS]):
        outs = outputs_of(loaded, case)
        assert len(outs) == 4
        if kind == "hsdp":  # FSDP2 over the (2, 2) mesh: shard in pairs, replicate across
            assert outs[0]["dims"][:2] == [("dp_replicate", 2), ("dp_shard", 2)], outs[0]["dims"]
        for out in outs:
            assert out["dtypes"] == ["torch.float32"], case
            assert str(DTYPES[precision]) in out["saved"], (case, out["saved"])
        diff, bound, loss_diff = compare(outs, kind, FULL_STEPS, precision)
        assert diff <= bound, f"{case}: differs by {diff:.3g} (bound {bound:.3g})"
        assert loss_diff <= TOLERANCE, (case, loss_diff)


# ---- one process, no launch -------------------------------------------------------------------

def test_the_policy_follows_the_plan_kind():
    """FSDP2's MixedPrecisionPolicy for sharded placement plans, autocast for every other kind,
    nothing for fp32; fp16 alone gets a loss scaler (executor/precision.py)."""
    pytest.importorskip("hybridplan.planner", reason="needs the compiled planner (make build)")
    pytest.importorskip("transformers")
    from hybridplan.executor import precision
    from hybridplan.executor.plan_spec import parse_plan
    for kind in QUICK_KINDS + ("zero2",):
        mixed = precision.of_plan(parse_plan(plan_of(kind)))
        assert mixed.dtype == torch.bfloat16
        assert mixed.fsdp_policy == (kind in FSDP_KINDS) and mixed.autocasts != mixed.fsdp_policy
        assert (mixed.mp_policy() is not None) == mixed.fsdp_policy
        assert mixed.scaler(torch.device("cpu")) is None
        assert mixed.message_dtype(torch.float32) == (
            torch.bfloat16 if mixed.autocasts else torch.float32)
        assert mixed.message_dtype(torch.int64) == torch.int64
    plain = precision.of_plan(parse_plan(plan_of("dp", "fp32")))
    assert plain.dtype is None and not plain.autocasts and plain.mp_policy() is None
    policy = precision.of_plan(parse_plan(plan_of("zero3", "fp16"))).mp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.float16, torch.float32)
    with pytest.raises(ValueError, match='precision must be one of "fp32", "bf16", "fp16" '
                                         r'\(got "half"\)'):
        parse_plan(plan_of("dp", "half"))


def test_parallelize_precision_is_the_jobs():
    pytest.importorskip("hybridplan.planner", reason="needs the compiled planner (make build)")
    from hybridplan.front_door import job_with_precision, resolve_job
    job = job_with_precision(resolve_job(None, 8), "bf16")
    assert job.to_dict()["precision"] == "bf16" and job.to_dict()["per_replica_batch"] == 8
    assert job_with_precision(job, "bf16").to_dict() == job.to_dict()
    with pytest.raises(ValueError, match="precision='fp16' but the job's precision is 'bf16'"):
        job_with_precision(job, "fp16")
    legacy = resolve_job({"mixed_precision": True}, 8)  # the older boolean: bf16
    assert legacy.to_dict()["precision"] == "bf16"
    with pytest.raises(ValueError, match='precision must be one of "fp32", "bf16", "fp16"'):
        job_with_precision(resolve_job(None, 8), "half")


def test_the_loss_scale_field_is_checked_and_loaded():
    """checkpoint.scaler_state / load_scaler_state on torch's GradScaler (no launch): the
    state round-trips into a fresh scaler whose scale tensor exists already, as the
    executor's does; a malformed grad_scaler is refused naming the file and the field; a
    plan without a scaler ignores it."""
    from hybridplan.executor import checkpoint
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    weight = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([weight], lr=0.1)
    for _ in range(3):  # three clean steps: the growth tracker counts them
        opt.zero_grad()
        scaler.scale(weight.square().sum()).backward()
        scaler.step(opt)
        scaler.update()
    state = checkpoint.scaler_state(scaler)
    assert state["scale"] == 1024.0 and state["_growth_tracker"] == 3
    fresh = torch.amp.GradScaler("cpu")
    fresh.scale(torch.ones(()))
    ckpt = checkpoint.build({}, {"class": "SGD", "state": {}, "param_groups": []}, 7, "{}", "",
                            grad_scaler=state)
    checkpoint.load_scaler_state(fresh, checkpoint.check_envelope(ckpt, "c.pt"), "c.pt")
    assert (fresh.get_scale(), fresh._get_growth_tracker()) == (1024.0, 3)
    checkpoint.load_scaler_state(None, ckpt, "c.pt")
    assert checkpoint.scaler_state(None) is None
    with pytest.raises(ValueError, match=r"^c.pt: grad_scaler.scale must be a positive float "
                                         r"\(got 0\)"):
        checkpoint.check_envelope(dict(ckpt, grad_scaler=dict(state, scale=0)), "c.pt")
    with pytest.raises(ValueError, match=r"^c.pt: grad_scaler._growth_tracker must be a "
                                         r"non-negative int \(got 'x'\)"):
        checkpoint.check_envelope(dict(ckpt, grad_scaler=dict(state, _growth_tracker="x")),
                                  "c.pt")
