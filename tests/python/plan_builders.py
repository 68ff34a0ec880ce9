"""Plan dicts written by hand for the executor tests (docs/formats.md "Plan"), so that executor
tests need neither the profiler nor the compiled planner."""

from typing import Any, Dict

from torch import nn

from hybridplan.hand_plans import even_split, hand_plan, nodes_in_call_order

__all__ = ["placement_plan", "pipeline_plan", "even_split", "nodes_in_call_order", "share"]


def placement_plan(module: nn.Module, dp: int, mp: int, **kw) -> Dict[str, Any]:
    """dp replicas of mp devices; leaves split evenly in call order over each replica's devices."""
    return hand_plan(module, mode="placement", dp=dp, mp=mp, **kw)


def pipeline_plan(module: nn.Module, dp: int, mp: int, schedule: str, num_microbatches: int,
                  **kw) -> Dict[str, Any]:
    """dp replicas of an mp-stage pipeline; contiguous stages of near-equal leaf counts."""
    return hand_plan(module, mode="pipeline", dp=dp, mp=mp, schedule=schedule,
                     num_microbatches=num_microbatches, **kw)


def share(value, parts, index):
    """Replica `index`'s share of a global batch (inputs as a tuple or dict, or a target)."""
    if isinstance(value, dict):
        return {k: share(v, parts, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(share(v, parts, index) for v in value)
    return value.tensor_split(parts)[index]
