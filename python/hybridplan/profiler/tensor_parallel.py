"""Which graph nodes tensor parallelism splits, and how (docs/tensor_parallel.md): one definition,
used by the profiler (which writes it into the graph) and by the executor (which applies it).

    layout = detect_layout(model, example_inputs=batch)        # {node name: TpNode}
    layout["model.layers.0.self_attn.q_proj"].style             # "colwise"
    layout.refused["transformer.h.0.attn.c_attn"]               # why it is not split

Decided from the module's structure and a check, never from class names:

1. Linear layers are found by testing: a node holding one 2-D `weight` (and maybe a 1-D
   `bias`) that computes x @ W.T + b (nn.Linear) or x @ W + b (Hugging Face's Conv1D) on a
   random input.
2. Candidate regions, from one traced forward: the linear nodes in call order; consecutive
   ones reading one same input tensor form a column-wise group (Llama's q/k/v, gate/up), and
   the next linear called after them is the row-wise one closing the region (o_proj,
   down_proj, TransformerEncoderLayer's linear2, BERT's attention.output.dense). The region's
   parent is the lowest called module containing them all (LlamaAttention; BertAttention), one
   region per parent. A refused candidate's row-wise layer may start the next group.
3. Each candidate is checked by simulating the split on this one process (_RegionCheck): per
   rank, a copy of the parent with the column-wise weights narrowed to that rank's output
   features and the row-wise weight to its input features runs the parent's forward on the
   inputs the parent received; a hook keeps the row-wise layer's partial output and hands the
   rest of the parent the unsplit output. The partials must add up to the unsplit output, the
   parent's own output must not change, and no node after the row-wise layer may read a
   sliced value. Nodes between the column-wise and row-wise layers that ran on sliced inputs
   are `sharded`. A candidate that fails (GPT-2's fused c_attn, whose output is split into
   q/k/v by a fixed size) is not split; `Layout.refused` keeps why.
4. `max_degree`: the largest even divisor of the split sizes' greatest common divisor at which
   one rank's narrowed parent still runs and the check passes (checked at that degree, or its
   largest divisor up to kMaxCheckedDegree): a projection feeding attention heads thus splits
   into whole (key-value) heads, found by trying, not from config attributes. A region whose
   split sizes have no even common divisor is not split: no even `tp` would divide its
   max_degree, so under every even `tp` it would run whole anyway (a node whose max_degree `tp`
   does not divide runs whole on every rank of its TP group; docs/tensor_parallel.md, "Which
   nodes split").
5. Embeddings (`vocab_rowwise`): a node holding one 2-D weight whose first input is one of the
   model's own integer inputs (token ids, not computed positions), with at least as many rows
   as columns, checked by simulating torch's vocabulary split (each rank looks up the ids in
   its rows, zeros elsewhere; the sum over ranks must be the unsplit output).
   LM heads (`colwise_gather`): a linear node outside any region whose output is (part of) the
   model's output and that widens (out > in features), checked by concatenating the ranks'
   narrowed outputs. A narrowing classifier head is left whole: it gathers more than it saves.
6. Tied weights: a parameter held by several nodes stays split only where every holder splits
   it along the same dimension (GPT-2's wte, split by rows = vocabulary, and lm_head, whose
   weight rows are its output features: the same rows on each rank); otherwise all holders
   (and their regions) are left whole, with the reason.

Glue time: a functional op between two nodes (attention's matmuls and softmax inside
LlamaAttention.forward) is charged to the node that runs next, forward and backward
(block_timing), so the row-wise o_proj carries the attention core and the row-wise down_proj
the gate product. That glue runs on each rank's heads or features, so the profiler measures a
node's `split_times` on the narrowed parent with the same timing harness (`split_times`), which
charges it the same way: the measured ratio includes the glue's split.
"""

import copy
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from . import block_list
from .block_timing import StepTimer
from .dataflow import map_tensors, record_dataflow, tensors_in

STYLES = ("colwise", "rowwise", "sharded", "vocab_rowwise", "colwise_gather")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")

# The largest degree a split is simulated at: a larger max_degree is checked at its largest
# even divisor up to this (the check costs one forward of the region's parent per rank; a TP
# group is one node's devices, so degrees above this are not planned in practice).
kMaxCheckedDegree = 8


@dataclass(frozen=True)
class Collective:
    """A collective the split needs over the TP group: `op` (COLLECTIVE_OPS) of the node's full
    `of` tensor ("input" or "output"; its bytes at a batch give the graph's `bytes`)."""
    op: str
    of: str


@dataclass(frozen=True)
class TpNode:
    """How one graph node (a node module, block_list) is split. Fields as the graph's
    `tensor_parallel` object (docs/tensor_parallel.md); the collectives name the tensor they
    move, `Collective.of`, since their bytes depend on the batch.

    region: the module whose forward the split was checked on: the parent for colwise, rowwise
        and sharded nodes (all nodes of one region share it and its max_degree), the node
        itself for vocab_rowwise and colwise_gather.
    note: what else the executor must know (a weight tied with another split node)."""
    style: str
    max_degree: int
    split_param_bytes: int
    activation_split: bool
    region: str
    forward_collective: Optional[Collective] = None
    backward_collective: Optional[Collective] = None
    note: str = ""


# Per style: (forward collective, backward collective, activations split by default).
_STYLE_RULES: Dict[str, Tuple[Optional[Collective], Optional[Collective], bool]] = {
    # a column-wise layer keeps its (replicated) input; its input gradient is all-reduced
    "colwise": (None, Collective("all_reduce", "input"), False),
    # a row-wise layer keeps its sliced input; its partial output is all-reduced
    "rowwise": (Collective("all_reduce", "output"), None, True),
    "sharded": (None, None, True),
    "vocab_rowwise": (Collective("all_reduce", "output"), None, False),
    "colwise_gather": (Collective("all_gather", "output"), Collective("all_reduce", "input"),
                       False),
}


@dataclass
class Region:
    """A verified column-then-row region inside `parent` (qualified module name, "" = root)."""
    parent: str
    colwise: List[str]
    rowwise: str
    sharded: List[str]
    max_degree: int


class Layout(dict):
    """{node name: TpNode} for the nodes tensor parallelism splits (absent: replicated), plus
    `refused` {node name: why it is not split} for the nodes holding parameters that are not
    split, and `regions` {parent: Region}."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: Dict[str, str] = {}
        self.regions: Dict[str, Region] = {}


def detect_layout(module: nn.Module, node_names: Optional[Sequence[str]] = None,
                  example_inputs: Any = None) -> Layout:
    """The tensor-parallel layout of `module` (see the module doc): {node name: TpNode}, a
    `Layout` whose `refused` says why each other parameter-holding node runs whole.

    node_names: the graph's node modules (block_list.select_nodes names; the profiler passes
        its own, without the parameter-free modules it treats as functional ops); default all
        of block_list.select_nodes(module).
    example_inputs: one batch the module runs on, as profile takes it (a tensor, a tuple of
        positional inputs or a dict of keyword inputs), on the module's device: the split is
        checked by running it. Required.

    Runs the module's forward a few times per region (in eval mode with autograd on, so
    dropout draws nothing and torch's fused inference paths stay off; each module's training
    flag is restored), and changes no parameter or buffer. Raises ValueError without
    example_inputs or where node_names names no node module."""
    return _analyse(module, node_names, example_inputs).layout


# ---- linear layers and embeddings, by test ---------------------------------------------------

@dataclass(frozen=True)
class LinearShape:
    """A linear node: y = x @ W.T + b (`transposed`, nn.Linear's (out, in) weight) or
    y = x @ W + b (Conv1D's (in, out) weight)."""
    in_features: int
    out_features: int
    transposed: bool

    def out_dim(self) -> int:
        """The weight dimension of the output features."""
        return 0 if self.transposed else 1


# int attributes naming a linear layer's widths (nn.Linear; Hugging Face's Conv1D), which a
# narrowed copy updates so that its forward uses the narrow width
_IN_ATTRS, _OUT_ATTRS = ("in_features", "nx"), ("out_features", "nf")


def _weight_and_bias(mod: nn.Module) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    params = dict(mod.named_parameters())
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None or weight.dim() != 2 or set(params) - {"weight", "bias"}:
        return None
    if bias is not None and bias.dim() != 1:
        return None
    return weight, bias


def as_linear(mod: nn.Module) -> Optional[LinearShape]:
    """The node's linear shape where it computes a linear map of its last dimension (tested
    on a random input, both weight orientations), else None."""
    wb = _weight_and_bias(mod)
    if wb is None or any(True for _ in mod.children()):
        return None
    weight, bias = wb
    rows, cols = weight.shape
    generator = torch.Generator(device="cpu").manual_seed(0)
    for transposed, (n_in, n_out) in ((True, (cols, rows)), (False, (rows, cols))):
        if bias is not None and bias.shape[0] != n_out:
            continue
        x = torch.randn(3, n_in, generator=generator).to(weight.device, weight.dtype)
        try:
            with torch.no_grad():
                y = mod(x)
        except Exception:  # any failure means: not this orientation
            continue
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != (3, n_out):
            continue
        with torch.no_grad():
            expected = F.linear(x, weight if transposed else weight.t(), bias)
        if _close(y, expected):
            return LinearShape(n_in, n_out, transposed)
    return None


def _close(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal up to rounding: the largest difference within a tolerance of the dtype's precision
    times the largest magnitude (a split sums in another order)."""
    if actual.shape != expected.shape:
        return False
    actual, expected = actual.detach().double(), expected.detach().double()
    if not expected.numel():
        return True
    eps = torch.finfo(torch.float32).eps  # checks run in float32 at least (_Trace)
    scale = float(expected.abs().max()) + 1e-12
    return float((actual - expected).abs().max()) <= 256 * eps * scale + 1e-9


# ---- one traced forward ----------------------------------------------------------------------

@dataclass
class _Call:
    """A module's first call in the traced forward."""
    enter: int                      # position in the trace's event sequence
    exit: int = -1
    args: Tuple[Any, ...] = ()      # inputs, detached (captured for parents and nodes)
    kwargs: Dict[str, Any] = field(default_factory=dict)
    outputs: List[Any] = field(default_factory=list)  # weak references to its output tensors


class _Trace:
    """Runs the module once in eval mode with autograd on and records each module's first call
    (inputs, outputs, when it entered and left), every node call's input and output bytes by
    graph node (block_list.call_name), and the model's inputs and outputs."""

    def __init__(self, module: nn.Module, nodes: Dict[str, nn.Module], args, kwargs,
                 capture: Callable[[str], bool]):
        self.calls: Dict[str, _Call] = {}
        self.io_bytes: Dict[str, Tuple[int, int]] = {}
        self.node_order: List[str] = []  # graph nodes in execution order
        counter = block_list.CallCounter()
        event = [0]
        node_of_module = {id(m): n for n, m in nodes.items()}
        handles = []

        def pre(name):
            def hook(mod, a, kw):
                event[0] += 1
                if name not in self.calls:
                    call = _Call(enter=event[0])
                    if capture(name):
                        call.args, call.kwargs = _detached(a), _detached(kw)
                    self.calls[name] = call
            return hook

        def post(name):
            def hook(mod, a, kw, out):
                event[0] += 1
                call = self.calls[name]
                if call.exit < 0:
                    call.exit = event[0]
                    if capture(name):
                        call.outputs = [weakref.ref(t) for t in tensors_in(out)]
                node = node_of_module.get(id(mod))
                if node == name:
                    graph_node = counter.finish(node)
                    self.node_order.append(graph_node)
                    self.io_bytes[graph_node] = (_nbytes((a, kw)), _nbytes(out))
            return hook

        for name, mod in module.named_modules():
            handles.append(mod.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(mod.register_forward_hook(post(name), with_kwargs=True))
        try:
            with _eval_with_grad(module):
                output = module(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()
        self.input_keys = {_tensor_key(t) for t in tensors_in((args, kwargs))}
        # modules an output tensor of which is (part of) the model's output, by identity while
        # the output lives (a dead weak reference is a tensor the model did not return)
        returned = {id(t) for t in tensors_in(output)}
        self.returns = {name for name, call in self.calls.items()
                        if any(id(ref()) in returned for ref in call.outputs
                               if ref() is not None)}
        for call in self.calls.values():
            call.outputs = []


def _detached(value: Any) -> Any:
    """Tensors detached (a leaf requiring grad where the tensor did: timing a region then
    computes its input gradient, as the whole model does); other objects copied (a cache the
    forward updates must be seen as it was when the module was called), or kept as they are
    where they cannot be copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        try:
            return type(value)({k: _detached(v) for k, v in value.items()})
        except TypeError:
            return {k: _detached(v) for k, v in value.items()}
    if value is None or isinstance(value, (int, float, bool, str, nn.Module)):
        return value
    return _copy_object(value)


def _copy_object(value: Any, every_tensor: bool = False) -> Any:
    """A deep copy of a stateful object a forward reads and updates (a Hugging Face KV cache,
    `past_key_values`), or the object itself where it cannot be copied. Tensors in it that
    autograd computed (the keys and values earlier layers stored while the trace ran with
    autograd on) are detached views in the copy: copy.deepcopy refuses a non-leaf tensor, and
    a cache kept as the live object would carry the whole heads of every earlier run into the
    next (a narrowed run's keys then fail to concatenate: "Sizes of tensors must match ...
    Expected size 8 but got size 4"). Other tensors are copied, as deepcopy copies them, unless
    `every_tensor`: then every tensor is a detached view (fake_tensor_parallel: copying a fake
    tensor makes a new fake mode)."""
    memo: Dict[int, Any] = {}
    seen: set = set()
    todo = [value]
    while todo:  # the non-leaf tensors reachable through containers and attributes
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (nn.Module, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if every_tensor or not obj.is_leaf:
                memo[id(obj)] = obj.detach()
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    try:
        return copy.deepcopy(value, memo)
    except Exception:  # not copyable: the object itself
        return value


def _fresh(value: Any) -> Any:
    """A captured call's inputs for one more run: stateful non-tensor objects copied again."""
    if isinstance(value, torch.Tensor) or value is None:
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_fresh(v) for v in value)
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    if isinstance(value, (int, float, bool, str, nn.Module)):
        return value
    return _copy_object(value)


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def _tensor_key(t: torch.Tensor) -> Tuple[Any, ...]:
    """Identity of a tensor's values: the same storage, offset, shape and strides."""
    if t.layout != torch.strided or t.device.type == "meta":
        return (id(t),)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())


class _eval_with_grad:
    """Eval mode (no dropout, batch-norm running statistics read, not updated) with autograd on
    (torch's fused inference paths of nn.TransformerEncoderLayer / nn.MultiheadAttention, which
    bypass their submodules, stay off); every module's training flag is restored."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __enter__(self):
        self.flags = [(m, m.training) for m in self.module.modules()]
        self.module.eval()
        self.grad = torch.is_grad_enabled()
        torch.set_grad_enabled(True)

    def __exit__(self, *exc):
        torch.set_grad_enabled(self.grad)
        for m, flag in self.flags:
            m.training = flag


# ---- narrowed copies -------------------------------------------------------------------------

def _set_param(mod: nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(mod, name)
    setattr(mod, name, nn.Parameter(value.detach().clone(), requires_grad=old.requires_grad))


def narrow_linear(mod: nn.Module, shape: LinearShape, role: str, rank: int, degree: int,
                   bias_on_this_rank: bool = True) -> None:
    """Narrows linear node `mod` in place to rank `rank`'s share at `degree`: a column-wise (or
    gathered head) layer's output features, a row-wise layer's input features (its bias kept on
    one rank: the all-reduce adds it once)."""
    weight, bias = _weight_and_bias(mod)
    if role in ("colwise", "colwise_gather"):
        k = shape.out_features // degree
        _set_param(mod, "weight", weight.narrow(shape.out_dim(), rank * k, k))
        if bias is not None:
            _set_param(mod, "bias", bias.narrow(0, rank * k, k))
        attrs, width = _OUT_ATTRS, k
    else:
        k = shape.in_features // degree
        _set_param(mod, "weight", weight.narrow(1 - shape.out_dim(), rank * k, k))
        if bias is not None and not bias_on_this_rank:
            _set_param(mod, "bias", torch.zeros_like(bias))
        attrs, width = _IN_ATTRS, k
    for attr in attrs:
        if isinstance(getattr(mod, attr, None), int):
            setattr(mod, attr, width)


def _narrow_embedding(mod: nn.Module, rank: int, degree: int) -> Tuple[int, int]:
    """Narrows embedding node `mod` in place to rank `rank`'s rows; returns (first row, rows)."""
    weight = mod.weight
    k = weight.shape[0] // degree
    _set_param(mod, "weight", weight.narrow(0, rank * k, k))
    if isinstance(getattr(mod, "num_embeddings", None), int):
        mod.num_embeddings = k
    if getattr(mod, "padding_idx", None) is not None:
        mod.padding_idx = None  # it only zeroes one row's gradient; the rank may not hold it
    return rank * k, k


def _vocab_ids(ids: torch.Tensor, first: int, rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch's vocabulary split of an embedding lookup: ids shifted into this rank's rows, and
    the mask of ids it does not hold (looked up as row 0, their output zeroed)."""
    outside = (ids < first) | (ids >= first + rows)
    return torch.where(outside, torch.zeros_like(ids), ids - first), outside


def _relative(name: str, parent: str) -> str:
    return name[len(parent) + 1:] if parent else name


def _submodule(module: nn.Module, name: str) -> nn.Module:
    return module.get_submodule(name) if name else module


# ---- the check -------------------------------------------------------------------------------

class _Refused(Exception):
    """A candidate that does not split; the message says why."""


def _low_precision(mod: nn.Module) -> bool:
    params = [p for p in mod.parameters() if p.is_floating_point()]
    return bool(params) and torch.finfo(params[0].dtype).bits < 32


def _float_copy(mod: nn.Module) -> nn.Module:
    """A copy for the check; float32 where the module computes in a lower precision (the
    tolerance is float32's)."""
    out = copy.deepcopy(mod)
    return out.float() if _low_precision(out) else out


def _float_view(mod: nn.Module) -> nn.Module:
    """`mod` itself, or a float32 copy where it computes in a lower precision."""
    return _float_copy(mod) if _low_precision(mod) else mod


def _float_inputs(value: Any, like: nn.Module) -> Any:
    params = [p for p in like.parameters() if p.is_floating_point()]
    dtype = params[0].dtype if params else torch.float32
    return map_tensors(value, lambda t: t.to(dtype) if t.is_floating_point() else t)


class _RegionCheck:
    """Simulates splitting one candidate region of `parent` (see the module doc, step 3)."""

    def __init__(self, root: nn.Module, parent_name: str, call: _Call,
                 colwise: Dict[str, LinearShape],
                 rowwise: Tuple[str, LinearShape], node_names: Sequence[str]):
        self.parent_name = parent_name
        self.parent = _submodule(root, parent_name)
        self.call = call
        self.colwise = {_relative(n, parent_name): s for n, s in colwise.items()}
        self.row_name, self.row_shape = _relative(rowwise[0], parent_name), rowwise[1]
        prefix = parent_name + "." if parent_name else ""
        self.nodes = [_relative(n, parent_name) for n in node_names
                      if n.startswith(prefix) and n != parent_name]
        self.reference = self._run(_float_view(self.parent), None, None)
        self.sharded: List[str] = []

    def _run(self, parent: nn.Module, degree: Optional[int], partials: Optional[list]):
        """Runs `parent` on the captured inputs; returns (its output, {node: input shapes per
        call, in call order}, the order the nodes ran in). With `partials`, the row-wise
        layer's output is appended there and replaced by the reference's."""
        shapes: Dict[str, List[List[Tuple[int, ...]]]] = {}
        order: List[str] = []
        handles = []

        def pre(name):
            def hook(mod, a, kw):
                shapes.setdefault(name, []).append([tuple(t.shape) for t in tensors_in((a, kw))])
                order.append(name)
            return hook

        def replace(mod, a, out):
            partials.append(out.detach())
            return self.reference[3].to(out.dtype)

        for name in self.nodes:
            handles.append(parent.get_submodule(name).register_forward_pre_hook(
                pre(name), with_kwargs=True))
        if partials is not None:
            handles.append(parent.get_submodule(self.row_name).register_forward_hook(replace))
        row_output: List[torch.Tensor] = []
        if partials is None:
            handles.append(parent.get_submodule(self.row_name).register_forward_hook(
                lambda mod, a, out: row_output.append(out.detach())))
        args = _float_inputs(_fresh(self.call.args), parent)
        kwargs = _float_inputs(_fresh(self.call.kwargs), parent)
        try:
            with _eval_with_grad(parent):
                output = parent(*args, **kwargs)
        finally:
            for h in handles:
                h.remove()
        first = tensors_in(output)[:1]
        out = first[0].detach() if first else None
        if partials is None:
            if len(row_output) != 1:
                raise _Refused(f"row-wise layer {self._full(self.row_name)} ran "
                               f"{len(row_output)} times in one forward of the region")
            return out, shapes, order, row_output[0]
        return out, shapes, order

    def _full(self, name: str) -> str:
        return f"{self.parent_name}.{name}" if self.parent_name else name

    def narrowed(self, rank: int, degree: int, bias_on_this_rank: bool = True,
                 as_is: bool = False) -> nn.Module:
        """A float copy (`as_is`: a copy in the model's dtype, for timing) of the parent with
        this region split as rank `rank` of `degree`."""
        copy_ = copy.deepcopy(self.parent) if as_is else _float_copy(self.parent)
        for name, shape in self.colwise.items():
            narrow_linear(copy_.get_submodule(name), shape, "colwise", rank, degree)
        narrow_linear(copy_.get_submodule(self.row_name), self.row_shape, "rowwise", rank,
                       degree, bias_on_this_rank)
        return copy_

    def runs(self, degree: int) -> bool:
        """Whether one rank's narrowed parent runs at `degree` (a cheap filter: a projection
        feeding attention reshapes its output into whole heads)."""
        try:
            self._run(self.narrowed(0, degree), degree, [])
            return True
        except Exception:  # any failure means: not at this degree
            return False

    def check(self, degree: int) -> None:
        """Raises _Refused where the split at `degree` does not compute what the whole parent
        computes; sets `sharded` (the nodes that ran on sliced inputs between the column-wise
        and row-wise layers)."""
        ref_out, ref_shapes, ref_order, ref_row = self.reference
        partials: List[torch.Tensor] = []
        changed: set = set()
        for rank in range(degree):
            try:
                out, shapes, order = self._run(self.narrowed(rank, degree, rank == 0), degree,
                                               partials)
            except _Refused:
                raise
            except Exception as exc:  # the forward itself fails on the narrowed weights
                raise _Refused(f"splitting at degree {degree} fails in "
                               f"{self.parent_name or 'the root'}'s forward: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
            if order != ref_order:
                raise _Refused(f"at degree {degree} the region's nodes run in another order")
            if len(partials) != rank + 1:
                raise _Refused(f"row-wise layer {self._full(self.row_name)} ran "
                               f"{len(partials) - rank} times in one forward of the region")
            if (ref_out is None) != (out is None) or (out is not None
                                                      and not _close(out, ref_out)):
                raise _Refused(f"at degree {degree} the output of "
                               f"{self.parent_name or 'the root'} changes")
            changed |= {n for n in shapes if shapes[n] != ref_shapes.get(n)}
        total = partials[0].double()
        for p in partials[1:]:
            if p.shape != total.shape:
                raise _Refused(f"at degree {degree} the row-wise layer's partial outputs "
                               "differ in shape")
            total = total + p.double()
        if not _close(total, ref_row):
            err = float((total - ref_row.double()).abs().max())
            raise _Refused(f"at degree {degree} the row-wise partial outputs of "
                           f"{self._full(self.row_name)} do not add up to its output (largest "
                           f"difference {err:.3g}): the column-wise outputs are not used "
                           "feature by feature")
        positions = {n: i for i, n in enumerate(ref_order)}
        first_col = min(positions[c] for c in self.colwise)
        row_at = positions[self.row_name]
        for name in sorted(changed - {self.row_name}):
            if name in self.colwise:
                raise _Refused(f"column-wise layer {self._full(name)} reads a sliced value")
            if not first_col < positions[name] < row_at:
                raise _Refused(f"node {self._full(name)} outside the column-to-row span reads "
                               "a sliced value")
        if degree == 2:  # the first check, which every region passes or is refused at
            self.sharded = [n for n in ref_order[first_col:row_at]
                            if n in changed and n not in self.colwise]

    def region_nodes(self) -> List[str]:
        return list(self.colwise) + [self.row_name] + self.sharded

    def activation_split(self) -> Dict[str, bool]:
        """{region node: whether the bytes it keeps for backward divide by the degree}: what
        autograd saves while each node runs, charged as the profiler charges it
        (dataflow.record_dataflow: a functional op's saved tensors to the node that ran last,
        so the attention core's go to v_proj), on the whole parent and on one rank of a split
        at degree 2 (copies, in the parent's own training mode): split where it at most 3/4 of
        the whole's. A node that keeps nothing gets its style's default."""
        members = self.region_nodes()
        saved = []
        for parent in (copy.deepcopy(self.parent), self.narrowed(0, 2, as_is=True)):
            with torch.enable_grad():
                flow, _ = record_dataflow(parent, {n: parent.get_submodule(n) for n in self.nodes},
                                          _fresh(self.call.args), _fresh(self.call.kwargs))
            saved.append(flow.saved_bytes)
        whole, split = saved
        return {n: split.get(n, 0) <= 0.75 * whole[n] for n in members if whole.get(n, 0) > 0}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _even_divisors_descending(g: int) -> List[int]:
    return [d for d in range(g, 1, -1) if g % d == 0 and d % 2 == 0]


def _checked_degree(d: int) -> int:
    """The degree a split of max degree `d` is simulated at: d, or its largest even divisor up
    to kMaxCheckedDegree."""
    if d <= kMaxCheckedDegree:
        return d
    return next(c for c in range(kMaxCheckedDegree, 1, -1) if d % c == 0 and c % 2 == 0)


def _max_degree(g: int, runs: Callable[[int], bool], check: Callable[[int], None]) -> int:
    """The largest even divisor of `g` at which `runs` holds and `check` passes; check(2) first,
    whose _Refused is the candidate's refusal."""
    if g < 2 or g % 2:
        raise _Refused(f"its split sizes have no even common divisor (greatest common divisor "
                       f"{g}): no even tensor-parallel degree would divide it, so it would always run whole")
    check(2)
    for d in _even_divisors_descending(g):
        if d == 2:
            break
        if not runs(d):
            continue
        try:
            c = _checked_degree(d)
            if c != 2:
                check(c)
            return d
        except _Refused:
            continue
    return 2


# ---- the analysis ----------------------------------------------------------------------------

@dataclass
class _Analysis:
    layout: Layout
    trace: _Trace
    checks: Dict[str, _RegionCheck]          # parent -> its region's check
    linears: Dict[str, LinearShape]


def _call_of(example_inputs: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise ValueError("detect_layout: example_inputs must be a tensor, a tuple of positional "
                     "inputs or a dict of keyword inputs (got "
                     f"{type(example_inputs).__name__}): the split is checked by running it")


def _common_ancestor(names: Sequence[str]) -> str:
    """The lowest module containing all of `names` (qualified names; "" = the root)."""
    parts = [n.split(".") for n in names]
    common: List[str] = []
    for segments in zip(*(p[:-1] for p in parts)):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    return ".".join(common)


def _analyse(module: nn.Module, node_names: Optional[Sequence[str]], example_inputs: Any,
             call: Optional[Tuple[Tuple[Any, ...], Dict[str, Any]]] = None) -> _Analysis:
    if example_inputs is None and call is None:
        raise ValueError("detect_layout: example_inputs is required (one batch the module runs "
                         "on): each split is checked by running it")
    args, kwargs = call if call is not None else _call_of(example_inputs)
    all_nodes = block_list.select_nodes(module)
    if node_names is None:
        nodes = all_nodes
    else:
        unknown = [n for n in node_names if n not in all_nodes]
        if unknown:
            raise ValueError(f"detect_layout: node_names {unknown} are not node modules of "
                             f"{type(module).__name__} (block_list's node rule)")
        nodes = {n: all_nodes[n] for n in node_names}
    linears = {name: shape for name, mod in nodes.items()
               if (shape := as_linear(mod)) is not None}
    parents = {".".join(n.split(".")[:k]) for n in linears for k in range(n.count(".") + 1)}
    wide = {n for n, m in nodes.items() if _weight_and_bias(m) is not None}  # linears, tables
    trace = _Trace(module, nodes, args, kwargs,
                   capture=lambda name: name in parents or name in wide)
    layout = Layout()
    checks: Dict[str, _RegionCheck] = {}

    # regions: column-wise groups closed by the next linear layer the model calls, checked on
    # their lowest common ancestor's forward
    activation_split: Dict[str, bool] = {}  # measured, region nodes that keep anything
    pending: List[str] = []
    for name in sorted((n for n in linears if n in trace.calls),
                       key=lambda n: trace.calls[n].enter):
        if pending and _same_input(trace.calls[name], trace.calls[pending[0]]):
            pending.append(name)
            continue
        if not pending:
            pending = [name]
            continue
        col = {c: linears[c] for c in pending}
        parent = _common_ancestor(list(col) + [name])
        while parent not in trace.calls:  # a container never called (nn.ModuleList)
            parent = parent.rpartition(".")[0]
        pcall = trace.calls[parent]
        try:
            if not all(pcall.enter < trace.calls[n].enter < pcall.exit for n in list(col) + [name]):
                raise _Refused(f"they do not run in {parent or 'the root'}'s first call")
            if parent in layout.regions:
                raise _Refused(f"{parent or 'the root'} already holds a split region "
                               f"({layout.regions[parent].rowwise} row-wise)")
            check = _RegionCheck(module, parent, pcall, col, (name, linears[name]), nodes)
            sizes = [s.out_features for s in col.values()] + [linears[name].in_features]
            degree = _max_degree(math.gcd(*sizes), check.runs, check.check)
        except _Refused as why:
            for n in list(col) + [name]:
                layout.refused.setdefault(n, f"region {parent or 'root'} ({', '.join(col)} "
                                             f"column-wise, {name} row-wise) does not split: "
                                             f"{why}")
            pending = [name]  # the row-wise candidate may start a column-wise group itself
            continue
        pending = []
        full = check._full
        layout.regions[parent] = Region(parent, [full(c) for c in check.colwise],
                                        full(check.row_name), [full(s) for s in check.sharded],
                                        degree)
        checks[parent] = check
        activation_split.update({full(n): split for n, split in check.activation_split().items()})
    for region in layout.regions.values():
        for n in region.colwise + [region.rowwise] + region.sharded:
            layout.refused.pop(n, None)

    heads = _heads_and_embeddings(module, nodes, linears, trace, layout)
    _assign(layout, module, nodes, linears, trace, heads, activation_split)
    return _Analysis(layout, trace, checks, linears)


def _same_input(a: _Call, b: _Call) -> bool:
    ta, tb = tensors_in(a.args)[:1], tensors_in(b.args)[:1]
    return bool(ta and tb) and _tensor_key(ta[0]) == _tensor_key(tb[0])


def _heads_and_embeddings(module, nodes, linears, trace, layout) -> Dict[str, Tuple[str, int]]:
    """{node: (style, max_degree)} for the embeddings and LM heads that split (module doc,
    step 5); refusals into layout.refused."""
    in_region = {n for r in layout.regions.values() for n in r.colwise + [r.rowwise] + r.sharded}
    found: Dict[str, Tuple[str, int]] = {}
    vocabularies = set()  # rows of the embeddings of the model's input ids
    for name, mod in nodes.items():
        wb = _weight_and_bias(mod)
        first = tensors_in(trace.calls[name].args)[:1] if name in trace.calls else []
        if (wb is not None and wb[1] is None and name not in linears and first
                and not first[0].is_floating_point()
                and _tensor_key(first[0]) in trace.input_keys):
            vocabularies.add(wb[0].shape[0])
    for name, mod in nodes.items():
        if name in in_region or name not in trace.calls:
            continue
        call = trace.calls[name]
        first = tensors_in(call.args)[:1]
        wb = _weight_and_bias(mod)
        if (wb is not None and wb[1] is None and name not in linears and first
                and not first[0].is_floating_point() and not first[0].is_complex()):
            rows, cols = wb[0].shape
            if _tensor_key(first[0]) not in trace.input_keys:
                layout.refused[name] = ("an embedding of ids computed in the forward (positions, "
                                        "default token types), not of the model's input ids: "
                                        "replicated")
                continue
            if rows < cols:
                layout.refused[name] = (f"an embedding of {rows} rows narrower than its width "
                                        f"{cols}: its all-reduce would move more than it saves")
                continue
            kind = "vocab_rowwise"
            check = lambda d, m=mod, c=call: _check_embedding(m, c, d)  # noqa: E731
            size = rows
        elif name in linears:
            shape = linears[name]
            if name not in trace.returns or shape.out_features not in vocabularies:
                continue
            kind = "colwise_gather"
            check = lambda d, m=mod, c=call, s=shape: _check_head(m, c, s, d)  # noqa: E731
            size = shape.out_features
        else:
            continue
        try:
            degree = _max_degree(size, lambda d: True, check)
        except _Refused as why:
            layout.refused[name] = f"{kind.replace('_', ' ')} split refused: {why}"
            continue
        found[name] = (kind, degree)
        layout.refused.pop(name, None)  # as a region's candidate it was refused
    return found


def _check_embedding(mod: nn.Module, call: _Call, degree: int) -> None:
    args, kwargs = _fresh(call.args), _fresh(call.kwargs)
    ids = args[0]
    with torch.no_grad():
        reference = _float_view(mod)(*args, **kwargs)
        total = None
        for rank in range(degree):
            part = _float_copy(mod)
            first, rows = _narrow_embedding(part, rank, degree)
            local, outside = _vocab_ids(ids, first, rows)
            try:
                out = part(local, *args[1:], **kwargs)
            except Exception as exc:
                raise _Refused(f"its forward fails on a vocabulary slice: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
            out = out.masked_fill(outside.unsqueeze(-1), 0).double()
            total = out if total is None else total + out
    if not _close(total, reference):
        raise _Refused(f"at degree {degree} the vocabulary slices' lookups do not add up to its "
                       "output")


def _check_head(mod: nn.Module, call: _Call, shape: LinearShape, degree: int) -> None:
    args, kwargs = _fresh(call.args), _fresh(call.kwargs)
    with torch.no_grad():
        reference = _float_view(mod)(*_float_inputs(args, _float_view(mod)), **kwargs)
        parts = []
        for rank in range(degree):
            part = _float_copy(mod)
            narrow_linear(part, shape, "colwise_gather", rank, degree)
            try:
                parts.append(part(*_float_inputs(args, part), **kwargs))
            except Exception as exc:
                raise _Refused(f"its forward fails on an output slice: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
    if not _close(torch.cat(parts, dim=-1), reference):
        raise _Refused(f"at degree {degree} the output slices concatenated are not its output")


def _split_params(mod: nn.Module, style: str, linear: Optional[LinearShape]
                  ) -> Dict[int, Tuple[torch.Tensor, int]]:
    """{id(param): (param, the dimension split)} of a node of `style`."""
    if style == "sharded":
        return {}
    if style == "vocab_rowwise":
        return {id(mod.weight): (mod.weight, 0)}
    weight, bias = _weight_and_bias(mod)
    if style in ("colwise", "colwise_gather"):
        out = {id(weight): (weight, linear.out_dim())}
        if bias is not None:
            out[id(bias)] = (bias, 0)
        return out
    return {id(weight): (weight, 1 - linear.out_dim())}  # rowwise: the bias is not split


def _assign(layout: Layout, module, nodes, linears, trace: _Trace,
            heads: Dict[str, Tuple[str, int]], activation_split: Dict[str, bool]) -> None:
    """Fills `layout` with a TpNode per split node: styles from the regions and heads, tied
    weights resolved (module doc, step 6), split parameter bytes counted once, at the first
    node in execution order that holds the parameter (the profiler's param_bytes rule)."""
    styles: Dict[str, Tuple[str, int, str]] = {}  # node -> (style, max_degree, region)
    for region in layout.regions.values():
        for n in region.colwise:
            styles[n] = ("colwise", region.max_degree, region.parent)
        styles[region.rowwise] = ("rowwise", region.max_degree, region.parent)
        for n in region.sharded:
            styles[n] = ("sharded", region.max_degree, region.parent)
    for n, (style, degree) in heads.items():
        styles[n] = (style, degree, n)

    holders: Dict[int, List[str]] = {}
    for name, mod in nodes.items():
        for p in mod.parameters():
            holders.setdefault(id(p), []).append(name)
    notes: Dict[str, str] = {}
    changed = True
    while changed:  # dropping a node can make a tie with it unsafe for another
        changed = False
        for name in list(styles):
            if name not in styles:
                continue
            style = styles[name][0]
            for key, (p, dim) in _split_params(nodes[name], style, linears.get(name)).items():
                others = [o for o in holders.get(key, []) if o != name]
                bad = [o for o in others if o not in styles or _split_params(
                    nodes[o], styles[o][0], linears.get(o)).get(key, (None, -1))[1] != dim]
                if bad:
                    _drop(layout, styles, name, f"its weight is tied with {', '.join(bad)}, "
                          "which does not split it along the same dimension")
                    changed = True
                    break
                if others:
                    notes[name] = (f"weight tied with {', '.join(others)}: the same slice on "
                                   "each rank")
    # a tie joins max degrees: both nodes split the one tensor the same way
    for name in styles:
        for key in _split_params(nodes[name], styles[name][0], linears.get(name)):
            for o in holders.get(key, []):
                if o != name and o in styles and styles[o][1] != styles[name][1]:
                    g = math.gcd(styles[o][1], styles[name][1])
                    styles[name] = (styles[name][0], g, styles[name][2])
                    styles[o] = (styles[o][0], g, styles[o][2])

    seen: set = set()
    order = [block_list.module_name(n) for n in trace.node_order]
    order += [n for n in nodes if n not in order]
    for name in dict.fromkeys(order):
        if name not in styles:
            continue
        style, degree, region = styles[name]
        split_bytes = 0
        for key, (p, _) in _split_params(nodes[name], style, linears.get(name)).items():
            if key not in seen:
                split_bytes += p.numel() * p.element_size()
        seen |= {id(p) for p in nodes[name].parameters()}
        forward, backward, activations = _STYLE_RULES[style]
        layout[name] = TpNode(style=style, max_degree=degree, split_param_bytes=split_bytes,
                              activation_split=activation_split.get(name, activations),
                              region=region,
                              forward_collective=forward, backward_collective=backward,
                              note=notes.get(name, ""))
    for name, mod in nodes.items():
        if name not in layout and name not in layout.refused and any(
                True for _ in mod.parameters()):
            layout.refused[name] = _why_whole(name, mod, linears)


def _drop(layout: Layout, styles, name: str, why: str) -> None:
    """Leaves `name` whole, with its region if it is in one (a region splits all or nothing)."""
    region = styles[name][2]
    members = [n for n, s in styles.items() if s[2] == region] if region in layout.regions \
        else [name]
    for n in members:
        styles.pop(n, None)
        layout.refused[n] = why if n == name else f"its region's {name} is left whole: {why}"
    layout.regions.pop(region, None)


def _why_whole(name: str, mod: nn.Module, linears: Dict[str, LinearShape]) -> str:
    if name in linears:
        return "a linear layer outside any column-then-row pair of linear layers"
    params = [n for n, _ in mod.named_parameters()]
    shown = ", ".join(params[:4]) + (", ..." if len(params) > 4 else "")
    return f"not a linear layer or embedding (holds {shown})"


# ---- the profiler's graph field --------------------------------------------------------------

# The degrees the profiler times one rank of (those that divide the node's max_degree).
kTimedDegrees = (2, 4, 8)


def timed_degrees(max_degree: int) -> List[int]:
    """The degrees of kTimedDegrees a node of `max_degree` is timed at: those that divide it.
    A plan's tp splits a node only where it divides max_degree (the planner's tp_split_mask);
    at any other degree the node runs whole, so a split time there would describe a split
    that never runs, and the graph refuses it (graph.cc validate_split_times). A vocabulary of
    100 is timed at 2 and 4, a width of 50 at 2 alone."""
    return [d for d in kTimedDegrees if max_degree % d == 0]


def graph_fields(module: nn.Module, nodes: Dict[str, nn.Module],
                 call: Tuple[Tuple[Any, ...], Dict[str, Any]], graph_nodes: Sequence[str],
                 forward_s: Dict[str, float], backward_s: Dict[str, float], clock: str,
                 warmup: int, repeats: int,
                 whole_s: Optional[Dict[str, Tuple[float, float]]] = None
                 ) -> Tuple[Dict[str, Dict[str, Any]], Layout]:
    """({graph node: its "tensor_parallel" object (docs/tensor_parallel.md)}, the layout) for
    the nodes the layout (detect_layout on `nodes` and the example `call`) splits; a node
    module called more than once gets one per call (`graph_nodes`, block_list.call_name).
    `whole_s`: {graph node: (forward, backward) seconds of its time that no split narrows}:
    the loss, which the profiled step charges to the last node and every rank computes whole
    on the gathered output (BigLSTM's head: its split times halved the loss's 4 ms forward
    and 5-11 ms backward with the Linear's ratio).

    Collective bytes are the node's input or output bytes at the profiled batch, per call.
    `split_times` per degree in timed_degrees(max_degree): the node's profiled
    `forward_s`/`backward_s` times the ratio, measured with block_timing.StepTimer (the
    profile's own harness, `clock`; the fastest of its steps), of one rank's time at that
    degree over the whole node's time: for a region, on a copy of its parent whose column-wise
    and row-wise layers are narrowed (so glue charged to a node, such as the attention core
    charged to o_proj, is narrowed with it); for an embedding or head, on the narrowed node. Each run takes
    min(warmup, 2) warm-up and min(repeats, 3) timed steps, so a quick profile stays quick."""
    analysis = _analyse(module, list(nodes), None, call=call)
    layout = analysis.layout
    if not layout:
        return {}, layout
    warmup, repeats = min(warmup, 2), max(1, min(repeats, 3))
    ratios: Dict[str, Dict[int, Tuple[float, float]]] = {}  # node -> degree -> (fwd, bwd)
    for parent, region in layout.regions.items():
        check = analysis.checks[parent]
        degrees = timed_degrees(region.max_degree)
        members = [check.row_name] + list(check.colwise) + list(check.sharded)
        timed = {d: _time_unit(check.narrowed(0, d, as_is=True) if d > 1
                               else copy.deepcopy(check.parent), members, check.call, None,
                               clock, warmup, repeats) for d in [1] + degrees}
        for rel in members:
            ratios[check._full(rel)] = _ratios(timed, rel, degrees)
    for name, tp in layout.items():
        if tp.style not in ("vocab_rowwise", "colwise_gather"):
            continue
        mod, trace_call = nodes[name], analysis.trace.calls[name]
        degrees = timed_degrees(tp.max_degree)
        timed = {}
        for d in [1] + degrees:
            part = copy.deepcopy(mod)
            ids = None
            if d > 1 and tp.style == "vocab_rowwise":
                first, rows = _narrow_embedding(part, 0, d)
                ids = _vocab_ids(tensors_in(trace_call.args)[0], first, rows)[0]
            elif d > 1:
                narrow_linear(part, analysis.linears[name], tp.style, 0, d)
            timed[d] = _time_unit(part, [""], trace_call, ids, clock, warmup, repeats)
        ratios[name] = _ratios(timed, "", degrees)
    return node_fields(layout, graph_nodes, analysis.trace.io_bytes, forward_s, backward_s,
                       ratios, whole_s), layout


def node_fields(layout: Layout, graph_nodes: Sequence[str],
                io_bytes: Dict[str, Tuple[int, int]], forward_s: Dict[str, float],
                backward_s: Dict[str, float], ratios: Dict[str, Dict[int, Tuple[float, float]]],
                whole_s: Optional[Dict[str, Tuple[float, float]]] = None
                ) -> Dict[str, Dict[str, Any]]:
    """{graph node: its "tensor_parallel" object} from a layout, the nodes' (input, output)
    bytes per graph node at the profiled batch (`io_bytes`: the collectives' bytes), their
    times, and {node: {degree: (forward, backward) ratio of one rank's time to the whole's}};
    `whole_s` as graph_fields. One definition for the real profile (graph_fields) and the fake
    one (fake_tensor_parallel), whose ratios come from pricing one rank's shapes."""
    fields: Dict[str, Dict[str, Any]] = {}
    for graph_node in graph_nodes:
        name = block_list.module_name(graph_node)
        if name not in layout:
            continue
        tp = layout[name]
        in_bytes, out_bytes = io_bytes.get(graph_node, (0, 0))
        # a module's later calls ("name@1": ALBERT's one layer at every depth) hold no
        # parameter bytes of their own: the graph charges them to the first call
        field_: Dict[str, Any] = {"style": tp.style, "max_degree": tp.max_degree,
                                  "split_param_bytes": (tp.split_param_bytes
                                                        if graph_node == name else 0),
                                  "activation_split": tp.activation_split}
        for key, collective in (("forward_collective", tp.forward_collective),
                                ("backward_collective", tp.backward_collective)):
            if collective is not None:
                field_[key] = {"op": collective.op,
                               "bytes": int(in_bytes if collective.of == "input" else out_bytes)}
        keep_f, keep_b = (whole_s or {}).get(graph_node, (0.0, 0.0))
        keep_f, keep_b = min(keep_f, forward_s[graph_node]), min(keep_b, backward_s[graph_node])
        # a region node's weight tied to another node's joins their max degrees (_assign),
        # which can leave a degree timed on the region that no longer divides the node's
        split = [{"degree": d, "forward_s": (forward_s[graph_node] - keep_f) * f + keep_f,
                  "backward_s": (backward_s[graph_node] - keep_b) * b + keep_b}
                 for d, (f, b) in sorted(ratios.get(name, {}).items())
                 if d in timed_degrees(tp.max_degree)]
        if split:
            field_["split_times"] = split
        fields[graph_node] = field_
    return fields


def _ratios(timed: Dict[int, Tuple[Dict[str, float], Dict[str, float]]], node: str,
            degrees: Sequence[int]) -> Dict[int, Tuple[float, float]]:
    """{degree: (forward, backward) time at that degree over the time at degree 1} for `node`;
    1.0/degree where the whole node's time measured zero (nothing to scale)."""
    out = {}
    whole_f, whole_b = timed[1][0].get(node, 0.0), timed[1][1].get(node, 0.0)
    for d in degrees:
        f, b = timed[d][0].get(node, 0.0), timed[d][1].get(node, 0.0)
        out[d] = (f / whole_f if whole_f > 0 else 1.0 / d, b / whole_b if whole_b > 0 else 1.0 / d)
    return out


def _time_unit(unit: nn.Module, members: Sequence[str], trace_call: _Call,
               ids: Optional[torch.Tensor], clock: str, warmup: int, repeats: int
               ) -> Tuple[Dict[str, float], Dict[str, float]]:
    """The fastest forward and backward seconds of `members` (names inside `unit`, "" = unit
    itself) over `repeats` steps of block_timing.StepTimer on `unit` and the captured inputs
    (`ids`: the first input replaced, an embedding's rank-local ids). The fastest, not the
    median: with at most 3 steps, interference from other processes only adds time, and a
    ratio of two inflated medians is noise."""
    timer = StepTimer(unit, {m: _submodule(unit, m) for m in members}, clock)
    samples = []
    try:
        for i in range(warmup + repeats):
            # each step on inputs as captured: a cache the forward updates starts as it was
            args, kwargs = _fresh(trace_call.args), _fresh(trace_call.kwargs)
            if ids is not None:
                args = (ids,) + tuple(args[1:])
            step = timer.step(args, kwargs)
            if i >= warmup:
                samples.append(step)
    finally:
        timer.remove()
    return ({m: min(s[0].get(m, 0.0) for s in samples) for m in members},
            {m: min(s[1].get(m, 0.0) for s in samples) for m in members})
