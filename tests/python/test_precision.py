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
fp16 for STEPS steps each;
the `full` form runs every 2-rank kind (zero2, placement dp=2 x mp=2, recompute, GPipe, interleaved
1F1B, ZB-V too) for 20 steps, and `python bench/bench_precision.py` prints the table and the
loss curves side by side.
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
FSDP_KINDS = ("zero2", "zero3")   # FSDP2's MixedPrecisionPolicy; the others autocast
DP = {"dp": 2, "zero2": 2, "zero3": 2, "placement": 2, "recompute": 2, "tp": 1,
      "pipeline": 1, "gpipe": 1, "interleaved": 1, "zbv": 1}


def gpt2():
    from test_tensor_parallel import gpt2 as build
    return build()


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def plan_of(kind, precision="bf16"):
    from test_tensor_parallel import with_tp
    model, batch, _ = gpt2()
    example = batch(BATCH, 0)[0]
    pipelines = {"pipeline": ("1f1b", 1), "gpipe": ("gpipe", 1),
                 "interleaved": ("interleaved-1f1b", 2), "zbv": ("zbv", 2)}
    if kind in pipelines:
        schedule, virtual = pipelines[kind]
        plan = pipeline_plan(model, dp=1, mp=2, schedule=schedule, num_microbatches=2,
                             per_replica_batch=BATCH, example_inputs=example,
                             virtual_stages=virtual)
    elif kind == "tp":
        plan = with_tp(placement_plan(model, dp=1, mp=1, per_replica_batch=BATCH), 2)
    elif kind == "placement":  # two replicas, each of two devices (run one after another)
        plan = placement_plan(model, dp=2, mp=2, per_replica_batch=BATCH)
    else:
        plan = placement_plan(model, dp=2, mp=1, per_replica_batch=BATCH)
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
        if case["id"] == "parallelize":
            result = _parallelize()
            torch.save(result, os.path.join(out_dir, f"parallelize.rank{dist.get_rank()}.pt"))
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
    fsdp = kind in FSDP_KINDS and dtype is not None
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
    cases = [{"id": kind, "kind": kind, "steps": steps} for kind in kinds] + list(extra)
    loaded, _ = run_cases("test_precision:train_cases", {2: cases}, out_dir, timeout_s=900)
    return loaded


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    return launch(QUICK_KINDS, STEPS, tmp_path_factory.mktemp("precision"),
                  extra=[{"id": "dp-fp32", "kind": "dp", "steps": STEPS, "precision": "fp32"},
                         {"id": "parallelize"}] +
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
