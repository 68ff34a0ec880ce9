"""Plans written by hand rather than searched: a contiguous, even split of a module's graph
nodes (profiler.block_list) over mp devices or stages, in a valid docs/formats.md Plan dict.
For examples, tests and benchmarks that need a specific (dp, mp, mode) without profiling; the
planner's plans come from hybridplan.plan.

    plan = hybridplan.hand_plan(model, mode="pipeline", dp=1, mp=2, schedule="1f1b",
                                num_microbatches=4, per_replica_batch=32,
                                example_inputs=model.example_inputs(2))
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from torch import nn

from .profiler import block_list, dataflow

__all__ = ["hand_plan", "nodes_in_call_order", "even_split"]


def nodes_in_call_order(module: nn.Module, example_inputs: Any = None) -> List[str]:
    """Graph nodes in the order forward() calls them on `example_inputs` (a tensor, a tuple or a
    dict of keyword arguments; one forward in eval mode, so BatchNorm statistics do not move),
    then any node it never calls; without inputs, in registration order. As in the profiler, a
    module called more than once is a node per call, unless it holds no parameters (then it
    is a functional op, no node)."""
    nodes = block_list.select_nodes(module)
    if example_inputs is None:
        return list(nodes)
    args, kwargs = ((), example_inputs) if isinstance(example_inputs, dict) else (
        (tuple(example_inputs) if isinstance(example_inputs, (tuple, list))
         else (example_inputs,)), {})
    training = module.training
    module.eval()
    try:
        flow, _ = dataflow.record_dataflow(module, nodes, args, kwargs)
    finally:
        module.train(training)
    reused = set(dataflow.reused_stateless(nodes, flow))
    called = [n for n in flow.order if block_list.module_name(n) not in reused]
    return called + [n for n in nodes if n not in flow.calls]


def even_split(names: Sequence[str], parts: int) -> Dict[str, int]:
    """names[i] -> part floor(i * parts / len(names)): contiguous runs of near-equal length."""
    return {name: i * parts // len(names) for i, name in enumerate(names)}


def hand_plan(module: nn.Module, *, mode: str, dp: int, mp: int, schedule: Optional[str] = None,
              num_microbatches: int = 1, per_replica_batch: int = 8,
              devices_per_node: Optional[int] = None, name: str = "",
              assignment: Optional[Dict[str, int]] = None,
              example_inputs: Any = None, virtual_stages: int = 1) -> Dict[str, Any]:
    """A Plan dict for `module`: assignment defaults to an even split of its graph nodes in call
    order (nodes_in_call_order) over mp devices (placement) or mp * virtual_stages stages
    (pipeline; virtual_stages > 1 for the multi-stage schedules, docs/schedules.md); mesh is
    replica r -> devices r*mp .. r*mp+mp-1; predicted figures are zero (not evaluated)."""
    names = nodes_in_call_order(module, example_inputs)
    parts = mp * virtual_stages if mode == "pipeline" else mp
    assignment = assignment if assignment is not None else even_split(names, parts)
    world = dp * mp
    per_node = devices_per_node or world
    schedule = schedule or ("none" if mode == "placement" else "1f1b")
    plan = {
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
    if virtual_stages != 1:
        plan["virtual_stages"] = virtual_stages
    return plan
