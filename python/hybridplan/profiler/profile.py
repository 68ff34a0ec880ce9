"""Profiles a torch.nn.Module into a Graph (docs/formats.md, kind "hybridplan.graph").

    graph = hybridplan.profile(model, example_inputs, device="cpu")

One node per graph node module (block_list: the node rule the executor shares), named by
qualified name so a plan's assignment maps back onto the module; edges from the real dataflow
(torch.fx, or forward hooks where fx cannot trace); per node the median forward and backward
seconds over `repeats` timed steps (see block_timing for how a step's time is split: a
functional op between modules is charged to the module that consumes its result, forward and
backward), parameter bytes, output bytes and forward FLOPs; whether and where the executor can
cut the module into pipeline stages (stage_split.probe: `pipeline_split`, `cut_before`); and
parameters several nodes share (`tied_params`).

A step back-propagates from `loss_fn(output, target)` where given: the loss's forward and
backward and what it saves are then the last node's, as any op after the last node is. A
language model's cross-entropy over a large vocabulary is not a small cost: BigLSTM's step at
batch 32 took 31.7 ms with it against 22.3 ms with the gradient of sum(output), which is what a
step back-propagates without a loss (all-ones gradients from the output's tensors). The module
is moved to `device` in place.
"""

import re
import statistics
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .. import _C
from . import (block_list, block_timing, dataflow, sequence_parallel, stage_split,
               tensor_parallel)

__all__ = ["profile", "profile_dict"]

# Measuring the extra batch sizes stops once this much time went into them (they are smaller
# than the example batch, so each costs less than the main measurement).
kBatchTimeBudgetS = 60.0

Inputs = Union[torch.Tensor, Sequence[Any], Dict[str, Any]]


def profile(module: nn.Module, example_inputs: Inputs, device: Union[str, torch.device] = "cpu",
            warmup: int = _C.kDefaultProfileWarmup,
            repeats: int = _C.kDefaultProfileRepeats, verbose: bool = True, name: str = None,
            clock: str = "auto", retain_freed_memory: bool = True,
            batch_sizes: Union[str, Sequence[int]] = "auto",
            batch_time_budget_s: float = kBatchTimeBudgetS,
            loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None, target: Any = None,
            tensor_parallel: bool = True, mode: str = "auto", device_model: Any = None):
    """Measures `module` on `example_inputs` (a tensor, a tuple of positional inputs or a dict
    of keyword inputs; dim 0 of the first tensor is the batch) and returns a
    hybridplan.planner.Graph. See profile_dict."""
    from ..planner import Graph  # the compiled planner validates the graph

    return Graph.from_dict(profile_dict(module, example_inputs, device=device, warmup=warmup,
                                        repeats=repeats, verbose=verbose, name=name,
                                        clock=clock,
                                        retain_freed_memory=retain_freed_memory,
                                        batch_sizes=batch_sizes,
                                        batch_time_budget_s=batch_time_budget_s,
                                        loss_fn=loss_fn, target=target,
                                        tensor_parallel=tensor_parallel, mode=mode,
                                        device_model=device_model))


def profile_dict(module: nn.Module, example_inputs: Inputs,
                 device: Union[str, torch.device] = "cpu", warmup: int = _C.kDefaultProfileWarmup,
                 repeats: int = _C.kDefaultProfileRepeats,
                 verbose: bool = True, name: str = None, clock: str = "auto",
                 retain_freed_memory: bool = True,
                 batch_sizes: Union[str, Sequence[int]] = "auto",
                 batch_time_budget_s: float = kBatchTimeBudgetS,
                 loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None,
                 target: Any = None, tensor_parallel: bool = True, mode: str = "auto",
                 device_model: Any = None) -> Dict[str, Any]:
    """Like profile, but returns the Graph JSON as a dict (not yet validated by the planner).

    `loss_fn`, `target`: the training loss, loss_fn(output, target) -> scalar, and the target
    of the example batch (dim 0 is the batch, sliced with the inputs for other batch sizes);
    both or neither. With them each step is a real training step (see the module doc).

    `batch_sizes`: the other batch sizes each node is also measured at (the graph's nodes then
    carry `batch_times`, from which the planner takes a node's time at any micro-batch or
    per-replica batch: a micro-batch of 1 costs more than 1/b of a batch of b). "auto": 1, ...,
    b/4, b/2 (halving the example batch b), smallest first, until `batch_time_budget_s` of
    measuring these extra sizes is spent (what was measured is logged); a list: exactly those
    (each < b, sliced from the example inputs); () or []: the example batch only. Never below
    the smallest batch the module's forward runs at, found by trying (BatchNorm in training
    needs two samples): "auto" leaves the smaller sizes out (logged), a list holding one is
    refused. The pipeline cut is tried at that smallest batch too.

    `clock`: "auto" (CUDA events on GPU, time.perf_counter on CPU), "wall", "cuda", or "thread"
    (CPU time of this thread; for a busy shared CPU, needs torch.set_num_threads(1)).
    `name`: the graph's name (default: the module's class name in snake_case).
    `tensor_parallel`: write each node that tensor parallelism splits its "tensor_parallel"
    object (docs/tensor_parallel.md; tensor_parallel.detect_layout decides which, and
    tensor_parallel.graph_fields times one rank of each split at degrees 2, 4, 8 up to its
    max_degree); False: no node carries one, and no time goes into it.
    `retain_freed_memory`: keep freed memory in the process (glibc mallopt, process-wide, and it
    stays) so that page faults do not enter op times; see block_timing.retain_freed_memory.

    `mode`: "real" measures the module on `device`; "fake" runs it under fake tensors and prices
    each node with `device_model` (fake_profile: nothing of the model's size is allocated, and
    the fields that need real values are left out, docs/fake_profile.md); "auto": "fake" for
    a module with parameters on the meta device or where a device_model is given, else
    "real". `device_model` (fake only):
    "cpu" (this CPU, measured; the default), a cluster preset name such as "dgx-h100", a
    cluster dict or a device_model.DeviceModel.

    Raises ValueError for: a module without parameters, a device that does not exist, inputs
    the module cannot run (naming the module that failed and the shapes), a module none of
    whose node modules runs, and dataflow between nodes that forms a cycle."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"profile: module must be a torch.nn.Module (got {type(module).__name__})")
    if mode not in ("auto", "real", "fake"):
        raise ValueError(f"profile: mode must be \"auto\", \"real\" or \"fake\" (got {mode!r})")
    if mode == "fake" or (mode == "auto" and (device_model is not None or any(
            p.device.type == "meta" for p in module.parameters()))):
        # fake_profile builds on this module's helpers, so it is imported here, not above
        from .fake_profile import fake_profile_dict

        return fake_profile_dict(module, example_inputs, device_model=device_model or "cpu",
                                 verbose=verbose, name=name, batch_sizes=batch_sizes,
                                 batch_time_budget_s=batch_time_budget_s, loss_fn=loss_fn,
                                 target=target)
    if device_model is not None:
        raise ValueError("profile: device_model prices a fake profile; a real profile measures "
                         f"(got device_model={device_model!r} with mode=\"real\")")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"profile: need warmup >= 0 and repeats >= 1 (got {warmup}, {repeats})")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"profile: {type(module).__name__} has no trainable parameters: "
                         "nothing to train or plan")
    dev = _check_device(device)
    clock = block_timing.resolve_clock(clock, dev)
    inputs, kwargs = _check_inputs(example_inputs, dev)
    if (loss_fn is None) != (target is None):
        raise ValueError("profile: loss_fn and target go together: give both for a training "
                         "step's loss, or neither for the gradient of sum(output) (got "
                         f"loss_fn={'given' if loss_fn else 'None'}, target="
                         f"{'given' if target is not None else 'None'})")
    target = _move(target, dev)
    loss_at = _loss_at(loss_fn, target, int(_first_tensor(inputs, kwargs).shape[0]))
    module.to(dev)
    graph_name = name or snake_case(type(module).__name__)
    log = (lambda msg: print(msg, file=sys.stderr)) if verbose else (lambda msg: None)

    nodes = block_list.select_nodes(module)
    try:
        flow, output = dataflow.record_dataflow(module, nodes, inputs, kwargs, loss_at(None))
    except ValueError as e:
        raise ValueError(_batch_advice(str(e), e.__cause__)) from e.__cause__
    reused = dataflow.reused_stateless(nodes, flow)
    if reused:
        log(f"profile {graph_name}: parameter-free modules called more than once are treated "
            f"as functional ops: {', '.join(reused)}")
        nodes = {n: m for n, m in nodes.items() if n not in reused}
        flow, output = dataflow.record_dataflow(module, nodes, inputs, kwargs, loss_at(None))
    if not flow.order:
        raise ValueError(
            f"profile: none of {type(module).__name__}'s {len(nodes)} graph nodes ran in "
            "forward (is the computation done with functional ops on their weights?); the "
            "profiler splits a model by the submodules it calls")
    if not block_timing.backward_roots(output):
        raise ValueError(f"profile: no output of {type(module).__name__} requires grad (got "
                         f"output shapes {dataflow.shapes_of(output)}): nothing to train or plan")
    _, uncalled = block_list.uncalled_nodes(nodes, map(block_list.module_name, flow.order))
    if uncalled:  # the graph is still worth planning; applying a plan of it is refused
        warnings.warn(f"profile {graph_name}: {uncalled[:5]} hold parameters or buffers but "
                      f"never ran in forward, so no plan places them and hybridplan.apply "
                      f"refuses this module; for each, {block_list.UNCALLED_ADVICE}",
                      stacklevel=2)
    edges, how = _edges(module, nodes, flow, inputs, kwargs)
    _check_acyclic(flow.order, edges)
    log(f"profile {graph_name}: {len(flow.order)} nodes, {len(edges)} edges ({how})")

    busy = block_timing.busy_cpu_warning(dev, clock)
    if busy:
        warnings.warn(busy, stacklevel=3)
    if retain_freed_memory:
        block_timing.retain_freed_memory()
    forward_s, backward_s = _measure(module, nodes, flow.order, (inputs, kwargs), clock, warmup,
                                     repeats, verbose, graph_name, loss_at(None))
    first = _first_tensor(inputs, kwargs)
    floor = _smallest_batch(module, (inputs, kwargs))
    sizes = _batch_sizes(batch_sizes, first, floor, type(module).__name__)
    if isinstance(batch_sizes, str) and floor > 1:
        log(f"profile {graph_name}: the forward runs at batches of {floor} or more; measured "
            f"sizes start there")
    batch_times = _measure_other_batches(module, nodes, flow.order, (inputs, kwargs), clock,
                                         warmup, repeats, verbose, graph_name, sizes,
                                         batch_time_budget_s, log, loss_at)
    flops = block_timing.count_flops(module, nodes, inputs, kwargs)
    graph = _build(graph_name, module, nodes, flow, edges, forward_s, backward_s, flops, dev,
                   first, batch_times)
    # what selective recompute would keep and run again, per node (docs/recompute.md)
    selective = block_timing.selective_recompute(module, nodes, inputs, kwargs,
                                                 repeats=max(1, min(3, repeats)))
    for node in graph["nodes"]:
        node.update(selective.get(node["name"], {}))
    # what each node's backward needs above what is held (memory_cost.h backward workspace)
    workspace = block_timing.backward_workspace_bytes(
        module, nodes, inputs, kwargs, loss_at(None),
        {node["name"]: node["output_bytes"] for node in graph["nodes"]})
    for node in graph["nodes"]:
        if node["name"] in workspace:
            node["backward_workspace_bytes"] = workspace[node["name"]]
    # each node's backward under the zero-bubble split (compute_cost.h split_backward)
    split = block_timing.split_backward(module, nodes, inputs, kwargs, clock,
                                        repeats=max(1, min(3, repeats)))
    for node in graph["nodes"]:
        node.update(split.get(node["name"], {}))
    if tensor_parallel:
        # the loss, charged to the last node, is computed whole on every rank of a TP group
        whole = ({flow.order[-1]: block_timing.loss_times(output, loss_at(None), clock,
                                                          repeats=max(3, repeats))}
                 if loss_fn is not None else {})
        _add_tensor_parallel(graph, module, nodes, flow, (inputs, kwargs), forward_s,
                             backward_s, clock, warmup, repeats, log, whole)
    _add_pipeline_split(graph, module, flow, inputs, kwargs, log, floor)
    # the model's input tensors at the profiled batch: the memory model's input batch term
    graph["profiled"]["input_bytes"] = sum(t.numel() * t.element_size()
                                           for t in dataflow.tensors_in((inputs, kwargs)))
    if floor > 1:  # the planner gives no device a (micro-)batch below it (docs/formats.md)
        graph["profiled"]["min_batch_size"] = floor
    if loss_fn is not None:  # the memory model's loss workspace (memory_cost.h)
        graph["profiled"]["loss_backward_bytes"] = block_timing.loss_backward_bytes(
            output, loss_at(None))
    total_ms = sum(n["forward_s"] + n["backward_s"] for n in graph["nodes"]) * 1e3
    log(f"profile {graph_name}: forward+backward {total_ms:.2f} ms at batch "
        f"{graph['profiled']['batch_size']} on {graph['profiled']['device']}")
    return graph


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


def _add_tensor_parallel(graph, module, nodes, flow, call, forward_s, backward_s, clock,
                         warmup, repeats, log, whole_s) -> None:
    """Nodes' "tensor_parallel" and "sequence_parallel" objects (docs/tensor_parallel.md), at
    the profiled batch; `whole_s` as tensor_parallel.graph_fields (the loss's times). Sequence
    parallelism is checked at degree 2 (the plan's degree is checked again where a plan is
    applied)."""
    import time

    started = time.monotonic()
    fields, layout = tensor_parallel.graph_fields(module, nodes, call, flow.order, forward_s,
                                                  backward_s, clock, warmup, repeats, whole_s)
    for node in graph["nodes"]:
        if node["name"] in fields:
            node["tensor_parallel"] = fields[node["name"]]
    sp_note = ""
    if fields:
        sp = sequence_parallel.detect_sequence_parallel(
            module, layout, degree=2,  # (every split's max_degree is even: it splits at 2)
            node_names=list(nodes), call=call)
        sp_fields = sequence_parallel.graph_fields(sp, nodes, flow.order)
        for node in graph["nodes"]:
            if node["name"] in sp_fields:
                node["sequence_parallel"] = sp_fields[node["name"]]
        sp_note = (f"; sequence parallelism: {len(sp_fields)} nodes" if not sp.refused
                   else f"; no sequence parallelism: {sp.refused}")
    log(f"profile {graph['name']}: tensor parallelism splits {len(fields)} of "
        f"{len(graph['nodes'])} nodes{sp_note} ({time.monotonic() - started:.1f} s)")


def _edges(module, nodes, flow, inputs, kwargs) -> Tuple[Dict[dataflow.EdgeKey, int], str]:
    """fx edges where the model traces, else the hooks' edges."""
    try:
        return dataflow.fx_edges(module, nodes, flow, inputs, kwargs), "torch.fx"
    except Exception as exc:  # any fx failure means: use the hook-based dataflow instead
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return flow.edges, f"forward hooks; torch.fx could not trace: {reason[:120]}"


def _measure(module, nodes, names, call, clock, warmup, repeats, verbose, graph_name,
             loss=None):
    """Median forward and backward seconds per graph node (`names`, one per call of a node
    module) over `repeats` steps after `warmup`."""
    from tqdm import tqdm

    timer = block_timing.StepTimer(module, nodes, clock)
    samples: List[Tuple[Dict[str, float], Dict[str, float]]] = []
    try:
        for i in tqdm(range(warmup + repeats), desc=f"profile {graph_name}", unit="step",
                      disable=not verbose, leave=False):
            step = timer.step(*call, loss=loss)
            if i >= warmup:
                samples.append(step)
    finally:
        timer.remove()
    forward_s = {n: statistics.median(s[0].get(n, 0.0) for s in samples) for n in names}
    backward_s = {n: statistics.median(s[1].get(n, 0.0) for s in samples) for n in names}
    return forward_s, backward_s


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


def _measure_other_batches(module, nodes, names, call, clock, warmup, repeats, verbose,
                           graph_name, sizes, budget_s, log, loss_at
                           ) -> Dict[int, Tuple[Dict[str, float], Dict[str, float]]]:
    """{batch size: (forward_s, backward_s)} for the sizes measured within the time budget."""
    import time

    b = int(_first_tensor(*call).shape[0])
    out = {}
    started = time.monotonic()
    for size in sizes:
        if out and time.monotonic() - started > budget_s:
            log(f"profile {graph_name}: batch-size budget of {budget_s:.0f} s spent; not "
                f"measured: {sizes[len(out):]}")
            break
        out[size] = _measure(module, nodes, names, _slice_batch(call, b, size), clock, warmup,
                             repeats, verbose, f"{graph_name} b={size}", loss_at(size))
    if out:
        log(f"profile {graph_name}: also measured at batch sizes "
            f"{', '.join(map(str, sorted(out)))} ({time.monotonic() - started:.1f} s)")
    return out


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
