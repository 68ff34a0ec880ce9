"""Tensor-parallel fields for a fake profile (docs/fake_profile.md "Tensor parallelism"): the
graph's `tensor_parallel` objects of a model that has no values (built on the meta device)
or is priced for a device that is not here.

A split is accepted only where it computes what the whole module computes, which needs values
(tensor_parallel.detect_layout runs each candidate split and compares). A model at its
published size has none, so the work is divided:

1. **What splits and how, on a miniature with values.** A model of the same class with the
   same structure and narrow widths: for a Hugging Face `PreTrainedModel`, its configuration
   with the same layer, head, key-value head and expert counts and the widths narrowed
   (`hidden_size` = heads x kMiniHeadDim, `intermediate_size` kMiniWidth, a vocabulary of a
   multiple of kMiniWidth wider than the hidden size), initialised on this CPU; any other
   model can pass its own (`miniature=(module, example_inputs)`, the same node names). The
   real detection runs on it (tensor_parallel._analyse): the regions, their column-wise,
   row-wise and sharded nodes, the embeddings and heads, which activations split, the tied
   weights, and why every other node runs whole.
2. **How far each split goes, at the model's own shapes, under fake tensors.** A region's
   max_degree is the largest even divisor of its split sizes' greatest common divisor (read
   from the full model's weights) at which one rank's narrowed copy of the region's parent
   runs on the inputs the parent received in a fake forward (the real detection's `runs`, on
   shapes), and at which the miniature's split passes the numerical check (at the degree the
   real detection checks, _checked_degree: at most kMaxCheckedDegree, 8). kMiniWidth = 24 is
   divisible by every even degree up to 8, so every degree the full model can split at is
   one the miniature can be checked at. Embeddings and heads likewise: the full vocabulary's
   divisors, checked on the miniature. Parameter bytes, the tied weights' joint degrees and the
   collectives' bytes (each node's input and output at the profiled batch) are the full
   model's.
3. **Split times, priced at one rank's shapes.** Per degree d of (2, 4, 8): a copy of the
   full model (on the meta device, so nothing of its size is allocated) with every node that
   splits at d narrowed to rank 0's slice (column-wise outputs, row-wise inputs, vocabulary
   rows, head outputs) is priced by the device model with the profile's own step
   (fake_profile._priced_step, block_timing's attribution: the attention core charged to
   o_proj runs on the rank's heads). A node's ratio is its time in that copy over its time in
   the whole model (both without the loss), applied as the real profile applies its measured
   ratio: the loss charged to the last node is computed whole on every rank
   (tensor_parallel.node_fields).

4. **Sequence parallelism, the same way** (sequence_fields): its check cuts the sequence of
   real activations (sequence_parallel.detect_sequence_parallel), so it runs on the miniature
   with the full model's layout (the nodes that split at the model's sizes; the check reads
   only their names and styles), at degree 2 as the real profile checks it; what depends on
   size is then taken from one fake forward of the full model (sequence_parallel.at_shapes):
   the sequence length (max_degree), the bytes of every collective, the entry's and the
   exit's, and a gather node's saved_share; parameter gradients' all-reduces are the full
   model's parameters. sequence_parallel.graph_fields writes the graph's objects from it, as
   for a real profile.

What stays out: any model without a miniature (not a Hugging Face model and none given): its
fake profile has no tensor- or sequence-parallel fields, as before, and the log says why.
`tests/python/test_fake_profile.py` holds the tensor-parallel fields of a meta-built small
Llama's fake profile to those of its real profile, `tests/python/test_fake_sequence_parallel.py`
the sequence-parallel ones.
"""

from __future__ import annotations

import copy
import math
import types
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from . import block_list, sequence_parallel, tensor_parallel as tp
from .dataflow import map_tensors, tensors_in

__all__ = ["hf_miniature", "graph_fields", "sequence_fields", "kMiniHeadDim", "kMiniWidth"]

# The miniature's widths: a head of kMiniHeadDim features (even, for rotary embeddings), and
# kMiniWidth for every other narrowed width, divisible by 2, 4, 6 and 8 (every even degree up to
# tensor_parallel.kMaxCheckedDegree, the largest a split is checked at).
kMiniHeadDim = 4
kMiniWidth = 24
kMiniSequence = 16       # tokens of the miniature's example batch (at most)
kMiniMaxParameters = 50_000_000

# configuration fields narrowed to kMiniWidth (the feed-forward widths)
_FFN_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
               "ffn_dim", "n_inner")


class NoMiniature(ValueError):
    """No miniature can be built for the model; the message says why."""


def hf_miniature(module: nn.Module, example_inputs: Any) -> Tuple[nn.Module, Any]:
    """(miniature, its example inputs) of a Hugging Face PreTrainedModel (the module doc):
    the same class from a copy of its configuration with the widths narrowed, on this CPU in
    float32, initialised from seed 0, in the module's training mode; inputs of the example's
    structure, at most 2 samples of kMiniSequence tokens, token ids drawn below the miniature's
    vocabulary, masks all ones. Raises NoMiniature otherwise."""
    try:
        from transformers import PreTrainedModel
    except ImportError as exc:  # pragma: no cover - transformers is an extra
        raise NoMiniature("transformers is not installed") from exc
    if not isinstance(module, PreTrainedModel):
        raise NoMiniature(f"{type(module).__name__} is not a Hugging Face PreTrainedModel (pass "
                          "miniature=(module, example_inputs) of the same structure)")
    config = copy.deepcopy(module.config)
    heads = getattr(config, "num_attention_heads", None)
    if isinstance(heads, int) and heads > 0:
        config.hidden_size = heads * kMiniHeadDim
        if isinstance(getattr(config, "head_dim", None), int):
            config.head_dim = kMiniHeadDim
    elif isinstance(getattr(config, "hidden_size", None), int):
        config.hidden_size = kMiniWidth
    for key in _FFN_FIELDS:
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, kMiniWidth)
    hidden = getattr(config, "hidden_size", kMiniWidth)
    vocab = kMiniWidth * (hidden // kMiniWidth + 1)  # wider than the hidden size
    if isinstance(getattr(config, "vocab_size", None), int):
        config.vocab_size = vocab
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= vocab:
            setattr(config, key, None)
    with torch.device("meta"):
        probe = type(module)(config)
    count = sum(p.numel() for p in probe.parameters())
    if count > kMiniMaxParameters:
        raise NoMiniature(f"its miniature would hold {count:,} parameters (> "
                          f"{kMiniMaxParameters:,}): a width field this rule does not narrow")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        mini = type(module)(config).float()
    mini.train(module.training)
    generator = torch.Generator().manual_seed(0)

    def narrow(t: torch.Tensor, key: str = "") -> torch.Tensor:
        shape = list(t.shape)
        if shape:
            shape[0] = min(shape[0], 2)
        if len(shape) > 1:
            shape[1] = min(shape[1], kMiniSequence)
        if t.is_floating_point():
            return torch.randn(shape, generator=generator)
        if "mask" in key:
            return torch.ones(shape, dtype=t.dtype)
        return torch.randint(0, vocab, shape, generator=generator, dtype=t.dtype)

    if isinstance(example_inputs, dict):
        inputs = {k: narrow(v, k) if isinstance(v, torch.Tensor) else v
                  for k, v in example_inputs.items()}
    else:
        inputs = map_tensors(example_inputs, narrow)
    return mini, inputs


def _fresh(value: Any) -> Any:
    """A captured fake call's inputs for one more run: tensors as they are (detached, under
    their own fake mode), other objects copied (a KV cache the run appends to). Unlike
    tensor_parallel._fresh, every tensor is kept rather than copied: copying a fake tensor makes
    a new fake mode, which the run refuses to mix."""
    if isinstance(value, torch.Tensor) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, (int, float, bool, str, nn.Module)):
        return value
    return tp._copy_object(value, every_tensor=True)


class _Capture:
    """One fake forward of the full model (eval mode, autograd on, as tensor_parallel._Trace
    runs it): the first call's inputs and output shape of each module in `capture`, every graph
    node call's (input, output) bytes, and the model's output."""

    def __init__(self, module: nn.Module, nodes: Dict[str, nn.Module], call, capture: set):
        self.calls: Dict[str, Tuple[Tuple[Any, ...], Dict[str, Any]]] = {}
        self.out_shapes: Dict[str, Optional[Tuple[int, ...]]] = {}
        self.io_bytes: Dict[str, Tuple[int, int]] = {}
        counter = block_list.CallCounter()
        node_of = {id(m): n for n, m in nodes.items()}
        handles = []

        def pre(name):
            def hook(mod, a, kw):
                if name not in self.calls:
                    self.calls[name] = (_fresh(tuple(a)), _fresh(dict(kw)))
            return hook

        def post(name):
            def hook(mod, a, kw, out):
                if name in capture and name not in self.out_shapes:
                    first = tensors_in(out)[:1]
                    self.out_shapes[name] = tuple(first[0].shape) if first else None
                if node_of.get(id(mod)) == name:
                    self.io_bytes[counter.finish(name)] = (tp._nbytes((a, kw)), tp._nbytes(out))
            return hook

        for name, mod in module.named_modules():
            if name in capture:
                handles.append(mod.register_forward_pre_hook(pre(name), with_kwargs=True))
            if name in capture or id(mod) in node_of:
                handles.append(mod.register_forward_hook(post(name), with_kwargs=True))
        try:
            with tp._eval_with_grad(module):
                self.output = module(*call[0], **call[1])
        finally:
            for h in handles:
                h.remove()


def _full_linear(mod: nn.Module, mini: tp.LinearShape) -> tp.LinearShape:
    rows, cols = mod.weight.shape
    return (tp.LinearShape(cols, rows, True) if mini.transposed
            else tp.LinearShape(rows, cols, False))


def _narrow_copy(module: nn.Module, layout: tp.Layout, linears: Dict[str, tp.LinearShape],
                 degree: int) -> nn.Module:
    """A deep copy of `module` (meta tensors stay meta: nothing of the model's size is
    allocated) with every node of `layout` that splits at `degree` narrowed to rank 0's slice."""
    out = copy.deepcopy(module)
    for name, node in layout.items():
        if degree not in tp.timed_degrees(node.max_degree):
            continue
        mod = out.get_submodule(name)
        if node.style == "vocab_rowwise":
            tp._narrow_embedding(mod, 0, degree)
        elif node.style in ("colwise", "rowwise", "colwise_gather"):
            tp.narrow_linear(mod, linears[name], node.style, 0, degree)
    return out


def graph_fields(module: nn.Module, nodes: Dict[str, nn.Module], order: Sequence[str], call,
                 fake_run: Callable[[nn.Module], Any], priced_step: Callable[..., Any],
                 forward_s: Dict[str, float], backward_s: Dict[str, float],
                 loss: Optional[Callable[[Any], torch.Tensor]],
                 price_loss: Callable[[Any, Callable[[Any], torch.Tensor]], Tuple[float, float]],
                 miniature: Tuple[nn.Module, Any]) -> Tuple[Dict[str, Dict[str, Any]], tp.Layout]:
    """({graph node: its "tensor_parallel" object}, the full model's layout) (the module doc).

    nodes, order: the profile's node modules and graph nodes in execution order; call: the
    fake (args, kwargs); fake_run(m): a context manager with m's parameters and buffers fake
    and the profile's fake mode on; priced_step(m, nodes, call, loss) -> (forward_s,
    backward_s) per graph node, priced; forward_s, backward_s: the profile's node times (the
    loss charged to the last node); loss: the step's loss on the output, or None;
    price_loss(output, loss) -> the loss's own (forward, backward) priced seconds; miniature:
    (module, example inputs) with values, whose node modules carry the same names."""
    mini, mini_inputs = miniature
    mini_nodes = block_list.select_nodes(mini)
    missing = [n for n in nodes if n not in mini_nodes]
    if missing:
        raise tp._Refused(f"the miniature lacks node modules {missing[:3]}")
    analysis = tp._analyse(mini, list(nodes), mini_inputs)
    mini_layout = analysis.layout
    linears = {n: _full_linear(nodes[n], s) for n, s in analysis.linears.items()}
    heads = {n: t for n, t in mini_layout.items() if t.style in ("vocab_rowwise",
                                                                  "colwise_gather")}
    capture = set(mini_layout.regions) | set(heads)
    with fake_run(module):
        seen = _Capture(module, nodes, call, capture)
    layout = tp.Layout()
    layout.refused.update(mini_layout.refused)

    def refuse(names: Sequence[str], why: str) -> None:
        for n in names:
            layout.refused[n] = why

    for parent, region in mini_layout.regions.items():
        members = region.colwise + [region.rowwise]
        sizes = [linears[c].out_features for c in region.colwise] + [
            linears[region.rowwise].in_features]
        args, kwargs = seen.calls[parent]

        def runs(d: int, parent=parent, region=region, args=args, kwargs=kwargs) -> bool:
            part = copy.deepcopy(module.get_submodule(parent))
            prefix = parent + "." if parent else ""
            for c in region.colwise:
                tp.narrow_linear(part.get_submodule(c[len(prefix):]), linears[c], "colwise", 0, d)
            tp.narrow_linear(part.get_submodule(region.rowwise[len(prefix):]),
                             linears[region.rowwise], "rowwise", 0, d)
            try:
                with fake_run(part), torch.no_grad():
                    out = part(*_fresh(args), **_fresh(kwargs))
            except Exception:  # any failure means: not at this degree
                return False
            first = tensors_in(out)[:1]
            return (tuple(first[0].shape) if first else None) == seen.out_shapes.get(parent)

        try:
            degree = tp._max_degree(math.gcd(*sizes), runs, analysis.checks[parent].check)
        except tp._Refused as why:
            refuse(members + region.sharded, f"region {parent or 'root'} does not split at "
                                             f"the model's sizes {sizes}: {why}")
            continue
        layout.regions[parent] = tp.Region(parent, region.colwise, region.rowwise,
                                           region.sharded, degree)
    vocabularies = {nodes[n].weight.shape[0] for n, t in heads.items()
                    if t.style == "vocab_rowwise"}
    found: Dict[str, Tuple[str, int]] = {}
    for name, node in heads.items():
        mod, mini_mod = nodes[name], mini_nodes[name]
        mini_call = analysis.trace.calls[name]
        if node.style == "vocab_rowwise":
            size, width = mod.weight.shape
            if size < width:
                refuse([name], f"an embedding of {size} rows narrower than its width {width}: "
                               "its all-reduce would move more than it saves")
                continue
            check = lambda c, m=mini_mod, k=mini_call: tp._check_embedding(m, k, c)  # noqa: E731
        else:
            size = linears[name].out_features
            if size not in vocabularies:
                refuse([name], "an LM head whose outputs are not a split embedding's vocabulary")
                continue
            check = (lambda c, m=mini_mod, k=mini_call, s=analysis.linears[name]:  # noqa: E731
                     tp._check_head(m, k, s, c))
        try:
            found[name] = (node.style, tp._max_degree(size, lambda d: True, check))
        except tp._Refused as why:
            refuse([name], f"{node.style.replace('_', ' ')} split refused at the model's sizes: "
                           f"{why}")
    activation_split = {n: t.activation_split for n, t in mini_layout.items()}
    trace = types.SimpleNamespace(node_order=list(order))
    tp._assign(layout, module, nodes, linears, trace, found, activation_split)
    if not layout:
        return {}, layout

    whole_f, whole_b = priced_step(module, nodes, call, None)
    ratios: Dict[str, Dict[int, Tuple[float, float]]] = {}
    for d in tp.kTimedDegrees:
        split = [n for n, t in layout.items() if d in tp.timed_degrees(t.max_degree)]
        if not split:
            continue
        part = _narrow_copy(module, layout, linears, d)
        part_nodes = {n: part.get_submodule(n) for n in nodes}
        f, b = priced_step(part, part_nodes, call, None)
        for g in order:
            n = block_list.module_name(g)
            if n in split and g == n:
                ratios.setdefault(n, {})[d] = (
                    f[g] / whole_f[g] if whole_f[g] > 0 else 1.0 / d,
                    b[g] / whole_b[g] if whole_b[g] > 0 else 1.0 / d)
    whole_s = None
    if loss is not None:  # the loss is computed whole on the gathered output
        with fake_run(module):
            whole_s = {order[-1]: price_loss(seen.output, loss)}
    return tp.node_fields(layout, order, seen.io_bytes, forward_s, backward_s, ratios,
                          whole_s), layout


def sequence_fields(module: nn.Module, nodes: Dict[str, nn.Module], order: Sequence[str], call,
                    fake_run: Callable[[nn.Module], Any], layout: tp.Layout,
                    miniature: Tuple[nn.Module, Any]
                    ) -> Tuple[Dict[str, Dict[str, Any]], "sequence_parallel.SpLayout"]:
    """({graph node: its "sequence_parallel" object}, the SpLayout at the model's sizes; its
    `refused` says why where there are none) (the module doc, step 4). `layout`: the full
    model's tensor-parallel layout (graph_fields'); the other arguments as graph_fields'. At
    degree 2, as profile._add_tensor_parallel checks it: every split's max_degree is even."""
    mini, mini_inputs = miniature
    sp = sequence_parallel.detect_sequence_parallel(mini, layout, example_inputs=mini_inputs,
                                                    degree=2, node_names=list(nodes))
    sp = sequence_parallel.at_shapes(sp, module, call, fake_run)
    return sequence_parallel.graph_fields(sp, nodes, order), sp
