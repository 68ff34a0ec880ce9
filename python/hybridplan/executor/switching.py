"""Plan switches inside a running job (AppliedPlan.switch) and the adaptive mode (Adapt).

    hp.switch(other_plan)                  # every rank; hp now trains under other_plan
    hp = hybridplan.apply(plan, model, optimizer=factory, measure_noise_scale=5,
                          adapt=hybridplan.Adapt(graph, cluster, job, every=20,
                                                 min_interval_steps=100))

A switch moves the job to another plan on the same processes, the training state handed over
in memory: every rank agrees that the new plan fits (its world size, the module, the options)
while the old plan is intact, so a plan that does not fit raises ValueError on every rank and
the old plan trains on; then AppliedPlan.consolidated_state() gathers the whole state, the old
plan's own process groups are destroyed (the default group stays), and apply(new plan, module,
resume_from=that state) builds the new one. The AppliedPlan object itself becomes the new plan
(its attributes are the new plan's: plan, module, optimizer, ...), so a training loop that
calls hp.step keeps working; the training continues exactly (tests/python/test_switch.py:
switched runs equal one process trained on the same global batches). This module holds both:
the switch (the Switching role of AppliedPlan: switch_plan takes the running plan apart and
rebuilds it with recipe.apply, the one way a plan is built) and the adaptive mode's policy,
which switches through it.

What a switch carries over: the model and optimizer state (lr and the other hyperparameters
as they are in the optimizer's param_groups at the switch: nothing is rescaled), step_count,
the LR scheduler (apply's lr_scheduler factory builds it on the new optimizer and its state is
restored, so the schedule goes on where it was), loss_fn, the optimizer factory, clip_grad_norm,
accumulation_steps, timeout, batch_dim, the noise-scale options, the adaptive policy and any
attribute the user set on hp. What it does not: the optimizer object (a new one is built by the
factory: hp.optimizer and hp.lr_scheduler are new objects), the noise-scale estimate (its
moving averages restart under the new per-replica batch), the module of a sharded plan (FSDP2
cannot be undone: pass module=, a freshly built model).

Adaptive mode (apply(..., adapt=Adapt(...)), needs measure_noise_scale): after every step
whose step_count is at least `every` steps after the last check and `min_interval_steps` after
apply() or the last switch, rank 0 asks AppliedPlan.switch_advice (the measured critical batch,
the best plan on this job's processes) and broadcasts its decision, so every rank switches
alike. On a switch rank 0 logs one line to stderr (why: the measured critical batch and its
standard error, the current and new plan, the predicted gain) and every rank calls
Adapt.on_switch(hp, record), e.g. to rescale the learning rate.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..planner import Plan
from ..profiler.dataflow import map_tensors, resize_batch
from . import batch_norm, checkpoint, compiling, rank_agreement
from .lifecycle import Lifecycle, destroy_groups
from .checks import check_step_options, local_checks
from .plan_spec import parse_plan
from .rank_agreement import RankReport, param_signature

__all__ = ["Adapt", "maybe_adapt", "describe"]


@dataclasses.dataclass
class Adapt:
    """The adaptive mode's policy: apply(..., adapt=Adapt(graph, cluster, job)).

    graph, cluster, job  what switch_advice prices plans with (the graph the running plan was
               planned on, the cluster, the job with its convergence model); None: those of
               hybridplan.parallelize (hp.parallelized).
    every      check the advice at most every `every` steps (each check: a planner search on
               rank 0 and one small broadcast).
    min_interval_steps  no switch before this many steps after apply() or the last switch
               (the noise-scale estimate restarts at each switch; no check before either).
    min_gain   switch_advice's: the predicted time-to-train gain a switch must bring.
    modes      the plan modes a switch may go to (default: all); the candidates always run on
               this job's processes, one per device.
    on_switch  called on every rank after each adaptive switch, as on_switch(hp, record)
               (record: the entry appended to hp.switches), e.g. to rescale the learning rate.
    log        print on rank 0 (stderr) a line per switch (and per failed advice).
    verbose    also a line per check that keeps the running plan (the advice, and why).
    """

    graph: Any = None
    cluster: Any = None
    job: Any = None
    every: int = 50
    min_interval_steps: int = 200
    min_gain: float = 0.05
    modes: Optional[Sequence[str]] = None
    on_switch: Optional[Callable[[Any, Dict[str, Any]], None]] = None
    log: bool = True
    verbose: bool = False

    def __post_init__(self) -> None:
        for name in ("every", "min_interval_steps"):
            value = getattr(self, name)
            low = 1 if name == "every" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"hybridplan.Adapt: {name} must be an integer >= {low} "
                                 f"(got {value!r})")
        if (isinstance(self.min_gain, bool) or not isinstance(self.min_gain, (int, float))
                or not math.isfinite(self.min_gain) or self.min_gain < 0):
            raise ValueError(f"hybridplan.Adapt: min_gain must be finite and >= 0 "
                             f"(got {self.min_gain!r})")
        if (self.graph is None) != (self.cluster is None) or (self.graph is None) != (
                self.job is None):
            raise ValueError("hybridplan.Adapt: give graph, cluster and job together, or none "
                             "of them (then hybridplan.parallelize's are used)")


def describe(spec: Any) -> str:
    """"dp 2 x mp 1 placement, global batch 64 (32 per replica)" (+ schedule, sharding)."""
    text = f"dp {spec.dp} x mp {spec.mp} {spec.mode}"
    if spec.mode == "pipeline":
        text += f" {spec.schedule} M={spec.num_microbatches}"
    if spec.sharding != "none":
        text += f" {spec.sharding}"
    return (f"{text}, global batch {spec.dp * spec.per_replica_batch} "
            f"({spec.per_replica_batch} per replica)")


# ---- the adaptive mode ------------------------------------------------------------------------

def check_adapt(adapt: Any, measure_noise_scale: int) -> None:
    """ValueError unless `adapt` is an Adapt (or None) and the noise scale is measured."""
    if adapt is None:
        return
    if not isinstance(adapt, Adapt):
        raise ValueError(f"hybridplan.apply: adapt must be a hybridplan.Adapt or None (got "
                         f"{type(adapt).__name__})")
    if not measure_noise_scale:
        raise ValueError("hybridplan.apply: adapt= needs measure_noise_scale=N > 0: the "
                         "advice is priced with the measured critical batch (the gradient "
                         "noise scale)")


def _advice_inputs(hp: Any, policy: Adapt):
    if policy.graph is not None:
        return policy.graph, policy.cluster, policy.job
    parallelized = getattr(hp, "parallelized", None)
    if parallelized is None:
        raise ValueError("hybridplan.Adapt: give graph, cluster and job (the running plan was "
                         "not made by hybridplan.parallelize)")
    return parallelized.graph, parallelized.cluster, parallelized.job


def _decide(hp: Any, policy: Adapt, chosen: Dict[str, Any]) -> Dict[str, Any]:
    """Rank 0's decision: {"switch": bool, "plan": the plan's JSON, "record": {...}, "line":
    str}; the Plan itself goes into chosen["plan"] (rank 0 switches to that object)."""
    graph, cluster, job = _advice_inputs(hp, policy)
    advice = hp.switch_advice(graph, cluster, job, min_gain=policy.min_gain,
                              processes=dist.get_world_size(), modes=policy.modes)
    if advice is None:
        return {"switch": False, "line": f"hybridplan adapt: step {hp.step_count}: no "
                                         f"noise-scale estimate yet"}
    if not advice.switch:
        return {"switch": False, "line": f"hybridplan adapt: step {hp.step_count}: {advice}"}
    new = chosen["plan"] = parse_plan(advice.best)  # the search's Plan, as it is
    lo, hi = (100 * g for g in advice.gain_range)
    record = {"critical_batch": advice.critical_batch, "stderr": advice.stderr,
              "gain": advice.gain, "gain_range": tuple(advice.gain_range),
              "reason": "adapt"}
    line = (f"hybridplan adapt: step {hp.step_count}: measured critical batch "
            f"{advice.critical_batch:.4g} +- {advice.stderr:.2g} (1 stderr); switching from "
            f"{describe(hp.plan)} to {describe(new)}: predicted {100 * advice.gain:.1f} % "
            f"faster to train ({lo:.1f} to {hi:.1f} % within 2 stderr)")
    return {"switch": True, "plan": new.to_json(), "record": record, "line": line}


def maybe_adapt(hp: Any) -> bool:
    """After a step under apply(..., adapt=): checks the advice when the policy's intervals
    have passed and switches when it says so (every rank alike: rank 0 decides and broadcasts).
    Returns whether hp switched. Collective on the steps where it checks."""
    policy: Adapt = hp._adapt
    state = hp._adapt_state
    step = hp.step_count
    if (hp._noise is None or step - state["switched"] < policy.min_interval_steps
            or step - state["checked"] < policy.every):
        return False
    state["checked"] = step
    box: List[Any] = [None]
    chosen: Dict[str, Any] = {}
    if hp.rank == 0:
        try:
            box[0] = _decide(hp, policy, chosen)
        except Exception as e:  # training goes on; the next check may succeed
            box[0] = {"switch": False,
                      "line": f"hybridplan adapt: step {step}: no advice "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:300]})",
                      "warn": True}
    dist.broadcast_object_list(box, src=0)
    decision = box[0]
    if hp.rank == 0 and policy.log and (decision["switch"] or decision.get("warn")
                                        or policy.verbose):
        print(decision["line"], file=sys.stderr, flush=True)
    if not decision["switch"]:
        return False
    plan = chosen.get("plan") or Plan.from_json(decision["plan"], "plan from rank 0")
    try:
        hp.switch(plan, record=decision["record"])
    except ValueError as e:  # refused before anything changed (every rank alike)
        if hp.rank == 0 and policy.log:
            print(f"hybridplan adapt: step {step}: switch refused, training on under "
                  f"{describe(hp.plan)} ({' '.join(str(e).split())[:300]})",
                  file=sys.stderr, flush=True)
        return False
    if policy.on_switch is not None:
        policy.on_switch(hp, hp.switches[-1])
    return True


# ---- the switch itself (AppliedPlan.switch) ----------------------------------------------

class Switching:
    """AppliedPlan's switching role (switch in place; the adaptive mode above calls it)."""

    def switch(self, plan: Any, *, module: Optional[nn.Module] = None, example_inputs: Any = None,
               **apply_options: Any) -> Any:
        """Moves this job to `plan` on the same processes, without a restart: every rank must
        call it (collective). This AppliedPlan becomes the new plan (plan, module, optimizer,
        ... are the new plan's; step() goes on) and is returned. The training state (model,
        optimizer state and hyperparameters as they are now: the learning rate is not
        rescaled, step_count) is handed over in memory (consolidated_state); loss_fn, the
        optimizer factory, timeout, batch_dim, the noise-scale options and the adaptive policy
        carry over unless `apply_options` (apply's keyword arguments, not resume_from) say
        otherwise. The default process group stays; the old plan's own groups are destroyed.

        module      required after a sharded plan (FSDP2 cannot be undone): a freshly built
                    model of the same architecture; otherwise the running module is reused.
        example_inputs  pipeline plans: one replica batch at the new per_replica_batch; by
                    default rank 0's last step's inputs, cut or repeated to it.

        Raises ValueError on every rank, with the old plan unchanged and still training, when
        the new plan does not fit (world size, module, options; an Optimizer instead of a
        factory; a sharded module without module=). A failure while building the new plan
        (after the old one is closed) leaves this AppliedPlan closed. apply's lr_scheduler is
        rebuilt on the new optimizer, its state restored; other objects built on the old
        optimizer must be rebuilt on hp.optimizer. See executor/switching.py.
        """
        return switch_plan(self, plan, module=module, example_inputs=example_inputs,
                       **apply_options)



# apply() options a switch accepts (the rest are apply's own: resume_from is the running state)
_OPTIONS = ("loss_fn", "optimizer", "timeout_s", "graph", "batch_dim", "measure_noise_scale",
            "noise_scale_decay", "adapt", "retain_freed_memory", "sync_batchnorm",
            "clip_grad_norm", "accumulation_steps", "lr_scheduler", "compile")
_STATE_NOTE = ("The training state at the switch is the exception's .hybridplan_state: "
               "hybridplan.apply(plan, module, resume_from=e.hybridplan_state) resumes it")
# AppliedPlan's own public attributes: every other public attribute is the user's, carried over
_OWN = {"plan", "original", "loss_fn", "batch_dim", "rank", "replica", "stage", "stages",
        "predicted_step_s", "recorded_actions", "step_count", "shard_units", "optimizer",
        "module", "ddp", "devices", "device", "switches", "layout", "tp_rank"}


def _agree(rank: int, plan_sha: Optional[str], error: Optional[str], module: nn.Module) -> None:
    """Every rank's local verdict gathered and judged alike (rank_agreement): ValueError on
    every rank if one failed, naming that the running plan is unchanged."""
    try:
        signature = param_signature(module) if error is None else []
        rank_agreement.agree_across_ranks(
            RankReport(rank, plan_sha, error, signature, *rank_agreement.local_versions()))
    except ValueError as e:
        raise ValueError(f"hybridplan switch refused ({e}); the running plan is unchanged and "
                         f"trains on") from None


def _derived_example(hp: Any, spec: Any) -> Any:
    """One replica batch at the new plan's per_replica_batch from rank 0's last step's inputs
    (rank 0 holds replica 0's inputs under every plan), broadcast to every rank; None when
    rank 0 has none (no step yet) or the batch is not along dim 0. Collective."""
    box: List[Any] = [None]
    if hp.rank == 0 and hp._last_inputs is not None and hp.batch_dim == 0:
        box[0] = resize_batch(map_tensors(hp._last_inputs, lambda t: t.detach().cpu()),
                              spec.per_replica_batch)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _unplace(hp: Any) -> None:
    """Undoes what a placement plan did to the original module besides DDP: the input-moving
    hooks and the recompute wrappers; drops its gradients."""
    for handle in getattr(hp, "_hooks", None) or []:
        handle.remove()
    if hp.plan.mode == "placement":
        compiling.uncompile_blocks(hp.original, hp.plan.assignment)  # under recompute's wrapper
        for name in hp.plan.recompute:
            node = hp.original.get_submodule(name.split("@")[0])
            if getattr(node.__dict__.get("forward"), "_hybridplan_recompute", False):
                del node.forward  # recompute() set it on the instance
    if hp.plan.mode == "placement" and hp.plan.sharding == "none":
        for p in hp.original.parameters():
            p.grad = None


def switch_plan(hp: Any, plan: Any, *, module: Optional[nn.Module] = None,
                example_inputs: Any = None, record: Optional[Dict[str, Any]] = None,
                **options: Any) -> Any:
    """AppliedPlan.switch (see there and this module's doc)."""
    # The switch rebuilds through the recipe that built hp (hp._rebuild: recipe.apply, handed
    # to AppliedPlan by apply itself, so this module needs no import of the recipe above it).
    apply = hp._rebuild

    hp._check_open("switch")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"AppliedPlan.switch() got unexpected options {unknown} (it takes "
                        f"apply's {list(_OPTIONS)}; the state comes from the running plan)")
    settings = dict(hp._switch_options)
    settings.update(options)  # loss_fn None: the module's default (apply's rule)
    requested_measure = settings["measure_noise_scale"]  # kept for later switches
    rank, world = hp.rank, dist.get_world_size()
    target = module if module is not None else hp.original
    spec, plan_sha, error, dropped = None, None, None, False
    try:
        if isinstance(settings["optimizer"], torch.optim.Optimizer):
            raise ValueError("a switch builds a new optimizer over the new plan's parameters: "
                             "pass apply(..., optimizer=) a factory (params -> Optimizer, e.g. "
                             "functools.partial(torch.optim.SGD, lr=0.1)), not an Optimizer "
                             "(its state is carried over by parameter name)")
        if target is hp.original and hp.plan.sharding != "none":
            raise ValueError(f"the running plan shards the module (\"sharding\": "
                             f"{hp.plan.sharding!r}), which FSDP2 cannot undo: pass "
                             f"switch(..., module=) a freshly built model (the same "
                             f"architecture; its weights are replaced by the running state)")
        if target is hp.original and hp.plan.tp > 1:
            raise ValueError(f"the running plan splits the module over its TP groups (\"tp\": "
                             f"{hp.plan.tp}; its parameters are DTensors), which cannot be "
                             f"undone: pass switch(..., module=) a freshly built model (the "
                             f"same architecture; its weights are replaced by the running "
                             f"state)")
        if target is hp.original and any(t.is_meta for t in list(target.parameters())
                                         + list(target.buffers())):
            raise ValueError("the running plan's module was built on the meta device and "
                             "its weights live in this plan's stages only (docs/real_size."
                             "md): pass switch(..., module=) a model built on a real device "
                             "(the same architecture; its weights are replaced by the "
                             "running state)")
        spec = parse_plan(plan)  # read once: the new plan's object from here on
        plan_sha = spec.sha256
        if ("measure_noise_scale" not in options and settings["measure_noise_scale"]
                and (spec.dp < 2 or spec.sharding != "none" or spec.tp > 1)):
            settings["measure_noise_scale"] = 0  # the new plan cannot measure it (noise.py)
            dropped = True
        if options.get("adapt") is not None:
            check_adapt(options["adapt"], settings["measure_noise_scale"])
    except ValueError as e:
        error = str(e)
    _agree(rank, plan_sha, error, target)
    if spec.mode == "pipeline" and example_inputs is None:
        example_inputs = _derived_example(hp, spec)
        if example_inputs is not None:
            device = next((p.device for p in target.parameters()), torch.device("cpu"))
            example_inputs = map_tensors(example_inputs, lambda t: t.to(device))
    try:
        if spec.mode == "pipeline" and example_inputs is None:
            raise ValueError(f"{spec.source}: a switch to a pipeline plan needs "
                             f"example_inputs= (one replica batch of per_replica_batch="
                             f"{spec.per_replica_batch} samples: the stages are cut by "
                             f"torch.export at that shape); it is derived from the last "
                             f"step's inputs when they are batched along dim 0, and no step "
                             f"has run or batch_dim is {hp.batch_dim}")
        local_checks(spec, target, settings.get("graph"), world, example_inputs,
                     settings["batch_dim"], settings["measure_noise_scale"],
                     settings["noise_scale_decay"], settings["optimizer"])
        batch_norm.check_sync(spec, target, settings.get("sync_batchnorm", False))
        check_step_options(settings.get("clip_grad_norm"), settings.get("accumulation_steps"),
                           settings.get("lr_scheduler"))
        if target is hp.original and hp._switch_options.get("sync_batchnorm") \
                and not settings.get("sync_batchnorm"):
            raise ValueError("the running plan converted the module's BatchNorm layers to "
                             "SyncBatchNorm over its replicas' group: pass switch(..., "
                             "module=) a freshly built model to train without sync_batchnorm")
    except ValueError as e:
        error = str(e)
    _agree(rank, plan_sha, error, target)
    state = hp.consolidated_state()  # collective; the old plan is still intact
    if module is not None:
        try:
            checkpoint.check_model(state, module, "the running state")
        except ValueError as e:
            error = str(e)
        _agree(rank, plan_sha, error, module)

    # ---- past this point the old plan is gone: a failure leaves hp closed ----
    old_spec, step = hp.plan, hp.step_count
    carried = {k: v for k, v in hp.__dict__.items()
               if not k.startswith("_") and k not in _OWN}
    switches = list(hp.switches)
    adapt_state = dict(hp._adapt_state)
    old_ddp = weakref.ref(hp.ddp) if getattr(hp, "ddp", None) is not None else None
    reused = target is hp.original
    hp._settle()
    hp.wait_checkpoint()  # an asynchronous save in flight completes on the old plan's group
    if hp._noise is not None:
        hp._noise.collect(wait=True)  # no noise-scale all-reduce left in flight
    dist.barrier()  # every rank is done with the old plan's collectives
    if reused:
        _unplace(hp)
    groups, ids = hp._groups, {k: hp.__dict__[k] for k in ("rank", "replica", "stage")}
    hp.__dict__.clear()  # drops the DDP wrappers, the pipeline schedule, the optimizer
    hp.__dict__.update(ids, plan=old_spec, _closed=True, _groups=[])  # a closed plan's
    destroy_groups(groups)  # gc first: the old DDP's reducer goes before its group
    if reused and old_ddp is not None and old_ddp() is not None:
        gc.collect()
        if old_ddp() is not None:
            Lifecycle.forget(hp)
            error = RuntimeError("hybridplan switch: the old plan's DistributedDataParallel "
                                 "wrapper is still referenced (a reference to hp.ddp kept by "
                                 "the caller?); its reducer's hooks would fire in the new "
                                 "plan's backward. hp is closed")
            error.hybridplan_state = state
            error.add_note(_STATE_NOTE)
            raise error
    try:
        new = apply(
            spec, target, loss_fn=settings["loss_fn"], optimizer=settings["optimizer"],
            timeout_s=settings["timeout_s"], graph=settings.get("graph"),
            batch_dim=settings["batch_dim"], example_inputs=example_inputs,
            measure_noise_scale=settings["measure_noise_scale"],
            noise_scale_decay=settings["noise_scale_decay"], resume_from=state,
            retain_freed_memory=settings.get("retain_freed_memory", True),
            sync_batchnorm=settings.get("sync_batchnorm", False),
            clip_grad_norm=settings.get("clip_grad_norm"),
            accumulation_steps=settings.get("accumulation_steps"),
            compile=settings.get("compile"),
            lr_scheduler=settings.get("lr_scheduler"))
    except BaseException as e:
        Lifecycle.forget(hp)
        e.hybridplan_state = state
        e.add_note("hybridplan switch: the new plan could not be built after the old one was "
                   "closed; this AppliedPlan is closed. " + _STATE_NOTE)
        raise
    # hp becomes the new plan: its attributes are new's, and new is no longer tracked apart
    hp.__dict__.update(new.__dict__)
    hp.__dict__.update(carried)
    Lifecycle.open_plans = [r for r in Lifecycle.open_plans if r() is not new]
    new.__dict__.clear()
    new._closed = True
    entry = {"step": step, "from": describe(old_spec), "to": describe(hp.plan),
             "reason": "switch()"}
    entry.update(record or {})
    hp.switches = switches + [entry]
    adapt_state["switched"] = adapt_state["checked"] = step
    hp._adapt_state = adapt_state
    hp._adapt = settings.get("adapt")
    hp._switch_options.update(adapt=hp._adapt, measure_noise_scale=requested_measure)
    if dropped and rank == 0:
        warnings.warn(f"hybridplan switch: the new plan ({describe(hp.plan)}) cannot measure "
                      f"the gradient noise scale (it needs dp >= 2 and no sharding): "
                      f"measure_noise_scale is off from here on"
                      + ("; the adaptive mode pauses" if hp._adapt is not None else ""),
                      stacklevel=3)
    return hp
