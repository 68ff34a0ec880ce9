"""Which node feeds which (the graph's edges); the nodes themselves are block_list's.

Edges come from the real dataflow, two ways:
- torch.fx: trace with the node modules as leaves (call_module), then walk each node's
  arguments back through functional ops (add, cat, flatten, getitem, ...) to the node modules
  that produced them;
- hooks (fallback for models fx cannot trace): run the model once with forward hooks that
  remember which node produced which tensor (by tensor identity, by autograd grad_fn, and by
  storage for views of tensors without autograd history) and look up each node's inputs.
Edge bytes are the bytes of the producer's output tensors the consumer reads (for an LSTM whose
consumer reads only `output`, not `(h, c)`, only `output`).

A value computed by functional ops between nodes belongs to the first node that reads it: the
executor's cut runs such ops on the stage of the next node module in execution order
(stage_split._place_markers), which is the first reader in models' forwards. A later reader's
edge then comes from that first reader, with the value's bytes, and the walk back stops there,
where the first reader is upstream of the later reader anyway (one of the later reader's other
producers, or their ancestor). Without this rule a residual stream (x = x + f(x) at every layer)
would be an edge from every earlier layer to every later one, charging a pipeline boundary for
each, where the cut carries the stream once. Where the first reader is not upstream (two
branches reading one concatenation), the edge would be a dependency the model does not have, so
the later reader's edges come from the value's producers, as the first reader's do.
"""

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from . import block_list

EdgeKey = Tuple[str, str]  # (producer node name, consumer node name)


def storage_key(t: torch.Tensor) -> int:
    """A key for `t`'s storage, unique while the storage lives: its address, or for a fake
    tensor (whose address is 0 for every storage) the storage object's own identity."""
    storage = t.untyped_storage()
    return storage._cdata if isinstance(t, FakeTensor) else storage.data_ptr()


def reused_stateless(nodes: Dict[str, nn.Module], flow: "Dataflow") -> List[str]:
    """Parameter-free node modules called more than once in one forward, like torchvision's
    ResNet blocks calling one self.relu twice. Such a module is a stateless function used in
    several places, not one place in the graph: merged into one node it would make edges
    run backwards (a cycle), so the profiler treats it as a functional op instead."""
    return [name for name, count in flow.calls.items()
            if count > 1 and not any(True for _ in nodes[name].parameters())]


def orphan_parameters(module: nn.Module, nodes: Dict[str, nn.Module]
                      ) -> Dict[str, nn.Parameter]:
    """Qualified name -> parameter, for the parameters inside no node (by the node rule, those
    the root holds directly: a ViT's class token and position embedding)."""
    inside = {id(p) for m in nodes.values() for p in m.parameters()}
    return {name: p for name, p in module.named_parameters() if id(p) not in inside}


def tensors_in(value: Any) -> List[torch.Tensor]:
    """Every tensor in a nested tuple/list/dict, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`value` with fn applied to every tensor in its nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def resize_batch(value: Any, want: int, batch_dim: int = 0, have: Optional[int] = None) -> Any:
    """`value` with its tensors cut or repeated (cyclically) to `want` samples along `batch_dim`:
    every tensor with that dimension, or with `have` given, only those whose batch dimension
    is `have` (a tensor of another size there is not a batch). An example brought to a plan's
    per-replica batch (the front door) or a switch's (executor/switching.py)."""
    def resize(t: torch.Tensor) -> torch.Tensor:
        if t.dim() <= batch_dim or t.shape[batch_dim] == 0 or t.shape[batch_dim] == want:
            return t
        if have is not None and t.shape[batch_dim] != have:
            return t
        index = torch.arange(want, device=t.device) % t.shape[batch_dim]
        return t.index_select(batch_dim, index)
    return map_tensors(value, resize)


def nbytes_tree(value: Any) -> Any:
    """The nested structure of `value` with each tensor replaced by its size in bytes."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return [nbytes_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: nbytes_tree(v) for k, v in value.items()}
    return 0


def tree_total(tree: Any) -> int:
    if isinstance(tree, int):
        return tree
    if isinstance(tree, list):
        return sum(tree_total(v) for v in tree)
    if isinstance(tree, dict):
        return sum(tree_total(v) for v in tree.values())
    return 0


def shapes_of(value: Any) -> List[List[int]]:
    return [list(t.shape) for t in tensors_in(value)]


@dataclass
class Dataflow:
    """What one hooked forward pass saw."""
    # graph nodes in execution order: one per call of a node module (block_list.call_name)
    order: List[str] = field(default_factory=list)
    calls: Dict[str, int] = field(default_factory=dict)      # node module name -> times called
    output_tree: Dict[str, Any] = field(default_factory=dict)  # graph node -> output nbytes_tree
    edges: Dict[EdgeKey, int] = field(default_factory=dict)  # hook-derived edges -> bytes
    # orphan parameter name -> the first node whose inputs were computed from it
    param_readers: Dict[str, str] = field(default_factory=dict)
    # node name -> bytes autograd saved for backward while it ran (see _SavedBytes)
    saved_bytes: Dict[str, int] = field(default_factory=dict)


class _Producers:
    """Remembers which node produced which tensor during one forward pass."""

    def __init__(self) -> None:
        self.by_id: Dict[int, Tuple[str, int]] = {}        # id(tensor) -> (node, bytes)
        # id(grad_fn) -> (node, output_nr -> bytes)
        self.by_grad_fn: Dict[int, Tuple[str, Dict[int, int]]] = {}
        self.by_storage: Dict[int, Tuple[str, int]] = {}    # storage_key -> (node, bytes)
        # (id(grad_fn), output_nr) of a functional value -> (its first reader, bytes, grad_fn,
        # output_nr); holding grad_fn keeps the id unique
        self.first_reader: Dict[Tuple[int, int], Tuple[str, int, Any, int]] = {}
        self.parameters: set = set()  # names of the orphan parameters added as producers
        self._keep_alive: List[Any] = []  # ids are only unique while the objects live

    def add_outputs(self, name: str, output: Any) -> None:
        for t in tensors_in(output):
            nbytes = t.numel() * t.element_size()
            self._keep_alive.append(t)
            self.by_id[id(t)] = (name, nbytes)
            if t.grad_fn is not None:
                self._keep_alive.append(t.grad_fn)
                if self.by_grad_fn.get(id(t.grad_fn), (name,))[0] != name:
                    # a node that returns its input unchanged (dropout with p=0, identity):
                    # later readers read it from this node, once
                    del self.by_grad_fn[id(t.grad_fn)]
                _, per_output = self.by_grad_fn.setdefault(id(t.grad_fn), (name, {}))
                per_output[t.output_nr] = per_output.get(t.output_nr, 0) + nbytes
            if t.numel() and t.layout == torch.strided and t.device.type != "meta":
                self.by_storage[storage_key(t)] = (name, nbytes)

    def add_parameter(self, name: str, p: torch.Tensor) -> None:
        """Marks an orphan parameter as a producer: a node whose input is computed from it (a
        class token concatenated to its input) reads it. Its autograd leaf node (AccumulateGrad)
        stands for it in the autograd walk."""
        self.by_id[id(p)] = (name, 0)
        self.parameters.add(name)
        if p.requires_grad and torch.is_grad_enabled():
            leaf = p.view_as(p).grad_fn.next_functions[0][0]
            self._keep_alive.append(leaf)
            self.by_grad_fn[id(leaf)] = (name, {0: 0})

    def producers_of(self, t: torch.Tensor, reader: str) -> Dict[Tuple[str, Any], int]:
        """(producer, distinguishing key) -> bytes, for the node outputs and the functional
        values first read by earlier nodes (key ("read", ...)) that `t` was computed from;
        functional values met for the first time become `reader`'s (see the module doc)."""
        # autograd history first: it survives in-place ops (out += x), which keep the tensor
        # object but add an input; identity and storage serve tensors without history
        if t.grad_fn is not None:
            return self._walk_autograd(t.grad_fn, t.output_nr, reader)
        if id(t) in self.by_id:
            name, nbytes = self.by_id[id(t)]
            return {(name, id(t)): nbytes}
        if (t.numel() and t.layout == torch.strided and t.device.type != "meta"
                and storage_key(t) in self.by_storage):
            name, nbytes = self.by_storage[storage_key(t)]
            return {(name, ("storage", name)): nbytes}
        return {}

    def upstream_only(self, consumed: Dict[Tuple[str, Any], int],
                      edges: Dict[EdgeKey, int]) -> Dict[Tuple[str, Any], int]:
        """`consumed` with each value read from a first reader that is not upstream of the
        reader's other producers replaced by the value's own producers (see the module doc)."""
        if not any(_is_read(key) for _, key in consumed):
            return consumed
        direct = {name for name, key in consumed if not _is_read(key)}
        upstream = ancestors_or_self(direct, edges)
        resolved: Dict[Tuple[str, Any], int] = {}
        for (name, key), nbytes in consumed.items():
            if _is_read(key) and name not in upstream:
                _, _, fn, nr = self.first_reader[key[1]]
                resolved.update(self._walk_autograd(fn, nr, reader=None))
            else:
                resolved[(name, key)] = nbytes
        return resolved

    def _walk_autograd(self, grad_fn: Any, output_nr: int, reader: Optional[str]
                       ) -> Dict[Tuple[str, Any], int]:
        """Node outputs `grad_fn`'s output `output_nr` was computed from; with a reader, values
        first read by earlier nodes stop the walk and new ones become the reader's."""
        found: Dict[Tuple[str, Any], int] = {}
        from_node: Dict[Tuple[int, int], bool] = {}  # value -> computed from a node's output
        functional: List[Tuple[Tuple[int, int], Any, int, List[Tuple[int, int]]]] = []
        stack = [(grad_fn, output_nr)]
        while stack:
            fn, nr = stack.pop()
            key = (id(fn), nr)
            if fn is None or key in from_node:
                continue
            if id(fn) in self.by_grad_fn:
                name, per_output = self.by_grad_fn[id(fn)]
                found[(name, key)] = per_output.get(nr, sum(per_output.values()))
                from_node[key] = name not in self.parameters
                continue
            if reader is not None and key in self.first_reader:
                name, nbytes, _, _ = self.first_reader[key]
                found[(name, ("read", key))] = nbytes
                from_node[key] = True
                continue
            from_node[key] = False
            inputs = [(f, n) for f, n in fn.next_functions if f is not None]
            functional.append((key, fn, nr, [(id(f), n) for f, n in inputs]))
            stack.extend(inputs)
        changed = True
        while changed:  # a value is from a node if any of its inputs is (to a fixed point)
            changed = False
            for key, _, _, inputs in reversed(functional):
                if not from_node[key] and any(from_node.get(i, False) for i in inputs):
                    from_node[key] = changed = True
        for key, fn, nr, _ in functional:
            # values of inputs and parameters alone have no producer node
            if reader is not None and from_node[key]:
                self.first_reader[key] = (reader, _value_bytes(fn, nr), fn, nr)
        return found


def _is_read(key: Any) -> bool:
    return isinstance(key, tuple) and len(key) == 2 and key[0] == "read"


def ancestors_or_self(names: Any, edges: Any) -> set:
    """`names` and every node upstream of them along `edges` ((src, dst) pairs)."""
    producers: Dict[str, List[str]] = {}
    for src, dst in edges:
        producers.setdefault(dst, []).append(src)
    found, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name not in found:
            found.add(name)
            stack.extend(producers.get(name, ()))
    return found


def _value_bytes(fn: Any, nr: int) -> int:
    """Bytes of forward output `nr` of the op whose backward is `fn` (its gradient's shape)."""
    metadata = fn._input_metadata
    if nr >= len(metadata) or metadata[nr].is_nested_tensor:
        return 0
    meta = metadata[nr]
    return int(torch.Size(meta.shape).numel()) * meta.dtype.itemsize


class _SavedBytes:
    """torch.autograd.graph.saved_tensors_hooks that charge each tensor autograd saves for
    backward to the node running when it is saved (or, between nodes, to the last node that ran;
    before the first node, to the first): the activation memory a node keeps until its backward.
    Each storage is counted once (a tensor saved by two ops is held once), with its whole size (a
    saved view keeps its base alive); parameters and buffers are excluded (the model's memory,
    counted apart)."""

    def __init__(self, module: nn.Module, flow: "Dataflow", running: List[Tuple[str, Any]]):
        self.flow, self.running = flow, running
        self.model_storages = {storage_key(t)
                               for t in list(module.parameters()) + list(module.buffers())
                               if t.layout == torch.strided and t.device.type != "meta"}
        self.seen: set = set()
        self.pending = 0  # saved before the first node ran

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout != torch.strided or t.device.type == "meta" or not t.numel():
            return t
        key = storage_key(t)
        if key in self.model_storages or key in self.seen:
            return t
        self.seen.add(key)
        owner = self.running[-1][0] if self.running else (
            self.flow.order[-1] if self.flow.order else None)
        self.charge(owner, t, t.untyped_storage().nbytes())
        return t

    def charge(self, owner: Optional[str], t: torch.Tensor, nbytes: int) -> None:
        """Adds a saved storage of `nbytes` to `owner`'s saved bytes (None: before the first
        node, charged to it by finish())."""
        if owner is None:
            self.pending += nbytes
        else:
            self.flow.saved_bytes[owner] = self.flow.saved_bytes.get(owner, 0) + nbytes

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def finish(self) -> None:
        if self.pending and self.flow.order:
            first = self.flow.order[0]
            self.flow.saved_bytes[first] = self.flow.saved_bytes.get(first, 0) + self.pending


def record_dataflow(module: nn.Module, nodes: Dict[str, nn.Module],
                    inputs: Sequence[Any], kwargs: Optional[Dict[str, Any]] = None,
                    loss: Optional[Callable[[Any], torch.Tensor]] = None,
                    saved_bytes: Callable[..., "_SavedBytes"] = None
                    ) -> Tuple[Dataflow, Any]:
    """Runs module(*inputs, **kwargs) once with hooks; returns what it saw and the output. With
    `loss` (output -> scalar), what the loss saves for backward is the last node's, as its time
    is (block_timing). `saved_bytes(module, flow, running)`: the counter of what autograd saves
    (default _SavedBytes; block_timing.saved_under_autocast passes one that charges autocast's
    weight copies apart). A failing forward becomes a ValueError naming the node that was
    running and its input shapes."""
    flow = Dataflow()
    producers = _Producers()
    orphans = orphan_parameters(module, nodes)
    for name, p in orphans.items():
        producers.add_parameter(name, p)
    running: List[Tuple[str, Any]] = []  # (graph node, input shapes) of calls entered, not left
    counter = block_list.CallCounter()

    def pre_hook(name):
        def hook(mod, args, kwargs):
            node = counter.current(name)
            consumed: Dict[Tuple[str, Any], int] = {}
            for t in tensors_in((args, kwargs)):
                consumed.update(producers.producers_of(t, node))
            for (src, _), nbytes in producers.upstream_only(consumed, flow.edges).items():
                if src in orphans:
                    flow.param_readers.setdefault(src, node)
                elif src != node:
                    flow.edges[(src, node)] = flow.edges.get((src, node), 0) + nbytes
            running.append((node, shapes_of((args, kwargs))))
        return hook

    def post_hook(name):
        def hook(mod, args, kwargs, output):
            running.pop()
            node = counter.finish(name)
            flow.calls[name] = flow.calls.get(name, 0) + 1
            flow.order.append(node)
            flow.output_tree[node] = nbytes_tree(output)
            producers.add_outputs(node, output)
        return hook

    handles = []
    for name, mod in nodes.items():
        handles.append(mod.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        handles.append(mod.register_forward_hook(post_hook(name), with_kwargs=True))
    saved = (saved_bytes or _SavedBytes)(module, flow, running)
    try:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            output = module(*inputs, **(kwargs or {}))
            if loss is not None and flow.order:
                loss(output)
        saved.finish()
    except Exception as exc:  # re-raised as ValueError naming where the forward failed
        raise ValueError(_forward_failure(module, nodes, flow, running, (inputs, kwargs),
                                          exc)) from exc
    finally:
        for h in handles:
            h.remove()
    return flow, output


def _forward_failure(module, nodes, flow, running, inputs, exc) -> str:
    given = shapes_of(inputs)
    if running:
        name, shapes = running[-1]
        module_type = type(nodes[block_list.module_name(name)]).__name__
        where = f"module '{name}' ({module_type}) with input shapes {shapes}"
    elif flow.order:
        where = f"code after module '{flow.order[-1]}' in {type(module).__name__}.forward"
    else:
        where = f"{type(module).__name__}.forward before any submodule ran"
    return (f"profile: forward failed in {where}; example_inputs shapes {given}: "
            f"{type(exc).__name__}: {exc}")


# ---- torch.fx ---------------------------------------------------------------------------------

class _NodeTracer(torch.fx.Tracer):
    """Traces node modules as call_module leaves and everything else through."""

    def __init__(self, node_names):
        super().__init__()
        self.node_names = set(node_names)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.node_names


def fx_edges(module: nn.Module, nodes: Dict[str, nn.Module], flow: Dataflow,
             inputs: Sequence[Any], kwargs: Optional[Dict[str, Any]] = None
             ) -> Dict[EdgeKey, int]:
    """Edges from a torch.fx trace; raises whatever fx raises on untraceable models. Bytes come
    from the hooked run's outputs, indexed by the getitem path the consumer reads, and, for a
    functional value first read by an earlier node (see the module doc), from running the
    traced graph on the inputs."""
    root_is_node = len(nodes) == 1 and next(iter(nodes.values())) is module
    if root_is_node:
        return {}
    graph = _NodeTracer(nodes).trace(module)
    calls = _call_names(graph, nodes)
    first_reader: Dict[torch.fx.Node, str] = {}
    from_node: set = set()  # fx values computed from a node's output
    for n in graph.nodes:
        if _is_node_call(n, nodes) or any(a in from_node for a in n.all_input_nodes):
            from_node.add(n)
    found: List[Tuple[str, str, Any]] = []  # (producer, consumer, getitem path or fx value)
    for fx_node in graph.nodes:
        if not _is_node_call(fx_node, nodes):
            continue
        consumer = calls[fx_node]
        reads = _fx_producers(fx_node.all_input_nodes, nodes, calls, first_reader, from_node,
                              consumer)
        values = [(p, read) for p, read in reads if isinstance(read, torch.fx.Node)]
        direct = {p for p, read in reads if not isinstance(read, torch.fx.Node)}
        upstream = ancestors_or_self(direct, [(p, c) for p, c, _ in found]) if values else set()
        for producer, read in values:
            if producer not in upstream:
                reads.discard((producer, read))  # not upstream: read from its producers
                reads |= _fx_producers([read], nodes, calls, None, from_node, consumer)
        for producer, read in reads:
            if producer != consumer:
                found.append((producer, consumer, read))
    value_bytes = (_fx_value_bytes(torch.fx.GraphModule(module, graph), inputs, kwargs or {})
                   if any(isinstance(read, torch.fx.Node) for _, _, read in found) else {})
    edges: Dict[EdgeKey, int] = {}
    for producer, consumer, read in found:
        if isinstance(read, torch.fx.Node):
            nbytes = value_bytes.get(read, 0)
        elif producer in flow.output_tree:
            nbytes = tree_total(_index(flow.output_tree[producer], read))
        else:
            continue
        edges[(producer, consumer)] = edges.get((producer, consumer), 0) + nbytes
    return edges


def _fx_value_bytes(gm: torch.fx.GraphModule, inputs: Sequence[Any], kwargs: Dict[str, Any]
                    ) -> Dict[torch.fx.Node, int]:
    """fx node -> bytes of the tensors it computed, from one forward of the traced graph."""
    sizes: Dict[torch.fx.Node, int] = {}

    class _Sizes(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            sizes[n] = tree_total(nbytes_tree(out))
            return out

    args = list(inputs)
    for p in [n for n in gm.graph.nodes if n.op == "placeholder"][len(args):]:
        if p.target not in kwargs:
            break  # the rest take their defaults
        args.append(kwargs[p.target])
    with torch.no_grad():
        _Sizes(gm).run(*args)
    return sizes


def _is_node_call(n: torch.fx.Node, nodes) -> bool:
    return n.op == "call_module" and n.target in nodes


def _call_names(graph: torch.fx.Graph, nodes) -> Dict[torch.fx.Node, str]:
    """fx call of a node module -> its graph node (block_list.call_name, in graph order)."""
    counter = block_list.CallCounter()
    return {n: counter.finish(n.target) for n in graph.nodes if _is_node_call(n, nodes)}


def _getitem_chain(n: torch.fx.Node, nodes, calls) -> Optional[Tuple[str, Tuple[Any, ...]]]:
    """For getitem(getitem(node_call, i), j): (graph node, (i, j)); None if not such a chain."""
    path: List[Any] = []
    while n.op == "call_function" and n.target is operator.getitem:
        path.append(n.args[1])
        n = n.args[0]
    if path and _is_node_call(n, nodes):
        return calls[n], tuple(reversed(path))
    return None


def _fx_producers(start: Sequence[torch.fx.Node], nodes, calls,
                  first_reader: Optional[Dict[torch.fx.Node, str]], from_node: set,
                  consumer: str) -> set:
    """{(producer node name, what it reads)} reachable from `start` (a consumer's arguments)
    through non-node fx nodes: a node's output (read: the getitem index path) or, with
    `first_reader`, a functional value an earlier node read first (read: its fx node).
    Functional values computed from a node's output (`from_node`) met for the first time
    become `consumer`'s, in `first_reader`; without it the walk goes on to node outputs."""
    found = set()
    stack = list(start)
    seen = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if _is_node_call(n, nodes):
            found.add((calls[n], ()))
            continue
        chain = _getitem_chain(n, nodes, calls)
        if chain is not None:
            found.add(chain)
            continue
        if first_reader is not None:
            if n in first_reader:
                found.add((first_reader[n], n))
                continue
            if n in from_node:
                first_reader[n] = consumer
        stack.extend(n.all_input_nodes)
    return found


def _index(tree: Any, path: Tuple[Any, ...]) -> Any:
    for key in path:
        try:
            tree = tree[key]
        except (IndexError, KeyError, TypeError):
            return tree  # a path fx saw but the run did not produce: charge the whole output
    return tree
