"""Applies a Plan to a torch.nn.Module inside a torch.distributed job: `apply` returns an
`AppliedPlan`. recipe (apply: the order a plan is built in), applied (AppliedPlan, assembled
from its roles: stepping, checkpointing, switching), lifecycle (the default process group and
the orderly teardown), checks (a plan against its module and job), calls (how a step's
arguments are read), rank_agreement (every rank holds the same plan and model: the C++ twin's
name), plan_spec (parse_plan: the hybridplan Plan the executor holds), layout (the plan's
process grid and every process group), placement and pipeline (the two MP modes),
bucket_policy (DDP's gradient buckets, as the cost model prices them), switching
(AppliedPlan.switch and the adaptive mode, Adapt)."""

from .applied import AppliedPlan
from .lifecycle import destroy_groups
from .recipe import apply
from .switching import Adapt

__all__ = ["apply", "AppliedPlan", "Adapt", "destroy_groups"]
