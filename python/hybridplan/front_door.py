"""The front door: one call in a torchrun script profiles, plans and applies (docs/front_door.md).

    hp = hybridplan.parallelize(model, example_inputs, example_target=target, loss_fn=loss_fn,
                                optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))
    global_batch = hp.global_batch                   # dp x per_replica_batch x accumulation
    for inputs, target in batches(global_batch):     # the same global batch on every rank
        loss = hp.step(*hp.shard(inputs, target))    # this replica's share

`example_inputs` is one replica's batch. Step by step, on every rank of the job:

  1. the process group: torchrun's (or one the caller initialised); without torchrun a job of
     one process, unless `world_size` asks for more (then the error says how to launch);
  2. rank 0 alone, the other ranks waiting for its answer on a group of their own:
     a. the Cluster: `cluster` (a Cluster, dict, file or preset name), else this host's cached
        calibration (<cache_dir>/cluster-<hostname>.json, as `hybridplan calibrate --out`
        writes one), else the localhost-cpu preset without a GPU or its machine's preset with
        one (logged), sized to the job;
     b. the Job: `job` (a Job, dict or file), else the example's batch per replica, the
        optimizer's state size, and samples/s as the objective;
     c. the Graph: from the cache (`cache_dir`, default ~/.cache/hybridplan/graphs/), keyed by
        the model's structure and the example's shapes, else profiled (on a copy of the model,
        under a forked RNG, so that the caller's model and random state stay as every other
        rank's) and written to the cache atomically;
     d. the Plan: the existing search (hybridplan.search) on the job's world size, keeping the
        plans that run one process per device (data parallelism, dp = world; pipelines, dp x
        mp = world); a model that cannot be cut into stages is planned without pipelines, and
        the log says which module and why;
  3. rank 0 broadcasts graph, cluster, job and plan as JSON, the one time they travel as text
     (or its error, raised on every rank; executor/rank_agreement.rank_zero_acts), logs the
     choice in two lines, and every rank applies the same plan with hybridplan.apply, which
     checks once more that the ranks agree (the plan's sha256). Rank 0 keeps the objects it
     made; the other ranks read each document once. A pipeline plan whose cut fails at apply
     falls back to the best data-parallel plan, logged.

`sync_batchnorm=True` (apply's: BatchNorm over the global batch, executor/batch_norm.py) plans
data parallelism only: a pipeline's stages normalise each micro-batch alone.

Returns apply's AppliedPlan: `hp.plan` is the hybridplan Plan applied (the search's object on
rank 0), and `hp.parallelized` a Parallelized (the graph, cluster, job and that plan, the log
lines, where the graph came from).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import json
import os
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from . import __version__
from .executor import apply, destroy_groups
from .executor.calls import as_call, batch_size, default_loss
from .executor.lifecycle import DEFAULT_TIMEOUT_S, init_process_group
from .executor.rank_agreement import rank_zero_acts
from .net import free_port
from .profiler.dataflow import resize_batch
from .profiler.profile import snake_case
from .planner import (MODES, Cluster, Graph, InfeasibleError, Job, Plan, as_cluster, as_job,
                      evaluate, search)

__all__ = ["parallelize", "Parallelized", "Choice", "choose_plan", "resolve_cluster",
           "resolve_job", "job_with_precision", "default_cache_dir", "graph_cache_key",
           "graph_cache_path", "calibration_path", "launch_hint"]

kDefaultTimeoutS = DEFAULT_TIMEOUT_S  # apply's
# How long the other ranks wait for rank 0's profile and plan (a group of its own, so the
# training's timeout_s does not bound a first profile of a large model).
kDefaultSetupTimeoutS = 3600.0
kCpuPreset = "localhost-cpu"
kTopK = 64           # plans ranked in the first search
kTopKRunnerUp = 512  # in a second one, when the other mode's best was not among those
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_APPLY_OWN = ("plan", "module", "graph", "example_inputs", "loss_fn", "optimizer", "timeout_s")


@dataclasses.dataclass
class Choice:
    """What choose_plan decided: `plan` (best), `fallback` (the best data-parallel plan when
    `plan` is a pipeline: apply falls back to it if the cut fails), `runner_up` (the best plan
    of the other mode) and its objective over the chosen one's, `candidates` (evaluated by the
    searches), `no_plan` (mode -> why that mode has no plan), `objective` ("samples/s" or
    "time to train")."""
    plan: Plan
    fallback: Optional[Plan]
    runner_up: Optional[Plan]
    runner_up_ratio: float
    candidates: int
    no_plan: Dict[str, str]
    objective: str


@dataclasses.dataclass
class Parallelized:
    """What parallelize used, the same on every rank (hp.parallelized)."""
    graph: Graph
    cluster: Cluster
    job: Job
    plan: Plan                   # the plan applied
    log: List[str]               # the lines rank 0 printed
    graph_source: str            # "cache" or "profiled"
    graph_path: Optional[str]    # the cache file (None when caching is off)


# ---- the cache ----------------------------------------------------------------------------------

def default_cache_dir() -> str:
    """$HYBRIDPLAN_CACHE_DIR, else $XDG_CACHE_HOME/hybridplan, else ~/.cache/hybridplan."""
    if os.environ.get("HYBRIDPLAN_CACHE_DIR"):
        return os.environ["HYBRIDPLAN_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hybridplan")


def calibration_path(cache_dir: str) -> str:
    """Where parallelize looks for this host's calibration (`hybridplan calibrate --out` it)."""
    return os.path.join(cache_dir, f"cluster-{socket.gethostname()}.json")


def _shapes(value: Any) -> Any:
    """The structure of a batch with each tensor as (shape, dtype): what a profile depends on."""
    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), str(value.dtype)]
    if isinstance(value, dict):
        return {str(k): _shapes(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (tuple, list)):
        return [_shapes(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__qualname__


def _qualname(obj: Any) -> Optional[str]:
    if obj is None:
        return None
    name = getattr(obj, "__qualname__", type(obj).__qualname__)
    return f"{getattr(obj, '__module__', '?')}.{name}"


def _profile_device() -> str:
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    return "cpu"


def graph_cache_key(model: nn.Module, example_inputs: Any, example_target: Any = None,
                    loss_fn: Optional[Callable] = None,
                    profile_options: Optional[Dict[str, Any]] = None) -> Tuple[str, dict]:
    """(sha256 hex, the document hashed): the model's structure (every module's name and type,
    every state entry's name, shape, dtype and whether it trains), the example's and target's
    shapes and dtypes, the loss function's name, the profile options, the device profiled on,
    intra-op threads, and the torch and hybridplan versions. Weights' values are not in it:
    they do not change a profile."""
    doc = {
        "model": _qualname(type(model)),
        "modules": [[name, _qualname(type(m))] for name, m in model.named_modules()],
        "state": [[k, list(v.shape), str(v.dtype), bool(getattr(v, "requires_grad", False))]
                  for k, v in model.state_dict(keep_vars=True).items()],
        "inputs": _shapes(example_inputs), "target": _shapes(example_target),
        "loss": _qualname(loss_fn), "profile_options": _shapes(dict(profile_options or {})),
        "device": _profile_device(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "hybridplan": __version__,
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest(), doc


def graph_cache_path(cache_dir: str, model: nn.Module, key: str) -> str:
    return os.path.join(cache_dir, "graphs", f"{snake_case(type(model).__name__)}-{key[:20]}.json")


# ---- where the cluster and the job come from ---------------------------------------------------

def _cluster_fits_world(c: Cluster, world: int, local_world: int, sized: bool
                        ) -> Tuple[Cluster, str]:
    """`c` with room for `world` processes: a CPU cluster (`sized`: one the caller did not name,
    or any CPU cluster, whose devices are processes) takes local_world devices per node; a GPU
    cluster takes more nodes like its own. ("", unchanged) when it has room."""
    if c.num_devices >= world:
        return c, ""
    d = c.to_dict()
    if d["device"].get("type", "cuda") == "cpu" and sized and world % local_world == 0:
        d.update(num_nodes=world // local_world, devices_per_node=local_world)
        return (Cluster.from_dict(d, f"{c.name} sized to {world} ranks"),
                f"{c.name} sized to {world // local_world} x {local_world} CPU ranks")
    if world % c.devices_per_node == 0:
        return (c.with_num_nodes(world // c.devices_per_node),
                f"{c.name} with {world // c.devices_per_node} nodes")
    raise ValueError(f"hybridplan.parallelize: cluster {c.name!r} has {c.num_devices} devices "
                     f"({c.num_nodes} x {c.devices_per_node}) and the job {world} processes, "
                     f"not a multiple of its {c.devices_per_node} devices per node: launch "
                     f"whole nodes, or pass a cluster that describes this job")


# GPU name -> the preset of its machine (presets), first match wins
_GPU_PRESETS = (("A100-PCIE", "pcie-8gpu"), ("H200", "dgx-h200"), ("H100", "dgx-h100"),
                ("A100", "dgx-a100"), ("V100", "dgx1-v100"))


def _gpu_preset(gpu_name: str) -> Optional[str]:
    name = gpu_name.upper().replace(" ", "-")
    return next((preset for key, preset in _GPU_PRESETS if key in name), None)


def resolve_cluster(cluster: Any, cache_dir: Optional[str], world: int, local_world: int,
                    cuda: Optional[bool] = None, gpu_name: Optional[str] = None
                    ) -> Tuple[Cluster, str]:
    """(Cluster, a log line or ""): `cluster` as given (a Cluster, dict, file or preset name),
    else the cached calibration of this host, else without a GPU the localhost-cpu preset, with
    one the preset of its machine (H100 -> dgx-h100, ...), sized to `world` processes.
    ValueError when a GPU cluster is asked for on a machine without one (naming the CPU preset
    to use instead), or a GPU matches no preset."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    calibrated = calibration_path(cache_dir) if cache_dir else None
    calibrate = (f"`torchrun --nproc-per-node {max(2, local_world)} -m hybridplan calibrate "
                 f"--out {calibrated or 'CACHE_DIR/cluster-HOST.json'}`")
    how = ""
    if cluster is not None:
        c = as_cluster(cluster)
    elif calibrated and os.path.exists(calibrated):
        c = Cluster.load(calibrated)
        how = f"cluster {c.name}: this host's calibration {calibrated}"
    elif not cuda:
        c = Cluster.preset(kCpuPreset)
        how = (f"cluster {kCpuPreset} (preset): no GPU and no calibration of this host; "
               f"{calibrate} measures this machine")
    else:
        if gpu_name is None:
            gpu_name = torch.cuda.get_device_name(torch.cuda.current_device())
        preset = _gpu_preset(gpu_name)
        if preset is None:
            raise ValueError(
                f"hybridplan.parallelize: no cluster given, no calibration of this host and no "
                f"preset for its GPU ({gpu_name}): pass cluster= a preset ("
                f"{', '.join(p for p in _presets() if p != kCpuPreset)}) or a Cluster file, or "
                f"measure this machine with {calibrate}")
        c = Cluster.preset(preset)
        how = (f"cluster {preset} (preset for {gpu_name}): no calibration of this host; "
               f"{calibrate} measures this machine")
    if c.to_dict()["device"].get("type", "cuda") == "cuda" and not cuda:
        raise ValueError(
            f"hybridplan.parallelize: cluster {c.name!r} describes CUDA devices, but this "
            f"machine has no GPU (torch.cuda.is_available() is False): use "
            f"cluster={kCpuPreset!r} (CPU ranks on loopback Gloo), or leave cluster out to use "
            f"this host's calibration ({calibrate})")
    c, sized = _cluster_fits_world(c, world, local_world, sized=cluster is None or
                                   c.to_dict()["device"].get("type") == "cpu")
    if sized:
        how = f"{how}; {sized}" if how else f"cluster {sized}"
    return c, how


def _presets() -> List[str]:
    from .planner import presets
    return presets()


def _optimizer_kind(optimizer: Any) -> str:
    """The Job's optimizer (its state: sgd 0x, sgd_momentum 1x, adam 2x the parameters) from an
    Optimizer or a factory, which is called once on a one-element parameter to see what it
    builds; "adam" (the most state) when that cannot tell."""
    if optimizer is None:
        return "sgd"  # apply's default, SGD(lr=0.01)
    opt = optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        try:
            opt = optimizer([nn.Parameter(torch.zeros(1))])
        except Exception:
            return "adam"
    if isinstance(opt, torch.optim.SGD):
        return "sgd_momentum" if opt.defaults.get("momentum") else "sgd"
    if isinstance(opt, (torch.optim.Adagrad, torch.optim.RMSprop)):
        return "sgd_momentum"  # one state tensor per parameter
    return "adam"


def job_with_precision(job: Job, precision: str) -> Job:
    """`job` with the precision `precision` (checked by the core); ValueError when the job
    names another one."""
    d = job.to_dict()
    have = d.get("precision")  # absent: fp32 (the core writes it only otherwise)
    if have is not None and have != precision:
        raise ValueError(f"hybridplan.parallelize: precision={precision!r} but the job's "
                         f"precision is {have!r}: give one of them")
    return Job.from_dict(dict(d, precision=precision), "job (parallelize's precision)")


def resolve_job(job: Any, per_replica_batch: int, optimizer: Any = None) -> Job:
    """`job` as given (a Job, dict or file; a dict without "optimizer" takes the optimizer's),
    else samples/s at `per_replica_batch` (the example's batch) with the optimizer's state."""
    if isinstance(job, dict):
        d = dict(job)
        d.setdefault("schema_version", 1)
        d.setdefault("kind", "hybridplan.job")
        d.setdefault("optimizer", _optimizer_kind(optimizer))
        return Job.from_dict(d, "job")
    if job is not None:
        return as_job(job)
    return Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                          "per_replica_batch": int(per_replica_batch),
                          "optimizer": _optimizer_kind(optimizer)}, "default job")


# ---- the plan --------------------------------------------------------------------------------

def describe(p: Plan, mode: bool = True) -> str:
    """dp=2 mp=1 placement b=8 / dp=1 mp=2 pipeline 1f1b M=4 b=8 (+ sharding, recompute)."""
    text = f"dp={p.dp} mp={p.mp}" + (f" {p.mode}" if mode else "")
    if p.mode == "pipeline":
        text += f" {p.schedule} M={p.num_microbatches}"
    text += f" b={p.per_replica_batch}"
    if p.accumulation_steps > 1:
        text += f" x{p.accumulation_steps} accumulated"
    if p.compile:
        text += " compiled"
    if p.sharding != "none":
        text += f" {p.sharding}"
    if p.precision != "fp32":
        text += f" {p.precision}"
    recomputed = len(p.recompute)
    if recomputed:
        text += f" recompute {recomputed} nodes"
    return text


def _first_line(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _ranked(graph: Graph, cluster: Cluster, job: Job, world: int, modes: Sequence[str],
            top_k: int, dp_only: bool = False) -> Tuple[List[Plan], Any]:
    """The search's best `top_k` plans of `modes` on `world` devices that run on `world`
    processes (a placement plan with mp > 1 runs a replica's devices in one process: not this
    job), best first, and the search's result."""
    r = search(graph, cluster, job, devices=world, top_k=top_k, modes=modes, dp_only=dp_only)
    # the search offers mp = 1 (data parallelism, mode "placement") in every mode
    return [p for p in r.plans if p.num_processes == world and p.mode in modes], r


def _infeasible_hint(batch: int, world: int) -> str:
    return (f"hint: a smaller per-replica batch (a smaller example batch, or job="
            f"{{'per_replica_batch': {{'min': 1, 'max': {batch}}}}} to let the search choose), "
            f"more processes than {world} (--nproc-per-node), pipelines (modes including "
            f"'pipeline'), or a cluster whose devices have more memory")


def choose_plan(graph: Graph, cluster: Cluster, job: Job, world: int,
                modes: Sequence[str] = MODES) -> Choice:
    """The search's best plan on `world` processes, one per device: data parallelism (dp =
    world, with the search's sharding) or a pipeline (dp x mp = world), ranked by the search's
    objective. Without pipelines where the graph cannot be cut (its pipeline_split says which
    module and why) or world is 1. InfeasibleError (the search's message and a hint) when
    nothing fits."""
    modes = tuple(modes)
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"hybridplan.parallelize: modes must be a non-empty subset of {MODES} "
                         f"(got {modes!r})")
    split = graph.to_dict().get("pipeline_split", {"supported": True, "reason": ""})
    no_plan: Dict[str, str] = {}
    for mode in MODES:
        if mode not in modes:
            no_plan[mode] = f"{mode} not among modes={list(modes)}"
    if "pipeline" in modes and world < 2:
        no_plan["pipeline"] = "one process: a pipeline needs a process per stage"
    elif "pipeline" in modes and not split.get("supported", True):
        no_plan["pipeline"] = _first_line(split.get("reason") or "the model cannot be cut")
    searched = tuple(m for m in MODES if m not in no_plan) or ("placement",)
    batch = job.to_dict().get("per_replica_batch", graph.batch_size)
    batch = batch if isinstance(batch, int) else graph.batch_size
    try:
        plans, result = _ranked(graph, cluster, job, world, searched, kTopK)
        if not plans:  # the best ranked plans need fewer processes (placement with mp > 1)
            plans, result = _ranked(graph, cluster, job, world, searched, kTopKRunnerUp)
        if not plans and "placement" in searched:  # data parallelism alone
            plans, result = _ranked(graph, cluster, job, world, ("placement",), kTopK,
                                    dp_only=True)
    except InfeasibleError as e:
        raise InfeasibleError(f"hybridplan.parallelize: {e}\n"
                              f"{_infeasible_hint(batch, world)}") from None
    if not plans:
        raise InfeasibleError(f"hybridplan.parallelize: no plan runs on {world} processes of "
                              f"{cluster.name} (one per device)\n{_infeasible_hint(batch, world)}")
    chosen = plans[0]
    other = "pipeline" if chosen.mode == "placement" else "placement"
    runner_up = next((p for p in plans if p.mode == other), None)
    if runner_up is None and other in searched:
        more, _ = _ranked(graph, cluster, job, world, searched, kTopKRunnerUp)
        runner_up = next((p for p in more if p.mode == other), None)
        if runner_up is None:
            why = [w for w in result.infeasible if w.startswith(other)]
            no_plan[other] = _first_line("; ".join(why) if why else
                                         f"none among the best {len(more)} plans")
    ratio = float("nan")
    if runner_up is not None:
        ratio = (evaluate(graph, cluster, runner_up, job)["objective"]
                 / evaluate(graph, cluster, chosen, job)["objective"])
    fallback = (next((p for p in plans if p.mode == "placement"), None)
                if chosen.mode == "pipeline" else None)
    if chosen.mode == "pipeline" and fallback is None and "placement" in modes:
        try:
            fallback = next(iter(_ranked(graph, cluster, job, world, ("placement",), 1,
                                         dp_only=True)[0]), None)
        except InfeasibleError:
            fallback = None
    has_convergence = "convergence" in job.to_dict()
    return Choice(chosen, fallback, runner_up, ratio, result.candidates_evaluated, no_plan,
                  "time to train" if has_convergence else "samples/s")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def plan_lines(choice: Choice, cluster: Cluster) -> List[str]:
    """The two log lines: what was chosen and its prediction; over what and why."""
    p, pred = choice.plan, choice.plan.predicted
    memory = max(pred.get("memory_bytes") or [0]) / 2**20
    first = (f"hybridplan: {describe(p)} on {cluster.name}: "
             f"{pred.get('samples_per_s', 0):.0f} samples/s predicted")
    if pred.get("time_to_train_s"):
        first += f", {_duration(pred['time_to_train_s'])} to train"
    first += f", {memory:.1f} MiB per device"
    other = "pipeline" if p.mode == "placement" else "placement"
    n = choice.candidates
    second = (f"hybridplan: chosen for {choice.objective} over {n} "
              f"candidate{'' if n == 1 else 's'}; ")
    if choice.runner_up is not None:
        kind = "pipeline" if other == "pipeline" else "data-parallel plan"
        second += (f"best {kind} ({describe(choice.runner_up, mode=False)}) "
                   f"{choice.runner_up_ratio:.2f}x slower")
    else:
        label = "pipeline" if other == "pipeline" else "data-parallel plan"
        second += f"no {label}: {choice.no_plan.get(other, 'none found')}"
    return [first, second]


# ---- the process group -----------------------------------------------------------------------

def launch_hint(world: int) -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") \
        else "train.py"
    return (f"launch with `torchrun --nproc-per-node {world} {script}` or "
            f"`python -m hybridplan run --nproc-per-node {world} {script}` (several machines: "
            f"torchrun --nnodes N --node-rank I --master-addr HOST ...)")


def _process_group(world_size: Optional[int], timeout_s: float) -> None:
    """The default process group: torchrun's environment, an existing group, or (neither, and
    at most one process expected) a job of one process on loopback."""
    if not dist.is_initialized():
        present = [k for k in _TORCHRUN_ENV if k in os.environ]
        if not present:
            if world_size is not None and world_size > 1:
                raise ValueError(
                    f"hybridplan.parallelize: world_size={world_size} but this process was not "
                    f"started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not "
                    f"set) and no process group is initialised: {launch_hint(world_size)}")
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        elif len(present) < len(_TORCHRUN_ENV):
            missing = [k for k in _TORCHRUN_ENV if k not in os.environ]
            raise ValueError(f"hybridplan.parallelize: the environment sets {present} but not "
                             f"{missing}: {launch_hint(world_size or 2)}")
        init_process_group(datetime.timedelta(seconds=timeout_s))
    world = dist.get_world_size()
    if world_size is not None and world_size != world:
        raise ValueError(f"hybridplan.parallelize: world_size={world_size} but the job has "
                         f"{world} processes: {launch_hint(world_size)}")


# ---- rank 0's part: graph, cluster, job, plan -------------------------------------------------

def _batch_of(example_inputs: Any, batch_dim: int) -> int:
    batch = batch_size(*as_call(example_inputs), batch_dim)
    if batch:
        return batch
    raise ValueError("hybridplan.parallelize: example_inputs must be one replica's batch: a "
                     "tensor, a tuple or a dict of inputs with a tensor whose dimension "
                     f"{batch_dim} is the batch (got {_shapes(example_inputs)})")


def _graph(model, example_inputs, example_target, loss_fn, cache_dir, profile_options, log
           ) -> Tuple[Graph, str, Optional[str]]:
    """(Graph, "cache" | "profiled", cache path): the cached profile, else a new one (cached)."""
    from . import models
    from .profiler import profile

    batch = _batch_of(example_inputs, 0)
    if example_target is not None:
        profile_loss = loss_fn or default_loss(model)
    elif loss_fn is None:  # a built-in model brings its loss and example target
        profile_loss, example_target = models.loss_and_target(model, batch)
    else:
        profile_loss = None  # the gradient of sum(output): no target to give the loss
    options = dict(profile_options or {})
    verbose = options.pop("verbose", False)  # progress output: not part of the key
    key, _ = graph_cache_key(model, example_inputs, example_target, profile_loss, options)
    path = graph_cache_path(cache_dir, model, key) if cache_dir else None
    if path and os.path.exists(path):
        try:
            graph = Graph.load(path)
            log(f"hybridplan: graph of {type(model).__name__} from the cache {path} "
                f"(not profiled again)")
            return graph, "cache", path
        except ValueError as e:
            log(f"hybridplan: the cached graph {path} is unreadable ({_first_line(e, 160)}); "
                f"profiling again")
    device = options.pop("device", None) or (
        f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    started = time.monotonic()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    # a copy, under a forked RNG: the caller's module (device, mode, gradients, BatchNorm
    # statistics) and random state stay as on the ranks that do not profile
    with torch.random.fork_rng(devices=devices):
        graph = profile(copy.deepcopy(model), example_inputs, device=device, verbose=verbose,
                        loss_fn=profile_loss, target=example_target, **options)
    where = ""
    if path:
        graph.save(path)  # atomic (files.write_text_atomic): a reader never sees half
        where = f"; cached at {path}"
    log(f"hybridplan: profiled {type(model).__name__} ({len(graph.node_names)} nodes) at batch "
        f"{batch} on {device} in {time.monotonic() - started:.1f} s"
        + ("" if profile_loss is not None else " (no loss: pass example_target with loss_fn "
           "to time the loss too)") + where)
    return graph, "profiled", path


def _decide(model, example_inputs, example_target, loss_fn, optimizer, job, cluster, cache_dir,
            profile_options, modes, world, local_world, log) -> Tuple[dict, dict]:
    """Rank 0's work: the payload broadcast to every rank (the documents as JSON text) and the
    same documents as the objects rank 0 holds (graph, cluster, job, plan, fallback)."""
    c, how = resolve_cluster(cluster, cache_dir, world, local_world)  # cheap errors first
    j = resolve_job(job, _batch_of(example_inputs, 0), optimizer)
    if how:
        log(f"hybridplan: {how}")
    graph, source, path = _graph(model, example_inputs, example_target, loss_fn, cache_dir,
                                 profile_options, log)
    choice = choose_plan(graph, c, j, world, modes)
    lines = plan_lines(choice, c)
    objects = {"graph": graph, "cluster": c, "job": j, "plan": choice.plan,
               "fallback": choice.fallback}
    payload = {k: v.to_json() if v is not None else None for k, v in objects.items()}
    payload.update(lines=lines, source=source, path=path)
    return payload, objects


def _setup_group(setup_timeout_s: float) -> Any:
    """A Gloo group of its own for rank 0's answer, created by every rank before rank 0 starts
    its work: the group's own timeout (setup_timeout_s) then bounds the wait, not the default
    group's and its store's (apply's timeout_s), which a first profile of a large model may
    exceed. None for a job of one process."""
    if dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=setup_timeout_s))


def _error_from_rank0(kind: str, message: str) -> BaseException:
    """Rank 0's failure as every other rank raises it: the planner's and the input checks'
    kinds as they are, anything else a RuntimeError naming it."""
    if kind == "InfeasibleError":
        return InfeasibleError(message)
    if kind == "ValueError":
        return ValueError(message)
    return RuntimeError(f"hybridplan.parallelize failed on rank 0: {kind}: {message}")


# ---- the front door --------------------------------------------------------------------------

def parallelize(model: nn.Module, example_inputs: Any, *, optimizer: Any = None,
                loss_fn: Optional[Callable] = None, example_target: Any = None,
                job: Any = None, cluster: Any = None, cache_dir: Optional[str] = None,
                world_size: Optional[int] = None, modes: Sequence[str] = MODES,
                timeout_s: float = kDefaultTimeoutS,
                setup_timeout_s: float = kDefaultSetupTimeoutS,
                profile_options: Optional[Dict[str, Any]] = None, verbose: bool = True,
                sync_batchnorm: bool = False, precision: Optional[str] = None,
                **apply_options: Any):
    """Profiles `model` (once: cached), plans it for this job and applies the plan; returns the
    AppliedPlan (hybridplan.apply's) with `.parallelized` (see the module doc).

    model           the full model, built identically on every rank.
    example_inputs  one replica's batch as the model takes it (a tensor, a tuple of positional
                    or a dict of keyword arguments); its batch is the default per-replica batch.
    optimizer       a factory params -> Optimizer (or an Optimizer), passed to apply; also tells
                    the planner the optimizer's state size.
    loss_fn         loss(output, target), mean-reduced; default module.loss or cross-entropy.
    example_target  the target of example_inputs: with it the profile times the loss too.
    job             a Job, dict or file; default: samples/s at the example's batch.
    cluster         a Cluster, dict, file or preset name; default: this host's calibration
                    (<cache_dir>/cluster-<hostname>.json), else localhost-cpu without a GPU.
    cache_dir       where graphs are cached (graphs/) and the calibration is looked for; default
                    $HYBRIDPLAN_CACHE_DIR, $XDG_CACHE_HOME/hybridplan or ~/.cache/hybridplan;
                    False: no cache.
    world_size      the processes expected (checked; without torchrun and > 1: the error says
                    how to launch). Default: the job's (1 without torchrun).
    modes           the plan modes to search ("placement": data parallelism, one process per
                    replica; "pipeline").
    timeout_s       apply's timeout (process groups, p2p waits).
    setup_timeout_s how long the other ranks wait for rank 0's profile and plan.
    profile_options hybridplan.profile's keyword arguments (warmup, repeats, batch_sizes, clock,
                    ...); part of the cache key.
    verbose         rank 0 logs to stderr (which graph, which cluster, the plan in two lines).
    sync_batchnorm  apply's (True: BatchNorm layers normalise over the global batch, torch's
                    SyncBatchNorm); then only "placement" plans are searched, as apply refuses
                    it for a pipeline.
    precision       "fp32", "bf16" or "fp16": the Job's precision (docs/training_step.md
                    "Precision"), which the planner prices and the plan carries to apply; None:
                    the job's (fp32 without one). A job naming another precision is an error.
    apply_options   further keyword arguments of hybridplan.apply (batch_dim,
                    measure_noise_scale, resume_from, the training step's clip_grad_norm,
                    accumulation_steps and lr_scheduler, ...).
    """
    clash = sorted(set(apply_options) & set(_APPLY_OWN))
    if clash:
        raise ValueError(f"hybridplan.parallelize: {clash} are parallelize's to set (got them "
                         f"as extra apply options)")
    if not isinstance(model, nn.Module):
        raise ValueError(f"hybridplan.parallelize: model must be a torch.nn.Module (got "
                         f"{type(model).__name__})")
    if sync_batchnorm:
        if "placement" not in modes:
            raise ValueError(f"hybridplan.parallelize: sync_batchnorm=True applies to placement "
                             f"(data-parallel) plans: modes must include \"placement\" (got "
                             f"{tuple(modes)})")
        modes = ("placement",)
    apply_options["sync_batchnorm"] = sync_batchnorm
    batch_dim = apply_options.get("batch_dim", 0)
    example_batch = _batch_of(example_inputs, batch_dim)
    if precision is not None:
        job = job_with_precision(
            resolve_job(job, _batch_of(example_inputs, 0), optimizer), precision)
    if cache_dir is None:
        cache_dir = default_cache_dir()
    elif cache_dir is False:
        cache_dir = None
    else:
        cache_dir = os.fspath(cache_dir)
    _process_group(world_size, timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    lines: List[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if verbose:
            print(line, file=sys.stderr, flush=True)

    mine: Dict[str, Any] = {}  # rank 0's objects: the other ranks read them from the payload

    def decide() -> dict:  # rank 0
        payload, objects = _decide(model, example_inputs, example_target, loss_fn, optimizer,
                                   job, cluster, cache_dir, profile_options, modes, world,
                                   local_world, log)
        mine.update(objects)
        for line in payload["lines"]:
            log(line)
        return payload

    group = _setup_group(setup_timeout_s)
    try:
        payload = rank_zero_acts(decide, _error_from_rank0, group=group,
                                 rank_zero_raises_own=True)
    finally:
        if group is not None:
            destroy_groups([group])
    def received(kind: Any, key: str) -> Any:
        """rank 0's object, or the one its payload holds read (and validated) once."""
        if key in mine:
            return mine[key]
        return kind.from_json(payload[key], f"{key} plan from rank 0" if key == "fallback"
                              else f"{key} from rank 0")

    graph, plan = received(Graph, "graph"), received(Plan, "plan")
    example = resize_batch(example_inputs, plan.per_replica_batch, batch_dim, have=example_batch)
    try:
        hp = apply(plan, model, loss_fn=loss_fn, optimizer=optimizer, timeout_s=timeout_s,
                   graph=graph, example_inputs=example, **apply_options)
    except ValueError as e:  # raised on every rank alike (apply's rank agreement)
        if payload["fallback"] is None:
            raise
        plan = received(Plan, "fallback")
        if rank == 0:
            log(f"hybridplan: the pipeline plan could not be applied ({_first_line(e, 300)}); "
                f"falling back to {describe(plan)}")
        example = resize_batch(example_inputs, plan.per_replica_batch, batch_dim,
                               have=example_batch)
        hp = apply(plan, model, loss_fn=loss_fn, optimizer=optimizer, timeout_s=timeout_s,
                   graph=graph, example_inputs=example, **apply_options)
    hp.parallelized = Parallelized(
        graph, received(Cluster, "cluster"), received(Job, "job"), plan,
        lines if rank == 0 else list(payload["lines"]), payload["source"], payload["path"])
    return hp
