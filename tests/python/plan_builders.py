"""Plan dicts written by hand for the executor tests (docs/formats.md "Plan"), so that executor
tests need neither the profiler nor the compiled planner."""

from typing import Any, Dict

from torch import nn

from hybridplan.hand_plans import even_split, hand_plan, nodes_in_call_order

__all__ = ["placement_plan", "pipeline_plan", "even_split", "nodes_in_call_order"]


def placement_plan(module: nn.Module, dp: int, mp: int, **kw) -> Dict[str, Any]:
    """dp replicas of mp devices; leaves split evenly in call order over each replica's devices."""
    return hand_plan(module, mode="placement", dp=dp, mp=mp, **kw)


def pipeline_plan(module: nn.Module, dp: int, mp: int, schedule: str, num_microbatches: int,
                  **kw) -> Dict[str, Any]:
    """dp replicas of an mp-stage pipeline; contiguous stages of near-equal leaf counts."""
    return hand_plan(module, mode="pipeline", dp=dp, mp=mp, schedule=schedule,
                     num_microbatches=num_microbatches, **kw)
