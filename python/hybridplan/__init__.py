"""hybridplan: plan and apply hybrid data-parallel x model-parallel training.

    graph = hybridplan.profile(module, example_inputs)          # measure a module into a Graph
    best = hybridplan.plan(graph, "dgx1-v100", job)              # search DP x MP configurations
    model = hybridplan.apply(best, module)                       # inside a torchrun job
    hp = hybridplan.parallelize(module, example_inputs)           # all three, in a torchrun job
    est = hybridplan.noise_scale(module, data, loss_fn, 8, 128, steps=50)   # B_simple

Submodules load lazily so that the planner works without torch and torch code without the
compiled planner where it does not need it.
"""

import importlib

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    # planner (hybridplan._C bindings)
    "Graph": "planner", "Cluster": "planner", "Job": "planner", "Plan": "planner",
    "plan": "planner", "search": "planner", "evaluate": "planner", "explain": "planner",
    "load_graph": "planner", "load_cluster": "planner", "load_job": "planner",
    "load_plan": "planner", "presets": "planner", "InfeasibleError": "planner",
    "plan_over_run": "planner", "RunSchedule": "planner",
    # profiler
    "profile": "profiler",
    # executor
    "apply": "executor", "AppliedPlan": "executor", "Adapt": "executor",
    # a model built on the meta device, materialised as every plan's ranks materialise it
    "materialize": "executor.materialize",
    # the front door: profile (cached), plan and apply in one call inside a torchrun script
    "parallelize": "front_door", "Parallelized": "front_door",
    # plans written by hand (examples, tests, benchmarks)
    "hand_plan": "hand_plans",
    # learning-rate schedules for apply(..., lr_scheduler=)
    "warmup_cosine": "schedules",
    # measuring the machine and the model against the cost model
    "calibrate": "measure.calibration", "validate": "measure.validation",
    # statistical efficiency from the gradients
    "noise_scale": "gradient_noise.noise_scale", "NoiseScale": "gradient_noise.noise_scale",
    "critical_batch_job": "gradient_noise.noise_scale_job",
    "switch_advice": "gradient_noise.noise_scale_job",
    "SwitchAdvice": "gradient_noise.noise_scale_job",
    # the batch-size trade-off measured directly (steps to a target at several batches)
    "measure_tradeoff": "convergence.tradeoff", "fit_critical_batch": "convergence.tradeoff",
    "convergence_job": "convergence.tradeoff",
}
_SUBMODULES = {"models", "planner", "profiler", "executor", "pipedream", "hand_plans",
               "front_door", "trace", "datasets", "measure", "convergence", "schedules"}

__all__ = sorted(set(_EXPORTS) | _SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _EXPORTS:
        module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'hybridplan' has no attribute {name!r}")
