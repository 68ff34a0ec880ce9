"""The planner from Python: Graph, Cluster, Job and Plan values; plan, search, evaluate, explain.

    graph = Graph.load("inception_v3.graph.json")           # or Graph.from_dict(d)
    best = plan(graph, "dgx1-v100", job, devices=32)         # the best Plan
    best.dp, best.mp, best.mode, best.predicted["step_s"]
    best.save("plan.json"); print(best.explain())

Each value wraps one validated JSON document (docs/formats.md) and is immutable: `from_dict`
validates through the C++ planner (hybridplan._C) and `to_dict` returns a copy. Bad input raises
ValueError carrying the C++ message, `<source>: <json.path> <rule> (got <value>)`. A valid
request that no plan satisfies (e.g. the model does not fit in memory on that many devices)
raises InfeasibleError, a RuntimeError subclass: it is not malformed input, so `except ValueError`
around input handling does not swallow it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import math
import os
from typing import Any, Iterable, List, Optional, Sequence, Union

from . import _C
from .files import write_text_atomic

InfeasibleError = _C.InfeasibleError

PathLike = Union[str, "os.PathLike[str]"]
MODES = ("placement", "pipeline")
SHARDINGS = ("none", "zero2", "zero3")  # data-parallel sharding kinds (docs/sharding.md)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv")  # docs/schedules.md


# ---- helpers ---------------------------------------------------------------------------------

def _json_default(value: Any) -> Any:
    # numpy and torch scalars/arrays (what a profiler tends to produce) serialise as numbers.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(d: Any, source: str) -> str:
    if not isinstance(d, dict):
        raise ValueError(f"{source}: $ must be a JSON object (got {type(d).__name__})")
    try:
        return json.dumps(d, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: $ must be JSON-serializable with finite numbers ({e})") from None


def canonical_json(d: Any) -> str:
    """Sorted keys, no spaces: a plan's canonical text (a graph's comes from the core, which
    also fills defaults), whose sha256 identifies the plan across ranks."""
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _read_text(path: PathLike) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{os.fspath(path)}: cannot be read ({e.strerror})") from None


def _atomic_write(path: PathLike, text: str) -> None:
    """The document's text and a newline, written atomically (files.write_text_atomic)."""
    write_text_atomic(path, text + "\n")


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


# ---- the four documents ----------------------------------------------------------------------

class _Document:
    """One validated JSON document. Subclasses name the _C function that validates it."""

    _kind = "document"

    def __init__(self, text: Optional[str], _validated: bool = False,
                 _parsed: Optional[dict] = None):
        if not _validated:
            raise TypeError(f"use {type(self).__name__}.from_dict / .load to build one")
        # `_parsed`: the document already parsed (a search's plans come out of one JSON text,
        # parsed once); its canonical text is then written when first asked for (to_json)
        self._text = text
        self._dict = json.loads(text) if _parsed is None else _parsed

    @classmethod
    def _validate(cls, text: str, source: str) -> str:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>"):
        """Validates `d` (ValueError naming `source` and the JSON path when it is bad)."""
        return cls(cls._validate(_dumps(d, source), source), _validated=True)

    @classmethod
    def from_json(cls, text: str, source: str = "<json>"):
        return cls(cls._validate(text, source), _validated=True)

    @classmethod
    def load(cls, path: PathLike):
        return cls.from_json(_read_text(path), os.fspath(path))

    def to_dict(self) -> dict:
        return copy.deepcopy(self._dict)

    def to_json(self) -> str:
        """The canonical JSON text (sorted keys, no spaces), as the C++ planner writes it."""
        if self._text is None:
            self._text = canonical_json(self._dict)
        return self._text

    def save(self, path: PathLike) -> None:
        """Writes the canonical JSON atomically (temporary file + rename)."""
        _atomic_write(path, self.to_json())

    @property
    def name(self) -> str:
        return self._dict.get("name", "")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._dict == self._dict

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class Graph(_Document):
    """A profiled dataflow graph (kind "hybridplan.graph")."""

    _kind = "graph"

    @classmethod
    def _validate(cls, text: str, source: str) -> str:
        return _C.canonical_graph(text, source)

    @property
    def nodes(self) -> list:
        return copy.deepcopy(self._dict["nodes"])

    @property
    def edges(self) -> list:
        return copy.deepcopy(self._dict["edges"])

    @property
    def node_names(self) -> list:
        return [n["name"] for n in self._dict["nodes"]]

    @property
    def batch_size(self) -> int:
        """The batch the node times were measured at (profiled.batch_size)."""
        return self._dict["profiled"]["batch_size"]

    @property
    def sha256(self) -> str:
        """Hex sha256 of the canonical JSON: the identity a Plan names."""
        if not hasattr(self, "_sha256"):
            self._sha256 = _C.graph_sha256(self._text, self.name or "graph")
        return self._sha256

    def __repr__(self) -> str:
        return f"Graph(name={self.name!r}, nodes={len(self._dict['nodes'])})"


class Cluster(_Document):
    """Devices and links (kind "hybridplan.cluster")."""

    _kind = "cluster"

    @classmethod
    def _validate(cls, text: str, source: str) -> str:
        return _C.canonical_cluster(text, source)

    @classmethod
    def preset(cls, name: str) -> "Cluster":
        """A shipped preset (see presets()); ValueError listing the names when unknown."""
        return cls.from_json(_C.preset_text(name), f"preset {name}")

    @classmethod
    def load(cls, path_or_preset: PathLike) -> "Cluster":
        """A cluster file, or a preset name when no such file exists (as the CLI's --cluster)."""
        if isinstance(path_or_preset, str) and not os.path.exists(path_or_preset):
            names = _C.preset_names()
            if path_or_preset in names:
                return cls.preset(path_or_preset)
            raise ValueError(f"{path_or_preset}: no such cluster file or preset "
                             f"(presets: {', '.join(names)})")
        return super().load(path_or_preset)

    def with_num_nodes(self, num_nodes: int) -> "Cluster":
        """The same cluster with `num_nodes` nodes (e.g. DGX-1 x 128 from the one-node preset)."""
        d = self.to_dict()
        d["num_nodes"] = num_nodes
        return Cluster.from_dict(d, f"{self.name} with num_nodes={num_nodes}")

    @property
    def num_nodes(self) -> int:
        return self._dict["num_nodes"]

    @property
    def devices_per_node(self) -> int:
        return self._dict["devices_per_node"]

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, num_devices={self.num_devices})"


class Job(_Document):
    """What is trained and how it converges (kind "hybridplan.job")."""

    _kind = "job"

    @classmethod
    def _validate(cls, text: str, source: str) -> str:
        return _C.canonical_job(text, source)

    @classmethod
    def default(cls) -> "Job":
        """No convergence model: the objective is samples/s at the profiled batch."""
        return cls.from_json(_C.default_job(), "default job")

    def __repr__(self) -> str:
        model = self._dict.get("convergence", {}).get("model", "none")
        return f"Job(convergence={model!r})"


class Plan(_Document):
    """One complete decision (kind "hybridplan.plan"): the contract read by the executor.

    `from_dict`/`load` check the plan's structure; `validate(graph, cluster)` checks it against
    what it is applied to (graph sha256, world size, mesh, assignment). One Plan object goes from
    the search to the running job (hybridplan.apply, parallelize, switch, checkpoints hold it);
    its identity is `sha256`, of its canonical JSON, computed once.
    """

    _kind = "plan"
    source = "plan"  # what messages about it name: the file it was loaded from, else "plan"

    @classmethod
    def load(cls, path: PathLike) -> "Plan":
        plan = super().load(path)
        plan.source = os.fspath(path)
        return plan

    @classmethod
    def _of(cls, d: dict) -> "Plan":
        """A plan the core itself wrote (search, plan_over_run), already parsed: no second
        validation, no text until one is asked for."""
        return cls(None, _validated=True, _parsed=d)

    @functools.cached_property
    def sha256(self) -> str:
        """sha256 of the canonical JSON: what every rank of a job must agree on."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> "Plan":
        """Checks `text` in the core and parses it once. Without the graph there is no C++
        canonical form (names come from it): the canonical text is Python's (sorted keys, no
        spaces), written when first asked for."""
        _C.check_plan(text, source)
        return cls._of(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict, source: str = "<dict>") -> "Plan":
        """Validates `d` (ValueError naming `source` and the JSON path when it is bad); the
        Plan holds a copy."""
        return cls.from_json(_dumps(d, source), source)

    def validate(self, graph: Union["Graph", dict, PathLike],
                 cluster: Union["Cluster", dict, PathLike]) -> "Plan":
        """This plan checked against `graph` and `cluster` (ValueError on any mismatch)."""
        g, c = as_graph(graph), as_cluster(cluster)
        text = _C.validate_plan(self.to_json(), "plan", g.to_json(), c.to_json())
        return Plan._of(json.loads(text))  # the canonical text is Python's (sha256)

    @property
    def name(self) -> str:
        return self._dict["graph"]["name"]

    @property
    def graph_name(self) -> str:
        return self._dict["graph"]["name"]

    @property
    def graph_sha256(self) -> str:
        return self._dict["graph"]["sha256"]

    @property
    def cluster_name(self) -> str:
        return self._dict["cluster"]["name"]

    @property
    def dp(self) -> int:
        return self._dict["dp"]

    @property
    def mp(self) -> int:
        return self._dict["mp"]

    @property
    def tp(self) -> int:
        """The tensor-parallel degree (1 when the plan has none; docs/tensor_parallel.md)."""
        return self._dict.get("tp", 1)

    @property
    def mode(self) -> str:
        return self._dict["mode"]

    @property
    def world_size(self) -> int:
        return self._dict["world_size"]

    @property
    def num_processes(self) -> int:
        return num_processes(self._dict)

    @property
    def schedule(self) -> str:
        return self._dict["schedule"]

    @property
    def dp_shard(self) -> int:
        """A sharded plan's shard group size (dp unless hybrid sharding, docs/sharding.md)."""
        return self._dict.get("dp_shard", self._dict["dp"])

    @property
    def virtual_stages(self) -> int:
        """Pipeline stages per rank (1 but for the multi-stage schedules, docs/schedules.md)."""
        return self._dict.get("virtual_stages", 1)

    @property
    def sharding(self) -> str:
        """"none", "zero2" or "zero3" (docs/sharding.md)."""
        return self._dict.get("sharding", "none")

    @property
    def precision(self) -> str:
        """"fp32", "bf16" or "fp16": the Job's precision the plan was priced in, which the
        executor applies (docs/training_step.md "Precision")."""
        return self._dict.get("precision", "fp32")

    @property
    def num_microbatches(self) -> int:
        return self._dict["num_microbatches"]

    @property
    def per_replica_batch(self) -> int:
        return self._dict["per_replica_batch"]

    @property
    def accumulation_steps(self) -> int:
        """Forward and backward micro-steps per optimizer step, each of per_replica_batch
        samples per replica, the gradients synchronised once (1 when the plan has none;
        docs/training_step.md)."""
        return self._dict.get("accumulation_steps", 1)

    @property
    def compile(self) -> bool:
        """Whether the planner priced compiled blocks (the Job's "compile"; apply then compiles
        each block with torch.compile, docs/training_step.md); False when absent."""
        return bool(self._dict.get("compile", False))

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all replicas: dp * per_replica_batch *
        accumulation_steps."""
        return self.dp * self.per_replica_batch * self.accumulation_steps

    @property
    def mesh(self) -> list:
        """mesh[replica][k]: global device index of replica's k-th device."""
        return copy.deepcopy(self._dict["mesh"])

    @functools.cached_property
    def assignment(self) -> dict:
        """Node name -> replica-local device (placement) or stage (pipeline). Shared: read it,
        do not change it."""
        return {a["name"]: a["device"] for a in self._dict["assignment"]}

    @property
    def assigned_names(self) -> list:
        """Each assignment entry's "name", in order (None where an entry has none)."""
        return [a.get("name") for a in self._dict["assignment"]]

    @functools.cached_property
    def recompute(self) -> frozenset:
        """The nodes whose forward is recomputed in backward (docs/recompute.md)."""
        return frozenset(a["name"] for a in self._dict["assignment"] if a.get("recompute"))

    @functools.cached_property
    def selective(self) -> frozenset:
        """Those of them recomputed selectively (the matmuls' and attention's outputs kept)."""
        return frozenset(a["name"] for a in self._dict["assignment"]
                         if a.get("recompute") == "selective")

    @property
    def sequence_parallel(self) -> bool:
        """With tp > 1: norms and dropout on 1/tp of the sequence (docs/tensor_parallel.md)."""
        return bool(self._dict.get("sequence_parallel", False))

    @property
    def devices_per_node(self) -> int:
        """The cluster's devices per node (the plan's own device count when it names none)."""
        return int(self._dict["cluster"].get("devices_per_node")
                   or max(1, self.dp * self.mp * self.tp))

    @property
    def num_stages(self) -> int:
        """Pipeline stages of a replica: mp * virtual_stages (the assignment's range)."""
        return self.mp * self.virtual_stages

    @functools.cached_property
    def stage_ranks(self) -> List[int]:
        """Pipeline rank (0..mp-1) of each stage (stage_ranks()). Shared: do not change it."""
        return stage_ranks(self.schedule, self.mp, self.virtual_stages)

    def stages_of(self, pipeline_rank: int) -> List[int]:
        """The stages pipeline rank `pipeline_rank` (0..mp-1) holds, in increasing order."""
        return [s for s, k in enumerate(self.stage_ranks) if k == pipeline_rank]

    @property
    def predicted(self) -> dict:
        return copy.deepcopy(self._dict.get("predicted", {}))

    @property
    def predicted_step_s(self) -> float:
        """The predicted step time (NaN when the plan carries no prediction)."""
        return float(self._dict.get("predicted", {}).get("step_s", math.nan))

    def explain(self, graph=None, cluster=None, job=None) -> str:
        """The plan as text for people (as `hybridplan explain`); see explain()."""
        return explain(self, graph, cluster, job)

    def __repr__(self) -> str:
        return (f"Plan(graph={self.name!r}, dp={self.dp}, mp={self.mp}, mode={self.mode!r}, "
                f"world_size={self.world_size})")


# ---- coercions: accept values, dicts or paths wherever a document is expected ------------------
# Public: every part of the package that takes a document from its caller coerces it with these.

def as_graph(g: Union[Graph, dict, PathLike]) -> Graph:
    if isinstance(g, Graph):
        return g
    if isinstance(g, dict):
        return Graph.from_dict(g)
    if _is_path(g):
        return Graph.load(g)
    raise ValueError(f"graph must be a Graph, dict or path (got {type(g).__name__})")


def as_cluster(c: Union[Cluster, dict, PathLike]) -> Cluster:
    if isinstance(c, Cluster):
        return c
    if isinstance(c, dict):
        return Cluster.from_dict(c)
    if _is_path(c):
        return Cluster.load(c)
    raise ValueError(f"cluster must be a Cluster, dict, path or preset name "
                     f"(got {type(c).__name__})")


def as_job(j: Union[Job, dict, PathLike, None]) -> Optional[Job]:
    if j is None or isinstance(j, Job):
        return j
    if isinstance(j, dict):
        return Job.from_dict(j)
    if _is_path(j):
        return Job.load(j)
    raise ValueError(f"job must be a Job, dict, path or None (got {type(j).__name__})")


def as_plan(p: Union[Plan, dict, PathLike]) -> Plan:
    if isinstance(p, Plan):
        return p
    if isinstance(p, dict):
        return Plan.from_dict(p)
    if _is_path(p):
        return Plan.load(p)
    raise ValueError(f"plan must be a Plan, dict or path (got {type(p).__name__})")


def load_graph(path: PathLike) -> Graph:
    return Graph.load(path)


def load_cluster(path_or_preset: PathLike) -> Cluster:
    return Cluster.load(path_or_preset)


def load_job(path: PathLike) -> Job:
    return Job.load(path)


def load_plan(path: PathLike) -> Plan:
    return Plan.load(path)


def num_processes(plan: dict) -> int:
    """Processes a plan (dict) runs, as plan.h Plan::num_processes: dp * tp in placement mode
    (a replica's devices are one process per TP rank) and dp * mp * tp in pipeline mode."""
    return (plan["dp"] * plan["mp"] if plan["mode"] == "pipeline" else plan["dp"]) \
        * plan.get("tp", 1)


def epochs_to_target(job: Union[Job, dict, PathLike], global_batch: float) -> float:
    """Epochs to the target at `global_batch` under the job's convergence model (the planner's
    own rule, csrc/planner/run/convergence.h); 0 when the job has none."""
    return float(_C.epochs_to_target(as_job(job).to_json(), float(global_batch)))


def presets() -> list:
    """Names of the shipped cluster presets (Cluster.preset(name) loads one)."""
    return list(_C.preset_names())


# ---- planning ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SearchResult:
    plans: list                  # best first, each with .predicted
    candidates_evaluated: int
    notes: list                  # e.g. heuristic placement gaps
    infeasible: list             # why rejected candidates did not fit


def _mode_flags(modes: Iterable[str]) -> tuple:
    modes = tuple(modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes must be a non-empty subset of {MODES} (got {modes!r})")
    return "placement" in modes, "pipeline" in modes


def _names(kinds: Sequence[str], allowed: Sequence[str], what: str) -> List[str]:
    """A name or list of names, each among `allowed`, as a list."""
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for kind in kinds:
        if kind not in allowed:
            raise ValueError(f"{what} must be among {list(allowed)} (got {kind!r})")
    return kinds


def _shardings(kinds: Sequence[str]) -> List[str]:
    return _names(kinds, SHARDINGS, "shardings")


def _schedules(kinds: Sequence[str]) -> List[str]:
    return _names(kinds, SCHEDULES, "schedules")


def stage_ranks(schedule: str, mp: int, virtual_stages: int = 1) -> List[int]:
    """The local rank (0..mp-1) of each of a pipeline's mp * virtual_stages stages under
    `schedule`: stage s on s % mp, or the V of "zbv" (the core's one definition, plan.h)."""
    return list(_C.stage_ranks(schedule, mp, virtual_stages))


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1 (got {value!r})")
    return value


def search(graph, cluster, job=None, devices: Optional[int] = None, top_k: int = 5,
           modes: Sequence[str] = MODES, dp_only: bool = False,
           exact_placement_max_nodes: Optional[int] = None,
           shardings: Sequence[str] = SHARDINGS,
           schedules: Sequence[str] = SCHEDULES,
           tensor_degrees: Optional[Sequence[int]] = None,
           sequence_parallel: str = "auto") -> SearchResult:
    """Searches dp x mp x tp x mode x micro-batches x sharding x device mapping on `devices`
    devices of `cluster` (all of them when None). `dp_only` restricts to mp = 1, the pure
    data-parallel baseline; `shardings` are the data-parallel sharding kinds a plan may take
    (docs/sharding.md: "none", "zero2", "zero3"); `schedules` the pipeline schedules a
    pipeline plan may take (docs/schedules.md); `tensor_degrees` the tensor-parallel degrees
    (docs/tensor_parallel.md; None: 1 and every degree the graph and cluster allow, [1]: no
    tensor parallelism, [4]: only tp = 4; a degree the graph or cluster does not allow raises
    ValueError); `sequence_parallel` whether tensor-parallel placement plans split the
    sequence too (docs/tensor_parallel.md "Sequence parallelism": "auto" tries both, "on" only
    with, "off" never);
    placements of graphs with more nodes than `exact_placement_max_nodes` (default: the C++
    SearchOptions default) are heuristic, with the gap in `notes`. Raises InfeasibleError when
    nothing fits."""
    g, c, j = as_graph(graph), as_cluster(cluster), as_job(job)
    placement, pipeline = _mode_flags(modes)
    devices = 0 if devices is None else _positive_int(devices, "devices")
    top_k = _positive_int(top_k, "top_k")
    exact = {} if exact_placement_max_nodes is None else {
        "exact_placement_max_nodes": _positive_int(exact_placement_max_nodes,
                                                   "exact_placement_max_nodes")}
    degrees = [] if tensor_degrees is None else [
        _positive_int(t, "tensor_degrees entries") for t in tensor_degrees]
    out = json.loads(_C.search(g.to_json(), c.to_json(), None if j is None else j.to_json(),
                               devices=devices, top_k=top_k, placement=placement,
                               pipeline=pipeline, dp_only=bool(dp_only),
                               shardings=_shardings(shardings),
                               schedules=_schedules(schedules), tensor_degrees=degrees,
                               sequence_parallel=str(sequence_parallel), **exact))
    plans = [Plan._of(p) for p in out["plans"]]
    return SearchResult(plans, out["candidates_evaluated"], out["notes"], out["infeasible"])


def plan(graph, cluster, job=None, devices: Optional[int] = None, top_k: int = 1,
         modes: Sequence[str] = MODES, tensor_degrees: Optional[Sequence[int]] = None,
         sequence_parallel: str = "auto"):
    """The best Plan for training `graph` on `cluster` (a Cluster, path or preset name); with
    top_k > 1 the best `top_k` plans, best first. `tensor_degrees` and `sequence_parallel` as
    search()'s."""
    result = search(graph, cluster, job, devices=devices, top_k=top_k, modes=modes,
                    tensor_degrees=tensor_degrees, sequence_parallel=sequence_parallel)
    return result.plans[0] if top_k == 1 else result.plans


def evaluate(graph, cluster, plan, job=None) -> dict:
    """The cost breakdown of any plan (keys as a plan's "predicted", plus "objective": the value
    search minimises). Never searches."""
    g, c, j, p = as_graph(graph), as_cluster(cluster), as_job(job), as_plan(plan)
    return json.loads(_C.evaluate(g.to_json(), c.to_json(), None if j is None else j.to_json(),
                                  p.to_json(), "plan"))


def with_recompute(plan, graph, cluster, job=None, selective: bool = False) -> dict:
    """`plan` (a dict) with every node recomputed (its forward again in backward, keeping only
    its inputs: docs/formats.md), re-evaluated: the memory-for-time trade of activation
    checkpointing, as the executor applies it. `selective`: recomputed selectively (the outputs
    of matrix products, convolutions and attention kept: docs/recompute.md; the graph must
    carry the profiler's selective_* measurements)."""
    p = as_plan(plan).to_dict()
    how = "selective" if selective else True
    p["assignment"] = [dict(a, recompute=how) for a in p["assignment"]]
    return reevaluated(p, graph, cluster, job)


def with_sharding(plan, sharding: str, graph, cluster, job=None,
                  dp_shard: Optional[int] = None) -> dict:
    """`plan` (a dict) with data-parallel sharding `sharding` ("none", "zero2", "zero3":
    docs/sharding.md) over shard groups of `dp_shard` replicas (None: the whole data-parallel
    group; fewer: hybrid sharding, HSDP), re-evaluated."""
    p = as_plan(plan).to_dict()
    p["sharding"] = _shardings([sharding])[0]
    p.pop("dp_shard", None)
    if sharding == "none":
        p.pop("sharding")
    if dp_shard is not None and dp_shard != p["dp"]:
        p["dp_shard"] = dp_shard  # the core's validation says what is allowed
    return reevaluated(p, graph, cluster, job)


def reevaluated(p: dict, graph, cluster, job) -> dict:
    """The plan dict `p` with its predicted breakdown evaluated again (validated on the way)."""
    predicted = evaluate(graph, cluster, p, job)
    predicted.pop("objective", None)
    p["predicted"] = dict(p.get("predicted") or {}, **predicted)
    return p


def explain(plan, graph=None, cluster=None, job=None) -> str:
    """A plan as text for people: the configuration, the device mesh, the nodes on each device or
    stage, the predicted breakdown. With `graph` (and `cluster`) it is first checked against them
    and also shows memory capacity and links."""
    p = as_plan(plan)
    if cluster is not None and graph is None:
        raise ValueError("explain: a cluster needs the graph too (got cluster without graph)")
    g = None if graph is None else as_graph(graph).to_json()
    c = None if cluster is None else as_cluster(cluster).to_json()
    j = as_job(job)
    return _C.explain(p.to_json(), "plan", g, c, None if j is None else j.to_json())


def sweep(graph, cluster, job=None, max_devices: Optional[int] = None,
          modes: Sequence[str] = MODES) -> dict:
    """The paper's scaling study (as `hybridplan sweep`): for N = 1, 2, 4, ... max_devices (all of
    the cluster when None), the best pure-DP plan and the best plan overall. Returns
    {"points": [{"devices", "dp_only", "best", ...}], "csv": text}; see csrc/planner/searches/sweep.h."""
    g, c, j = as_graph(graph), as_cluster(cluster), as_job(job)
    placement, pipeline = _mode_flags(modes)
    max_devices = c.num_devices if max_devices is None else _positive_int(max_devices,
                                                                          "max_devices")
    return json.loads(_C.sweep(g.to_json(), c.to_json(), None if j is None else j.to_json(),
                               max_devices, placement=placement, pipeline=pipeline))


@dataclasses.dataclass(frozen=True)
class RunPhase:
    progress_start: float   # fraction of the run (of epochs_min's work) where the phase starts
    progress_end: float
    plan: Plan
    epochs: float           # of this phase
    time_s: float           # training time of this phase (switches not included)


@dataclasses.dataclass(frozen=True)
class RunSchedule:
    """A schedule of plans over the run (csrc/planner/run/run_phases.h); `to_dict()` is the JSON
    `hybridplan plan --over-run --json` prints."""
    phases: list                  # RunPhase, in run order
    time_s: float                 # phases plus switches
    switches: int
    switch_s: float               # the price of one switch used
    best_single: Plan             # the best plan for the whole run
    best_single_time_s: float
    gain_over_best_single: float  # best_single_time_s / time_s - 1
    candidates: int
    _dict: dict = dataclasses.field(repr=False, compare=False, default_factory=dict)

    def to_dict(self) -> dict:
        return copy.deepcopy(self._dict)


def _plan_of(d: dict) -> Plan:
    return Plan._of(d)


def plan_over_run(graph, cluster, job, devices: Optional[int] = None, segments: int = 16,
                  switch_s: Optional[float] = None, modes: Sequence[str] = MODES) -> RunSchedule:
    """The schedule of plans over the whole run as the job's critical batch grows (as `hybridplan
    plan --over-run`): the run cut into `segments` equal parts of progress, each phase's plan
    chosen by dynamic programming with `switch_s` seconds per change of plan (None: a 30 s
    restart plus a checkpoint round trip at 1 GB/s). `job` must have a critical_batch
    convergence model (a number or a [[progress, critical_batch], ...] trajectory); ValueError
    otherwise, InfeasibleError when no plan fits."""
    g, c, j = as_graph(graph), as_cluster(cluster), as_job(job)
    if j is None:
        raise ValueError("plan_over_run: job must be given: its critical_batch model decides "
                         "each phase's plan (got None)")
    placement, pipeline = _mode_flags(modes)
    devices = 0 if devices is None else _positive_int(devices, "devices")
    segments = _positive_int(segments, "segments")
    if switch_s is None:
        switch_s = -1.0
    elif (isinstance(switch_s, bool) or not isinstance(switch_s, (int, float))
          or not 0 <= switch_s < float("inf")):
        raise ValueError(f"switch_s must be finite and >= 0, or None (got {switch_s!r})")
    d = json.loads(_C.plan_over_run(g.to_json(), c.to_json(), j.to_json(), devices=devices,
                                    segments=segments, switch_s=float(switch_s),
                                    placement=placement, pipeline=pipeline))
    phases = [RunPhase(p["progress_start"], p["progress_end"], _plan_of(p["plan"]), p["epochs"],
                       p["time_s"]) for p in d["phases"]]
    return RunSchedule(phases, d["time_s"], d["switches"], d["switch_s"],
                       _plan_of(d["best_single"]), d["best_single_time_s"],
                       d["gain_over_best_single"], d["candidates"], d)
