"""The profiler's steps that need no measured values, shared by the real profile (profile.py) and
the fake one (fake_profile.py), so both build one Graph the same way: the example's inputs and
batch, the loss, the edges, the pipeline cut, the profile batch sizes and the smallest batch the
model accepts, parameter and tied bytes, and the graph JSON itself."""

import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .. import _C
from . import block_list, dataflow, stage_split

# Measuring the extra batch sizes stops once this much time went into them (they are smaller
# than the example batch, so each costs less than the main measurement).
kBatchTimeBudgetS = 60.0

Inputs = Union[torch.Tensor, Sequence[Any], Dict[str, Any]]


def _check_device(device: Union[str, torch.device]) -> torch.device:
    available = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"profile: device {device!r} is not a device name ({exc}); "
                         f"devices here: {', '.join(available)}") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        index = 0 if dev.index is None else dev.index
        if index < torch.cuda.device_count():
            return torch.device("cuda", index)
    raise ValueError(f"profile: device {str(device)!r} does not exist here; "
                     f"devices here: {', '.join(available)}")


def _check_inputs(example_inputs: Inputs, dev: torch.device
                  ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """(args, kwargs) on `dev`; the first tensor must have a batch dimension."""
    if isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    else:
        args, kwargs = tuple(example_inputs), {}
    first = _first_tensor(args, kwargs)
    if first is None or first.dim() == 0:
        raise ValueError("profile: example_inputs must be a tensor, a tuple or a dict of inputs "
                         "whose first tensor has a batch dimension (got "
                         f"{[type(x).__name__ for x in (*args, *kwargs.values())]})")
    return tuple(_move(x, dev) for x in args), {k: _move(v, dev) for k, v in kwargs.items()}


def _move(value: Any, dev: torch.device) -> Any:
    return dataflow.map_tensors(value, lambda t: t.to(dev))


def _loss_at(loss_fn, target, b: int) -> Callable[[Optional[int]], Optional[Callable]]:
    """size -> the step's loss at batch `size` (None: the example batch b), the target's first
    `size` samples along dim 0; None throughout without a loss_fn."""
    def at(size: Optional[int]):
        if loss_fn is None:
            return None
        part = target if size is None else dataflow.map_tensors(
            target, lambda t: _first_samples(t, b, size))
        return lambda output: loss_fn(output, part)
    return at


def _first_tensor(args, kwargs) -> Optional[torch.Tensor]:
    return next((x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), None)


def _add_pipeline_split(graph, module, flow, args, kwargs, log, floor: int = 1) -> None:
    """Graph `pipeline_split` and nodes' `cut_before` (docs/formats.md): the executor's
    export-based cut tried at profile time with a stage boundary at every node where one can
    be, on the first `floor` samples of the example, the smallest batch the forward runs at
    (the cut needs the shape of a micro-batch, not its size, and torch.export runs the
    module's Python at that shape: BatchNorm's check refuses one sample in training)."""
    def first(v):
        return v[:floor] if isinstance(v, torch.Tensor) and v.dim() else v
    training = module.training
    try:
        split, cut_before = stage_split.probe(module, tuple(first(a) for a in args),
                                              {k: first(v) for k, v in kwargs.items()},
                                              flow.order)
    finally:
        module.train(training)
    graph["pipeline_split"] = split
    for node in graph["nodes"]:
        if not cut_before.get(node["name"], True):
            node["cut_before"] = False
    if not split["supported"]:
        log(f"profile {graph['name']}: no pipeline plans: {split['reason']}")


def _edges(module, nodes, flow, inputs, kwargs) -> Tuple[Dict[dataflow.EdgeKey, int], str]:
    """fx edges where the model traces, else the hooks' edges."""
    try:
        return dataflow.fx_edges(module, nodes, flow, inputs, kwargs), "torch.fx"
    except Exception as exc:  # any fx failure means: use the hook-based dataflow instead
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return flow.edges, f"forward hooks; torch.fx could not trace: {reason[:120]}"


def _batch_sizes(batch_sizes, first: torch.Tensor, floor: int = 1, model: str = "the module"
                 ) -> List[int]:
    """The other batch sizes to measure, smallest first: the small ones cost least and are the
    furthest from the example batch, so they matter most when the budget runs out. None below
    `floor`, the smallest batch the forward runs at (_smallest_batch)."""
    b = int(first.shape[0])
    if isinstance(batch_sizes, str):
        if batch_sizes != "auto":
            raise ValueError(f"profile: batch_sizes must be \"auto\" or a list of batch sizes "
                             f"below the example batch {b} (got {batch_sizes!r})")
        # the rule the C++ profiler uses too, at the sizes the module runs
        return [x for x in _C.default_profile_batch_sizes(b) if x >= floor]
    sizes = sorted({int(x) for x in batch_sizes})
    bad = [x for x in sizes if not 1 <= x < b]
    if bad:
        raise ValueError(f"profile: batch_sizes must lie in 1..{b - 1} (below the example batch "
                         f"{b}, whose inputs are sliced) (got {bad})")
    small = [x for x in sizes if x < floor]
    if small:
        raise ValueError(f"profile: batch_sizes must be at least {floor}, the smallest batch "
                         f"{model}'s forward runs at (got {small})")
    return sizes


def _smallest_batch(module: nn.Module, call) -> int:
    """The smallest batch (the first samples of the example `call`, (args, kwargs)) at which
    `module`'s forward runs, in its current mode, found by trying: the automatic batch sizes'
    halvings upwards until one runs, then bisection below it (a forward that runs at some batch
    runs at every larger one). The module's buffers are put back afterwards: the trials must
    not move BatchNorm's running statistics."""
    b = int(_first_tensor(*call).shape[0])
    buffers = list(module.buffers())
    saved = [t.clone() for t in buffers]

    def runs(size: int) -> bool:
        try:
            args, kwargs = _slice_batch(call, b, size)
            with torch.no_grad():
                module(*args, **kwargs)
            return True
        except Exception:  # any failure means: not at this batch (the example batch ran)
            return False
    try:
        low, high = 0, b  # the forward fails at `low` (0: none tried) and runs at `high`
        for size in _C.default_profile_batch_sizes(b):
            if runs(size):
                high = size
                break
            low = size
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if runs(middle) else (middle, high)
        return high
    finally:
        with torch.no_grad():
            for t, value in zip(buffers, saved):
                t.copy_(value)


def _batch_advice(message: str, cause: Optional[BaseException]) -> str:
    """The example batch's forward failure, with what to do where the batch is too small."""
    if cause is not None and "value per channel" in str(cause):
        return (f"{message}. BatchNorm in training normalises over the batch: give "
                f"example_inputs a batch of at least 2 samples (the profile measures smaller "
                f"batches only where the module runs)")
    return message


def _first_samples(t: torch.Tensor, b: int, size: int) -> torch.Tensor:
    """The first `size` samples of `t` where its dim 0 is the batch b; else `t` as it is."""
    return t[:size] if t.dim() > 0 and t.shape[0] == b else t


def _slice_batch(call, b: int, size: int):
    """(args, kwargs) with the first `size` samples of every tensor whose dim 0 is the batch b."""
    def cut(x):
        return _first_samples(x, b, size) if isinstance(x, torch.Tensor) else x
    args, kwargs = call
    return tuple(cut(x) for x in args), {k: cut(v) for k, v in kwargs.items()}


def _build(graph_name, module, nodes, flow, edges, forward_s, backward_s, flops, dev, first,
           batch_times=None):
    ids = {name: i for i, name in enumerate(flow.order)}
    param_bytes, param_tensors = _param_bytes(module, nodes, flow)
    floating = [p.dtype for p in module.parameters() if p.is_floating_point()]
    dtype = str(floating[0] if floating else first.dtype).replace("torch.", "")
    return {
        "schema_version": 1, "kind": "hybridplan.graph", "name": graph_name,
        "profiled": {"device": str(dev), "batch_size": int(first.shape[0]), "dtype": dtype},
        "nodes": [{"id": ids[n], "name": n,
                   "op": snake_case(type(nodes[block_list.module_name(n)]).__name__),
                   "forward_s": forward_s[n], "backward_s": backward_s[n],
                   "param_bytes": param_bytes[n], "param_tensors": param_tensors[n],
                   "output_bytes": dataflow.tree_total(flow.output_tree[n]),
                   "saved_bytes": int(flow.saved_bytes.get(n, 0)),
                   "flops": flops.get(n, 0.0),
                   **_batch_times_of(n, batch_times)} for n in flow.order],
        "edges": [{"src": ids[s], "dst": ids[d], "bytes": int(b)}
                  for (s, d), b in sorted(edges.items(), key=lambda e: (ids[e[0][0]],
                                                                       ids[e[0][1]]))
                  if s in ids and d in ids],
        "tied_params": _tied_params(nodes, flow.order, ids),
    }


def _batch_times_of(name: str, batch_times) -> Dict[str, Any]:
    """The node's "batch_times" entry (docs/formats.md), ascending batch size; {} if none."""
    if not batch_times:
        return {}
    return {"batch_times": [{"batch_size": size, "forward_s": f[name], "backward_s": bw[name]}
                            for size, (f, bw) in sorted(batch_times.items())]}


def _param_bytes(module, nodes, flow) -> Tuple[Dict[str, int], Dict[str, int]]:
    """Bytes of each node's parameters, and how many of them the optimizer updates (tensors that
    require grad: the optimizer pays a fixed cost per tensor, docs/formats.md param_tensors). A
    parameter several nodes hold (tied weights such as GPT-2's wte/lm_head) counts once, at its
    first node in execution order (_tied_params lists it for the others); a parameter inside no
    node (block_list: held by the root) goes to the first node that reads it, else to the first
    node. A module called more than once holds its parameters at its first call's node (the
    other calls' nodes share them, block_list)."""
    seen = set()
    nbytes: Dict[str, int] = {}
    tensors: Dict[str, int] = {}
    for name in flow.order:
        nbytes[name] = tensors[name] = 0
        for p in nodes[block_list.module_name(name)].parameters():
            if id(p) not in seen:
                seen.add(id(p))
                nbytes[name] += p.numel() * p.element_size()
                tensors[name] += int(p.requires_grad)
    for name, p in dataflow.orphan_parameters(module, nodes).items():
        reader = flow.param_readers.get(name, flow.order[0])
        nbytes[reader] += p.numel() * p.element_size()
        tensors[reader] += int(p.requires_grad)
    return nbytes, tensors


def _tied_params(nodes, order, ids) -> List[Dict[str, Any]]:
    """[{"nodes": [ids], "bytes": n}] for each parameter held by more than one graph node (tied
    weights, or the calls of a module called more than once): a stage holding any of those
    nodes holds a copy of it (docs/formats.md, Graph tied_params)."""
    holders: Dict[int, List[str]] = {}
    tensors: Dict[int, torch.Tensor] = {}
    for name in order:
        for p in nodes[block_list.module_name(name)].parameters():
            holders.setdefault(id(p), []).append(name)
            tensors[id(p)] = p
    return [{"nodes": [ids[n] for n in names],
             "bytes": tensors[key].numel() * tensors[key].element_size()}
            for key, names in holders.items() if len(names) > 1]


def _check_acyclic(order: List[str], edges: Dict[dataflow.EdgeKey, int]) -> None:
    """Kahn's algorithm. Each call of a module is its own node (block_list), so a cycle means
    the hooks saw a value flow backwards, which no plan can order."""
    succs: Dict[str, List[str]] = {n: [] for n in order}
    indegree = {n: 0 for n in order}
    for src, dst in edges:
        if src in succs and dst in succs:
            succs[src].append(dst)
            indegree[dst] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    done = 0
    while ready:
        n = ready.pop()
        done += 1
        for m in succs[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
    if done != len(order):
        cyclic = sorted(n for n, d in indegree.items() if d > 0)
        raise ValueError("profile: the dataflow between modules has a cycle among "
                         f"{cyclic}; a plan needs a DAG")


def snake_case(name: str) -> str:
    """BranchyCNN -> branchy_cnn, GroupNorm -> group_norm, Conv2d -> conv2d, LSTM -> lstm."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()
