"""The plan the executor holds: hybridplan.planner.Plan (docs/formats.md "Plan"), the one object
that goes from the search to the running job. parse_plan takes a Plan as it is (validated when
it was made) and reads a dict or a path once, through the core (C++ Plan::validate_structure,
the same rules and messages as the C++ loader); the plan's fields, its stages' pipeline ranks
and its identity (Plan.sha256) are the Plan's own.

Which process runs which part of the plan (ranks, process groups) is executor/layout.py's. The
plan's mp * virtual_stages stages lie on the pipeline ranks (0..mp-1) as its schedule says
(Plan.stage_ranks, torch's generate_stage_to_rank_mapping): stage s on k = s with one stage
per rank, on s % mp for the interleaved schedules, along a V for "zbv" (stages s and
2 * mp - 1 - s on rank s), so the last stage is on rank 0 there.

This module adds one rule of its own, what the Python executor needs to map a plan onto a
module: every assignment entry names a leaf module, once.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, List

from ..planner import Graph, Plan, canonical_json


def parse_plan(plan: Any) -> Plan:
    """The Plan to apply: a Plan as it is; anything with to_dict(), a dict or a path to a plan
    JSON file read and validated by the core once. ValueError `<source>: <json.path> <rule>
    (got <value>)`, the source being the file or "plan"."""
    if isinstance(plan, Plan):
        parsed = plan
    elif hasattr(plan, "to_dict"):
        parsed = Plan.from_dict(plan.to_dict(), "plan")
    elif isinstance(plan, dict):
        parsed = Plan.from_dict(plan, "plan")
    elif isinstance(plan, (str, os.PathLike)):
        parsed = Plan.load(plan)
    else:
        raise ValueError(f"plan: $ must be a hybridplan Plan, a dict or a path "
                         f"(got {type(plan).__name__})")
    _check_names(parsed.assigned_names, parsed.source)
    return parsed


def sha256_hex(d: Any) -> str:
    """sha256 of a plan dict's canonical text (Plan.sha256 of the same plan)."""
    return hashlib.sha256(canonical_json(d).encode("utf-8")).hexdigest()


def graph_sha256(graph: Any) -> str:
    """sha256 of a graph's canonical JSON, always the core's (C++ omits defaults and fills edge
    bytes, so no Python canonical form could match it): a Graph (or anything with a `sha256`)
    knows its own; a dict or a path goes through hybridplan.planner.Graph."""
    sha = getattr(graph, "sha256", None)
    if isinstance(sha, str):
        return sha
    if isinstance(graph, (str, os.PathLike)):
        return Graph.load(graph).sha256
    if isinstance(graph, dict):
        return Graph.from_dict(graph, "graph").sha256
    raise ValueError(f"graph: $ must be a hybridplan Graph, a dict or a path "
                     f"(got {type(graph).__name__})")


def _check_names(names: List[Any], source: str) -> None:
    """The executor applies a plan by module name: every assignment entry needs one, used
    once."""
    seen = set()
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{source}: assignment[{i}].name must name a leaf module for the "
                             f"executor (got {name!r})")
        if name in seen:
            raise ValueError(f"{source}: assignment[{i}].name must be unique (got {name!r})")
        seen.add(name)
