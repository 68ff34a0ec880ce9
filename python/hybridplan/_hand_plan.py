"""Plans written by hand rather than searched: a contiguous, even split of a module's leaf
modules over mp devices or stages, in a valid docs/formats.md Plan dict. For examples, tests and
benchmarks that need a specific (dp, mp, mode) without profiling; the planner's plans come from
hybridplan.plan."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from torch import nn

from ._stage_split import leaf_module_names, trace


def leaves_in_call_order(module: nn.Module) -> List[str]:
    """Leaf modules in the order forward() first calls them (a topological order of the
    dataflow graph), then any leaf forward() never calls."""
    called: List[str] = []
    for node in trace(module).graph.nodes:
        if node.op == "call_module" and node.target not in called:
            called.append(node.target)
    return called + [n for n in leaf_module_names(module) if n not in called]


def even_split(names: Sequence[str], parts: int) -> Dict[str, int]:
    """names[i] -> part floor(i * parts / len(names)): contiguous runs of near-equal length."""
    return {name: i * parts // len(names) for i, name in enumerate(names)}


def hand_plan(module: nn.Module, *, mode: str, dp: int, mp: int, schedule: Optional[str] = None,
              num_microbatches: int = 1, per_replica_batch: int = 8,
              devices_per_node: Optional[int] = None, name: str = "",
              assignment: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """A Plan dict for `module`: assignment defaults to an even split of leaves in call order;
    mesh is replica r -> devices r*mp .. r*mp+mp-1; predicted figures are zero (not evaluated)."""
    names = leaves_in_call_order(module)
    assignment = assignment if assignment is not None else even_split(names, mp)
    world = dp * mp
    per_node = devices_per_node or world
    schedule = schedule or ("none" if mode == "placement" else "1f1b")
    return {
        "schema_version": 1, "kind": "hybridplan.plan",
        "graph": {"name": name or type(module).__name__, "sha256": "0" * 64},
        "cluster": {"name": "localhost-cpu", "num_nodes": (world + per_node - 1) // per_node,
                    "devices_per_node": per_node},
        "world_size": world, "dp": dp, "mp": mp, "mode": mode,
        "per_replica_batch": per_replica_batch, "global_batch": dp * per_replica_batch,
        "num_microbatches": num_microbatches if mode == "pipeline" else 1,
        "schedule": schedule,
        "mesh": [[r * mp + k for k in range(mp)] for r in range(dp)],
        "assignment": [{"node": i, "name": n, "device": assignment[n]}
                       for i, n in enumerate(names) if n in assignment],
        "device_mapping": "hand-written: replica r on devices r*mp..r*mp+mp-1",
        "predicted": {"step_s": 0.0, "compute_s": 0.0, "allreduce_s": 0.0, "transfer_s": 0.0,
                      "bubble_s": 0.0, "memory_bytes": [0] * mp, "epochs": 0,
                      "time_to_train_s": 0, "samples_per_s": 0.0, "feasible": True},
    }
