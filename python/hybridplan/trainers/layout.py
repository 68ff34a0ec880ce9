"""The layout every trainer's configuration names, between a hybridplan Plan and a trainer's file.

A trainer does not name nodes: it names degrees (data-parallel replicate and shard, tensor,
pipeline), a schedule, a micro-batch size, the gradient-accumulation steps (each trainer as its
batch arithmetic: global batch = micro-batch x micro-batches x accumulation steps x data-parallel
size), one activation-checkpointing mode for every layer and a precision. `layout_of` reduces a Plan to that, listing what the trainer cannot hold;
`plan_of` builds the nearest Plan back for a graph and cluster: the pipeline stages split the
graph's layers (nodes named `layers.<i>.`) as the trainer splits them (`stage_split`), and the
ranks are in the trainers' order (tensor innermost, then data, then pipeline).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

from ..planner import Cluster, Graph, Job, Plan, evaluate

RECOMPUTES = ("none", "selective", "full")
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class Layout:
    """One trainer-neutral configuration: what export writes and parse reads back."""
    dp_replicate: int = 1          # replicas that all-reduce (DDP; HSDP's outer group)
    dp_shard: int = 1              # replicas that shard among themselves (FSDP; HSDP's inner)
    tp: int = 1
    pp: int = 1
    schedule: str = "none"         # hybridplan's names (planner.SCHEDULES), "none" without pp
    virtual_stages: int = 1        # pipeline stages per rank
    micro_batch: int = 1           # samples per micro-batch per data-parallel rank
    global_batch: int = 1          # samples per optimizer step over all replicas
    recompute: str = "none"        # RECOMPUTES, applied to every layer
    sharding: str = "none"         # "none", "zero2", "zero3"
    precision: str = "bf16"        # PRECISIONS: "fp32", "bf16" or "fp16"
    sequence_parallel: bool = False
    # forward and backward passes per optimizer step, each of per_replica_batch samples per
    # replica, the gradients synchronised once (the Plan's accumulation_steps)
    accumulation_steps: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def per_replica_batch(self) -> int:
        """Samples per replica in one forward and backward (one accumulation step)."""
        return self.global_batch // (self.dp * self.accumulation_steps)

    @property
    def num_microbatches(self) -> int:
        return self.per_replica_batch // self.micro_batch if self.pp > 1 else 1

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), dp=self.dp, world_size=self.world_size,
                    num_microbatches=self.num_microbatches)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a trainer's configuration can say. `schedules` maps hybridplan's schedule names to
    the trainer's own; a schedule absent from it is written as `nearest_schedule`'s choice."""
    name: str
    schedules: Dict[str, str]
    shardings: Sequence[str]
    tensor_parallel: bool
    hybrid_sharding: bool           # dp_shard < dp with sharding (HSDP)
    sequence_parallel_optional: bool  # False: the trainer always splits the sequence under TP
    recompute_kinds: Sequence[str] = RECOMPUTES
    sequence_parallel: bool = True    # has sequence parallelism at all
    pipeline_note: str = ""           # where its pipeline is set when not in its file
    # how its pipeline splits the layers: "layers" (whole layers evenly, the embedding with the
    # first and the output head with the last stage: Megatron-LM), "layers+ends" (the
    # embedding and the output each count as one layer: torchtitan's
    # generate_llm_fqn_per_model_part, DeepSpeed's partition_method "uniform" over
    # [embedding, layers..., head])
    stage_split: str = "layers"
    # tensor parallelism composes with sharded data parallelism only (Accelerate's
    # ParallelismConfig refuses tp > 1 with dp_replicate > 1 and dp_shard 1)
    tp_needs_sharding: bool = False
    precisions: Sequence[str] = PRECISIONS   # the mixed precisions its file can set
    # where its file does not hold the accumulation steps as a key it reads, in words ("" when
    # it does)
    accumulation_note: str = ""
    # its pipeline runs a step's micro-batches in one schedule: accumulation steps over a
    # pipeline become more micro-batches of that schedule (Megatron-LM, DeepSpeed)
    pipeline_accumulates: bool = False
    # what its file holds for sharding under a pipeline when not the plan's (DeepSpeed's
    # pipeline engine: ZeRO stage 1 at most), in words; "" when it holds the plan's
    pipeline_sharding_note: str = ""

    def nearest_schedule(self, schedule: str, virtual_stages: int) -> str:
        if schedule in self.schedules:
            return schedule
        # the multi-stage schedules fall back to the other multi-stage one, then to 1F1B
        for candidate in (("interleaved-1f1b",) if virtual_stages > 1 else ()) + ("1f1b",
                                                                                  "gpipe"):
            if candidate in self.schedules:
                return candidate
        return ""

    @property
    def modes(self) -> Tuple[str, ...]:
        return ("placement", "pipeline") if self.schedules else ("placement",)


@dataclasses.dataclass(frozen=True)
class Reduced:
    layout: Layout
    unexpressed: List[str]    # each thing of the plan the trainer's file does not hold, in words
    lost_axes: List[str]      # "dp", "mp", "tp": parallel axes (degree > 1) it cannot run at all


def _recompute_of(plan: Plan, caps: Capabilities, unexpressed: List[str]) -> str:
    kinds = [("selective" if a.get("recompute") == "selective" else "full")
             if a.get("recompute") else "none" for a in plan.to_dict()["assignment"]]
    used = sorted(set(kinds), key=RECOMPUTES.index)
    # the trainers apply one mode to every layer: the most recomputation the plan uses, so
    # that what fit in memory still fits
    chosen = used[-1]
    if len(used) > 1:
        counted = ", ".join(f"{kinds.count(k)} {k}" for k in used)
        unexpressed.append(f"recompute differs between nodes ({counted} of {len(kinds)}): "
                           f"{caps.name} applies one mode to every layer; wrote {chosen!r}")
    if chosen not in caps.recompute_kinds:
        nearest = "full" if "full" in caps.recompute_kinds else "none"
        unexpressed.append(f"recompute {chosen!r}: {caps.name} has no such mode; wrote "
                           f"{nearest!r}")
        chosen = nearest
    return chosen


def _precision_of(plan: Plan, caps: Capabilities, graph: Optional[Graph], job: Optional[Job],
                  unexpressed: List[str]) -> str:
    """The plan's precision (docs/training_step.md "Precision"), else the Job's; a plan and a
    Job in fp32 train a graph measured in float32 in fp32, the 16-bit graphs (and a plan
    without a graph) in bf16. A precision the trainer's file cannot set is written as bf16,
    said in words."""
    name = plan.to_dict().get("precision")
    if name is None:
        mixed = None if job is None else job.to_dict().get("precision", "fp32")
        dtype = None if graph is None else graph.to_dict()["profiled"].get("dtype")
        name = mixed if mixed not in (None, "fp32") else (
            "fp32" if dtype == "float32" else "bf16")
    if name not in caps.precisions:
        unexpressed.append(f"precision {name!r}: {caps.name}'s file sets "
                           f"{' or '.join(caps.precisions)} only; wrote 'bf16'")
        name = "bf16"
    return name


def _split_note(plan: Plan, caps: Capabilities, graph: Optional[Graph],
                stages: int) -> Optional[str]:
    """In words, where the plan's pipeline stages are not the trainer's split of the graph's
    layers (which is what the file runs); None when they are, or nothing can be compared."""
    if graph is None or plan.mode != "pipeline":
        return None
    order = sorted(plan.to_dict()["assignment"], key=lambda a: a["node"])
    try:
        theirs = layer_stages([a.get("name") or "" for a in order], stages, caps.stage_split,
                              caps.name)
    except ValueError as e:
        return f"{e}; the file does not run as written"
    mine = [a["device"] for a in order]
    if theirs is None or theirs == mine:
        return None
    count = lambda xs: [xs.count(k) for k in range(stages)]  # noqa: E731
    return (f"pipeline stage boundaries (nodes per stage {count(mine)}): {caps.name} splits "
            f"whole layers evenly; the file runs its split ({count(theirs)})")


def layout_of(plan: Plan, caps: Capabilities, graph: Optional[Graph] = None,
              job: Optional[Job] = None) -> Reduced:
    """`plan` as `caps`'s trainer can hold it, with what it cannot."""
    unexpressed: List[str] = []
    lost: List[str] = []
    schedule, pp, vs, microbatches = plan.schedule, 1, 1, 1
    if plan.mode == "pipeline":
        pp, vs, microbatches = plan.mp, plan.virtual_stages, plan.num_microbatches
    elif plan.mp > 1:
        # concurrent branches on a replica's devices: no trainer places layers that way; a
        # pipeline of one micro-batch runs the same split one device at a time
        unexpressed.append(f"placement of each replica's nodes on {plan.mp} devices (branches "
                           f"running concurrently): {caps.name} has no such mode; wrote a "
                           f"{plan.mp}-stage pipeline of one micro-batch")
        pp, schedule = plan.mp, "gpipe"
    if pp > 1:
        if not caps.schedules:
            unexpressed.append(f"pipeline of {pp} stages ({plan.schedule}): {caps.name} sets "
                               f"no pipeline in its configuration; wrote none")
            lost.append("mp")
            pp, vs, schedule, microbatches = 1, 1, "none", 1
        else:
            nearest = caps.nearest_schedule(schedule, vs)
            if nearest != schedule:
                unexpressed.append(f"schedule {schedule!r}: {caps.name} lacks it; wrote "
                                   f"{nearest!r}")
                if vs > 1 and nearest not in ("interleaved-1f1b", "interleaved-zb"):
                    unexpressed.append(f"{vs} stages per rank: {nearest!r} holds one")
                    vs = 1
                schedule = nearest
            if caps.pipeline_note:
                unexpressed.append(f"pipeline of {pp} stages: {caps.pipeline_note}")
            note = _split_note(plan, caps, graph, pp * vs)
            if note:
                unexpressed.append(note)
    else:
        schedule = "none"
    tp = plan.tp
    if tp > 1 and not caps.tensor_parallel:
        unexpressed.append(f"tensor parallelism of degree {tp}: {caps.name} has none in its "
                           f"configuration; wrote 1")
        lost.append("tp")
        tp = 1
    sequence_parallel = plan.sequence_parallel and tp > 1
    if sequence_parallel and not caps.sequence_parallel:
        unexpressed.append(f"sequence parallelism: {caps.name} has none; wrote tensor "
                           f"parallelism alone")
        sequence_parallel = False
    if tp > 1 and not plan.sequence_parallel and not caps.sequence_parallel_optional:
        unexpressed.append(f"tensor parallelism without sequence parallelism: {caps.name} "
                           f"always splits the norms' sequence under tensor parallelism")
        sequence_parallel = True
    sharding = plan.sharding
    if sharding not in caps.shardings:
        nearest = "zero2" if sharding == "zero3" and "zero2" in caps.shardings else "none"
        unexpressed.append(f"sharding {sharding!r}: {caps.name} lacks it; wrote {nearest!r}")
        sharding = nearest
    if caps.tp_needs_sharding and tp > 1 and sharding == "none" and plan.dp > 1:
        unexpressed.append(f"tensor parallelism with unsharded data parallelism: {caps.name} "
                           f"composes tensor parallelism with sharded data parallelism only; "
                           f"wrote 'zero2' over the {plan.dp} replicas")
        sharding = "zero2"
    dp_shard = (plan.dp_shard if plan.sharding != "none" else plan.dp) \
        if sharding != "none" else 1
    if pp > 1 and sharding != "none" and caps.pipeline_sharding_note:
        unexpressed.append(f"sharding {sharding!r} under a pipeline: "
                           f"{caps.pipeline_sharding_note}")
    if sharding != "none" and dp_shard < plan.dp and not caps.hybrid_sharding:
        unexpressed.append(f"hybrid sharding (shard groups of {dp_shard} of {plan.dp} "
                           f"replicas): {caps.name} lacks it; wrote one shard group of "
                           f"{plan.dp}")
        dp_shard = plan.dp
    k = plan.accumulation_steps
    if k > 1 and caps.accumulation_note:
        unexpressed.append(f"{k} gradient-accumulation steps: {caps.accumulation_note}")
    if k > 1 and pp > 1 and caps.pipeline_accumulates:
        unexpressed.append(f"{k} gradient-accumulation steps over a pipeline of {microbatches} "
                           f"micro-batches: {caps.name} runs the {k * microbatches} micro-"
                           f"batches of a step in one pipeline schedule (one fill and drain, "
                           f"where the plan runs {k})")
    layout = Layout(dp_replicate=plan.dp // dp_shard, dp_shard=dp_shard, tp=tp, pp=pp,
                    schedule=schedule, virtual_stages=vs,
                    micro_batch=plan.per_replica_batch // microbatches,
                    global_batch=plan.global_batch,
                    recompute=_recompute_of(plan, caps, unexpressed), sharding=sharding,
                    precision=_precision_of(plan, caps, graph, job, unexpressed),
                    sequence_parallel=sequence_parallel, accumulation_steps=k)
    return Reduced(layout, unexpressed, lost)


def even_stages(num_nodes: int, num_stages: int) -> List[int]:
    """Node i (in graph order) -> stage floor(i * num_stages / num_nodes): contiguous runs of
    near-equal length, for a graph without named layers."""
    return [i * num_stages // num_nodes for i in range(num_nodes)]


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _front_loaded(units: int, num_stages: int) -> List[int]:
    """Unit u -> its stage when `units` are split into `num_stages` contiguous runs, the first
    units % num_stages runs one longer (torchtitan's and DeepSpeed's uniform split; for a
    count that divides, Megatron-LM's)."""
    base, extra = divmod(units, num_stages)
    return [s for s in range(num_stages) for _ in range(base + (s < extra))]


def layer_stages(names: Sequence[str], num_stages: int, split: str = "layers",
                 source: str = "layout") -> Optional[List[int]]:
    """Each node's pipeline stage (nodes in graph order) as a trainer splits whole layers, or
    None when no node is named `layers.<i>.` (the caller splits the nodes evenly instead).
    Nodes before the first layer go with the first unit, nodes after the last layer with the
    last, nodes between layers with the layer before. ValueError naming `source` when the
    stages outnumber what the trainer splits (it would leave a stage empty)."""
    layer_of = [int(m.group(1)) if m else None for m in (_LAYER.search(n or "") for n in names)]
    layers = sorted({j for j in layer_of if j is not None})
    if not layers:
        return None
    ends = split == "layers+ends"
    units = len(layers) + (2 if ends else 0)
    if units < num_stages:
        what = f"{len(layers)} layers" + (" and the embedding and output" if ends else "")
        raise ValueError(f"{source}: a pipeline of {num_stages} stages needs at least as many "
                         f"layers to split: the graph has {what} (got {num_stages} stages)")
    stage_of_unit = _front_loaded(units, num_stages)
    unit = {j: i + ends for i, j in enumerate(layers)}
    last_node = max(i for i, j in enumerate(layer_of) if j is not None)
    stages: List[int] = []
    seen_layer = False
    for i, j in enumerate(layer_of):
        if j is not None:
            stages.append(stage_of_unit[unit[j]])
            seen_layer = True
        elif not seen_layer:
            stages.append(stage_of_unit[0])          # the embedding's side
        elif i > last_node:
            stages.append(stage_of_unit[-1])         # the final norm and output head
        else:
            stages.append(stages[-1])                # between layers: with the one before
    return stages


def plan_of(layout: Layout, graph: Graph, cluster: Cluster, job: Optional[Job] = None,
            source: str = "layout", stage_split: str = "layers") -> Plan:
    """The hybridplan Plan that runs `layout` on `graph` and `cluster`, evaluated (its
    "predicted"), validated by the planner (ValueError naming `source` when the layout does not
    fit the graph or cluster, e.g. a degree the graph's nodes cannot split at). The pipeline
    stages split the layers as `stage_split` says (Capabilities.stage_split); stage k of
    replica r runs on devices (k * dp + r) * tp .. + tp - 1, the trainers' rank order (tensor
    innermost, then data, then pipeline: Megatron-LM's default order, torchtitan's device mesh
    ["pp", "dp_replicate", "dp_shard", "tp"], DeepSpeed's pipe-data-model topology)."""
    dp, mp, tp = layout.dp, layout.pp, layout.tp
    k = layout.accumulation_steps
    if layout.global_batch % (dp * k):
        raise ValueError(f"{source}: global batch must be a multiple of the data-parallel "
                         f"degree {dp} x the accumulation steps {k} (got "
                         f"{layout.global_batch})")
    if layout.pp > 1 and layout.per_replica_batch % layout.micro_batch:
        raise ValueError(f"{source}: each replica's batch {layout.per_replica_batch} must be a "
                         f"multiple of the micro-batch (got {layout.micro_batch})")
    nodes = graph.nodes
    order = sorted(n["id"] for n in nodes)
    names = {n["id"]: n["name"] for n in nodes}
    stages = [0] * len(order)
    if mp > 1:
        count = mp * layout.virtual_stages
        stages = (layer_stages([names[i] for i in order], count, stage_split, source)
                  or even_stages(len(order), count))
    # selective recompute where the graph measured it; a node without the measurement (the
    # profiler leaves out RNN nodes) is recomputed fully, which keeps less, so what fit fits
    measured = {n["id"] for n in nodes if "selective_saved_bytes" in n}

    def entry(i: int) -> dict:
        if layout.recompute == "none":
            return {}
        return {"recompute": "selective" if layout.recompute == "selective" and i in measured
                else True}
    d = {"schema_version": 1, "kind": "hybridplan.plan",
         "graph": {"name": graph.name, "sha256": graph.sha256},
         "cluster": {"name": cluster.name, "num_nodes": cluster.num_nodes,
                     "devices_per_node": cluster.devices_per_node},
         "world_size": dp * mp * tp, "dp": dp, "mp": mp,
         "mode": "pipeline" if mp > 1 else "placement",
         "per_replica_batch": layout.per_replica_batch, "global_batch": layout.global_batch,
         "num_microbatches": layout.num_microbatches,
         **({"accumulation_steps": k} if k > 1 else {}),
         "schedule": layout.schedule if mp > 1 else "none",
         # the trainers' rank order: a TP group's tp devices together, then the replicas,
         # then the pipeline stages
         "mesh": [[(k * dp + r) * tp for k in range(mp)] for r in range(dp)],
         "assignment": [dict({"node": i, "name": names[i], "device": s}, **entry(i))
                        for i, s in zip(order, stages)],
         "device_mapping": f"from a {source} configuration: stage k of replica r on device "
                           f"group k*{dp}+r (tensor, then data, then pipeline)"}
    if tp > 1:
        d["tp"] = tp
    # the planner prices sequence parallelism on placement plans of graphs that allow it; a
    # trainer that splits the sequence elsewhere too is priced without it there
    if layout.sequence_parallel and mp == 1 and any("sequence_parallel" in n for n in nodes):
        d["sequence_parallel"] = True
    if layout.virtual_stages > 1:
        d["virtual_stages"] = layout.virtual_stages
    if layout.sharding != "none":
        d["sharding"] = layout.sharding
        if layout.dp_shard < dp:
            d["dp_shard"] = layout.dp_shard
    # the file's 16-bit precision where the Job prices it (a plan is priced in its Job's
    # precision: the evaluation refuses another); under another Job the plan is the Job's
    if layout.precision != "fp32" and job is not None and \
            job.to_dict().get("precision", "fp32") == layout.precision:
        d["precision"] = layout.precision
    plan = Plan.from_dict(d, source).validate(graph, cluster)
    predicted = evaluate(graph, cluster, plan, job)
    predicted.pop("objective", None)
    d["predicted"] = predicted
    return Plan.from_dict(d, source)
