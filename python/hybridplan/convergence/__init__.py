"""Statistical efficiency: the steps training takes to a target at each global batch, measured
and handed to the planner as a Job's convergence model.

    tradeoff               the batch-size trade-off measured directly: steps to a target at
                           several global batches, the fitted critical batch, the Job
    report                 its Markdown table and log-log figure

The gradient noise scale, which the executor measures too, is gradient_noise's; plans trained
to the target under torchrun, predicted beside measured, are measure.time_to_target's.

tradeoff's public names are this package's own: `from hybridplan import convergence as cv;
cv.train_to_target(...)`.
"""

from .report import markdown, plot
from .tradeoff import (OPTIMIZERS, SCALINGS, TASK_FIELDS, Fit, LrRule, Run, Sweep, Target, Task,
                       branched, convergence_job, eval_due, evaluate, fit_critical_batch,
                       load_start, measure, measure_tradeoff, noise_scale_at, predicted_steps,
                       refit, sample_indices, task_from_spec, train_to_target)

__all__ = ["LrRule", "Target", "Task", "Run", "Sweep", "Fit", "sample_indices", "eval_due",
           "evaluate", "train_to_target", "measure", "branched", "load_start",
           "fit_critical_batch", "convergence_job", "predicted_steps", "task_from_spec",
           "OPTIMIZERS", "SCALINGS", "TASK_FIELDS", "noise_scale_at", "measure_tradeoff", "refit",
           "markdown", "plot"]
