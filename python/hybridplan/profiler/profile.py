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

import statistics
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .. import _C
from ..planner import Graph  # the compiled planner validates the graph
from . import block_list, block_timing, dataflow, sequence_parallel, tensor_parallel
from .fake_profile import fake_profile_dict
from .graph_steps import (_check_device, _check_inputs, _move, _loss_at, _first_tensor,
                          _add_pipeline_split, _edges, _batch_sizes, _smallest_batch,
                          _batch_advice, _slice_batch, _build, _check_acyclic, snake_case,
                          Inputs, kBatchTimeBudgetS)

__all__ = ["profile", "profile_dict"]


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

        return fake_profile_dict(module, example_inputs, device_model=device_model or "cpu",
                                 verbose=verbose, name=name, batch_sizes=batch_sizes,
                                 batch_time_budget_s=batch_time_budget_s, loss_fn=loss_fn,
                                 target=target, tensor_parallel=tensor_parallel)
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
    if graph["profiled"]["dtype"] == "float32":  # what a 16-bit job's autocast plans keep
        _add_autocast_saved(graph, module, nodes, inputs, kwargs, loss_at(None), log)
    total_ms = sum(n["forward_s"] + n["backward_s"] for n in graph["nodes"]) * 1e3
    log(f"profile {graph_name}: forward+backward {total_ms:.2f} ms at batch "
        f"{graph['profiled']['batch_size']} on {graph['profiled']['device']}")
    return graph


def _add_autocast_saved(graph, module, nodes, inputs, kwargs, loss, log) -> None:
    """Each node's "autocast_saved_bytes" and "autocast_weight_copy_bytes" and the profile's
    "autocast_loss_backward_bytes" (docs/formats.md), one forward per 16-bit dtype under
    torch.autocast at the profiled batch (block_timing.saved_under_autocast). A dtype autocast
    refuses on this device is left out (the planner then halves the float32 bytes)."""
    started = time.monotonic()
    for name, dtype in block_timing.AUTOCAST_DTYPES.items():
        try:
            got = block_timing.saved_under_autocast(module, nodes, inputs, kwargs, loss, dtype)
        except Exception as exc:  # autocast or a kernel without the dtype on this device
            log(f"profile {graph['name']}: nothing recorded under autocast in {name}: {exc}")
            continue
        for node in graph["nodes"]:
            node.setdefault("autocast_saved_bytes", {})[name] = int(got.saved.get(node["name"], 0))
            copies = int(got.weight_copies.get(node["name"], 0))
            if copies:
                node.setdefault("autocast_weight_copy_bytes", {})[name] = copies
        if got.loss_backward_bytes is not None and graph["profiled"].get("loss_backward_bytes"):
            graph["profiled"].setdefault("autocast_loss_backward_bytes", {})[name] = int(
                got.loss_backward_bytes)
    log(f"profile {graph['name']}: saved bytes under autocast recorded "
        f"({time.monotonic() - started:.1f} s)")


def _add_tensor_parallel(graph, module, nodes, flow, call, forward_s, backward_s, clock,
                         warmup, repeats, log, whole_s) -> None:
    """Nodes' "tensor_parallel" and "sequence_parallel" objects (docs/tensor_parallel.md), at
    the profiled batch; `whole_s` as tensor_parallel.graph_fields (the loss's times). Sequence
    parallelism is checked at degree 2 (the plan's degree is checked again where a plan is
    applied)."""
    started = time.monotonic()
    fields, layout = tensor_parallel.graph_fields(module, nodes, call, flow.order, forward_s,
                                                  backward_s, clock, warmup, repeats, whole_s)
    for node in graph["nodes"]:
        if node["name"] in fields:
            node["tensor_parallel"] = fields[node["name"]]
    sp, sp_fields = None, {}
    if fields:
        sp = sequence_parallel.detect_sequence_parallel(
            module, layout, degree=2,  # (every split's max_degree is even: it splits at 2)
            node_names=list(nodes), call=call)
        sp_fields = sequence_parallel.graph_fields(sp, nodes, flow.order)
        for node in graph["nodes"]:
            if node["name"] in sp_fields:
                node["sequence_parallel"] = sp_fields[node["name"]]
    log(f"profile {graph['name']}: tensor parallelism splits {len(fields)} of "
        f"{len(graph['nodes'])} nodes{sequence_parallel.note(sp, sp_fields)} "
        f"({time.monotonic() - started:.1f} s)")


def _measure(module, nodes, names, call, clock, warmup, repeats, verbose, graph_name,
             loss=None):
    """Median forward and backward seconds per graph node (`names`, one per call of a node
    module) over `repeats` steps after `warmup`."""
    from tqdm import tqdm  # optional: installed with the torch extra, needed only here

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


def _measure_other_batches(module, nodes, names, call, clock, warmup, repeats, verbose,
                           graph_name, sizes, budget_s, log, loss_at
                           ) -> Dict[int, Tuple[Dict[str, float], Dict[str, float]]]:
    """{batch size: (forward_s, backward_s)} for the sizes measured within the time budget."""
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


