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
switched runs equal one process trained on the same global batches). The switch itself is
AppliedPlan.switch (executor.py: it takes the running plan apart and rebuilds it with apply);
this module holds the adaptive mode's policy, which switches through it.

What a switch carries over: the model and optimizer state (lr and the other hyperparameters
as they are in the optimizer's param_groups at the switch: nothing is rescaled), step_count,
loss_fn, the optimizer factory, timeout, batch_dim, the noise-scale options, the adaptive
policy and any attribute the user set on hp. What it does not: the optimizer object (a new one
is built by the factory: an LR scheduler built on the old one must be rebuilt), the noise-scale
estimate (its moving averages restart under the new per-replica batch), the module of a sharded
plan (FSDP2 cannot be undone: pass module=, a freshly built model).

Adaptive mode (apply(..., adapt=Adapt(...)), needs measure_noise_scale): after every step
whose step_count is at least `every` steps after the last check and `min_interval_steps` after
apply() or the last switch, rank 0 asks AppliedPlan.switch_advice (the measured critical batch,
the best plan on this job's processes) and broadcasts its decision, so every rank switches
alike. On a switch rank 0 logs one line to stderr (why: the measured critical batch and its
standard error, the current and new plan, the predicted gain) and every rank calls
Adapt.on_switch(hp, record), e.g. to rescale the learning rate or rebuild a scheduler.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.distributed as dist

from ..planner import Plan
from .plan_spec import parse_plan

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
