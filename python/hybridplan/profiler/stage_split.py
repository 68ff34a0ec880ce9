"""Cuts a module into pipeline stages with torch.distributed.pipelining's export-based frontend
(`pipeline()`: torch.export, then split_module at `pipe_split` markers). The executor runs the
stages it returns; the profiler calls the same cut at profile time to record whether and where
the model can be cut (docs/formats.md, Graph `pipeline_split` and `cut_before`).

    cut = split(module, args, kwargs, stage_of={"enc0": 0, "enc1": 1, ...}, num_stages=2)
    cut.stages[s]          stage s as a module of the values it receives (see CarryStage)
    cut.flatten_inputs(args, kwargs) / cut.unflatten_outputs(tensors)

How the cut is made:
- The module is exported through `_FlatCall`, which takes the flat list of input tensors
  (pytree leaves of (args, kwargs), non-tensor leaves fixed to the example's) and returns the
  flat tuple of output tensors, so keyword inputs (input_ids, attention_mask) and structured
  outputs (tuples, dicts, ModelOutput) become what PipelineStage passes: tuples of tensors.
  Export specialises shapes to the example, which is one micro-batch: every micro-batch must
  have that shape.
- The split policy places a `pipe_split` marker before stage s's first graph node (node rule:
  block_list) right after the last operation of an earlier stage, so functional ops between
  nodes run with the node that consumes them, as the profiler charges them. Each operation
  belongs to the node whose module (nn_module_stack) ran it; stages must be contiguous in
  execution order, or ValueError names the module.
- Values do not skip stages: stage s receives from stage s-1 every value that stage s or a later
  stage reads (batch inputs included) and passes on what later stages need (CarryStage). Torch's
  own traced stage (`Pipe.build_stage`) supports neither a batch input read after stage 0 (an
  attention mask read by every layer) nor the gradient of a value read by two later stages, so
  the stages are built from the Pipe's stage modules as PipelineStage's manual frontend runs
  them: each receives one tuple from its predecessor. With two stages this is exactly the Pipe.
- Regions that torch.export wraps in a higher-order op (`torch.no_grad()` or an autocast block
  inside a module: a Llama rotary embedding computes its cos/sin under both) are inlined back
  into the graph between calls that set and restore the mode (`_inline_mode_regions`).
  pipelining's outliner otherwise moves the region's subgraph (a get_attr, then a placeholder)
  to the front of the stage, which splits the module into two calls of which it keeps one,
  and the stage fails with "forward() missing ... positional arguments".
- A parameter read on several stages (tied weights: GPT-2's wte and lm_head; a module called on
  several stages) is copied onto each by the Pipe; `tied` lists them so that the executor sums
  their gradients between those stages, and copies inside one stage are one tensor
  (`_tie_copies`).
- A module built on the meta device (parameters with shapes and no storage) is traced as it
  is, with the example's tensors moved to the meta device: torch.export needs one device, not
  values, and the stages keep the module's own meta tensors, which each rank gives storage to
  for its stages only (executor/materialize.py). What the trace records of the device it ran
  on, the `device=` of an `arange` or a `.to(device)`, names the meta device in the stages'
  graphs; `StageCut.stage_on(s, device)` rewrites those to the device the stage runs on, as
  torch's own `Pipe.build_stage` does for a traced graph's `device=` arguments.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import traceback
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx as fx
from torch import nn
from torch.export.unflatten import InterpreterModule
from torch.utils import _pytree as pytree

from . import block_list

# torch.distributed.pipelining is imported where a module is cut, not here: it takes seconds to
# import, and the executor and the profiler import this module for its names alone as well.

ValueKey = Tuple[Any, ...]  # ("input", i): flat input tensor i; ("stage", s, j): output j of s
kPrefix = "module."          # _FlatCall holds the user's module as its child "module"


class _Record(list):
    """A list that copies are the same object: torch.export restores a module's attributes
    after tracing (from deep copies), and this one must keep what the trace recorded."""

    def __deepcopy__(self, memo):
        return self


class _FlatCall(nn.Module):
    """module(*args, **kwargs) as a function of the flat input tensors returning the flat output
    tensors (see the module doc). Records the output structure on its first call."""

    def __init__(self, module: nn.Module, args: Sequence[Any], kwargs: Dict[str, Any]):
        super().__init__()
        self.module = module
        leaves, self.in_spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self.input_leaves = leaves
        self.tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self.out_record = _Record()  # the output structure, recorded on the first call

    def forward(self, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        leaves = list(self.input_leaves)
        for i, t in zip(self.tensor_at, tensors):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self.in_spec)
        out_leaves, out_spec = pytree.tree_flatten(self.module(*args, **kwargs))
        tensor_at = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
        if not self.out_record:
            self.out_record.extend([out_spec, list(out_leaves), tensor_at])
        return tuple(out_leaves[i] for i in tensor_at)

    def flatten_inputs(self, args: Sequence[Any], kwargs: Dict[str, Any], source: str
                       ) -> Tuple[torch.Tensor, ...]:
        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if spec != self.in_spec:
            raise ValueError(f"{source}: inputs must have the structure of example_inputs "
                             f"(got {spec}, expected {self.in_spec})")
        for i, (got, want) in enumerate(zip(leaves, self.input_leaves)):
            if not isinstance(want, torch.Tensor) and got != want:
                raise ValueError(f"{source}: non-tensor input {i} must equal the example's "
                                 f"(the stages were traced with it) (got {got!r}, expected "
                                 f"{want!r})")
        return tuple(leaves[i] for i in self.tensor_at)

    def unflatten_outputs(self, tensors: Sequence[torch.Tensor]) -> Any:
        spec, leaves, tensor_at = self.out_record
        leaves = list(leaves)
        for i, t in zip(tensor_at, tensors):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, spec)


class CarryStage(nn.Module):
    """Stage s of a cut: forward(*received) -> the tuple stage s+1 receives (the last stage: the
    model's flat output tensors). `received` are the values named by `carry_in` (stage 0: the
    flat input tensors); the Pipe's stage module `part` reads `part_inputs` of them, and values
    later stages need are passed on unchanged."""

    def __init__(self, stage: int, part: nn.Module, part_inputs: List[ValueKey],
                 carry_in: List[ValueKey], carry_out: List[ValueKey]):
        super().__init__()
        self.stage, self.part = stage, part
        self.part_inputs, self.carry_in, self.carry_out = part_inputs, carry_in, carry_out

    def forward(self, *received: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        values = dict(zip(self.carry_in, received))
        out = self.part(*(values[k] for k in self.part_inputs))
        for j, v in enumerate(out if isinstance(out, tuple) else (out,)):
            values[("stage", self.stage, j)] = v
        # contiguous: Gloo sends only contiguous tensors (a no-op for those already are)
        return tuple(values[k].contiguous() for k in self.carry_out)


@dataclasses.dataclass
class StageCut:
    """A module cut into stages (see the module doc). Parameter and buffer names in stages are
    the original module's (`original_name`)."""
    num_stages: int
    stages: List[CarryStage]
    flat: _FlatCall
    carry_meta: List[List[torch.Tensor]]   # stage s -> meta tensors of what it receives
    output_meta: List[torch.Tensor]        # the last stage's outputs
    tied: List[Dict[int, str]]             # per tied parameter: stage -> its name in part
    on_meta: bool = False                  # traced on the meta device (a meta-built module)

    def stage_on(self, stage: int, device: torch.device) -> "CarryStage":
        """Stage `stage`, its graphs' meta-device arguments set to `device` when the cut was
        traced on the meta device (the module doc); its tensors are the caller's to place."""
        part = self.stages[stage]
        if self.on_meta:
            retarget_device(part, torch.device("meta"), torch.device(device))
        return part

    def flatten_inputs(self, args, kwargs, source="pipeline"):
        return self.flat.flatten_inputs(args, kwargs, source)

    def unflatten_outputs(self, tensors):
        return self.flat.unflatten_outputs(tensors)

    def meta_of(self, stage: int) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """(inputs, outputs) of `stage` as meta tensors, for PipelineStage's static metadata."""
        outputs = (self.carry_meta[stage + 1] if stage + 1 < self.num_stages
                   else self.output_meta)
        return self.carry_meta[stage], outputs


def retarget_device(part: nn.Module, old: torch.device, new: torch.device) -> None:
    """Every `old` device among the arguments of the graphs in `part` (positional or keyword:
    `arange(..., device=)`, `aten.to.device(x, device, ...)`, `_assert_tensor_metadata(...,
    device=)`) becomes `new`; the graphs' code is regenerated. torch's `_modify_graph_op_device`
    (what Pipe.build_stage calls) rewrites only keyword `device=` arguments and every device,
    not just the traced one; the positional `.to(device)` a Llama rotary embedding traces to
    would keep the meta device."""
    def swap(value):
        return new if isinstance(value, torch.device) and value == old else value
    for mod in part.modules():
        graph = getattr(mod, "graph", None)
        if not isinstance(graph, fx.Graph):
            continue
        changed = False
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            args = fx.node.map_aggregate(node.args, swap)
            kwargs = fx.node.map_aggregate(node.kwargs, swap)
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs, changed = args, kwargs, True
        if changed:
            code_of = mod.graph_module if isinstance(mod, InterpreterModule) else mod
            if isinstance(code_of, fx.GraphModule):
                code_of.recompile()


def original_name(stage_name: str) -> str:
    """A parameter's name inside a CarryStage ("part.module.enc0.weight") -> the original
    module's ("enc0.weight"). The outliner names a module's repeated calls "layer@1": the
    parameter they read is the module's ("part.module.layer@1.weight" -> "layer.weight")."""
    for prefix in ("part.", kPrefix):
        if stage_name.startswith(prefix):
            stage_name = stage_name[len(prefix):]
    return re.sub(r"@\d+(?=\.|$)", "", stage_name)


# ---- where each graph operation belongs ------------------------------------------------------

def _clean_path(path: str) -> str:
    """An nn_module_stack path as a qualified name in the original module ("" for the root)."""
    path = re.sub(r"\[(\w+)\]", r".\1", path.replace("L['self'].", ""))  # strict-mode spellings
    return path[len(kPrefix):] if path.startswith(kPrefix) else ("" if path == "module" else path)


def _owners(gm: fx.GraphModule, graph_nodes: Sequence[str], aliases: Dict[str, str]
            ) -> List[Tuple[fx.Node, Optional[str]]]:
    """(operation, graph node that owns it or None for a functional op between nodes) in graph
    order. An operation belongs to the outermost module on its nn_module_stack that is a node
    module (under any of its names); each distinct stack entry of that module is one call of it
    (torch.export keys a module's repeated calls "...@1", "...@2"; calls under another name
    have other keys), numbered in graph order as the profiler numbers calls (block_list)."""
    modules = {block_list.module_name(n) for n in graph_nodes}
    calls: Dict[str, Dict[str, str]] = {}  # node module -> stack key -> graph node
    owners: List[Tuple[fx.Node, Optional[str]]] = []
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method", "call_module"):
            continue
        owner = None
        for key, (path, _) in (n.meta.get("nn_module_stack") or {}).items():
            name = block_list.canonical_name(_clean_path(path), aliases)
            if name in modules:
                seen = calls.setdefault(name, {})
                owner = seen.setdefault(key, block_list.call_name(name, len(seen)))
                break
        owners.append((n, owner))
    return owners


def _place_markers(gm: fx.GraphModule, stage_of: Dict[str, int], num_stages: int,
                   source: str, aliases: Dict[str, str]) -> fx.GraphModule:
    """Inserts pipe_split before each stage's first operation (see the module doc)."""
    from torch.distributed.pipelining._IR import aten_pipe_split_alias

    current, last_owned, current_node = 0, None, None
    for op, owner in _owners(gm, list(stage_of), aliases):
        if owner is None or owner not in stage_of:
            continue
        stage = stage_of[owner]
        if stage < current:
            raise ValueError(
                f"{source}: assignment must be contiguous in execution order: module "
                f"'{owner}' (stage {stage}) runs after module '{current_node}' (stage {current})")
        if stage > current:
            if stage > current + 1 or last_owned is None:
                empty = current + 1 if last_owned is not None else current
                raise ValueError(f"{source}: assignment stage {empty} must run an operation "
                                 f"(got no module of it with operations before '{owner}')")
            with gm.graph.inserting_after(last_owned):
                gm.graph.call_function(aten_pipe_split_alias, ())
            current = stage
        last_owned, current_node = op, owner
    if current != num_stages - 1:
        raise ValueError(f"{source}: assignment stage {current + 1} must run an operation (got "
                         f"none of its modules in the exported graph)")
    gm.recompile()
    return gm


# ---- regions under another grad or autocast mode ----------------------------------------------

def _mode_region(node: fx.Node):
    """(enter, exit, subgraph argument index) for a higher-order op that runs a subgraph under
    another mode, else None. enter(*mode args) -> state that exit(state) restores."""
    if node.op != "call_function":
        return None
    if node.target is torch.ops.higher_order.wrap_with_set_grad_enabled:
        return _enter_grad_mode, _exit_grad_mode, 1
    if node.target is torch.ops.higher_order.wrap_with_autocast:
        return _enter_autocast_mode, _exit_autocast_mode, 4
    return None


def _enter_grad_mode(enabled: bool) -> bool:
    """Sets grad mode; returns the mode it replaced, for _exit_grad_mode."""
    previous = torch.is_grad_enabled()
    torch._C._set_grad_enabled(enabled)
    return previous


def _exit_grad_mode(previous: bool) -> None:
    """(Not torch._C._set_grad_enabled itself: pipelining's passes expect its argument to be
    a constant.)"""
    torch._C._set_grad_enabled(previous)


def _enter_autocast_mode(*mode_args: Any) -> Any:
    """torch.amp._enter_autocast under a name of our own: fx's split_module gives torch's
    enter/exit calls a region handling of its own that fails on a cut graph (KeyError)."""
    return torch.amp._enter_autocast(*mode_args)


def _exit_autocast_mode(mode: Any) -> None:
    torch.amp._exit_autocast(mode)


# torch.fx drops calls whose results are unused unless their targets are known side effects
fx.node._side_effectful_functions.update((_enter_grad_mode, _exit_grad_mode,
                                          _enter_autocast_mode, _exit_autocast_mode))


def _inline_mode_regions(gm: fx.GraphModule) -> None:
    """Replaces each set-grad or autocast region (see the module doc) by its subgraph's
    operations between enter and exit calls, all in the region's module scope; nested regions
    are inlined in turn. The subgraph's own get_attr targets move to `gm`."""
    while True:
        region = next(((n, r) for n in gm.graph.nodes if (r := _mode_region(n))), None)
        if region is None:
            break
        node, (enter, leave, at) = region
        holder = node.args[at]  # the get_attr of the region's subgraph
        sub = getattr(gm, holder.target)
        mode_args, operands = node.args[:at], node.args[at + 1:]
        scope = {k: v for k, v in node.meta.items() if k == "nn_module_stack"}
        with gm.graph.inserting_before(node):
            state = gm.graph.call_function(enter, tuple(mode_args))
            env = dict(zip((p for p in sub.graph.nodes if p.op == "placeholder"), operands))
            result = None
            for inner in sub.graph.nodes:
                if inner.op == "placeholder":
                    continue
                if inner.op == "output":
                    result = fx.map_arg(inner.args[0], lambda a: env[a])
                    continue
                if inner.op == "get_attr":
                    target = f"_hp_region_{inner.target}_{len(gm.graph.nodes)}"
                    setattr(gm, target, getattr(sub, inner.target))
                    env[inner] = gm.graph.get_attr(target)
                else:
                    env[inner] = gm.graph.node_copy(inner, lambda a: env[a])
                env[inner].meta.update(scope)
            done = gm.graph.call_function(leave, (state,))
            for n in (state, done):
                n.meta.update(scope)
        for user in list(node.users):  # getitem(region, i) -> the region's i-th output
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                gm.graph.erase_node(user)
        if node.users:
            node.replace_all_uses_with(result)  # a region with one output
        gm.graph.erase_node(node)
        if not holder.users:
            gm.graph.erase_node(holder)
    gm.recompile()


# ---- the cut -----------------------------------------------------------------------------------

def split(module: nn.Module, args: Sequence[Any], kwargs: Dict[str, Any],
          stage_of: Dict[str, int], num_stages: int, source: str = "plan") -> StageCut:
    """Cuts `module` as `stage_of` (node name -> stage; nodes not named run with their
    consumers) says. `args`/`kwargs`: one micro-batch. ValueError where torch.export or the
    split fails (naming the module and the cause) or the stages are not contiguous. A module
    with meta tensors is traced on the meta device (the module doc)."""
    on_meta = any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))
    if on_meta:  # the example's values do not matter to the trace, only shapes and dtypes
        args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"),
                                            (tuple(args), dict(kwargs)))
    cut = _split(module, args, kwargs, lambda gm, _inputs, _aliases: (stage_of, num_stages),
                 source)
    cut.on_meta = on_meta
    return cut


def _split(module, args, kwargs, stages_for, source) -> StageCut:
    """The cut, with `stages_for(traced graph, flat inputs, module aliases)` -> (stage_of,
    num_stages)."""
    from torch.distributed.pipelining import pipeline

    flat = _FlatCall(module, args, kwargs)
    aliases = block_list.module_aliases(module)
    inputs = tuple(flat.input_leaves[i] for i in flat.tensor_at)
    policy_error: List[ValueError] = []
    wanted: List[int] = []

    def policy(gm):
        try:
            _inline_mode_regions(gm)
            stage_of, num_stages = stages_for(gm, inputs, aliases)
            wanted.append(num_stages)
            return _place_markers(gm, stage_of, num_stages, source, aliases)
        except ValueError as e:  # pipeline() would wrap it; keep it to raise as it is
            policy_error.append(e)
            raise
    try:
        with warnings.catch_warnings():
            # torch's pipeline() deep-copies the traced graph's codegen, which holds a pytree
            # LeafSpec: each copy warns that LeafSpec is deprecated (a FutureWarning meant for
            # torch's own code, not the user), once per cut and rank.
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                                    category=FutureWarning)
            # export notes that nn.LSTM assigns its own _flat_weights list while traced: torch's
            # module, nothing the user can register; a user module's attributes still warn
            warnings.filterwarnings("ignore", message=r"The tensor attributes (\S*_flat_weights"
                                    r"\[\d+\](, )?)+ were assigned during export",
                                    category=UserWarning)
            pipe = pipeline(flat, inputs, split_policy=policy)
        if pipe.num_stages != wanted[0]:
            raise ValueError(f"the cut must give {wanted[0]} stages (got {pipe.num_stages})")
        return _build_cut(pipe, flat, pipe.num_stages)
    except Exception as e:  # export and split raise many types; the user needs module + cause
        if policy_error:
            raise policy_error[0] from None
        raise ValueError(f"{source}: {type(module).__name__} cannot be cut into pipeline "
                         f"stages: {export_failure(module, e)}") from None


def probe(module: nn.Module, args: Sequence[Any], kwargs: Dict[str, Any],
          order: Sequence[str]) -> Tuple[Dict[str, Any], Dict[str, bool]]:
    """Whether and where `module` can be cut, as the profiler records it: ({"supported": bool,
    "reason": str}, node -> cut_before) for the graph nodes `order` (execution order). A stage
    can begin at node n when every operation of the nodes before n runs before every operation
    of n and the nodes after it; the cut with a stage boundary at every such node is then built
    (one export), so "supported" means the executor's cut works there."""
    cut_before: Dict[str, bool] = {}

    def place(gm, flat_inputs, aliases):
        owners = _owners(gm, order, aliases)
        cut_before.update(_cut_before(owners, order))
        owning = {owner for _, owner in owners if owner is not None}
        stage_of, stage = {}, 0
        for i, name in enumerate(order):
            if i and cut_before[name] and name in owning and stage_of:
                stage += 1
            stage_of[name] = stage
        return stage_of, stage + 1
    try:
        _split(module, args, kwargs, place, "profile")
    except ValueError as e:
        return {"supported": False, "reason": str(e)}, {}
    return {"supported": True, "reason": ""}, cut_before


def _cut_before(owners: List[Tuple[fx.Node, Optional[str]]], order: Sequence[str]
                ) -> Dict[str, bool]:
    positions: Dict[str, List[int]] = {}
    for i, (_, owner) in enumerate(owners):
        if owner is not None:
            positions.setdefault(owner, []).append(i)
    out, last_before = {}, -1
    for k, name in enumerate(order):
        first_after = min((positions[n][0] for n in order[k:] if n in positions), default=None)
        out[name] = first_after is None or last_before < first_after
        if name in positions:
            last_before = max(last_before, positions[name][-1])
    return out


def export_failure(module: nn.Module, exc: BaseException) -> str:
    """'in module <name> (<type>): <cause>' for the innermost submodule of `module` whose
    forward the failure passed through, and the first line of the innermost cause."""
    names = {id(m): n for n, m in module.named_modules()}
    where = None
    cause = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    for frame, _ in traceback.walk_tb(cause.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names and names[id(owner)]:
            where = f"in module '{names[id(owner)]}' ({type(owner).__name__})"
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    reason = f"{type(cause).__name__}: {text}"[:300]
    return f"{where}: {reason}" if where else reason


def _run_generated_code(part: nn.Module) -> None:
    """Makes the stage's outlined submodules (torch.export's InterpreterModule, which pipelining's
    split leaves for every module call it preserves) run their generated Python code instead of
    torch.fx.Interpreter. The Interpreter dispatches every graph node through Python, about 20 us
    per node per call on CPU: branchy_cnn's two stages at micro-batch 1 took 5.8 ms per forward
    + backward against 2.5 ms eager, and 2.7 ms with the generated code (thread clock; `python
    bench/bench_stage_code.py` measures all three side by side). The generated code is the
    graph's own (`InterpreterModule.forward` falls back to it under torch.compile); the flag is
    torch's, read per call."""
    for mod in part.modules():
        if not (hasattr(mod, "_run_with_interpreter") and hasattr(mod, "graph_module")):
            continue
        # torch names a call's value after the module it calls; a submodule named `self`
        # (Hugging Face BERT's attention.self) then shadows forward's `self` in the generated
        # code (`self = self.self(x); self.output(...)` fails). Rename such values first.
        renamed = [n for n in mod.graph.nodes if n.name == "self"]
        for node in renamed:
            node._rename("self_module")
        if renamed:
            mod.graph_module.recompile()
        mod._run_with_interpreter = False


def _build_cut(pipe, flat: _FlatCall, num_stages: int) -> StageCut:
    root = pipe.split_gm.graph
    keys: Dict[fx.Node, Any] = {}
    part_inputs: List[List[ValueKey]] = [[] for _ in range(num_stages)]
    num_inputs = 0
    output_keys: List[ValueKey] = []
    for node in root.nodes:  # stages appear where their inputs are ready, not in stage order
        if node.op == "placeholder":
            keys[node] = ("input", num_inputs)
            num_inputs += 1
        elif node.op == "call_module":  # submod_pp_<stage>
            s = int(node.target.rsplit("_", 1)[1])
            part_inputs[s] = [keys[a] for a in node.args]
            keys[node] = ("stage", s, 0)
        elif node.op == "call_function":  # getitem on a stage's tuple of outputs
            s = keys[node.args[0]][1]
            keys[node] = ("stage", s, node.args[1])
        elif node.op == "output":
            output_keys = [keys[n] for n in pytree.tree_leaves(node.args[0])]
    # carry_out[s]: what stages after s (and the output) read that exists by the end of s
    needed_later: List[set] = [set() for _ in range(num_stages + 1)]
    needed_later[num_stages] = set(output_keys)
    for s in range(num_stages - 1, -1, -1):
        needed_later[s] = needed_later[s + 1] | set(part_inputs[s])

    def made_by(key, s):  # the value exists once stage s has run
        return key[0] == "input" or key[1] <= s
    carry_in = [[("input", i) for i in range(num_inputs)]]
    for s in range(num_stages - 1):
        carry_in.append(sorted((k for k in needed_later[s + 1] if made_by(k, s)), key=repr))
    stages = []
    for s in range(num_stages):
        part = pipe.get_stage_module(s)
        _drop_unused_attributes(part)
        _run_generated_code(part)
        out = carry_in[s + 1] if s + 1 < num_stages else output_keys
        stages.append(CarryStage(s, part, part_inputs[s], carry_in[s], out))
    meta = _value_meta(pipe, flat)
    carry_meta = [[meta[k] for k in keys_s] for keys_s in carry_in]
    tied = _tie_copies([stage.part for stage in stages], flat.module)
    return StageCut(num_stages, stages, flat, carry_meta, [meta[k] for k in output_keys], tied)


def _tie_copies(parts: Sequence[nn.Module], module: nn.Module) -> List[Dict[int, str]]:
    """Makes the copies of one parameter of `module` inside one stage one tensor again, and
    returns, per parameter held by several stages, stage -> its name in that stage's part.
    The Pipe copies a parameter onto every stage that reads it (its replicated_params: tied
    weights) and, when a module is called more than once, once more for each call the
    outliner keeps as its own submodule ("layer@1"): ALBERT's shared layer on one stage had a
    copy per call, each with only its call's gradient. The copies are found by the tensor
    their name (original_name) has in `module`, under any of its names."""
    tensor_of = {name: id(p) for name, p in module.named_parameters(remove_duplicate=False)}
    holders: Dict[int, Dict[int, str]] = {}  # original tensor -> stage -> name
    for stage, part in enumerate(parts):
        first: Dict[int, nn.Parameter] = {}
        for name, param in list(part.named_parameters(remove_duplicate=False)):
            key = tensor_of.get(original_name(name))
            if key is None:
                continue
            kept = first.setdefault(key, param)
            if kept is not param:
                owner, _, attr = name.rpartition(".")
                (part.get_submodule(owner) if owner else part)._parameters[attr] = kept
            holders.setdefault(key, {}).setdefault(stage, name)
    return [uses for uses in holders.values() if len(uses) > 1]


def _value_meta(pipe, flat: _FlatCall) -> Dict[ValueKey, torch.Tensor]:
    """Meta tensors (shape, dtype, requires_grad) of every value: batch inputs from the example
    (no gradient flows back into them), stage outputs from the export's fake values (floating
    ones carry gradients)."""
    meta: Dict[ValueKey, torch.Tensor] = {}
    for i, leaf in enumerate(flat.input_leaves[j] for j in flat.tensor_at):
        meta[("input", i)] = torch.empty(leaf.shape, dtype=leaf.dtype, device="meta")
    for s in range(pipe.num_stages):
        part = pipe.get_stage_module(s)
        output = next(n for n in part.graph.nodes if n.op == "output")
        for j, value in enumerate(pytree.tree_leaves(output.args[0])):
            val = value.meta["val"]
            meta[("stage", s, j)] = torch.empty(val.shape, dtype=val.dtype, device="meta"
                                                ).requires_grad_(val.is_floating_point())
    return meta


def _drop_unused_attributes(part: nn.Module) -> None:
    """Deletes parameters and buffers no graph in `part` reads. The Pipe leaves behind, on a
    stage that reads a tied weight under one of its names, the other name still pointing at the
    original tensor (GPT-2's stage 0 keeps an unused `lm_head.weight`); such a tensor would get
    no gradient, which DDP rejects, and would hide the stage's own copy in state_dict."""
    used = set()
    stack = [("", part)]
    while stack:
        scope, mod = stack.pop()
        if isinstance(mod, (fx.GraphModule, InterpreterModule)):
            used.update(f"{scope}{n.target}" for n in mod.graph.nodes if n.op == "get_attr")
        stack.extend((f"{scope}{name}.", child) for name, child in mod.named_children())
    named = list(part.named_parameters(remove_duplicate=False)) + list(
        part.named_buffers(remove_duplicate=False))
    for name, _ in named:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            holder = part.get_submodule(owner) if owner else part
            if attr in holder._parameters or attr in holder._buffers:  # not yet deleted under
                delattr(holder, attr)                                   # another name of holder
