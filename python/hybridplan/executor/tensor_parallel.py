"""Tensor parallelism (docs/tensor_parallel.md "Applied"): splits the graph nodes a plan's `tp`
applies to over each TP group of `tp` ranks with torch's DTensor engine
(torch.distributed.tensor.parallel.parallelize_module).

Which nodes split and how is the profiler's one definition (profiler.tensor_parallel.
detect_layout, called on the module the plan is applied to): each node gets a style,

    colwise         ColwiseParallel: weight split by output features, output left sharded
    rowwise         RowwiseParallel: weight split by input features, output all-reduced
    vocab_rowwise   RowwiseParallel(input_layouts=Replicate()) on an embedding (split by
                    vocabulary; the lookup's partial rows all-reduced)
    colwise_gather  ColwiseParallel(output_layouts=Replicate()): an LM head whose logits are
                    all-gathered
    sharded         nothing to do: a parameter-free node between a colwise and a rowwise node
                    that runs on each rank's slice (an activation, a dropout)

with use_local_output=True, so the rest of the model sees plain tensors: each rank runs the
activations between a colwise and a rowwise node on its slice of the features (its heads), and
every node that no style names runs whole on every rank of the group. A node splits at the
plan's tp only where the planner's rule says so (split_nodes: tp divides its max_degree, a tied
group splitting as one; hybridplan._C.tp_split_mask, the C++ function the cost model uses), so
one odd node (an attention with 2 key-value heads under tp = 4) runs whole instead of ruling
tensor parallelism out.

torch's styles accept only nn.Linear and nn.Embedding modules (their `_apply` checks the class).
Two kinds of modules hold the same computation under another class, and get the subclasses
below, which choose the partition by the weight's layout instead:
  - Hugging Face's Conv1D (GPT-2): a linear layer whose weight is stored (in, out), so
    column-wise shards weight dim 1 (and the bias), row-wise weight dim 0;
  - a pipeline stage's modules: torch.export's InterpreterModule in place of each node module
    (profiler.stage_split), holding the node's parameters under the same names and running its
    operations (aten.linear, aten.embedding, ...). The layout is the original module's.

Compositions (executor.AppliedPlan builds the meshes):
  - placement (mp = 1): a 2-D DeviceMesh (dp, tp) per process; the module is parallelized over
    mesh["tp"], then data parallel over mesh["dp"]: FSDP2 fully_shard for sharded plans
    (torch's documented FSDP + TP composition), else FSDP2's replicate (all-reduce, DDP's
    algorithm). Not DDP: torch's DDP + TP path (DDP(device_mesh=mesh["dp"]), which runs
    tensor.parallel.ddp._pre_dp_module_transform) leaves the module without registered
    parameters after its first forward (named_parameters() and state_dict() come back empty
    in torch 2.13), which state_dict, checkpoints and the optimizer's names depend on.
  - pipeline: each stage module is parallelized over its TP group's mesh before it is wrapped
    in a PipelineStage (its inputs and outputs are plain, replicated tensors), and replicated
    over its stage's DP group likewise. A stage is a graph traced by torch.export, which
    records sizes as literal numbers (Llama's repeat_kv expands to a number of key-value
    heads): each TP rank therefore traces a copy whose column-wise and row-wise nodes already
    hold its shard (narrowed_for_export), so the graph records the sizes that rank runs, and
    the shards are wrapped as DTensors as they are (parallelize(..., local=True)).
  - recompute: applied to the node modules before they are parallelized; the recomputed
    forward runs between the style's input and output hooks, on the same DTensors.

Parameters are DTensors (over the TP mesh, or the 2-D mesh once data parallelism wraps them):
AppliedPlan.state_dict(), save_checkpoint() and the sharded checkpoints gather them whole, so
checkpoints move between TP and non-TP plans.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Dict, Iterable, List, Mapping, Optional

import torch
from torch import nn

from .. import _C
from ..profiler import block_list
from ..profiler.sequence_parallel import SEQUENCE_DIM, detect_sequence_parallel
from ..profiler.tensor_parallel import LinearShape, detect_layout, narrow_linear
from . import sharding

# torch.distributed.tensor, its parallel styles and FSDP's replicate are imported inside the
# functions that apply them: importing them takes seconds (3.4 to 5.3 s measured on this 2-core
# machine under load), which every process that imports the executor would pay, tensor-parallel
# plan or not.

STYLES = ("colwise", "rowwise", "sharded", "vocab_rowwise", "colwise_gather")
# how a split node's module stores its weight (the partition follows it)
LINEAR, EMBEDDING, CONV1D = "linear", "embedding", "conv1d"


def _style_name(node: Any) -> str:
    """The style of a layout entry: detect_layout's TpNode (its `style`) or the style itself."""
    return node if isinstance(node, str) else getattr(node, "style")


class NodeLayout(dict):
    """detect()'s result: {node name: TpNode}, plus `tied_groups`: the lists of those nodes
    that hold one parameter between them (tied weights), which split together or not at all
    (split_nodes)."""

    def __init__(self, nodes: Mapping[str, Any], tied_groups: Iterable[Iterable[str]] = ()):
        super().__init__(nodes)
        self.tied_groups: List[List[str]] = [list(g) for g in tied_groups]


def detect(module: nn.Module, node_names: Optional[Iterable[str]], example_inputs: Any,
           source: str = "plan") -> NodeLayout:
    """The profiler's layout of `module` (profiler.tensor_parallel.detect_layout, the one
    definition of which nodes split and how): node name -> its TpNode (style, max_degree, ...),
    with the groups of those nodes that share a parameter. `node_names`: the plan's nodes
    ("name@k" calls count as their module); `example_inputs`: one batch, on which detect_layout
    checks each split by running it. The random number generators are left as they were (the
    check draws random inputs)."""
    if example_inputs is None:
        raise ValueError(f"{source}: a plan with tp > 1 needs apply(..., example_inputs=) (one "
                         f"replica batch): the split of each node is checked by running it "
                         f"(profiler.tensor_parallel.detect_layout)")
    names = None
    if node_names is not None:
        wanted = {block_list.module_name(n) for n in node_names}
        names = [n for n in block_list.select_nodes(module) if n in wanted]
    with torch.random.fork_rng(devices=[]):
        layout = dict(detect_layout(module, names, example_inputs=example_inputs))
    holders: Dict[int, List[str]] = {}
    for name in layout:
        for param in module.get_submodule(block_list.module_name(name)).parameters():
            holders.setdefault(id(param), []).append(name)
    return NodeLayout(layout, [h for h in holders.values() if len(h) > 1])


def split_nodes(layout: Mapping[str, Any], tp: int) -> List[str]:
    """The nodes of `layout` that split at degree `tp`, in its order: the planner's one rule
    (hybridplan._C.tp_split_mask, csrc/planner/costs/tensor_parallel_cost.h; docs/tensor_parallel.md
    "In the plan"): `tp` divides the node's max_degree, and a tied group (NodeLayout.
    tied_groups) splits only where all its nodes do. The others run whole on every rank of the
    TP group. An entry without a max_degree (a style alone) splits at any degree."""
    names = list(layout)
    index = {name: i for i, name in enumerate(names)}
    degrees = [int(getattr(layout[name], "max_degree", tp)) for name in names]
    tied = [[index[n] for n in group if n in index]
            for group in getattr(layout, "tied_groups", ())]
    mask = _C.tp_split_mask(degrees, [g for g in tied if len(g) > 1], int(tp))
    return [name for name, splits in zip(names, mask) if splits]


def check_layout(layout: Mapping[str, Any], tp: int, source: str) -> Dict[str, str]:
    """node -> style of the nodes that split at `tp` (split_nodes; the others run whole),
    checked: known styles, and at least one node split. ValueError naming the plan and the
    node."""
    for name, node in layout.items():
        style = _style_name(node)
        if style not in STYLES:
            raise ValueError(f"{source}: tensor_parallel.style of node {name!r} must be one of "
                             f"{STYLES} (got {style!r})")
    styles = {name: _style_name(layout[name]) for name in split_nodes(layout, tp)}
    if not styles:
        degrees = sorted({int(getattr(node, "max_degree", 0)) for node in layout.values()})
        raise ValueError(f"{source}: tp={tp} must divide the max_degree of a node that tensor "
                         f"parallelism splits, so that one splits (the module's: "
                         f"{degrees or 'none'}; profiler.tensor_parallel.detect_layout)")
    return styles


def weight_kind(module: nn.Module, name: str = "") -> str:
    """How `module` stores its weight: nn.Linear (out, in), nn.Embedding (vocab, dim) or Hugging
    Face's Conv1D (in, out). ValueError for any other module (no style splits it)."""
    if isinstance(module, nn.Linear):
        return LINEAR
    if isinstance(module, nn.Embedding):
        return EMBEDDING
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # no transformers: no Conv1D either
        Conv1D = ()
    if Conv1D and isinstance(module, Conv1D):
        return CONV1D
    raise ValueError(f"tensor parallelism splits nn.Linear, nn.Embedding and Hugging Face "
                     f"Conv1D modules: node {name!r} is a {type(module).__name__}")


def weight_kinds(module: nn.Module, styles: Mapping[str, str]) -> Dict[str, str]:
    """node module name -> weight_kind, for every node whose style splits it."""
    kinds: Dict[str, str] = {}
    for node, style in styles.items():
        if style == "sharded":
            continue
        name = block_list.module_name(node)
        kinds[name] = weight_kind(module.get_submodule(name), name)
    return kinds


def _distribute_params(module: nn.Module, mesh: Any, placements: Dict[str, Any],
                       src_data_rank: Optional[int], local: bool = False) -> None:
    """Replaces each parameter `name` of `module` by a DTensor parameter laid out as
    placements[name] over `mesh`. `local`: the module's parameters are already this rank's
    shards (narrowed_for_export), wrapped as they are with the whole tensor's shape."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    for name, param in list(module.named_parameters(recurse=False)):
        placement = placements[name]
        if local:
            shape = list(param.shape)
            if isinstance(placement, Shard):
                shape[placement.dim] *= mesh.size()
            stride = [1] * len(shape)
            for i in range(len(shape) - 2, -1, -1):
                stride[i] = stride[i + 1] * shape[i + 1]
            value = DTensor.from_local(param.detach(), mesh, [placement], run_check=False,
                                       shape=torch.Size(shape), stride=tuple(stride))
        else:
            value = distribute_tensor(param, mesh, [placement], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(value, requires_grad=param.requires_grad))


@functools.lru_cache(maxsize=None)
def _style_classes():
    """ColwiseParallel and RowwiseParallel that partition by a weight kind rather than by the
    module's class (see the module doc); everything else (input and output layouts, hooks) is
    torch's."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torch.distributed.tensor.parallel.style import distribute_module

    # weight kind -> (weight placement, bias placement) of each split
    colwise = {LINEAR: (Shard(0), Shard(0)), EMBEDDING: (Shard(1), None),
               CONV1D: (Shard(1), Shard(0))}
    rowwise = {LINEAR: (Shard(1), Replicate()), EMBEDDING: (Shard(0), None),
               CONV1D: (Shard(0), Replicate())}

    def apply(style, table, module, mesh):
        weight, bias = table[style.kind]
        placements = {"weight": weight, "bias": bias}
        return distribute_module(
            module, mesh,
            lambda _name, mod, m: _distribute_params(mod, m, placements, style.src_data_rank,
                                                     style.local),
            functools.partial(style._prepare_input_fn, style.input_layouts,
                              style.desired_input_layouts),
            functools.partial(style._prepare_output_fn, style.output_layouts,
                              style.use_local_output))

    class ColwiseByKind(ColwiseParallel):
        def __init__(self, kind: str, local: bool = False, **kwargs: Any):
            super().__init__(**kwargs)
            self.kind, self.local = kind, local

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return apply(self, colwise, module, device_mesh)

    class RowwiseByKind(RowwiseParallel):
        def __init__(self, kind: str, local: bool = False, **kwargs: Any):
            super().__init__(**kwargs)
            self.kind, self.local = kind, local
            # torch sets these in _apply by the module's class: a linear layer's input arrives
            # sharded on its last dimension, an embedding's indices whole
            self.desired_input_layouts = (Replicate(),) if kind == EMBEDDING else (Shard(-1),)

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return apply(self, rowwise, module, device_mesh)

    return ColwiseByKind, RowwiseByKind


def parallel_style(style: str, kind: str, sequence: str = "", local: bool = False) -> Any:
    """The torch ParallelStyle of a layout style for a module of weight kind `kind` (None for
    "sharded": nothing to split). `sequence` (sequence parallelism, sequence_parallelize):
    "gather" for a column-wise node that all-gathers its input over the sequence itself,
    "scatter" for a row-wise node that reduce-scatters its output over the sequence. `local`:
    a column-wise or row-wise module that already holds this rank's shard
    (narrowed_for_export)."""
    from torch.distributed.tensor import Replicate, Shard

    if style == "sharded":
        return None
    colwise, rowwise = _style_classes()
    if style == "colwise":
        if sequence == "gather":
            return colwise(kind, local, input_layouts=Shard(SEQUENCE_DIM),
                           use_local_output=True)
        return colwise(kind, local, use_local_output=True)
    if style == "colwise_gather":
        return colwise(kind, output_layouts=Replicate(), use_local_output=True)
    if style == "rowwise":
        if sequence == "scatter":
            return rowwise(kind, local, output_layouts=Shard(SEQUENCE_DIM),
                           use_local_output=True)
        return rowwise(kind, local, use_local_output=True)
    if style == "vocab_rowwise":
        return rowwise(kind, input_layouts=Replicate(), use_local_output=True)
    raise ValueError(f"tensor_parallel.style must be one of {STYLES} (got {style!r})")


def parallelize(module: nn.Module, styles: Mapping[str, str], kinds: Mapping[str, str],
                tp_mesh: Any, module_name_of=None, sequence: Any = None,
                local: bool = False) -> List[str]:
    """Splits the nodes of `module` that `styles` names over `tp_mesh` (1-D); returns the
    qualified names of the submodules split. `kinds`: node module name -> weight_kind (from the
    original module). `module_name_of(qualified name)` -> the node module name a submodule of
    `module` stands for (a pipeline stage's "part.module.enc0" -> "enc0", stage_split's
    original_name; default: the name itself); a node absent from `module` (on another stage) is
    skipped. Parameters tied across split modules stay tied: each module registers its own
    DTensor, so the copies are made one again (ValueError where the split lays them out
    differently, or splits one copy and not another). `sequence`: the SpLayout of sequence
    parallelism (detect_sequence), applied with the split (sequence_parallelize). `local`: the
    column-wise and row-wise modules hold this rank's shards already (a pipeline stage cut
    from narrowed_for_export's copy)."""
    from torch.distributed.tensor.parallel import parallelize_module

    module_name_of = module_name_of or (lambda qualified: qualified)
    by_module: Dict[str, str] = {}
    for node, style in styles.items():
        name = block_list.module_name(node)
        if by_module.setdefault(name, style) != style:
            raise ValueError(f"tensor parallelism: the calls of module {name!r} must share one "
                             f"style (got {by_module[name]!r} and {style!r})")
    plan: Dict[str, Any] = {}
    for qualified, sub in module.named_modules():
        name = module_name_of(qualified)
        style = by_module.get(name)
        if qualified and style is not None and style != "sharded" \
                and any(True for _ in sub.parameters(recurse=False)):
            # (a pipeline stage keeps an empty module where a node's parameters moved away)
            plan[qualified] = parallel_style(style, kinds[name],
                                             _sequence_role(sequence, name, style),
                                             local and _narrowed_in_export(style,
                                                                           kinds[name]))
    # every tensor registered under several (module, attribute) names, before the split
    tied: Dict[int, List[tuple]] = {}
    for qualified, sub in module.named_modules(remove_duplicate=False):
        for attr, param in sub._parameters.items():
            if param is not None:
                tied.setdefault(id(param), []).append((qualified, attr))
    if plan:
        parallelize_module(module, tp_mesh, plan)
    if sequence is not None:
        sequence_parallelize(module, sequence, tp_mesh)
    for holders in (h for h in tied.values() if len(h) > 1):
        _retie(module, holders)
    return list(plan)


def narrowed_for_export(module: nn.Module, styles: Mapping[str, str], rank: int,
                        tp: int) -> nn.Module:
    """A copy of `module` whose column-wise and row-wise nodes (of `styles`, those that split)
    hold TP rank `rank`'s shard at degree `tp`, for torch.export to trace a pipeline stage at
    the shapes that rank runs (_narrowed_in_export says which nodes): the operations between a
    column-wise and a row-wise node then record the rank's sizes (Llama's repeat_kv expands to a literal number of key-value
    heads, which at the whole model's shapes would not match a rank's heads). The narrowing is
    the split check's (profiler.tensor_parallel.narrow_linear: weights, biases and the
    in/out feature attributes); row-wise biases stay whole (RowwiseParallel keeps them
    replicated). parallelize(..., local=True) then wraps the shards as DTensors. Only
    nn.Linear nodes are narrowed, so each one's shape is read from its weight, (out, in),
    without running it: a model built on the meta device has no values to test it on."""
    shapes = {}
    for node, style in styles.items():
        name = block_list.module_name(node)
        if (style in ("colwise", "rowwise") and name not in shapes
                and _narrowed_in_export(style, weight_kind(module.get_submodule(name), name))):
            rows, cols = module.get_submodule(name).weight.shape
            shapes[name] = (LinearShape(cols, rows, True), style)
    copy_ = copy.deepcopy(module)
    for name, (shape, style) in shapes.items():
        narrow_linear(copy_.get_submodule(name), shape, style, rank, tp)
    return copy_


def _narrowed_in_export(style: str, kind: str) -> bool:
    """Whether narrowed_for_export narrows a node of `style` and weight kind `kind`: the
    column-wise and row-wise nn.Linear nodes. Not Hugging Face's Conv1D: its forward views its
    output to its `nf` attribute, a literal in the traced graph, and a split module's forward
    runs on DTensors of the whole shapes (GPT-2's MLP then stays traced whole, as its glue
    fixes no size)."""
    return style in ("colwise", "rowwise") and kind == LINEAR


def _sequence_role(sequence: Any, name: str, style: str) -> str:
    """parallel_style's `sequence` for node `name` under SpLayout `sequence` (or None)."""
    if sequence is None or name not in sequence.roles:
        return ""
    if style == "rowwise":
        return "scatter"
    if style == "colwise" and name not in sequence.gather_at:
        return "gather"
    return ""


def detect_sequence(module: nn.Module, layout: Mapping[str, Any], tp: int,
                    node_names: Optional[Iterable[str]], example_inputs: Any,
                    source: str = "plan") -> Any:
    """The SpLayout of sequence parallelism on `module` at degree `tp` (profiler.
    sequence_parallel.detect_sequence_parallel, the one definition, checked at `tp` on
    `example_inputs`), for a plan with "sequence_parallel": the nodes of `layout` that split at
    `tp` (split_nodes). ValueError naming the plan and why where it does not apply."""
    split = {n: layout[n] for n in split_nodes(layout, tp)}
    # (its runs leave the random number generators as they were)
    sp = detect_sequence_parallel(module, split, example_inputs=example_inputs, degree=tp,
                                  node_names=node_names)
    if sp.refused:
        raise ValueError(f"{source}: sequence_parallel does not apply to "
                         f"{type(module).__name__} at tp={tp}: {sp.refused} "
                         f"(profiler.sequence_parallel)")
    return sp


def sequence_parallelize(module: nn.Module, sequence: Any, tp_mesh: Any) -> None:
    """Sequence parallelism (profiler.sequence_parallel's module doc) on a module whose split
    nodes parallelize() has styled with `sequence` (row-wise outputs reduce-scattered over the
    sequence, column-wise inputs all-gathered), with torch's styles: the first block's hidden
    states cut to this rank's chunk of the sequence (PrepareModuleInput, Replicate -> Shard:
    nothing moves forward, the gradient is all-gathered), the last block's output all-gathered
    (PrepareModuleOutput), the inputs of region parents and gather nodes all-gathered and the
    gather nodes' outputs chunked again, and the per-token nodes that hold parameters
    SequenceParallel (their parameters replicated DTensors, whose gradients DTensor sums over
    the TP group). Parameter-free per-token nodes just run on the local chunk."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (PrepareModuleInput, PrepareModuleOutput,
                                                   SequenceParallel, parallelize_module)

    seq, whole = Shard(SEQUENCE_DIM), Replicate()

    def inputs(where, src, dst):
        return PrepareModuleInput(
            input_layouts=tuple(src if i in where.positions else None
                                for i in range(where.count)),
            desired_input_layouts=tuple(dst if i in where.positions else None
                                        for i in range(where.count)),
            input_kwarg_layouts={k: src for k in where.keywords} if where.keywords else None,
            desired_input_kwarg_layouts={k: dst for k in where.keywords} or None,
            use_local_output=True)

    def outputs(where, src, dst):
        if where.whole:
            return PrepareModuleOutput(output_layouts=src, desired_output_layouts=dst,
                                       use_local_output=True)
        return PrepareModuleOutput(
            output_layouts=tuple(src if i in where.positions else None
                                 for i in range(where.count)),
            desired_output_layouts=tuple(dst if i in where.positions else None
                                         for i in range(where.count)),
            use_local_output=True)

    def apply(name, style):
        parallelize_module(module.get_submodule(name), tp_mesh, style)

    for name, where in sequence.inputs.items():
        if sequence.roles.get(name) == "colwise":
            continue  # its ColwiseParallel gathers (parallel_style)
        apply(name, inputs(where, seq, whole))  # region parents and gather nodes
    for name, where in sequence.outputs.items():
        apply(name, outputs(where, whole, seq))
    for name, role in sequence.roles.items():
        if role == "per_token" and any(True for _ in
                                       module.get_submodule(name).parameters(recurse=False)):
            apply(name, SequenceParallel(sequence_dim=SEQUENCE_DIM, use_local_output=True))
    apply(sequence.blocks[0], inputs(sequence.entry, whole, seq))
    apply(sequence.blocks[-1], outputs(sequence.exit, seq, whole))


def _retie(module: nn.Module, holders: List[tuple]) -> None:
    """Makes every (module, attribute) in `holders` hold the first one's parameter again."""
    from torch.distributed.tensor import DTensor

    owner, attr = holders[0]
    first = module.get_submodule(owner)._parameters[attr]
    for name, other_attr in holders[1:]:
        sub = module.get_submodule(name)
        other = sub._parameters[other_attr]
        if other is first:
            continue
        same = (isinstance(other, DTensor) == isinstance(first, DTensor)
                and other.shape == first.shape
                and (not isinstance(first, DTensor) or other.placements == first.placements))
        if not same:
            raise ValueError(
                f"tensor parallelism: tied parameters {owner}.{attr} and {name}.{other_attr} "
                f"must be split alike (got {_layout(first)} and {_layout(other)})")
        sub._parameters[other_attr] = first


def _layout(param: torch.Tensor) -> str:
    placements = getattr(param, "placements", None)
    return f"{list(param.shape)} {list(placements)}" if placements is not None else \
        f"{list(param.shape)} whole"


def dp_dim(mesh: Any) -> Any:
    """A (dp, tp) mesh's data-parallel dimension (a 1-D mesh; layout.Mesh.dp_tp)."""
    return mesh[mesh.mesh_dim_names[0]]


def tp_dim(mesh: Any) -> Any:
    """A (dp, tp) mesh's tensor-parallel dimension (a 1-D mesh)."""
    return mesh[mesh.mesh_dim_names[1]]


def replicate(module: nn.Module, mesh: Any) -> nn.Module:
    """Data parallelism without sharding over `mesh["dp"]` for a module whose parameters are
    split over `mesh["tp"]`: FSDP2's replicate (parameters kept whole per replica, gradients
    all-reduced and averaged over the replicas; see the module doc for why not DDP)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate as fsdp_replicate

    return fsdp_replicate(module, mesh=dp_dim(mesh))


def replicate_placement(module: nn.Module, nodes: Iterable[str], mesh: Any) -> List[str]:
    """replicate() over a placement replica in the units FSDP2 would shard it in
    (sharding.node_units, then the root): each unit's gradients are all-reduced as soon as its
    backward is done, overlapping the backward that remains, as DDP's buckets do. Returns the
    node units' names."""
    units = sharding.node_units(module, nodes)
    for name in units:
        replicate(module.get_submodule(name), mesh)
    replicate(module, mesh)
    return units
