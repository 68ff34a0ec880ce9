"""Profiles a module without materialising it: the same Graph as profile.profile_dict, from one
run of the model under torch's FakeTensorMode (tensors with shapes, dtypes and autograd history
but no memory and no values), each node's time priced by a device model (device_model) instead
of measured.

    graph = hybridplan.profile(model, inputs, mode="fake", device_model="dgx-h100")

A model built under `torch.device("meta")` is profiled this way without asking
(profile's mode="auto"). Its parameters and buffers are swapped for fake tensors for the run
and put back afterwards: the module is left as it was, and nothing of its size is allocated.

**What is the real profiler's, unchanged**: the node rule (block_list), the dataflow, edges and
saved bytes (dataflow.record_dataflow, torch.fx where the model traces), parameter and output
bytes, tied parameters, the smallest batch the forward accepts, the pipeline cut
(stage_split.probe, torch.export), and the attribution of a step to nodes (block_timing's
StepTimer: a functional op between nodes is charged to the node that consumes its result,
forward and backward), which here reads a clock that advances by each op's modelled seconds.

**What is priced**: forward and backward per node and at the other batch sizes
(`batch_times`), FLOPs (torch.utils.flop_counter's formulas), and selective recompute's fields:
the bytes of the outputs of recompute.SAVED_OPS and the share of the node's modelled forward
in the other ops.

**Tensor and sequence parallelism** (`tensor_parallel=True`, the default): a split is found
by running each candidate on real values, which fake tensors have none of, so what splits is
decided on a miniature with values (the model itself where it has values; for a meta-built
Hugging Face model, the same class at narrow widths; or `miniature=(module, inputs)`) and how
far each split goes, its bytes and its per-rank times at the model's own shapes, priced
(fake_tensor_parallel); sequence parallelism's check likewise runs on the miniature, its
sequence length and collectives' bytes taken at the model's shapes.

**What is left out, and why** (the planner treats each as absent, as for a graph that lacks
it): `tensor_parallel` and `sequence_parallel` where no miniature can be had (the log says
why), `backward_workspace_bytes` and
`profiled.loss_backward_bytes` (read from the allocator's events, which a fake run has none
of), and the zero-bubble split of the backward (`backward_input_s`/`backward_weight_s`, timed
separately by the real profiler). The log names them.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..autograd.recompute import saves
from . import block_list, block_timing, dataflow
# the real profiler's steps that need no values, shared so both modes build one Graph
from .graph_steps import (Inputs, _add_pipeline_split, _batch_advice, _batch_sizes, _build,
                      _check_acyclic, _check_inputs, _edges, _first_tensor, _loss_at,
                      _slice_batch, _smallest_batch, kBatchTimeBudgetS, snake_case)
from .device_model import DeviceModel, device_model as make_device_model, op_flops
from . import fake_tensor_parallel, sequence_parallel

__all__ = ["fake_profile_dict", "on_meta_device", "LEFT_OUT"]

LEFT_OUT = ("backward_workspace_bytes and loss_backward_bytes (read from allocator events)",
            "the zero-bubble backward split (timed apart by the real profiler)",
            "what autocast keeps (autocast_saved_bytes: the planner halves the float32 bytes "
            "for a 16-bit job's autocast plans, an estimate)")


def on_meta_device(module: nn.Module) -> bool:
    """Whether any of `module`'s parameters is on the meta device (built without memory)."""
    return any(p.device.type == "meta" for p in module.parameters())


class _Meter(TorchDispatchMode):
    """Prices each aten op the model runs (DeviceModel.op_s) into a running total; while
    `log` is a list, also appends (seconds, flops, kept-by-selective-recompute storages) per
    op."""

    def __init__(self, dm: DeviceModel):
        super().__init__()
        self.dm = dm
        self.total_s = 0.0
        self.log: Optional[List[Tuple[float, float, Optional[Dict[int, int]]]]] = None
        self.saves: Callable[[Any], bool] = lambda func: False  # recompute.saves while logging
        # the kept storages, alive while `log` is: their keys (dataflow.storage_key) are unique
        # only while the storage lives, and one freed in the forward may hand its key to a
        # later one, which would then count as the same storage (how often depends on what
        # the process allocated before)
        self.held: List[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        seconds = self.dm.op_s(func, args, kwargs, out)
        self.total_s += seconds
        if self.log is not None:
            outputs = ([t for t in dataflow.tensors_in(out) if t.layout == torch.strided
                        and t.numel()] if self.saves(func) else None)
            kept = (None if outputs is None else
                    {dataflow.storage_key(t): t.untyped_storage().nbytes() for t in outputs})
            self.held += [t.untyped_storage() for t in outputs or ()]
            self.log.append((seconds, op_flops(func, args, kwargs, out), kept))
        return out


class _PricedClock:
    """block_timing.StepTimer's clock, reading the meter's modelled seconds instead of time."""

    def __init__(self, meter: _Meter):
        self.meter = meter

    def mark(self) -> float:
        return self.meter.total_s

    def sync(self) -> None:
        pass

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    """A fake CPU tensor of t's shape, strides, dtype and requires_grad (under a FakeTensorMode:
    one CPU device whatever t's, so that a meta-built model meets its inputs on one device)."""
    fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    if isinstance(t, nn.Parameter):
        return nn.Parameter(fake, requires_grad=t.requires_grad)
    return fake.requires_grad_(t.requires_grad) if t.is_floating_point() else fake


@contextlib.contextmanager
def _fake_state(module: nn.Module, mode: FakeTensorMode) -> Iterator[None]:
    """Every parameter and buffer of `module` replaced by a fake tensor (one per tensor: tied
    weights stay tied) until the block ends, then the originals put back."""
    swapped: List[Tuple[Dict[str, Any], str, torch.Tensor]] = []
    fakes: Dict[int, torch.Tensor] = {}
    try:
        with mode:
            for mod in module.modules():
                for table in (mod._parameters, mod._buffers):
                    for key, t in list(table.items()):
                        if t is None:
                            continue
                        if id(t) not in fakes:
                            fakes[id(t)] = _fake_like(t)
                        swapped.append((table, key, t))
                        table[key] = fakes[id(t)]
        yield
    finally:
        for table, key, t in reversed(swapped):
            table[key] = t


class _GpuAttention(TorchFunctionMode):
    """Fake tensors live on the CPU, so an op that dispatches by device takes the CPU's
    choice. Scaled dot-product attention with dropout has no fused CPU kernel: it falls back
    to the math path in float32 (GPT-2 at hidden 4096, sequence 2048: 3.57 ms forward priced
    for H100 against 0.155 ms for the fused kernel), where a GPU's flash and memory-efficient
    kernels apply the dropout inside the fused kernel. Priced for a GPU, the call runs with
    dropout_p = 0 (fake tensors carry no values, so only the kernel chosen changes) and is
    priced as the fused kernel it would be."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.scaled_dot_product_attention:
            if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
                args = (*args[:4], 0.0, *args[5:])
            elif "dropout_p" in kwargs:
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)


def _fake_values(value: Any, mode: FakeTensorMode) -> Any:
    with mode:
        return dataflow.map_tensors(value, _fake_like)


def fake_profile_dict(module: nn.Module, example_inputs: Inputs,
                      device_model: Union[str, dict, DeviceModel] = "cpu", verbose: bool = True,
                      name: Optional[str] = None,
                      batch_sizes: Union[str, Sequence[int]] = "auto",
                      batch_time_budget_s: float = kBatchTimeBudgetS,
                      loss_fn: Optional[Callable[[Any, Any], torch.Tensor]] = None,
                      target: Any = None, tensor_parallel: bool = True,
                      miniature: Optional[Tuple[nn.Module, Inputs]] = None) -> Dict[str, Any]:
    """profile.profile_dict's Graph, priced by `device_model` (device_model.device_model: "cpu"
    measures this CPU; a preset name such as "dgx-h100", a cluster dict or a DeviceModel) from a
    fake run (the module doc). `example_inputs`, `name`, `batch_sizes`, `loss_fn`, `target` as
    profile_dict's; only their shapes and dtypes are read. `batch_time_budget_s` bounds the
    wall time of the runs at the other batch sizes, as profile_dict's bounds its measurements.
    `tensor_parallel`: write the nodes' "tensor_parallel" objects (fake_tensor_parallel: the
    split decided on `miniature`, (module, example inputs) of the same structure with values;
    default the module itself where it has values, else a Hugging Face model's narrowed
    configuration; without one the fields are left out and the log says why).
    Raises ValueError as profile_dict does."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"profile: module must be a torch.nn.Module (got {type(module).__name__})")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"profile: {type(module).__name__} has no trainable parameters: "
                         "nothing to train or plan")
    if (loss_fn is None) != (target is None):
        raise ValueError("profile: loss_fn and target go together: give both for a training "
                         "step's loss, or neither for the gradient of sum(output) (got "
                         f"loss_fn={'given' if loss_fn else 'None'}, target="
                         f"{'given' if target is not None else 'None'})")
    dm = make_device_model(device_model)
    graph_name = name or snake_case(type(module).__name__)
    log = (lambda msg: print(msg, file=sys.stderr)) if verbose else (lambda msg: None)
    started = time.monotonic()
    # shapes only: the meta device takes real and meta inputs alike without copying values
    meta_args, meta_kwargs = _check_inputs(example_inputs, torch.device("meta"))
    mode = FakeTensorMode()
    args, kwargs = _fake_values((meta_args, meta_kwargs), mode)
    target = _fake_values(target, mode)
    gpu_kernels = _GpuAttention() if dm.gemm.sms > 1 else contextlib.nullcontext()
    with _fake_state(module, mode), mode, gpu_kernels:
        graph, flow, floor, nodes = _profile_fake(module, (args, kwargs), dm, graph_name, log,
                                                  batch_sizes, batch_time_budget_s, loss_fn,
                                                  target)
    if tensor_parallel:
        _add_tensor_parallel(graph, module, nodes, flow.order, (args, kwargs), mode, dm,
                             _loss_at(loss_fn, target, int(_first_tensor(args, kwargs).shape[0]))(
                                 None), example_inputs, miniature, log)
    # the cut's inputs where the module's parameters are: meta for a meta-built module
    cut_device = (torch.device("meta") if on_meta_device(module)
                  else next(module.parameters()).device)
    _pipeline_cut(graph, module, flow, *_check_inputs(example_inputs, cut_device), log, floor)
    log(f"profile {graph_name}: fake run priced for {dm.name} in "
        f"{time.monotonic() - started:.1f} s; left out: {'; '.join(LEFT_OUT)}")
    return graph


def _profile_fake(module, call, dm, graph_name, log, batch_sizes, budget_s, loss_fn, target):
    args, kwargs = call
    first = _first_tensor(args, kwargs)
    loss_at = _loss_at(loss_fn, target, int(first.shape[0]))
    nodes = block_list.select_nodes(module)
    flow, output = _record(module, nodes, call, loss_at(None))
    reused = dataflow.reused_stateless(nodes, flow)
    if reused:
        log(f"profile {graph_name}: parameter-free modules called more than once are treated "
            f"as functional ops: {', '.join(reused)}")
        nodes = {n: m for n, m in nodes.items() if n not in reused}
        flow, output = _record(module, nodes, call, loss_at(None))
    if not flow.order:
        raise ValueError(f"profile: none of {type(module).__name__}'s {len(nodes)} graph nodes "
                         "ran in forward; the profiler splits a model by the submodules it calls")
    if not block_timing.backward_roots(output):
        raise ValueError(f"profile: no output of {type(module).__name__} requires grad (got "
                         f"output shapes {dataflow.shapes_of(output)}): nothing to train or plan")
    del output
    edges, how = _edges(module, nodes, flow, args, kwargs)
    _check_acyclic(flow.order, edges)
    log(f"profile {graph_name}: {len(flow.order)} nodes, {len(edges)} edges ({how})")

    meter = _Meter(dm)
    forward_s, backward_s = _priced_step(module, nodes, flow.order, call, meter, loss_at(None))
    floor = _smallest_batch(module, call)
    sizes = _batch_sizes(batch_sizes, first, floor, type(module).__name__)
    batch_times, started = {}, time.monotonic()
    b = int(first.shape[0])
    for size in sizes:
        if batch_times and time.monotonic() - started > budget_s:
            log(f"profile {graph_name}: batch-size budget of {budget_s:.0f} s spent; not "
                f"priced: {sizes[len(batch_times):]}")
            break
        batch_times[size] = _priced_step(module, nodes, flow.order,
                                         _slice_batch(call, b, size), meter, loss_at(size))
    per_node = _forward_fields(module, nodes, call, meter)
    flops = {n: fields.pop("flops") for n, fields in per_node.items()}
    graph = _build(graph_name, module, nodes, flow, edges, forward_s, backward_s, flops,
                        dm.name, first, batch_times)
    for node in graph["nodes"]:
        node.update(per_node.get(node["name"], {}))
    graph["profiled"]["input_bytes"] = sum(t.numel() * t.element_size()
                                           for t in dataflow.tensors_in(call))
    if floor > 1:
        graph["profiled"]["min_batch_size"] = floor
    return graph, flow, floor, nodes


def _add_tensor_parallel(graph, module, nodes, order, call, mode, dm: DeviceModel, loss,
                         example_inputs, miniature, log) -> None:
    """The nodes' "tensor_parallel" objects (fake_tensor_parallel.graph_fields), or a log line
    saying why there are none."""
    started = time.monotonic()
    meter = _Meter(dm)

    @contextlib.contextmanager
    def fake_run(m: nn.Module) -> Iterator[None]:
        gpu = _GpuAttention() if dm.gemm.sms > 1 else contextlib.nullcontext()
        with _fake_state(m, mode), mode, gpu:
            yield

    def priced_step(m, m_nodes, m_call, m_loss):
        with fake_run(m):
            return _priced_step(m, m_nodes, order, m_call, meter, m_loss)

    def price_loss(output, loss_of):
        out, roots = block_timing._loss_leaves(output)
        start = meter.total_s
        with meter:
            value = loss_of(out)
        middle = meter.total_s
        with meter:
            torch.autograd.grad(value, roots, allow_unused=True)
        return middle - start, meter.total_s - middle

    try:
        if miniature is None:
            if on_meta_device(module) or any(t.device.type == "meta" for t in
                                             dataflow.tensors_in(example_inputs)):
                miniature = fake_tensor_parallel.hf_miniature(module, example_inputs)
            else:
                miniature = (module, example_inputs)
        forward_s = {n["name"]: n["forward_s"] for n in graph["nodes"]}
        backward_s = {n["name"]: n["backward_s"] for n in graph["nodes"]}
        fields, layout = fake_tensor_parallel.graph_fields(
            module, nodes, order, call, fake_run, priced_step, forward_s, backward_s, loss,
            price_loss, miniature)
        sp_fields, sp = (fake_tensor_parallel.sequence_fields(
            module, nodes, order, call, fake_run, layout, miniature) if fields else ({}, None))
    except (ValueError, fake_tensor_parallel.tp._Refused) as why:
        log(f"profile {graph['name']}: no tensor-parallel fields: {why}")
        return
    for node in graph["nodes"]:
        for key, table in (("tensor_parallel", fields), ("sequence_parallel", sp_fields)):
            if node["name"] in table:
                node[key] = table[node["name"]]
    log(f"profile {graph['name']}: tensor parallelism splits {len(fields)} of "
        f"{len(graph['nodes'])} nodes{sequence_parallel.note(sp, sp_fields)} (decided on a "
        f"miniature, priced at the model's shapes; {time.monotonic() - started:.1f} s)")


def _pipeline_cut(graph, module, flow, args, kwargs, log, floor) -> None:
    """The pipeline cut (graph_steps._add_pipeline_split), exported outside the fake mode on
    the module as it is and inputs on its parameters' device (meta for a meta-built module):
    torch.export makes its own fake tensors of them. Run
    under this profile's FakeTensorMode with its fake parameters swapped in, the export
    worked, but the interpreter then aborted at exit now and then ("corrupted double-linked
    list", 2 of 9 runs of a one-layer GPT-2; 0 of 10 exported this way)."""
    try:
        _add_pipeline_split(graph, module, flow, args, kwargs, log, floor)
    except Exception as exc:  # export failing on shapes alone means: no pipeline plans
        graph["pipeline_split"] = {"supported": False,
                                   "reason": f"torch.export failed on the meta module: "
                                             f"{str(exc).strip().splitlines()[0][:200]}"}
        log(f"profile {graph['name']}: no pipeline plans: {graph['pipeline_split']['reason']}")


def _record(module, nodes, call, loss):
    try:
        return dataflow.record_dataflow(module, nodes, *call, loss)
    except ValueError as e:
        raise ValueError(_batch_advice(str(e), e.__cause__)) from e.__cause__


def _priced_step(module, nodes, order, call, meter: _Meter, loss
                 ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """One forward and backward, each node's share of the modelled seconds (StepTimer's
    attribution, on the meter's clock)."""
    timer = block_timing.StepTimer(module, nodes, "wall")
    timer.clock = _PricedClock(meter)
    try:
        with meter:
            step = timer.step(*call, loss=loss)
    finally:
        timer.remove()
        module.zero_grad(set_to_none=True)
    # each node's fixed cost beyond its ops (DeviceModel.node_overhead_s), where it ran any
    forward_extra, backward_extra = meter.dm.node_overhead_s
    return ({n: step[0].get(n, 0.0) + forward_extra for n in order},
            {n: step[1].get(n, 0.0) + (backward_extra if step[1].get(n, 0.0) > 0 else 0.0)
             for n in order})


def _forward_fields(module, nodes, call, meter: _Meter) -> Dict[str, Dict[str, float]]:
    """Per node, from one logged forward: "flops", and selective recompute's
    "selective_saved_bytes", "selective_recompute_fraction", "selective_ops" as
    block_timing.selective_recompute defines them, the ops charged like FLOPs (count_flops: a
    functional op between nodes to the next node). RNN nodes carry no selective fields there
    (the policy cannot see into their fused kernels); here neither, to plan alike."""
    marks: List[Tuple[int, str]] = []
    calls = block_list.CallCounter()
    meter.log, meter.saves = [], saves

    def mark(name, ends):
        def hook(mod, args, *output):
            marks.append((len(meter.log), calls.finish(name) if ends else calls.current(name)))
        return hook

    handles = []
    for name, mod in nodes.items():
        handles.append(mod.register_forward_pre_hook(mark(name, False)))
        handles.append(mod.register_forward_hook(mark(name, True)))
    try:
        with meter, torch.no_grad():
            module(*call[0], **call[1])
        ops = meter.log
    finally:
        meter.log, meter.held = None, []
        for h in handles:
            h.remove()
    owner = [marks[-1][1] if marks else ""] * len(ops)
    start = 0
    for end, node in marks:  # ops before a mark belong to the node the mark names
        for i in range(start, end):
            owner[i] = node
        start = max(start, end)
    out: Dict[str, Dict[str, Any]] = {node: {"flops": 0.0, "_total": 0.0, "_again": 0.0,
                                             "_kept": {}, "selective_ops": 0}
                                      for _, node in marks}
    for node, (seconds, flops, kept) in zip(owner, ops):
        if not node:
            continue
        fields = out[node]
        fields["flops"] += flops
        fields["_total"] += seconds
        fields["selective_ops"] += 1
        if kept is None:
            fields["_again"] += seconds
        else:
            fields["_kept"].update(kept)
    rnn = {name for name, mod in nodes.items() if isinstance(mod, nn.RNNBase)}
    for node, fields in out.items():
        total, again, kept = fields.pop("_total"), fields.pop("_again"), fields.pop("_kept")
        if block_list.module_name(node) in rnn:
            del fields["selective_ops"]
            continue
        fields["selective_saved_bytes"] = int(sum(kept.values()))
        fields["selective_recompute_fraction"] = again / total if total > 0 else 0.0
    return out
