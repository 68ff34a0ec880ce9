"""A stage's backward split in two, for the zero-bubble pipeline schedules (ZB1P and ZB-V,
https://arxiv.org/abs/2401.10241): "I" computes the gradient of the stage's inputs, which the
previous stage waits for, and "W" later computes the gradient of the parameters, which nothing
waits for, in a bubble of the schedule. The gradients are exactly those of one backward.

    state = backward_input(outputs, output_grads, inputs, params)   # -> (input grads, state)
    backward_weight(state)                                          # params' .grad += dW

Why not torch's own split (torch.distributed.pipelining._backward.stage_backward_input /
stage_backward_weight, torch 2.13): on the stages a cut produces it computes wrong parameter
gradients or fails:
- Its W runs one autograd.grad per group of parameters, from the group's "intermediates" (the
  nodes where the parameters' part of the graph meets the inputs' part), freeing the graph as
  it goes; a group's pass also runs through input-side nodes to another group's intermediates
  (a decoder layer's cross-attention: the residual Add reaches the attention through
  out_proj's Addmm), so that a later group finds its graph freed ("Trying to backward through
  the graph a second time") or, in the other order, counts those paths twice. Its grouping
  can leave a parameter in two groups (a dict entry keyed by an intermediate still points to a
  group merged since).
- A parameter whose path to the stage's outputs never meets an input that needs a gradient (a
  module reading only batch inputs whose result is carried to the next stage) is in no group
  and gets no gradient at all.
- It detaches every stage output in place after I, which fails for an output that is a view,
  and for an output some backward node saved (a softmax's result) makes W fail ("Trying to use
  a saved tensor that has been detached in-place"). This split keeps the outputs as they are:
  the cache that holds them until W holds their graph a little longer.
- It assigns `param.grad` from autograd.grad, so no AccumulateGrad node runs and
  DistributedDataParallel's reducer, which hooks those nodes, never all-reduces the gradient.

This module's split:
- The graph is divided at the stage's inputs: the "input region" is every node on a path from
  an input that needs a gradient to an output (the nodes I must run); the "weight side" is the
  nodes outside it from which a parameter is reached. A "boundary" node is an input-region node
  with an edge into the weight side (a matmul reading an activation and a weight). Outputs on
  the weight side (computed from parameters and batch inputs alone) are "free roots".
- I runs autograd.grad(outputs -> inputs, retain_graph) and records, with a pre-hook, the
  gradient each boundary node receives: it is final there (every path from the outputs to the
  node lies in the input region, which I runs in full).
- W runs each boundary node once more from its recorded gradient, for its edges into the
  weight side only (the weight-gradient half of a matmul's backward; autograd computes no
  input-side output nobody asks for). Nodes it would otherwise run on the way to another of
  its edges pass no gradient meanwhile (pre-hooks; see backward_weight), so each edge gets this
  node's own share. Boundary nodes whose edges meet at one weight-side node (an LSTM's bias,
  added at every step; a layer applied several times) run in one pass together, each from its
  own recorded gradient (_passes): one pass per node there runs the whole recurrence below
  each node again, quiet, to reach the shared node, and W of a projected LSTM took 8.6, 29,
  109 and 538 ms at 16, 32, 64 and 128 steps that way, against 2.6, 5.4, 12.5 and 24.6 ms in
  passes and 1.2-10.5 ms for its plain backward (bench/bench_split_backward.py). Then one
  autograd.backward from those edges and the free roots runs the weight side into the
  parameters. No gradient reaches an edge twice and nothing is freed under another pass.
  AccumulateGrad runs, so gradient hooks (DDP's reducer, FSDP's) see the gradients as after a
  plain backward. On CPU, I + W of 4 TransformerEncoderLayers (d 256, 8 x 64 tokens) took
  46 + 45 ms against 85 ms for one backward (the Python bookkeeping ~1 ms).
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from torch.autograd.graph import GradientEdge, Node


def _node_of(t: torch.Tensor) -> Optional[Node]:
    """A tensor's grad_fn, or for a leaf that needs a gradient its AccumulateGrad node."""
    if t.grad_fn is not None:
        return t.grad_fn
    if t.requires_grad:
        return t.view_as(t).grad_fn.next_functions[0][0]
    return None


def _consumers(roots: Sequence[Node]) -> Dict[Node, List[Node]]:
    """node -> the nodes that pass their gradient to it (toward the outputs): the graph below
    `roots` with its edges reversed."""
    users: Dict[Node, List[Node]] = collections.defaultdict(list)
    seen: Set[Node] = set()
    queue = collections.deque(n for n in roots if n is not None)
    seen.update(queue)
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            users[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return users


def _reach(starts: Sequence[Node], users: Dict[Node, List[Node]], stop: Set[Node]
           ) -> Tuple[Set[Node], Set[Node]]:
    """(nodes reached from `starts` toward the outputs without entering `stop`, the `stop`
    nodes met)."""
    reached: Set[Node] = set()
    met: Set[Node] = set()
    queue = collections.deque()
    for n in starts:
        if n is not None and n not in reached:
            if n in stop:
                met.add(n)
                continue
            reached.add(n)
            queue.append(n)
    while queue:
        for user in users.get(queue.popleft(), ()):
            if user in stop:
                met.add(user)
            elif user not in reached:
                reached.add(user)
                queue.append(user)
    return reached, met


class WeightState:
    """What W needs from I: the boundary nodes, each with its edges into the weight side, and
    their recorded gradients; the nodes W must not run a gradient through while it runs one
    boundary node; the free roots with their output gradients; the parameters to accumulate
    into."""

    def __init__(self):
        # the boundary nodes, each with its edges into the weight side, in the groups W runs a
        # pass each (_passes)
        self.passes: List[List[Tuple[Node, List[Tuple[Node, int]]]]] = []
        self.silent: Set[Node] = set()  # nodes a boundary node's own pass must not run through
        self.grads: Dict[Node, Tuple[Optional[torch.Tensor], ...]] = {}
        self.free_roots: List[Tuple[GradientEdge, torch.Tensor]] = []
        self.params: List[torch.Tensor] = []


def backward_input(outputs: Sequence[torch.Tensor], output_grads: Optional[Sequence[Any]],
                   inputs: Sequence[Any], params: Sequence[torch.Tensor]
                   ) -> Tuple[Tuple[Optional[torch.Tensor], ...], WeightState]:
    """I: the gradients of `inputs` (None where an input needs none) from `outputs` and their
    gradients (`output_grads` None: the outputs are a loss, gradient 1), and the state W needs."""
    roots: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for i, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor) or (not out.requires_grad and out.grad_fn is None):
            continue
        grad = torch.ones_like(out) if output_grads is None else output_grads[i]
        if grad is not None:  # no gradient came back for it: it adds nothing
            roots.append((out, grad))
    needing = [(i, x) for i, x in enumerate(inputs)
               if isinstance(x, torch.Tensor) and x.requires_grad]
    state = WeightState()
    root_nodes = [_node_of(out) for out, _ in roots]
    users = _consumers(root_nodes)
    region, _ = _reach([_node_of(x) for _, x in needing], users, set())
    param_nodes = {}
    for p in params:
        if p.requires_grad:
            param_nodes[_node_of(p)] = p
    weight_side, boundary = _reach(list(param_nodes), users, region)
    boundary_edges: List[Tuple[Node, List[Tuple[Node, int]]]] = []
    for node in boundary:  # its edges into the weight side, each once
        edges = list(dict.fromkeys((child, nr) for child, nr in node.next_functions
                                   if child is not None and child in weight_side))
        boundary_edges.append((node, edges))
        state.silent.update(c for c, _ in edges if c.next_functions)
    # the input-region nodes below a boundary node (toward the inputs): W may reach them
    queue = collections.deque(boundary)
    while queue:
        for child, _ in queue.popleft().next_functions:
            if child is not None and child in region and child not in boundary \
                    and child not in state.silent and child.next_functions:
                state.silent.add(child)
                queue.append(child)
    state.passes = _passes(boundary_edges, users)
    state.params = [p for n, p in param_nodes.items() if n in weight_side]
    for (out, grad), node in zip(roots, root_nodes):
        if node in weight_side:  # an output outside the input region that reaches parameters
            state.free_roots.append((GradientEdge(node, out.output_nr if out.grad_fn is not None
                                                  else 0), grad))

    def recorder(node):
        def hook(grad_outputs):
            state.grads[node] = tuple(grad_outputs)
        return hook
    handles = [node.register_prehook(recorder(node)) for node in boundary]
    try:
        result: List[Optional[torch.Tensor]] = [None] * len(inputs)
        if needing and roots:
            grads = torch.autograd.grad([out for out, _ in roots], [x for _, x in needing],
                                        [g for _, g in roots], retain_graph=True,
                                        allow_unused=True)
            for (i, _), g in zip(needing, grads):
                # contiguous, as a full backward's AccumulateGrad leaves it: it is sent, and
                # Gloo sends only contiguous tensors (autograd.grad may return an expanded one)
                result[i] = g.contiguous() if g is not None else None
    finally:
        for handle in handles:
            handle.remove()
    return tuple(result), state


def _passes(boundary: List[Tuple[Node, List[Tuple[Node, int]]]],
            users: Dict[Node, List[Node]]) -> List[List[Tuple[Node, List[Tuple[Node, int]]]]]:
    """The boundary nodes in groups that W runs in one pass each (union-find):
    - nodes whose edges lead into one weight-side node share a pass (an LSTM's bias, added at
      every step; a layer applied several times): a pass per node would run the whole graph
      below each node again, quiet, to reach the shared node;
    - a boundary node that such a pass runs through on its way (below the pass's nodes and above
      one of its edges: an LSTM's earlier steps) joins it, so that it runs once, from its own
      gradient, and not also quiet in that pass. It then computes its input-side gradient once
      more, which nobody uses, where its own pass would not.
    Other nodes run alone: a pass of several layers' nodes would compute every input-side
    gradient below it again (W of 4 transformer layers: 79 ms in one pass, 44 ms node by node,
    85 ms for their plain backward)."""
    index = {node: i for i, (node, _) in enumerate(boundary)}
    parent = list(range(len(boundary)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: Dict[Node, int] = {}  # weight-side node -> the first boundary node with an edge to it
    for i, (_, edges) in enumerate(boundary):
        for child, _ in edges:
            parent[find(i)] = find(first.setdefault(child, i))
    searched: Set[frozenset] = set()
    grown = True
    while grown:
        grown = False
        members: Dict[int, List[int]] = collections.defaultdict(list)
        for i in range(len(boundary)):
            members[find(i)].append(i)
        for root, group in members.items():
            if len(group) < 2 or frozenset(group) in searched:
                continue
            searched.add(frozenset(group))
            # the nodes the pass runs: below its nodes, and above one of its edges
            above, _ = _reach([c for i in group for c, _ in boundary[i][1]], users, set())
            seen = {boundary[i][0] for i in group}
            queue = collections.deque(seen)
            while queue:
                for child, _ in queue.popleft().next_functions:
                    if child is not None and child in above and child not in seen:
                        seen.add(child)
                        queue.append(child)
                        j = index.get(child)
                        if j is not None and find(j) != find(root):
                            parent[find(j)] = find(root)
                            grown = True
    groups: Dict[int, List[Tuple[Node, List[Tuple[Node, int]]]]] = {}
    for i, entry in enumerate(boundary):
        groups.setdefault(find(i), []).append(entry)
    return list(groups.values())


def backward_weight(state: WeightState) -> None:
    """W: accumulates the parameters' gradients (see the module doc) and releases the graph."""
    into: Dict[Tuple[Node, int], torch.Tensor] = {}  # weight-side edge -> its gradient

    def add(key, grad):
        into[key] = into[key] + grad if key in into else grad

    # Each group of boundary nodes (_passes) runs from their recorded gradients into their
    # weight-side edges. The engine would also run every node on another path from them to one
    # of those edges: an input-region node below them (an LSTM's recurrence below every step's
    # bias; ALBERT's shared layer reads one transposed weight in calls that follow each other),
    # or a weight-side child that leads to another edge (a weight read as a view). Those pass no
    # gradient meanwhile, so each edge gets only the running nodes' own shares (a capture
    # precedes the node's hooks); a running node takes its recorded gradient, whatever reached
    # it on the way.
    running: Set[Node] = set()

    def quiet(node):
        def hook(grad_outputs):
            recorded = state.grads.get(node) if node in running else None
            return tuple(recorded) if recorded is not None else tuple(None for _ in grad_outputs)
        return hook
    boundary = {node for group in state.passes for node, _ in group}
    handles = [node.register_prehook(quiet(node)) for node in state.silent | boundary]
    try:
        for group in state.passes:
            saved = [(GradientEdge(node, i), g) for node, node_edges in group if node_edges
                     for i, g in enumerate(state.grads.get(node, ())) if g is not None]
            edges = list(dict.fromkeys(e for _, node_edges in group for e in node_edges))
            if not saved or not edges:
                continue
            running.clear()
            running.update(node for node, _ in group)
            grads = torch.autograd.grad([e for e, _ in saved],
                                        [GradientEdge(c, nr) for c, nr in edges],
                                        [g for _, g in saved], retain_graph=True,
                                        allow_unused=True)
            for key, grad in zip(edges, grads):
                if grad is not None:
                    add(key, grad)
    finally:
        for handle in handles:
            handle.remove()
    for edge, grad in state.free_roots:
        add((edge.node, edge.output_nr), grad)
    state.passes, state.grads, state.free_roots, state.silent = [], {}, [], set()
    if into and state.params:
        torch.autograd.backward([GradientEdge(n, nr) for n, nr in into],
                                grad_tensors=list(into.values()), inputs=state.params)
