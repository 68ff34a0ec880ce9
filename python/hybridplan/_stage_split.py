"""Cuts a module into the pipeline stages a plan assigns: torch.fx symbolic_trace, then
torch.fx.passes.split_module with a callback that maps

    call_module node  -> the plan's stage of that leaf module
    any other node    -> max(stage of its inputs)      (so stages stay contiguous; this includes
                         parameter-free leaf modules the plan leaves out)
    node without inputs (constants, parameters read with get_attr) -> min(stage of its users)

The split module's top-level graph then says which value each stage reads and from where. A
value is named by a key:

    ("input", i)          the i-th argument of forward()   (stage 0 holds the batch)
    ("attr", qualname)    a parameter or buffer read directly (it lives on the stage that reads it)
    ("stage", s, i)       the i-th output of stage s's submodule

Every rank traces and splits the whole module, so every rank knows who sends what to whom.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Dict, List, Set, Tuple

import torch
import torch.fx
from torch import nn
from torch.fx.passes.split_module import split_module

ValueKey = Tuple[Any, ...]


def leaf_module_names(module: nn.Module) -> List[str]:
    """Qualified names of the modules without children: the profiler's graph node names."""
    return [name for name, m in module.named_modules() if name and not any(m.children())]


class _LeafTracer(torch.fx.Tracer):
    """Keeps every module without children as one call_module node, including user-defined ones
    (fx's default traces through modules outside torch.nn), so nodes match the plan's names."""

    def __init__(self, leaf_names: Set[str]):
        super().__init__()
        self._leaf_names = leaf_names

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self._leaf_names or super().is_leaf_module(
            m, module_qualified_name)


def trace(module: nn.Module) -> torch.fx.GraphModule:
    leaves = set(leaf_module_names(module))
    try:
        graph = _LeafTracer(leaves).trace(module)
    except Exception as e:  # fx raises many types; the user needs the model and the reason
        raise ValueError(f"pipeline mode needs a torch.fx-traceable module: symbolic_trace of "
                         f"{type(module).__name__} failed ({type(e).__name__}: {e})") from None
    return torch.fx.GraphModule(module, graph)


def stage_of_nodes(gm: torch.fx.GraphModule, stage_of_module: Dict[str, int],
                   source: str = "plan") -> Dict[torch.fx.Node, int]:
    """Stage of every call_module/call_function/call_method/get_attr node (see module doc).
    ValueError where a module's stage is lower than the stage of one of its inputs."""
    stage: Dict[torch.fx.Node, int] = {}
    floating: List[torch.fx.Node] = []  # nodes that read no computed value
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        inputs = [n for n in node.all_input_nodes if n in stage]
        if node.op == "call_module" and node.target in stage_of_module:
            own = stage_of_module[node.target]
            late = [n for n in inputs if stage[n] > own]
            if late:
                raise ValueError(
                    f"{source}: assignment stage of {node.target!r} must be >= the stage of its "
                    f"input {late[0].name!r}, stages never decrease along an edge (got "
                    f"{own} < {stage[late[0]]})")
            stage[node] = own
        elif inputs:
            stage[node] = max(stage[n] for n in inputs)
        else:
            floating.append(node)
    # In reverse order every user of a floating node already has its stage; running it where
    # its first user runs keeps stages contiguous (all its inputs are floating too).
    for node in reversed(floating):
        stage[node] = min((stage[u] for u in node.users if u in stage), default=0)
    return stage


@dataclasses.dataclass
class StageProgram:
    """What one stage computes and exchanges (identical on every rank)."""
    num_stages: int
    submodules: Dict[int, torch.fx.GraphModule]      # stage -> its part (absent: empty stage)
    stage_inputs: Dict[int, List[ValueKey]]          # stage -> arguments of its submodule
    output: Any                                      # pytree of keys: forward()'s return value
    producer: Dict[ValueKey, int]                    # key -> stage that computes or holds it
    consumers: Dict[ValueKey, List[int]]             # key -> other stages that read it (sorted)

    def received_by(self, stage: int) -> List[ValueKey]:
        return sorted((k for k, cs in self.consumers.items() if stage in cs), key=repr)

    def sent_by(self, stage: int) -> List[ValueKey]:
        return sorted((k for k in self.consumers if self.producer[k] == stage), key=repr)


def build_program(module: nn.Module, stage_of_module: Dict[str, int], num_stages: int,
                  source: str = "plan") -> StageProgram:
    """Traces `module`, cuts it into the plan's stages and says who sends what to whom."""
    gm = trace(module)
    stage = stage_of_nodes(gm, stage_of_module, source)
    split = split_module(gm, module, lambda node: stage[node], tuple_return=True)
    submodules = {int(name[len("submod_"):]): sub for name, sub in split.named_children()}
    stage_inputs, output = _read_split_graph(split)

    uses: Dict[ValueKey, Set[int]] = {}
    for s, keys in stage_inputs.items():
        for key in keys:
            uses.setdefault(key, set()).add(s)
    # the loss is computed on the last stage, so forward()'s result goes there
    _walk(output, lambda key: uses.setdefault(key, set()).add(num_stages - 1))

    producer: Dict[ValueKey, int] = {}
    consumers: Dict[ValueKey, List[int]] = {}
    for key, users in uses.items():
        if key[0] == "attr":
            continue  # read locally from the module by the stage that uses it
        owner = key[1] if key[0] == "stage" else 0
        producer[key] = owner
        others = sorted(u for u in users if u != owner)
        if others:
            consumers[key] = others
    return StageProgram(num_stages, submodules, stage_inputs, output, producer, consumers)


def _read_split_graph(split: torch.fx.GraphModule) -> Tuple[Dict[int, List[ValueKey]], Any]:
    """(stage -> keys of its submodule's arguments, forward()'s result as keys) from the
    top-level graph split_module writes: placeholders, get_attr, submod_<s> calls and getitem
    on their (always tuple) results, and the output."""
    env: Dict[torch.fx.Node, Any] = {}
    stage_inputs: Dict[int, List[ValueKey]] = {}
    output: Any = None
    for node in split.graph.nodes:
        if node.op == "placeholder":
            env[node] = ("input", sum(1 for k in env.values() if k[0] == "input"))
        elif node.op == "get_attr":
            env[node] = ("attr", node.target)
        elif node.op == "call_module":
            s = int(node.target[len("submod_"):])
            stage_inputs[s] = [env[a] for a in node.args]
            env[node] = ("tuple", s)
        elif (node.op == "call_function" and node.target is operator.getitem
              and env[node.args[0]][0] == "tuple"):
            env[node] = ("stage", env[node.args[0]][1], node.args[1])
        elif node.op == "output":
            output = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
        else:
            raise AssertionError(f"unexpected node in split graph: {node.format_node()}")
    return stage_inputs, output


def _walk(tree: Any, fn: Callable[[ValueKey], Any]) -> None:
    """Calls fn on every value key in a (nested tuple/list/dict) output structure."""
    if isinstance(tree, tuple) and tree and tree[0] in ("input", "stage", "attr"):
        fn(tree)
    elif isinstance(tree, (tuple, list)):
        for t in tree:
            _walk(t, fn)
    elif isinstance(tree, dict):
        for t in tree.values():
            _walk(t, fn)


def stage_parameters(module: nn.Module, program: StageProgram, stage: int
                     ) -> List[Tuple[str, torch.Tensor]]:
    """(original state_dict key, tensor) of every parameter and buffer the stage owns: those of
    its submodule's leaf modules plus those it reads with get_attr. Tensors are shared with
    `module` (split_module reuses the module objects), so training a stage trains `module`."""
    owned: Set[int] = set()
    sub = program.submodules.get(stage)
    if sub is not None:
        owned.update(id(t) for t in sub.parameters())
        owned.update(id(t) for t in sub.buffers())
    for key in program.stage_inputs.get(stage, []):
        if key[0] == "attr":
            owned.add(id(get_attr(module, key[1])))
    named = list(module.named_parameters(remove_duplicate=False)) + list(
        module.named_buffers(remove_duplicate=False))
    return [(name, t) for name, t in named if id(t) in owned]


def get_attr(module: nn.Module, qualname: str) -> Any:
    """The attribute at dotted path `qualname` (a parameter or buffer read with get_attr)."""
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
