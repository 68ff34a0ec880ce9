"""A Job JSON whose convergence model is the measured critical batch.

    est = hybridplan.noise_scale(module, data, loss_fn, small_batch=8, big_batch=128, steps=50)
    job = critical_batch_job(est, samples_per_epoch=1281167, per_replica_batch=64,
                             epochs_at=(256, 90))      # or epochs_min=30
    hybridplan.plan(graph, "dgx1-v100", job)

`trajectory_job` does the same with the noise scale measured at several points of a run (the
planner's trajectory form), as `python -m hybridplan convergence` writes it beside the Job of
the batch-size trade-off it measured directly.

critical_batch is B_simple (McCandlish et al., https://arxiv.org/abs/1812.06162, section 2.2:
the critical batch is close to the simple noise scale). epochs_min, the epochs an infinitely
small batch would need, is not in the gradients: the user gives it, or gives one measured point
(B, E) from which it follows by inverting the critical-batch model,
    E = epochs_min * (1 + B / B_crit)   =>   epochs_min = E / (1 + B / B_crit).
The model itself lives in csrc/planner/run/convergence.h; tests/python/test_noise_scale.py holds
this inverse to it by planning at B and reading back E.

The job carries the measurement under "noise_scale" (docs/formats.md), which the loaders ignore.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from typing import Any, Dict, Optional, Sequence, Tuple

from .noise_scale import NoiseScale

# The planner is imported inside the functions that use it, so that importing this module
# (convergence does, at its top) does not load the planner's compiled extension.

PROVENANCE_KEY = "noise_scale"


def epochs_min_from_point(global_batch: float, epochs: float, critical_batch: float) -> float:
    """epochs_min such that epochs_min * (1 + global_batch / critical_batch) == epochs."""
    for name, value in (("global_batch", global_batch), ("epochs", epochs),
                        ("critical_batch", critical_batch)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"epochs_at: {name} must be finite and > 0 (got {value!r})")
    return epochs / (1 + global_batch / critical_batch)


def _epochs_min(critical_batch: float, epochs_min: Optional[float],
                epochs_at: Optional[Tuple[float, float]]) -> Tuple[float, Dict[str, Any]]:
    """epochs_min and how it was obtained (the provenance's "epochs_min_from")."""
    if (epochs_min is None) == (epochs_at is None):
        raise ValueError("critical_batch_job: give exactly one of epochs_min and epochs_at "
                         f"(got epochs_min={epochs_min!r}, epochs_at={epochs_at!r})")
    if epochs_min is not None:
        if not math.isfinite(epochs_min) or epochs_min <= 0:
            raise ValueError(f"critical_batch_job: epochs_min must be finite and > 0 "
                             f"(got {epochs_min!r})")
        return float(epochs_min), {"given": float(epochs_min)}
    global_batch, epochs = epochs_at
    return (epochs_min_from_point(global_batch, epochs, critical_batch),
            {"global_batch": float(global_batch), "epochs": float(epochs)})


def provenance(estimate: NoiseScale, epochs_min_from: Dict[str, Any],
               model: Optional[str] = None) -> Dict[str, Any]:
    """The measurement behind the job's critical batch (docs/formats.md, Job, "noise_scale")."""
    record = {"b_simple": estimate.b_simple, "stderr": estimate.stderr,
              "g_squared": estimate.g_squared, "trace_sigma": estimate.trace_sigma,
              "small_batch": estimate.small_batch, "big_batch": estimate.big_batch,
              "steps": estimate.steps,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "epochs_min_from": epochs_min_from}
    if model:
        record["model"] = model
    return record


def _critical_batch(estimate: NoiseScale) -> float:
    """estimate.b_simple, or ValueError when it is no usable critical batch."""
    b_simple = estimate.b_simple
    if not math.isfinite(b_simple) or b_simple <= 0:
        raise ValueError(f"noise_scale: b_simple must be finite and > 0 for a critical batch "
                         f"(got {b_simple!r}; |G|^2 estimate {estimate.g_squared!r} over "
                         f"{estimate.steps} steps): use more steps or a bigger big_batch")
    return b_simple


def critical_batch_job(estimate: NoiseScale, samples_per_epoch: int, *,
                       epochs_min: Optional[float] = None,
                       epochs_at: Optional[Tuple[float, float]] = None,
                       per_replica_batch: Optional[int] = None,
                       global_batch: Optional[int] = None, optimizer: str = "sgd_momentum",
                       model: Optional[str] = None) -> dict:
    """A Job dict (validated by the planner) with convergence {"model": "critical_batch",
    "critical_batch": estimate.b_simple, "epochs_min": ...} and the provenance. `epochs_at` is
    a (global_batch, epochs) point; give it or `epochs_min`. ValueError when the estimate has no
    finite positive B_simple (|G|^2 not resolved above the noise: more steps or bigger batches)."""
    b_simple = _critical_batch(estimate)
    e_min, epochs_min_from = _epochs_min(b_simple, epochs_min, epochs_at)
    job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": samples_per_epoch,
           "optimizer": optimizer,
           "convergence": {"model": "critical_batch", "epochs_min": e_min,
                           "critical_batch": b_simple}}
    if per_replica_batch is not None:
        job["per_replica_batch"] = per_replica_batch
    if global_batch is not None:
        job["global_batch"] = global_batch
    from ..planner import Job  # the planner's loader is the one validation of a Job

    Job.from_dict(job, "noise-scale job")
    job[PROVENANCE_KEY] = provenance(estimate, epochs_min_from, model)
    return job


def trajectory_job(trajectory: Sequence[Tuple[float, float]], point: Tuple[int, float],
                   samples_per_epoch: int, **job_fields) -> Optional[dict]:
    """A Job whose critical batch is the noise scale B_simple along the run
    ([[progress, B_simple], ...], the planner's trajectory form) and whose epochs_min makes the
    model pass through one measured (global batch, epochs) point, as `critical_batch_job`'s
    epochs_at does. None when an estimate is not finite and positive."""
    from .. import planner

    if not trajectory or any(not (math.isfinite(b) and b > 0) for _, b in trajectory):
        return None
    job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": samples_per_epoch,
           "optimizer": job_fields.pop("optimizer", "sgd_momentum"),
           "convergence": {"model": "critical_batch", "epochs_min": 1.0,
                           "critical_batch": [[p, b] for p, b in trajectory]}}
    job.update({k: v for k, v in job_fields.items() if v is not None})
    batch, epochs = point
    job["convergence"]["epochs_min"] = epochs / planner.epochs_to_target(job, batch)
    return job


def measured_job(job: Any, estimate: NoiseScale, *, epochs_at: Optional[Tuple[float, float]] = None
                 ) -> dict:
    """`job` (a Job, dict or path) with its convergence model replaced by the measured critical
    batch: {"model": "critical_batch", "critical_batch": estimate.b_simple, "epochs_min": ...}
    (a trajectory becomes the one measured value: the critical batch now). epochs_min is the
    job's own under a critical_batch model; otherwise it follows from `epochs_at` (a
    (global_batch, epochs) point, e.g. what the job's table says for the running plan's batch).
    Everything else in the job is kept."""
    from ..planner import Job, as_job

    d = as_job(job).to_dict()
    b_simple = _critical_batch(estimate)
    convergence = d.get("convergence") or {}
    if convergence.get("model") == "critical_batch" and epochs_at is None:
        e_min, epochs_min_from = _epochs_min(b_simple, convergence["epochs_min"], None)
    elif epochs_at is not None:
        e_min, epochs_min_from = _epochs_min(b_simple, None, epochs_at)
    else:
        raise ValueError(f"job: convergence.model must be critical_batch, or epochs_at given, "
                         f"for a measured critical batch (epochs_min is not in the gradients) "
                         f"(got {convergence.get('model', 'none')})")
    d["convergence"] = {"model": "critical_batch", "epochs_min": e_min,
                        "critical_batch": b_simple}
    Job.from_dict(d, "measured job")
    d[PROVENANCE_KEY] = provenance(estimate, epochs_min_from)
    return d


@dataclasses.dataclass(frozen=True)
class SwitchAdvice:
    """Whether the running plan should give way, priced with the measured critical batch.

    Times are the planner's time_to_train_s of the whole run under the measured critical batch;
    with a constant critical batch every plan's time scales alike with the part of the run left,
    so `gain` is also the predicted gain over what remains (less what a switch costs:
    `hybridplan.plan_over_run` prices switches, and csrc/planner/run/run_phases.h's
    default_switch_s is a restart plus a checkpoint round trip)."""

    critical_batch: float     # measured B_simple
    stderr: float             # of critical_batch
    current: dict             # the running plan's breakdown under the measured job (evaluate)
    current_time_s: float
    best: Any                 # planner.Plan: the best plan for the measured critical batch
    best_time_s: float
    gain: float               # current_time_s / best_time_s - 1: time saved by switching
    gain_range: Tuple[float, float]   # the gain at critical_batch -+ 2 stderr (low, high end)
    switch: bool              # best is another configuration, gain >= min_gain at the estimate
                              # and > 0 at both ends of its +- 2 stderr
    job: dict                 # the measured job the plans were priced with

    def __str__(self) -> str:
        b = self.best
        lo, hi = (100 * g for g in self.gain_range)
        verdict = (f"switch to dp {b.dp} x mp {b.mp} {b.mode}, global batch {b.global_batch}: "
                   f"{100 * self.gain:.1f} % faster ({lo:.1f} to {hi:.1f} % within 2 stderr)"
                   if self.switch else
                   f"keep the running plan (best alternative {100 * self.gain:.1f} % faster at the "
                   f"estimate, {lo:.1f} to {hi:.1f} % within 2 stderr)")
        return (f"measured critical batch {self.critical_batch:.4g} +- {self.stderr:.2g}: "
                f"{verdict}")


def _best_plan(graph: Any, cluster: Any, job: dict, devices: int, processes: Optional[int],
               modes: Tuple[str, ...], running: Any) -> Any:
    """The search's best plan on `devices` devices of `modes`; with `processes`, the best that
    runs on that many processes (`running` when none of the best 512 does)."""
    from .. import planner

    if processes is None:
        return planner.plan(graph, cluster, job, devices=devices, modes=modes)
    for top_k in (64, 512):
        plans = planner.search(graph, cluster, job, devices=devices, top_k=top_k,
                               modes=modes).plans
        fitting = [p for p in plans if p.num_processes == processes and p.mode in modes]
        if fitting:
            return fitting[0]
        if len(plans) < top_k:
            break
    return running


_CONFIG_KEYS = ("dp", "mp", "mode", "per_replica_batch", "global_batch", "num_microbatches",
                "schedule")


def switch_advice(plan: Any, estimate: NoiseScale, graph: Any, cluster: Any, job: Any, *,
                  devices: Optional[int] = None, min_gain: float = 0.05,
                  processes: Optional[int] = None, modes: Optional[Sequence[str]] = None
                  ) -> SwitchAdvice:
    """Prices the running `plan` (a Plan, dict or path) and the best plan on the same number of
    devices (`devices`, default the plan's world size) with the measured critical batch in place
    of `job`'s (measured_job; a job without a critical_batch model takes epochs_min from the
    point (plan's global batch, epochs the job gives it)), and advises a switch when the best
    plan is another configuration that is at least `min_gain` faster at the estimate and still
    faster (gain > 0) with the critical batch 2 standard errors below and above it: a switch
    costs a restart, so a noisy estimate does not trigger one. `processes`: only plans that run
    on that many processes (one per device: what the running job can switch to in place, see
    AppliedPlan.switch; a placement plan with mp > 1 runs a replica in one process) are
    candidates, the best of the search's 64 (then 512) best; when none is, the advice keeps the
    running plan. `modes`: the plan modes searched (default all)."""
    from .. import planner

    if not isinstance(min_gain, (int, float)) or not math.isfinite(min_gain) or min_gain < 0:
        raise ValueError(f"switch_advice: min_gain must be finite and >= 0 (got {min_gain!r})")
    running = planner.as_plan(plan)
    if planner.as_job(job).to_dict().get("convergence", {}).get("model") == "critical_batch":
        epochs_at = None
    else:
        epochs = planner.evaluate(graph, cluster, running, job).get("epochs", 0)
        if not epochs:
            raise ValueError("job: convergence must be given for switch advice: without it the "
                             "planner's objective is samples/s, which the critical batch does "
                             "not change (got none)")
        epochs_at = (running.global_batch, epochs)
    measured = measured_job(job, estimate, epochs_at=epochs_at)
    current = planner.evaluate(graph, cluster, running, measured)
    best = _best_plan(graph, cluster, measured,
                      devices if devices is not None else running.world_size, processes,
                      tuple(modes) if modes is not None else planner.MODES, running)
    current_s = current["time_to_train_s"]
    best_s = current_s if best is running else best.predicted["time_to_train_s"]
    gain = current_s / best_s - 1
    same = all(best.to_dict().get(k) == running.to_dict().get(k) for k in _CONFIG_KEYS)

    def gain_at(critical_batch: float) -> float:
        if not math.isfinite(critical_batch) or critical_batch <= 0:
            return -math.inf   # the estimate does not bound the critical batch on this side
        job_at = dict(measured, convergence=dict(measured["convergence"],
                                                 critical_batch=critical_batch))
        job_at.pop(PROVENANCE_KEY, None)
        return (planner.evaluate(graph, cluster, running, job_at)["time_to_train_s"]
                / planner.evaluate(graph, cluster, best, job_at)["time_to_train_s"] - 1)
    ends = [gain_at(estimate.b_simple + k * 2 * estimate.stderr) for k in (-1, 1)]
    gain_range = (min(ends), max(ends))
    switch = (not same) and gain >= min_gain and gain_range[0] > 0
    return SwitchAdvice(critical_batch=estimate.b_simple, stderr=estimate.stderr,
                        current=current, current_time_s=current_s, best=best, best_time_s=best_s,
                        gain=gain, gain_range=gain_range, switch=switch, job=measured)
