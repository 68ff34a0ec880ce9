"""The node rule: which modules are graph nodes. One definition, used by the profiler, the
executor's plan checks and its stage cut (csrc/profiler/block_list.h is the C++ twin; the
parity test tests/python/test_node_rule.py holds the two together).

    a non-root module that has no children, or that holds parameters directly
    (parameters(recurse=False) non-empty), is one node containing everything inside it;
    the root is a node only when it has no children.

So nn.MultiheadAttention (in_proj_weight held directly, out_proj's weight used without calling
out_proj) is one node, as is any custom block with weights of its own; containers and blocks
that only hold children are looked through. Two refinements, applied where the forward is
known (see dataflow.reused_stateless): a parameter-free node called more than once per forward
(a shared ReLU) is a functional op, not a node.

Parameters held directly by the root (a ViT's class token and position embedding) belong to no
node: the profiler charges their bytes to the first node in execution order that reads them,
the executor keeps them where the ops that read them run.

A module reachable under several names (an embedding that is an attribute of the root and of
both halves of an encoder-decoder) is one node, named by its first name in `named_modules`
order (its canonical name; `module_aliases` maps the others to it). A node module called
more than once in one forward (ALBERT's one layer applied at every depth, a shared embedding
called by the encoder and by the decoder) is one graph node per call: the first call is named
by the module's name, the k-th after it by `call_name(name, k)` = "name@k" (torch.export's
spelling of a module's repeated calls). Every call reads the module's parameters, so its
graph nodes share them as tied weights do (Graph `tied_params`).

A node module that never runs in forward is no graph node. Where every parameter it holds is a
parameter of a node module that runs (the same Parameter object: Hugging Face T5's and Bart's
`shared` embedding, whose weight `encoder.embed_tokens`, `decoder.embed_tokens` and `lm_head`
hold and call) and it holds no buffer, it needs no place of its own: its tensors are those
nodes', placed and trained with them (`uncalled_nodes`). Any other such module holds state no
plan can place, and the profiler and the executor name it (`UNCALLED_ADVICE`).
"""

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from torch import nn


def holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def select_nodes(module: nn.Module) -> Dict[str, nn.Module]:
    """Qualified name -> module for every node module, in `named_modules` order. A root without
    children is itself the only node, named after its class (a node name must be non-empty)."""
    if not any(True for _ in module.children()):
        return {type(module).__name__: module}
    nodes: Dict[str, nn.Module] = {}

    def visit(prefix: str, mod: nn.Module) -> None:
        for name, child in mod.named_children():
            qualified = f"{prefix}.{name}" if prefix else name
            if child in nodes.values():
                continue  # a module registered twice is one node, under its first name
            if not any(True for _ in child.children()) or holds_parameters(child):
                nodes[qualified] = child
            else:
                visit(qualified, child)

    visit("", module)
    return nodes


def uncalled_nodes(nodes: Mapping[str, nn.Module], called: Iterable[str]
                   ) -> Tuple[Dict[str, List[str]], List[str]]:
    """(tied, untied) over the node modules of `nodes` whose names are not in `called` (node
    module names that run): `tied` maps each one whose parameters are all parameters of called
    node modules, and which holds no buffer, to those called modules (it goes where they go);
    `untied` lists the others that hold a parameter or a buffer. Modules holding neither are in
    neither."""
    called = set(called)
    holders: Dict[int, List[str]] = {}
    for name in nodes:
        if name in called:
            for p in nodes[name].parameters():
                holders.setdefault(id(p), []).append(name)
    tied: Dict[str, List[str]] = {}
    untied: List[str] = []
    for name, mod in nodes.items():
        if name in called:
            continue
        params = list(mod.parameters())
        has_buffers = any(True for _ in mod.buffers())
        if params and not has_buffers and all(id(p) in holders for p in params):
            tied[name] = sorted({h for p in params for h in holders[id(p)]})
        elif params or has_buffers:
            untied.append(name)
    return tied, untied


# What a user can do about a node module that holds state and never runs (`untied` of
# uncalled_nodes); the profiler's warning and the executor's error both end with it.
UNCALLED_ADVICE = ("delete it (del model.<name>) if the model does not need it, call it in "
                   "forward, or tie its parameters to a module that runs (the same Parameter "
                   "object, as Hugging Face ties an embedding: it is then placed with that "
                   "module)")


def module_aliases(module: nn.Module) -> Dict[str, str]:
    """Qualified name -> canonical name, for every module reached under a name other than its
    first ("encoder.embed" -> "shared" when both name one module); {} for most models."""
    first: Dict[int, str] = {}
    aliases: Dict[str, str] = {}
    for name, mod in module.named_modules(remove_duplicate=False):
        canonical = first.setdefault(id(mod), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


def canonical_name(qualified_name: str, aliases: Dict[str, str]) -> str:
    """`qualified_name` with its longest prefix that is an alias replaced by the canonical name
    ("decoder.embed.weight" -> "shared.weight")."""
    if not aliases:
        return qualified_name
    parts = qualified_name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in aliases:
            return ".".join([aliases[prefix]] + parts[end:])
    return qualified_name


def node_of(qualified_name: str, node_names: Iterable[str],
            aliases: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The node that contains the module or tensor at `qualified_name` ("enc0.self_attn.out_proj"
    -> "enc0.self_attn"), or None where it belongs to no node (the root's own parameters, or a
    module that is not inside any node). A name under an alias is read as its canonical name."""
    names = set(node_names)
    parts = canonical_name(qualified_name, aliases or {}).split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in names:
            return prefix
    return None


def call_name(name: str, call: int) -> str:
    """The graph node of call `call` (0 = the first) of node module `name` in one forward."""
    return name if call == 0 else f"{name}@{call}"


def split_call_name(node: str) -> Tuple[str, int]:
    """("name", k) for the graph node "name@k", ("name", 0) for "name"."""
    name, at, call = node.rpartition("@")
    if at and call.isdigit() and name:
        return name, int(call)
    return node, 0


def module_name(node: str) -> str:
    """The node module that graph node `node` is a call of."""
    return split_call_name(node)[0]


class CallCounter:
    """Names the calls of node modules during one forward (see the module doc): `current(name)`
    is the graph node of the call now running or about to run, `finish(name)` returns it and
    moves on to the next call. `reset()` before each forward."""

    def __init__(self) -> None:
        self.calls: Dict[str, int] = {}

    def reset(self) -> None:
        self.calls.clear()

    def current(self, name: str) -> str:
        return call_name(name, self.calls.get(name, 0))

    def finish(self, name: str) -> str:
        node = self.current(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        return node
