"""Sequence parallelism (docs/tensor_parallel.md "Sequence parallelism"; Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 2022): under tensor
parallelism the nodes between the split regions (layer norms, dropout, the residual adds)
otherwise run whole on every rank of the TP group, on the same tokens. With sequence
parallelism each rank runs them on its 1/t of the sequence: a column-wise layer all-gathers
the sequence before it, a row-wise layer reduce-scatters its output over the sequence instead
of all-reducing it, and the activations those nodes keep divide by t. One definition, used by
the profiler (graph field "sequence_parallel") and the executor (which applies it):

    sp = detect_sequence_parallel(model, layout, example_inputs=batch, degree=2)
    sp.roles["model.layers.0.input_layernorm"]      # "per_token"
    sp.refused                                      # why it does not apply, or ""

Decided from the module's structure and a check, never from class names:

1. The region: the blocks are consecutive children of one nn.ModuleList / nn.Sequential
   (the container holding the most children with split column-wise or row-wise nodes), from
   its first such child to its last. The sequence is split along dimension 1 of the
   activations entering the first block (its inputs shaped like its output: the hidden
   states), whose size is the graph's max_degree (a plan's tp must divide it). Before the
   first block and after the last nothing changes (embeddings, the final norm and the LM head
   see the whole sequence: the first block's input is chunked, which moves nothing forward,
   and the last block's output all-gathered).
2. Each node of the region gets a role:
       colwise    a split column-wise node: its input is all-gathered over the sequence
       rowwise    a split row-wise node: its output is reduce-scattered over the sequence
       per_token  a node that computes each token from that token alone (norms, dropout,
                  linear layers left whole): runs on the rank's tokens; parameters it holds
                  stay whole on every rank (torch's SequenceParallel style), their gradients
                  summed over the TP group
       gather     any other node (an attention left whole, nn.MultiheadAttention): its
                  sequence inputs are all-gathered, it runs whole, its sequence outputs are
                  chunked again
   and the nodes between a column-wise and a row-wise node (style "sharded") run on the
   rank's features of the whole sequence, as without sequence parallelism.
3. The check, by simulation on this one process at `degree`: the module runs once whole
   (the reference) and once per rank r with the first block's hidden states cut to the r-th
   chunk of the sequence. Every node's inputs must then be either the reference's (not split)
   or the r-th chunk of the reference's (split by sequence); a column-wise or gather node gets
   the reference's whole inputs (what the all-gather returns), a row-wise or gather node's
   output is replaced by the r-th chunk of the reference's (what the reduce-scatter returns),
   and a node whose output on the chunk is the chunk of its reference output is per-token. The
   last block's output must be the r-th chunk of the reference's, and the module's output the
   reference's. Code between the nodes that needs the whole sequence (GPT-2's attention core
   between its whole c_attn and c_proj, a mask built from the hidden states' length) shows up
   as a node input that is neither: sequence parallelism is refused, with the node named.

A model without values (a fake profile at size) is checked on a miniature of it, and at_shapes
takes what depends on size (the sequence length, the collectives' bytes, saved_share) from one
forward of the model itself under fake tensors (fake_tensor_parallel.sequence_fields).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import block_list
from .dataflow import storage_key, tensors_in
from .tensor_parallel import (Layout, _call_of, _close, _detached, _eval_with_grad,
                              _first_line, _float_inputs, _float_view, _fresh, _nbytes, _Refused)

SEQUENCE_DIM = 1
ROLES = ("colwise", "rowwise", "per_token", "gather")


@dataclass
class Where:
    """Which top-level inputs (positions, keyword names) or outputs (positions of a tuple
    output; () with `whole` for a tensor output) of a module hold the sequence."""
    positions: Tuple[int, ...] = ()
    keywords: Tuple[str, ...] = ()
    count: int = 0  # positional inputs / outputs the call had (torch's layouts match them)
    whole: bool = False  # a single tensor output (not a tuple)


@dataclass
class SpLayout:
    """detect_sequence_parallel's result (see the module doc). `refused` non-empty: sequence
    parallelism does not apply, and says why; the other fields are then empty."""
    degree: int = 0                          # the degree the check ran at
    max_degree: int = 0                      # the sequence length: tp must divide it
    container: str = ""
    blocks: List[str] = field(default_factory=list)
    entry: Where = field(default_factory=Where)   # the first block's inputs chunked
    exit: Where = field(default_factory=Where)    # the last block's outputs gathered
    roles: Dict[str, str] = field(default_factory=dict)        # node module -> role
    inputs: Dict[str, Where] = field(default_factory=dict)     # gather/colwise node -> inputs
    outputs: Dict[str, Where] = field(default_factory=dict)    # gather node -> outputs
    # node -> (bytes of each sequence input, of each sequence output): the executor moves each
    # tensor in a collective of its own
    io_bytes: Dict[str, Tuple[List[int], List[int]]] = field(default_factory=dict)
    # column-wise node -> the region parent whose inputs are all-gathered for it (absent: the
    # node's own input is); `inputs` holds those parents' sequence inputs too
    gather_at: Dict[str, str] = field(default_factory=dict)
    entry_bytes: int = 0
    exit_bytes: int = 0
    # gather node -> its saved bytes with its sequence inputs gathered apart / as one process
    # passes them (_saved_share)
    saved_share: Dict[str, float] = field(default_factory=dict)
    # every region node's and region parent's sequence inputs as the check found them (`inputs`
    # holds those the executor gathers): what io_bytes measures
    sequence_inputs: Dict[str, Where] = field(default_factory=dict)
    refused: str = ""


def detect_sequence_parallel(module: nn.Module, layout: Layout, example_inputs: Any = None,
                             degree: int = 2, node_names: Optional[Sequence[str]] = None,
                             call: Optional[Tuple[Tuple[Any, ...], Dict[str, Any]]] = None
                             ) -> SpLayout:
    """Where sequence parallelism applies in `module` whose tensor-parallel layout (at the
    plan's degree: only the nodes that split) is `layout`, checked at `degree` (module doc).
    `example_inputs` (or `call`, (args, kwargs)): one batch. Never raises for a module it does
    not apply to: SpLayout.refused says why."""
    args, kwargs = call if call is not None else _call_of(example_inputs)
    nodes = block_list.select_nodes(module)
    if node_names is not None:
        wanted = {block_list.module_name(n) for n in node_names}
        nodes = {n: m for n, m in nodes.items() if n in wanted}
    try:
        return _detect(module, layout, nodes, args, kwargs, degree)
    except _Refused as why:
        return SpLayout(degree=degree, refused=str(why))


def _blocks(module: nn.Module, layout: Layout) -> Tuple[str, List[str]]:
    split = [n for n, tp in layout.items()
             if getattr(tp, "style", tp) in ("colwise", "rowwise")]
    if not split:
        raise _Refused("no node splits column-wise or row-wise: nothing to split the sequence "
                       "between")
    best: Tuple[int, str, List[str]] = (0, "", [])
    for name, mod in module.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        children = [f"{name}.{c}" if name else c for c, _ in mod.named_children()]
        holding = [i for i, c in enumerate(children)
                   if any(n == c or n.startswith(c + ".") for n in split)]
        if len(holding) > best[0]:
            best = (len(holding), name, children[holding[0]:holding[-1] + 1])
    if not best[0]:
        raise _Refused("the split nodes are not inside the children of an nn.ModuleList or "
                       "nn.Sequential (the repeated blocks sequence parallelism runs between)")
    outside = [n for n in split if not any(n == b or n.startswith(b + ".") for b in best[2])]
    if outside:
        raise _Refused(f"split nodes outside the blocks of {best[1] or 'the root'}: "
                       f"{', '.join(outside[:3])}")
    return best[1], best[2]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to rounding, or exactly (masks hold infinities, which _close cannot compare)."""
    return torch.equal(a, b) or _close(a, b)


def _chunk(t: torch.Tensor, rank: int, degree: int) -> torch.Tensor:
    return t.chunk(degree, dim=SEQUENCE_DIM)[rank]


def _top_level(args: Tuple[Any, ...], kwargs: Dict[str, Any]):
    """(("pos", i) or ("kw", name), tensor) for the top-level tensor inputs of a call."""
    out = [(("pos", i), a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out += [(("kw", k), v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return out


def _outputs(value: Any) -> List[Tuple[int, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(-1, value)]
    if isinstance(value, tuple):
        return [(i, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return []


def _replace_outputs(value: Any, new: Dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return new.get(-1, value)
    if isinstance(value, tuple):
        return tuple(new.get(i, v) for i, v in enumerate(value))
    return value


def _is_sequence(ref: torch.Tensor, length: int) -> bool:
    return ref.dim() > SEQUENCE_DIM and ref.shape[SEQUENCE_DIM] == length


def _detect(module, layout, nodes, args, kwargs, degree) -> SpLayout:
    container, blocks = _blocks(module, layout)
    in_blocks = {n: m for n, m in nodes.items()
                 if any(n.startswith(b + ".") for b in blocks)}
    styles = {n: getattr(tp, "style", tp) for n, tp in layout.items()}
    view = _float_view(module)
    original_args, original_kwargs = args, kwargs
    args, kwargs = _float_inputs(_fresh(args), view), _float_inputs(_fresh(kwargs), view)
    first, last = view.get_submodule(blocks[0]), view.get_submodule(blocks[-1])
    members = {n: view.get_submodule(n) for n in in_blocks}
    ref_parents = {getattr(tp, "region", "") for n, tp in layout.items()
                   if styles[n] in ("colwise", "rowwise")}
    ref_parents = {p for p in ref_parents if p and p not in members
                   and any(p.startswith(b + ".") for b in blocks)}
    members.update({p: view.get_submodule(p) for p in sorted(ref_parents)})

    # the reference: every region node's first call, the first block's inputs, the last
    # block's output
    ref, calls, block_io, reference = _reference(view, members, first, last, args, kwargs)
    ref_parents = {p for p in ref_parents if p in ref}
    twice = [n for n, c in calls.items() if c > 1]
    if twice:
        raise _Refused(f"node {twice[0]} runs more than once in a forward (a module used "
                       "again across blocks): its calls would need several layouts")
    if "in" not in block_io or "out" not in block_io:
        raise _Refused(f"block {blocks[0]} or {blocks[-1]} does not run in the forward")
    out_tensors = _outputs(block_io["out"])
    if not out_tensors:
        raise _Refused(f"block {blocks[-1]} returns no tensor")
    hidden = out_tensors[0][1]
    if hidden.dim() <= SEQUENCE_DIM:
        raise _Refused(f"block {blocks[-1]}'s output has no sequence dimension "
                       f"{SEQUENCE_DIM} (shape {list(hidden.shape)})")
    length = _length(hidden, degree)
    entry_args = [(key, t) for key, t in _top_level(*block_io["in"])
                  if tuple(t.shape) == tuple(hidden.shape) and t.is_floating_point()]
    if not entry_args:
        raise _Refused(f"block {blocks[0]} takes no input shaped like its hidden states "
                       f"{list(hidden.shape)}")
    exits = [i for i, t in _outputs(block_io["out"]) if tuple(t.shape) == tuple(hidden.shape)]
    result = SpLayout(degree=degree, max_degree=length, container=container, blocks=blocks)
    result.entry = Where(tuple(k[1] for k, _ in entry_args if k[0] == "pos"),
                         tuple(k[1] for k, _ in entry_args if k[0] == "kw"),
                         len(block_io["in"][0]))
    result.exit = Where(tuple(i for i in exits if i >= 0), (),
                        len(block_io["out"]) if isinstance(block_io["out"], tuple) else 1,
                        whole=isinstance(block_io["out"], torch.Tensor))

    ran = [n for n in members if n in ref]
    roles: Dict[str, str] = {}
    for n in ran:
        style = styles.get(n)
        if style in ("colwise", "rowwise"):
            roles[n] = style
        elif style is None:
            roles[n] = "per_token"  # until a rank shows otherwise
    # where a split region gathers the sequence: at its parent's inputs where the parent is
    # inside a block (the glue between its column-wise and row-wise nodes reads the shapes of
    # the parent's input: LlamaAttention's view into heads), else at each column-wise node
    for n in ran:
        parent = getattr(layout[n], "region", "") if roles.get(n) == "colwise" else ""
        if parent in ref_parents:
            result.gather_at[n] = parent
            roles[parent] = "region"
    seq_in: Dict[str, Where] = {}

    for rank in range(degree):
        _simulate(view, members, ref, roles, seq_in, result, first, last, block_io,
                  entry_args, reference, args, kwargs, rank, degree, length)

    result.roles = {n: roles[n] for n in ran if roles.get(n) in ROLES and n in nodes}
    for parent in sorted(ref_parents):
        result.inputs[parent] = seq_in.get(parent, Where())
    for n, role in result.roles.items():
        _, _, out = ref[n]
        if role in ("colwise", "gather"):
            result.inputs[n] = seq_in.get(n, Where())
        if role == "gather":
            seq_outs = [i for i, t in _outputs(out) if _is_sequence(t, length)]
            result.outputs[n] = Where(tuple(i for i in seq_outs if i >= 0), (),
                                      len(out) if isinstance(out, tuple) else 1,
                                      whole=isinstance(out, torch.Tensor))
    result.sequence_inputs = {n: seq_in.get(n, Where()) for n in
                              list(result.roles) + sorted(ref_parents)}
    if view is not module:
        # the collectives move the module's own dtype, not the float32 view's: sized from a
        # forward of the module itself
        members = {n: module.get_submodule(n) for n in members}
        ref, _, block_io, _ = _reference(
            module, members, module.get_submodule(blocks[0]),
            module.get_submodule(blocks[-1]), original_args, original_kwargs)
    _sizes(result, members, ref, block_io)
    return result


def _reference(module: nn.Module, members: Dict[str, nn.Module], first: nn.Module,
               last: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
    """One forward of `module` (eval mode, autograd on): (each member's first call as (args,
    kwargs, output), detached; the number of calls of each member; the first block's inputs
    "in" and the last block's output "out"; the module's output)."""
    ref: Dict[str, Tuple[Tuple[Any, ...], Dict[str, Any], Any]] = {}
    calls: Dict[str, int] = {}
    block_io: Dict[str, Any] = {}

    def record(name):
        def hook(mod, a, kw, out):
            calls[name] = calls.get(name, 0) + 1
            if name not in ref:
                ref[name] = (_detached(a), _detached(kw), _detached(out))
        return hook

    handles = [m.register_forward_hook(record(n), with_kwargs=True) for n, m in members.items()]
    handles.append(first.register_forward_pre_hook(
        lambda m, a, kw: block_io.setdefault("in", (_detached(a), _detached(kw))),
        with_kwargs=True))
    handles.append(last.register_forward_hook(
        lambda m, a, out: block_io.setdefault("out", _detached(out))))
    try:
        with torch.random.fork_rng(devices=[]), _eval_with_grad(module):
            output = module(*_fresh(args), **_fresh(kwargs))
    finally:
        for h in handles:
            h.remove()
    return ref, calls, block_io, output


def _length(hidden: torch.Tensor, degree: int) -> int:
    """The sequence length of the hidden states; refused where `degree` does not divide it."""
    length = int(hidden.shape[SEQUENCE_DIM])
    if length % degree:
        raise _Refused(f"the sequence length {length} (dimension {SEQUENCE_DIM} of the hidden "
                       f"states) is not divisible by {degree}")
    return length


def _sizes(sp: SpLayout, members: Dict[str, nn.Module], ref, block_io) -> None:
    """What in `sp` depends on the size of the model and batch, from one forward's records
    (_reference; `members` the modules they were taken on): max_degree (the sequence length),
    the bytes of each node's sequence inputs and outputs, of the entry and the exit, and each
    gather node's saved_share. A detection sets them from its own forward; at_shapes from the
    full model's."""
    out_tensors = _outputs(block_io["out"])
    length = int(out_tensors[0][1].shape[SEQUENCE_DIM])
    sp.max_degree = length
    sp.entry_bytes = sum(_seq_bytes(*block_io["in"], sp.entry))
    sp.exit_bytes = sum(_nbytes(t) for i, t in out_tensors
                        if (i == -1 and sp.exit.whole) or (i >= 0 and i in sp.exit.positions))
    sp.io_bytes = {}
    for n, where in sp.sequence_inputs.items():  # region nodes and parents (no outputs)
        a, kw, out = ref[n]
        sp.io_bytes[n] = (_seq_bytes(a, kw, where),
                          [_nbytes(t) for _, t in _outputs(out) if _is_sequence(t, length)]
                          if n in sp.roles else [])
        if sp.roles.get(n) == "gather":
            sp.saved_share[n] = _saved_share(members[n], a, kw, where)


def at_shapes(sp: SpLayout, module: nn.Module, call: Tuple[Tuple[Any, ...], Dict[str, Any]],
              run: Callable[[nn.Module], ContextManager[Any]] = lambda m: nullcontext()
              ) -> SpLayout:
    """`sp`, detected on a miniature of `module` (the same structure and node names at
    narrower widths and a shorter sequence, with values), with what depends on size taken from
    one forward of `module` itself on `call` ((args, kwargs)) under `run(module)` (a fake
    profile's fake mode: shapes, no values): the sequence length (max_degree), the bytes of
    the collectives, each gather node's saved_share (_sizes). The roles, where the sequence
    enters and leaves and which inputs are the sequence's are the miniature's. Refused (a new
    SpLayout saying why) where `sp` is, where `sp.degree` does not divide the model's sequence
    length, where a node of the miniature's region does not run in the model's forward, or
    where the first block takes no input shaped like the hidden states."""
    if sp.refused:
        return sp
    try:
        out = copy.deepcopy(sp)
        names = list(sp.sequence_inputs)
        members = {n: module.get_submodule(n) for n in names}
        with run(module):
            ref, _, block_io, _ = _reference(
                module, members, module.get_submodule(sp.blocks[0]),
                module.get_submodule(sp.blocks[-1]), *call)
            missing = [n for n in names if n not in ref]
            if missing or "in" not in block_io or "out" not in block_io:
                raise _Refused(f"nodes of the miniature's sequence-parallel region do not run in "
                               f"the model's forward: {(missing or sp.blocks)[:3]}")
            hidden = _outputs(block_io["out"])[0][1]
            _length(hidden, sp.degree)
            entry = _seq_bytes(*block_io["in"], sp.entry)
            if not entry or any(b != _nbytes(hidden) for b in entry):
                raise _Refused(f"block {sp.blocks[0]} takes no input shaped like its hidden "
                               f"states {list(hidden.shape)} at the model's size")
            _sizes(out, members, ref, block_io)
        return out
    except _Refused as why:
        return SpLayout(degree=sp.degree, refused=str(why))


def _saved_bytes_of_call(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> int:
    """Bytes of the storages autograd saves for backward in one call of `module` (each once; its
    parameters and buffers excluded)."""
    own = {storage_key(t) for t in list(module.parameters()) + list(module.buffers())}
    storages: Dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.layout == torch.strided and t.numel():
            key = storage_key(t)
            if key not in own:
                storages[key] = t.untyped_storage().nbytes()
        return t
    with torch.random.fork_rng(devices=[]), torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*_fresh(args), **_fresh(kwargs))
    return sum(storages.values())


def _saved_share(module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                 where: Where) -> float:
    """A gather node's kept activations under sequence parallelism over its kept activations in
    one process, measured by running it both ways: PrepareModuleInput all-gathers each sequence
    input apart, so inputs that were one tensor (nn.MultiheadAttention's self-attention passes
    x as query, key and value) become separate tensors, and the node takes the path for distinct
    inputs and keeps each (three input projections, three saved inputs, where one process
    projects x once). 1.0 where nothing is saved."""
    leaves: Dict[int, torch.Tensor] = {}

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone().requires_grad_(t.requires_grad)

    def shared(t: torch.Tensor) -> torch.Tensor:  # one tensor per storage, as one process has
        key = storage_key(t)
        if key not in leaves:
            leaves[key] = leaf(t)
        return leaves[key]

    def mapped(f):
        a, kw = list(args), dict(kwargs)
        for i in where.positions:
            a[i] = f(a[i])
        for k in where.keywords:
            kw[k] = f(kw[k])
        return tuple(a), kw
    whole = _saved_bytes_of_call(module, *mapped(shared))
    apart = _saved_bytes_of_call(module, *mapped(leaf))
    return apart / whole if whole > 0 else 1.0


def _seq_bytes(args: Tuple[Any, ...], kwargs: Dict[str, Any], where: Where) -> List[int]:
    """The bytes of each top-level input `where` names (the same tensor passed twice: twice,
    as PrepareModuleInput redistributes each argument on its own)."""
    return [_nbytes(t) for key, t in _top_level(args, kwargs)
            if (key[0] == "pos" and key[1] in where.positions)
            or (key[0] == "kw" and key[1] in where.keywords)]


def _simulate(view, members, ref, roles, seq_in, result, first, last, block_io, entry_args,
              reference, args, kwargs, rank, degree, length) -> None:
    """One rank's run (module doc, step 3); refines `roles` (per_token -> gather) and records
    each node's sequence inputs in `seq_in`. Raises _Refused."""
    handles = []

    def entry(mod, a, kw):
        a, kw = list(a), dict(kw)
        for (kind, key), t in entry_args:
            if kind == "pos":
                a[key] = _chunk(a[key], rank, degree)
            else:
                kw[key] = _chunk(kw[key], rank, degree)
        return tuple(a), kw

    def check_inputs(name):
        def hook(mod, a, kw):
            ra, rkw, _ = ref[name]
            local = dict(_top_level(a, kw))
            positions, keywords = [], []
            for key, r in _top_level(ra, rkw):
                t = local.get(key)
                if t is None:
                    raise _Refused(f"node {name} is called with other inputs when the sequence "
                                   f"is split")
                if tuple(t.shape) == tuple(r.shape) and _same(t, r):
                    continue
                if _is_sequence(r, length) and _close(t, _chunk(r, rank, degree)):
                    (positions if key[0] == "pos" else keywords).append(key[1])
                    continue
                raise _Refused(
                    f"the input {key[1]!r} of node {name} is neither the whole value nor this "
                    f"rank's share of the sequence when the sequence is split (shape "
                    f"{list(t.shape)}, whole {list(r.shape)}): code before it needs the whole "
                    f"sequence")
            where = Where(tuple(positions), tuple(keywords), len(ra))
            old = seq_in.setdefault(name, where)
            if (old.positions, old.keywords) != (where.positions, where.keywords):
                raise _Refused(f"node {name}'s sequence inputs differ between ranks")
            if roles.get(name) in ("colwise", "gather", "region"):
                # the all-gather returns the whole inputs (a node without sequence inputs
                # runs whole as it did)
                return _fresh(ra), _fresh(rkw)
            return None
        return hook

    def check_output(name):
        def hook(mod, a, kw, out):
            _, _, rout = ref[name]
            role = roles.get(name)
            if role is None:  # "sharded": the features of the whole sequence, as it was
                return None
            chunked = {i: (_chunk(r, rank, degree) if _is_sequence(r, length) else r)
                       for i, r in _outputs(rout)}
            seq = seq_in.get(name, Where())
            if role in ("per_token", "whole") and not (seq.positions or seq.keywords):
                roles[name] = "whole"  # no sequence input: it runs whole, as it did
                return None
            if role == "per_token":
                ok = all(i in chunked and tuple(t.shape) == tuple(chunked[i].shape)
                         and _close(t, chunked[i]) for i, t in _outputs(out))
                if ok:
                    return None
                roles[name] = "gather"
            if role in ("colwise", "region"):
                return None  # its output runs on into the region, whole as the reference's
            return _replace_outputs(out, {i: t.clone() for i, t in chunked.items()})
        return hook

    handles.append(first.register_forward_pre_hook(entry, with_kwargs=True))
    for name, mod in members.items():
        if name in ref and name in roles and name not in result.gather_at:
            handles.append(mod.register_forward_pre_hook(check_inputs(name), with_kwargs=True))
            handles.append(mod.register_forward_hook(check_output(name), with_kwargs=True))
    gathered: List[Any] = []

    def leave(mod, a, out):
        rout = block_io["out"]
        new = {}
        for i, t in _outputs(out):
            r = dict(_outputs(rout)).get(i)
            if r is None:
                continue
            if tuple(r.shape) == tuple(t.shape) and _same(t, r):
                continue
            if not (_is_sequence(r, length) and _close(t, _chunk(r, rank, degree))):
                raise _Refused(f"the output of block {result.blocks[-1]} is not this rank's "
                               f"share of the sequence when the sequence is split")
            new[i] = r.clone()
        gathered.append(True)
        return _replace_outputs(out, new)

    handles.append(last.register_forward_hook(leave))
    try:
        with torch.random.fork_rng(devices=[]), _eval_with_grad(view):
            try:
                output = view(*_fresh(args), **_fresh(kwargs))
            except _Refused:
                raise
            except Exception as exc:
                raise _Refused(f"the forward fails with the sequence split: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from None
    finally:
        for h in handles:
            h.remove()
    if not gathered:
        raise _Refused(f"block {result.blocks[-1]} did not run")
    got, want = tensors_in(output), tensors_in(reference)
    if len(got) != len(want) or not all(g.shape == w.shape and _close(g, w)
                                        for g, w in zip(got, want)):
        raise _Refused("the module's output changes when the sequence is split between its "
                       "blocks (code between the blocks needs the whole sequence)")


def graph_fields(sp: SpLayout, nodes: Dict[str, nn.Module], graph_nodes: Sequence[str]
                 ) -> Dict[str, Dict[str, Any]]:
    """{graph node: its "sequence_parallel" object (docs/formats.md)}: role, max_degree and the
    collectives the executor runs for it under sequence parallelism, at the profiled batch
    (bytes of the whole tensors; "fixed_bytes": a parameter gradient's, not scaled by the
    batch). The first region node in execution order carries the entry's backward all-gather,
    the last the exit's forward all-gather."""
    if sp.refused:
        return {}
    order = [g for g in graph_nodes if block_list.module_name(g) in sp.roles]
    fields: Dict[str, Dict[str, Any]] = {}
    gathered: set = set()  # region parents whose all-gather a node already carries

    def each(op: str, sizes: Sequence[int]) -> List[Dict[str, Any]]:
        return [{"op": op, "bytes": b} for b in sizes]
    for g in order:
        name = block_list.module_name(g)
        role = sp.roles[name]
        ins, outs = sp.io_bytes.get(name, ([], []))
        fwd: List[Dict[str, Any]] = []
        bwd: List[Dict[str, Any]] = []
        parent = sp.gather_at.get(name)
        if role == "colwise" and parent is not None:
            # the region's parent gathers once for all its column-wise nodes: the first
            # carries it (and the reduce-scatter of the summed input gradient)
            if parent not in gathered:
                gathered.add(parent)
                ins = sp.io_bytes.get(parent, ([], []))[0]
                fwd += each("all_gather", ins)
                bwd += each("reduce_scatter", ins)
        elif role == "colwise":  # all-gather the input; its gradient reduce-scattered
            fwd += each("all_gather", ins)
            bwd += each("reduce_scatter", ins)
        elif role == "rowwise":  # reduce-scatter the output; its gradient all-gathered
            fwd += each("reduce_scatter", outs)
            bwd += each("all_gather", outs)
        elif role == "gather":  # all-gather the inputs; the outputs' gradients all-gathered
            fwd += each("all_gather", ins)
            bwd += each("all_gather", outs)
        elif g == block_list.module_name(g):  # per_token, its first call: parameters' grads,
            # each a Partial DTensor gradient that DTensor all-reduces on its own when the
            # optimizer reads it
            bwd += [{"op": "all_reduce", "bytes": p.numel() * p.element_size(),
                     "fixed_bytes": True} for p in nodes[name].parameters()]
        if g == order[0]:
            bwd.append({"op": "all_gather", "bytes": sp.entry_bytes})
        if g == order[-1]:
            fwd.append({"op": "all_gather", "bytes": sp.exit_bytes})
        field_: Dict[str, Any] = {"role": role, "max_degree": sp.max_degree}
        if role == "gather" and name in sp.saved_share:
            field_["saved_share"] = sp.saved_share[name]
        if fwd:
            field_["forward_collectives"] = fwd
        if bwd:
            field_["backward_collectives"] = bwd
        fields[g] = field_
    return fields


def note(sp: Optional[SpLayout], fields: Dict[str, Dict[str, Any]]) -> str:
    """The profile log's words on sequence parallelism ("" where it was not checked: no node
    splits)."""
    if sp is None:
        return ""
    return (f"; no sequence parallelism: {sp.refused}" if sp.refused
            else f"; sequence parallelism: {len(fields)} nodes")
