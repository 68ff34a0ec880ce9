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
"""

from typing import Dict, Iterable, Optional

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


def node_of(qualified_name: str, node_names: Iterable[str]) -> Optional[str]:
    """The node that contains the module or tensor at `qualified_name` ("enc0.self_attn.out_proj"
    -> "enc0.self_attn"), or None where it belongs to no node (the root's own parameters, or a
    module that is not inside any node)."""
    names = set(node_names)
    parts = qualified_name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in names:
            return prefix
    return None
