"""Plans for the trainers people already run: a hybridplan Plan written as torchtitan's,
Megatron-LM's, DeepSpeed's or Accelerate's own configuration, and such a configuration read back
as the nearest Plan (docs/trainers.md).

    text, unexpressed = trainers.export(plan, "torchtitan", graph, job)
    layout = trainers.parse("megatron", text)              # the degrees, batch, recompute, ...
    plan = trainers.plan_from("deepspeed", text, graph, cluster, job)
    best = trainers.best_for("accelerate", graph, cluster, job, devices=16)

Each trainer module holds its CAPABILITIES (what its file can say), `write(layout)` and
`read(text)`; layout.py turns a Plan into the trainer-neutral Layout and back.
"""

from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, Tuple

from .. import planner
from . import accelerate, deepspeed, megatron, torchtitan
from .layout import Capabilities, Layout, Reduced, layout_of, plan_of

TRAINERS = {"torchtitan": torchtitan, "megatron": megatron, "deepspeed": deepspeed,
            "accelerate": accelerate}

__all__ = ["TRAINERS", "Layout", "Capabilities", "export", "reduce", "parse", "plan_from",
           "best_for", "num_layers"]


def _module(trainer: str):
    if trainer not in TRAINERS:
        raise ValueError(f"trainer must be among {sorted(TRAINERS)} (got {trainer!r})")
    return TRAINERS[trainer]


def capabilities(trainer: str) -> Capabilities:
    return _module(trainer).CAPABILITIES


def num_layers(graph: Optional[planner.Graph]) -> Optional[int]:
    """The transformer layers of a graph whose nodes are named `layers.<i>.` (None otherwise):
    what the trainers split their pipeline stages by."""
    if graph is None:
        return None
    found = {m.group(1) for name in graph.node_names
             for m in [re.search(r"(?:^|\.)layers\.(\d+)\.", name)] if m}
    return len(found) or None


def reduce(plan, trainer: str, graph=None, job=None) -> Reduced:
    """`plan` as `trainer` can hold it: its Layout, what it cannot say (in words) and the
    parallel axes it loses entirely."""
    p = planner.as_plan(plan)
    g = None if graph is None else planner.as_graph(graph)
    return layout_of(p, capabilities(trainer), g, planner.as_job(job))


def _write(trainer: str, layout: Layout, graph, plan) -> str:
    module = _module(trainer)
    if module is accelerate:
        return module.write(layout, devices_per_node=plan.devices_per_node)
    return module.write(layout, num_layers=num_layers(graph))


def export(plan, trainer: str, graph=None, job=None) -> Tuple[str, List[str]]:
    """(that trainer's configuration text for `plan`, what it cannot express, in words)."""
    p = planner.as_plan(plan)
    g = None if graph is None else planner.as_graph(graph)
    reduced = reduce(p, trainer, g, job)
    return _write(trainer, reduced.layout, g, p), reduced.unexpressed


def parse(trainer: str, text: str, graph=None, source: Optional[str] = None,
          world_size: Optional[int] = None) -> Layout:
    """The Layout a trainer's configuration text sets (ValueError naming `source` when it is
    not one). `graph` gives the layer count some pipeline settings are counted in;
    `world_size` the device count the job is launched on (Megatron-LM's arguments need it
    unless the file says it; for the other trainers' files, which hold it, a check)."""
    g = None if graph is None else planner.as_graph(graph)
    source = source or f"{trainer} config"
    if world_size is not None and (isinstance(world_size, bool) or
                                   not isinstance(world_size, int) or world_size < 1):
        raise ValueError(f"{source}: world size must be an integer >= 1 (got {world_size!r})")
    module = _module(trainer)
    if module is megatron:
        return module.read(text, source, num_layers=num_layers(g), world_size=world_size)
    layout = module.read(text, source, num_layers=num_layers(g))
    if world_size is not None and layout.world_size != world_size:
        raise ValueError(f"{source}: the configuration runs on {layout.world_size} devices "
                         f"(data-parallel {layout.dp} x tensor {layout.tp} x pipeline "
                         f"{layout.pp}); it must match the world size (got {world_size})")
    return layout


def plan_from(trainer: str, text: str, graph, cluster, job=None,
              source: Optional[str] = None, world_size: Optional[int] = None) -> planner.Plan:
    """The nearest hybridplan Plan for the configuration `text` on `graph` and `cluster`,
    evaluated and validated (ValueError when the configuration does not fit them)."""
    g, c = planner.as_graph(graph), planner.as_cluster(cluster)
    layout = parse(trainer, text, g, source, world_size)
    if _module(trainer) is accelerate and not accelerate.holds_batch(text):
        layout = _batch_from_job(layout, planner.as_job(job), source or f"{trainer} config")
    return plan_of(layout, g, c, planner.as_job(job), source or f"{trainer} config",
                   stage_split=capabilities(trainer).stage_split)


def _batch_from_job(layout: Layout, job, source: str) -> Layout:
    """An Accelerate file without the batch line export writes: the training script sets the
    batch, so the Job must say it (one global_batch, or one per_replica_batch)."""
    d = {} if job is None else job.to_dict()
    glob, per = d.get("global_batch"), d.get("per_replica_batch")
    if isinstance(glob, int) and not isinstance(glob, bool):
        batch = glob
    elif isinstance(per, int) and not isinstance(per, bool):
        batch = per * layout.dp
    else:
        raise ValueError(f"{source}: an Accelerate configuration holds no batch (the training "
                         f"script sets it): give a Job with one global_batch or "
                         f"per_replica_batch (--job), or add the line '# hybridplan: "
                         f"global_batch=N recompute=none' (got "
                         f"{'no Job' if job is None else 'a Job with neither as one integer'})")
    return dataclasses.replace(layout, global_batch=batch, micro_batch=batch // layout.dp)


def best_for(trainer: str, graph, cluster, job=None, devices: Optional[int] = None,
             top_k: int = 8) -> Tuple[planner.Plan, str]:
    """The best plan `trainer` can run and its configuration text: the planner's search kept to
    the trainer's modes, schedules and sharding kinds (tensor parallelism where it has it),
    each of its best `top_k` written, read back and priced as the trainer would run it (one
    recompute mode for every layer, stages split evenly); the fastest of those."""
    g, c, j = planner.as_graph(graph), planner.as_cluster(cluster), planner.as_job(job)
    caps = capabilities(trainer)
    result = planner.search(g, c, j, devices=devices, top_k=top_k, modes=caps.modes,
                            shardings=caps.shardings,
                            schedules=list(caps.schedules) or list(planner.SCHEDULES),
                            tensor_degrees=None if caps.tensor_parallel else [1],
                            sequence_parallel="auto" if caps.sequence_parallel else "off")
    best = None
    for candidate in result.plans:
        if candidate.mode == "placement" and candidate.mp > 1:
            continue   # concurrent branches: no trainer runs them
        text = _write(trainer, reduce(candidate, trainer, g, j).layout, g, candidate)
        try:
            ran = plan_from(trainer, text, g, c, j)
        except ValueError:
            continue   # its nearest layout does not fit the graph or cluster
        if best is None or _objective(ran) < _objective(best[0]):
            best = (ran, text)
    if best is None:
        raise planner.InfeasibleError(f"no plan {caps.name} can run fits ({len(result.plans)} "
                                      f"searched plans tried)")
    return best


def _objective(plan: planner.Plan) -> float:
    """What the search minimises: time to train when the job has a convergence model, else
    the step time per sample."""
    pred = plan.predicted
    if pred.get("time_to_train_s"):
        return pred["time_to_train_s"]
    return pred["step_s"] / plan.global_batch
