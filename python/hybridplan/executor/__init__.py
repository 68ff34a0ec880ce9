"""Applies a Plan to a torch.nn.Module inside a torch.distributed job: `apply` returns an
`AppliedPlan`. Modules named after their C++ twins in csrc/executor: executor, rank_agreement
(every rank holds the same plan and model), plus plan_spec (parse_plan: the hybridplan Plan the
executor holds), layout (the plan's process grid and every process group), placement and
pipeline (the two MP modes), bucket_policy (DDP's gradient buckets, as the cost model prices
them), switching (AppliedPlan.switch and the adaptive mode, Adapt)."""

from .executor import AppliedPlan, apply, destroy_groups
from .switching import Adapt

__all__ = ["apply", "AppliedPlan", "Adapt", "destroy_groups"]
