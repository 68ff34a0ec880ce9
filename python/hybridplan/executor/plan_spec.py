"""The executor's view of a Plan (docs/formats.md "Plan"): accepts a hybridplan Plan, a dict or a
path, checks the fields the executor acts on, and answers what the plan means for one process.

Process layout (docs/formats.md):
    placement  one process per replica: rank = r, world = dp; rank r owns mesh[r][0..mp-1]
    pipeline   one process per device:  rank = r * mp + stage, world = dp * mp;
               the DP group of stage s is {r * mp + s for r in 0..dp-1}

The full structural validation of a plan belongs to the planner (hybridplan.planner.Plan); this
module checks only what the executor relies on, so that it works without the compiled planner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, List, Tuple

MODES = ("placement", "pipeline")
SCHEDULES = {"placement": ("none",), "pipeline": ("gpipe", "1f1b")}


def canonical_json(d: Any) -> str:
    """Sorted keys, no spaces: the text whose sha256 identifies a plan (or graph)."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256_hex(d: Any) -> str:
    return hashlib.sha256(canonical_json(d).encode("utf-8")).hexdigest()


def load_plan_dict(plan: Any) -> Tuple[Dict[str, Any], str]:
    """(plan dict, source label for messages) from a Plan object (anything with to_dict()), a
    dict, or a path to a plan JSON file."""
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
            raise ValueError(f"{source}: $ is not valid JSON ({e})") from None
    raise ValueError(f"plan: $ must be a hybridplan Plan, a dict or a path "
                     f"(got {type(plan).__name__})")


def graph_sha256(graph: Any) -> str:
    """sha256 of a graph's canonical JSON. A hybridplan Graph knows its own (the C++ planner's
    canonical form); a dict or path goes through hybridplan.planner.Graph when the compiled
    planner is present, else through Python's canonical JSON of the same shape."""
    sha = getattr(graph, "sha256", None)
    if sha is not None:
        return sha() if callable(sha) else str(sha)
    try:
        from ..planner import Graph  # needs hybridplan._C
    except ImportError:
        Graph = None
    if isinstance(graph, (str, os.PathLike)):
        if Graph is not None:
            return Graph.load(graph).sha256
        with open(graph, encoding="utf-8") as f:
            graph = json.load(f)
    if isinstance(graph, dict):
        return Graph.from_dict(graph).sha256 if Graph is not None else sha256_hex(graph)
    raise ValueError(f"graph: $ must be a hybridplan Graph, a dict or a path "
                     f"(got {type(graph).__name__})")


def _require_int(d: Dict[str, Any], key: str, source: str, minimum: int = 1) -> int:
    value = d.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{source}: {key} must be an integer >= {minimum} (got {value!r})")
    return value


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """The fields of a plan the executor acts on, checked for consistency."""
    source: str
    sha256: str          # of the plan's canonical JSON: what every rank must agree on
    mode: str
    dp: int
    mp: int
    schedule: str
    num_microbatches: int
    per_replica_batch: int
    mesh: List[List[int]]
    assignment: Dict[str, int]   # node name -> replica-local device (placement) or stage
    devices_per_node: int
    graph_sha256: str
    predicted_step_s: float

    @property
    def num_processes(self) -> int:
        """Processes the plan's mode runs: dp (placement) or dp * mp (pipeline)."""
        return self.dp if self.mode == "placement" else self.dp * self.mp

    def replica_of(self, rank: int) -> int:
        return rank if self.mode == "placement" else rank // self.mp

    def stage_of(self, rank: int) -> int:
        """Pipeline stage of `rank` (0 in placement mode, where a process holds all stages)."""
        return 0 if self.mode == "placement" else rank % self.mp

    def rank_of(self, replica: int, stage: int) -> int:
        return replica * self.mp + stage

    def dp_group_ranks(self, stage: int) -> List[int]:
        """Ranks holding `stage` of every replica (pipeline): {r * mp + stage}."""
        return [self.rank_of(r, stage) for r in range(self.dp)]

    def replica_ranks(self, replica: int) -> List[int]:
        """Ranks holding the stages of one replica (pipeline): r * mp + 0..mp-1."""
        return [self.rank_of(replica, s) for s in range(self.mp)]


def parse_plan(plan: Any) -> PlanSpec:
    """Loads and checks `plan`; ValueError `<source>: <json.path> <rule> (got <value>)`."""
    d, source = load_plan_dict(plan)
    if not isinstance(d, dict):
        raise ValueError(f"{source}: $ must be a JSON object (got {type(d).__name__})")
    if d.get("kind") != "hybridplan.plan":
        raise ValueError(f"{source}: kind must be \"hybridplan.plan\" (got {d.get('kind')!r})")
    mode = d.get("mode")
    if mode not in MODES:
        raise ValueError(f"{source}: mode must be one of {list(MODES)} (got {mode!r})")
    dp, mp = _require_int(d, "dp", source), _require_int(d, "mp", source)
    world = _require_int(d, "world_size", source)
    if world != dp * mp:
        raise ValueError(f"{source}: world_size must equal dp * mp = {dp * mp} (got {world})")
    schedule = d.get("schedule")
    if schedule not in SCHEDULES[mode]:
        raise ValueError(f"{source}: schedule must be one of {list(SCHEDULES[mode])} in "
                         f"{mode} mode (got {schedule!r})")
    num_microbatches = _require_int(d, "num_microbatches", source)
    if mode == "placement" and num_microbatches != 1:
        raise ValueError(f"{source}: num_microbatches must be 1 in placement mode "
                         f"(got {num_microbatches})")
    per_replica_batch = _require_int(d, "per_replica_batch", source)
    mesh = d.get("mesh")
    if (not isinstance(mesh, list) or len(mesh) != dp
            or any(not isinstance(row, list) or len(row) != mp for row in mesh)):
        raise ValueError(f"{source}: mesh must be dp={dp} rows of mp={mp} device indices "
                         f"(got {mesh!r})")
    assignment: Dict[str, int] = {}
    entries = d.get("assignment")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: assignment must be a non-empty list (got {entries!r})")
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        device = entry.get("device") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{source}: assignment[{i}].name must be a non-empty string "
                             f"(got {name!r})")
        if name in assignment:
            raise ValueError(f"{source}: assignment[{i}].name must be unique (got {name!r})")
        if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < mp:
            raise ValueError(f"{source}: assignment[{i}].device must be in 0..{mp - 1} "
                             f"(got {device!r})")
        assignment[name] = device
    cluster = d.get("cluster") or {}
    graph = d.get("graph") or {}
    predicted = d.get("predicted") or {}
    return PlanSpec(
        source=source, sha256=sha256_hex(d), mode=mode, dp=dp, mp=mp, schedule=schedule,
        num_microbatches=num_microbatches, per_replica_batch=per_replica_batch,
        mesh=[list(row) for row in mesh], assignment=assignment,
        devices_per_node=int(cluster.get("devices_per_node") or max(1, dp * mp)),
        graph_sha256=str(graph.get("sha256", "")),
        predicted_step_s=float(predicted.get("step_s", float("nan"))))
