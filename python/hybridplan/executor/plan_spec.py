"""The executor's view of a Plan (docs/formats.md "Plan"): accepts a hybridplan Plan, a dict or a
path, has the core validate it, and answers what the plan means for one process.

Which process runs which part of the plan (ranks, process groups) is executor/layout.py's. The
plan's mp * virtual_stages stages lie on the pipeline ranks (0..mp-1) as its schedule says
(hybridplan.planner.stage_ranks, torch's generate_stage_to_rank_mapping): stage s on k = s with
one stage per rank, on s % mp for the interleaved schedules, along a V for "zbv" (stages s and
2 * mp - 1 - s on rank s), so the last stage is on rank 0 there.

Validation and graph hashing are the core's (C++ Plan::validate_structure and graph_sha256,
through hybridplan._C): this module adds no rule of its own beyond what the Python executor
needs to map a plan onto a module (every assignment entry names a leaf module, once).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, FrozenSet, List, Tuple

from ..planner import Graph, Plan, canonical_json, num_processes


def load_plan_dict(plan: Any) -> Tuple[Dict[str, Any], str]:
    """(plan dict, source label for messages) from a Plan object (anything with to_dict()), a
    dict, or a path to a plan JSON file. Reads; does not validate."""
    if hasattr(plan, "to_dict"):
        return plan.to_dict(), "plan"
    if isinstance(plan, dict):
        return json.loads(canonical_json(plan)), "plan"  # a deep copy that is surely JSON
    if isinstance(plan, (str, os.PathLike)):
        source = os.fspath(plan)
        try:
            with open(source, encoding="utf-8") as f:
                return json.load(f), source
        except OSError as e:
            raise ValueError(f"{source}: cannot be read ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: $ must be valid JSON (got {e})") from None
    raise ValueError(f"plan: $ must be a hybridplan Plan, a dict or a path "
                     f"(got {type(plan).__name__})")


def sha256_hex(d: Any) -> str:
    """sha256 of a plan dict's canonical text: what every rank must agree on."""
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


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """The fields of a validated plan the executor acts on."""
    source: str
    sha256: str          # of the plan's canonical JSON: what every rank must agree on
    mode: str
    dp: int
    mp: int
    schedule: str
    virtual_stages: int          # pipeline stages per rank (the multi-stage schedules: >= 2)
    num_microbatches: int
    per_replica_batch: int
    mesh: List[List[int]]
    assignment: Dict[str, int]   # node name -> replica-local device (placement) or stage
    recompute: FrozenSet[str]    # node names whose forward is recomputed in backward
    selective: FrozenSet[str]    # those of them recomputed selectively (executor.recompute)
    sharding: str                # "none" | "zero2" | "zero3" (docs/sharding.md)
    dp_shard: int                # shard group size: dp, or fewer for hybrid sharding (HSDP)
    devices_per_node: int
    graph_sha256: str
    predicted_step_s: float
    tp: int = 1                  # tensor-parallel degree (docs/tensor_parallel.md)
    sequence_parallel: bool = False  # with tp > 1: norms and dropout on 1/tp of the sequence

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all replicas: dp * per_replica_batch."""
        return self.dp * self.per_replica_batch

    @property
    def num_processes(self) -> int:
        """Processes the plan's mode runs: dp * tp (placement) or dp * mp * tp (pipeline)."""
        return num_processes({"mode": self.mode, "dp": self.dp, "mp": self.mp, "tp": self.tp})

    @property
    def num_stages(self) -> int:
        """Pipeline stages of a replica: mp * virtual_stages (the assignment's range)."""
        return self.mp * self.virtual_stages

    @property
    def stage_ranks(self) -> List[int]:
        """Pipeline rank (0..mp-1) of each stage 0..num_stages-1 (see the module doc)."""
        return stage_ranks(self.schedule, self.mp, self.virtual_stages)

    def stages_of(self, pipeline_rank: int) -> List[int]:
        """The stages pipeline rank `pipeline_rank` (0..mp-1) holds, in increasing order."""
        return [s for s, k in enumerate(self.stage_ranks) if k == pipeline_rank]


def stage_ranks(schedule: str, mp: int, virtual_stages: int) -> List[int]:
    """The pipeline rank (0..mp-1) of each of mp * virtual_stages stages under `schedule`: the
    core's one definition (hybridplan.planner.stage_ranks, which is torch's
    generate_stage_to_rank_mapping: "v" style for "zbv", "loop" otherwise)."""
    from .. import planner

    return list(planner.stage_ranks(schedule, mp, virtual_stages))


def _assignment_by_name(entries: List[Dict[str, Any]], source: str) -> Dict[str, int]:
    """The executor applies a plan by module name: every entry needs one, used once."""
    assignment: Dict[str, int] = {}
    for i, entry in enumerate(entries):
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{source}: assignment[{i}].name must name a leaf module for the "
                             f"executor (got {name!r})")
        if name in assignment:
            raise ValueError(f"{source}: assignment[{i}].name must be unique (got {name!r})")
        assignment[name] = entry["device"]
    return assignment


def parse_plan(plan: Any) -> PlanSpec:
    """Loads `plan` and has the core validate it (Plan::validate_structure: the same rules and
    messages as the C++ loader); ValueError `<source>: <json.path> <rule> (got <value>)`."""
    d, source = load_plan_dict(plan)
    d = Plan.from_dict(d, source).to_dict()
    cluster, graph, predicted = d["cluster"], d["graph"], d.get("predicted") or {}
    return PlanSpec(
        source=source, sha256=sha256_hex(d), mode=d["mode"], dp=d["dp"], mp=d["mp"],
        schedule=d["schedule"], virtual_stages=int(d.get("virtual_stages", 1)),
        num_microbatches=d["num_microbatches"],
        per_replica_batch=d["per_replica_batch"], mesh=[list(row) for row in d["mesh"]],
        assignment=_assignment_by_name(d["assignment"], source),
        recompute=frozenset(e["name"] for e in d["assignment"] if e.get("recompute")),
        selective=frozenset(e["name"] for e in d["assignment"]
                            if e.get("recompute") == "selective"),
        sharding=d.get("sharding", "none"),
        dp_shard=int(d.get("dp_shard", d["dp"])),
        devices_per_node=int(cluster.get("devices_per_node")
                             or max(1, d["dp"] * d["mp"] * int(d.get("tp", 1)))),
        graph_sha256=str(graph["sha256"]),
        predicted_step_s=float(predicted.get("step_s", float("nan"))),
        tp=int(d.get("tp", 1)), sequence_parallel=bool(d.get("sequence_parallel", False)))
