"""A Job JSON whose convergence model is the measured critical batch.

    est = hybridplan.noise_scale(module, data, loss_fn, small_batch=8, big_batch=128, steps=50)
    job = critical_batch_job(est, samples_per_epoch=1281167, per_replica_batch=64,
                             epochs_at=(256, 90))      # or epochs_min=30
    hybridplan.plan(graph, "dgx1-v100", job)

critical_batch is B_simple (McCandlish et al., https://arxiv.org/abs/1812.06162, section 2.2:
the critical batch is close to the simple noise scale). epochs_min, the epochs an infinitely
small batch would need, is not in the gradients: the user gives it, or gives one measured point
(B, E) from which it follows by inverting the critical-batch model,
    E = epochs_min * (1 + B / B_crit)   =>   epochs_min = E / (1 + B / B_crit).
The model itself lives in csrc/planner/convergence.h; tests/python/test_noise_scale.py holds
this inverse to it by planning at B and reading back E.

The job carries the measurement under "noise_scale" (docs/formats.md), which the loaders ignore.
"""

from __future__ import annotations

import datetime
import math
from typing import Any, Dict, Optional, Tuple

from .gradient_noise import NoiseScale

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
    b_simple = estimate.b_simple
    if not math.isfinite(b_simple) or b_simple <= 0:
        raise ValueError(f"noise_scale: b_simple must be finite and > 0 for a critical batch "
                         f"(got {b_simple!r}; |G|^2 estimate {estimate.g_squared!r} over "
                         f"{estimate.steps} steps): use more steps or a bigger big_batch")
    e_min, epochs_min_from = _epochs_min(b_simple, epochs_min, epochs_at)
    job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": samples_per_epoch,
           "optimizer": optimizer,
           "convergence": {"model": "critical_batch", "epochs_min": e_min,
                           "critical_batch": b_simple}}
    if per_replica_batch is not None:
        job["per_replica_batch"] = per_replica_batch
    if global_batch is not None:
        job["global_batch"] = global_batch
    from .planner import Job  # the planner's loader is the one validation of a Job

    Job.from_dict(job, "noise-scale job")
    job[PROVENANCE_KEY] = provenance(estimate, epochs_min_from, model)
    return job
