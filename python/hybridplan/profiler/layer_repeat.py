"""A deep stack of identical layers profiled at a few layers and repeated to its full depth: the
graph of a 126-layer Llama from the fake profile of a 3-layer one.

    shallow = fake_profile_dict(model_with_3_layers, ...)
    graph = repeat_layers(shallow, "model.layers.", depth=126)

Why: a fake profile's cost is Python's, per op it dispatches (a few seconds per decoder layer
on this machine), not the model's size; a 126-layer model would take minutes where three
layers take seconds. The layers of a decoder stack are the same module class at the same
shapes, so every layer after the first and before the last prices the same under a device model
(the fake profile's times are a function of shapes alone). The first and the last layer can
differ (what runs between the embedding and layer 0, or between the last layer and the final
norm, is charged to the neighbouring node), so the shallow profile keeps them as they are and
its middle layer is the template of every layer between them.

What is copied: each node's fields (times, bytes, FLOPs, selective recompute, cut points,
batch_times, what it keeps under autocast where recorded), renamed to its layer; the edges inside a layer, the edges from a layer to the
next (taken from the shallow graph's middle layer to its last, or from its first to its
middle for layer 0), and the edges between a layer and the nodes outside the stack (embedding,
rotary embedding, final norm, head) for every layer of the same role. Refused with ValueError:
fewer than three profiled layers, a node outside the stack between two layers, an edge that
skips a layer, a tied parameter held by a layer node, or sequence-parallel fields other than
a region that is the whole stack with every layer alike. Tensor- and sequence-parallel fields
are copied with the rest of each node's fields: a layer's splits, their collectives' bytes and
split times are the same at every depth (the fake profile's are functions of the shapes), and
sequence parallelism's region, the whole stack, has its entry's collective on the first layer's
first node and its exit's on the last layer's last node, the two layers kept as profiled.

`tests/python/test_fake_profile.py` checks that a 3-layer profile repeated to 5 layers equals
the fake profile of the 5-layer model node by node and edge by edge;
`tests/python/test_fake_sequence_parallel.py` the same for the sequence-parallel fields.
"""

from __future__ import annotations

import copy
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["repeat_layers"]


def _layer_of(name: str, prefix: str) -> Optional[Tuple[int, str]]:
    """(layer index, the rest of the name) for a node inside the stack, else None."""
    if not name.startswith(prefix):
        return None
    match = re.match(r"(\d+)(\..*)?$", name[len(prefix):])
    if match is None:
        return None
    return int(match.group(1)), match.group(2) or ""


def repeat_layers(graph: dict, prefix: str, depth: int) -> dict:
    """`graph` (a fake profile of a stack whose layers are the nodes named `prefix`<i>...,
    i = 0 .. n-1, n >= 3) with the stack repeated to `depth` layers (the module doc). Returns a
    new graph dict; `graph` is left as it was."""
    where = f"repeat_layers({graph.get('name', '?')!r}, {prefix!r})"
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 3:
        raise ValueError(f"{where}: depth must be an integer >= 3 (got {depth!r})")
    nodes = graph["nodes"]
    layer = {n["id"]: _layer_of(n["name"], prefix) for n in nodes}
    indices = sorted({lay[0] for lay in layer.values() if lay is not None})
    if len(indices) < 3 or indices != list(range(len(indices))):
        raise ValueError(f"{where}: the graph must hold layers 0 .. n-1 with n >= 3 (the first, "
                         f"a middle one as the template, the last); got layers {indices}")
    last = indices[-1]
    positions = [i for i, n in enumerate(nodes) if layer[n["id"]] is not None]
    inside = range(positions[0], positions[-1] + 1)
    strays = [nodes[i]["name"] for i in inside if layer[nodes[i]["id"]] is None]
    if strays:
        raise ValueError(f"{where}: nodes outside the stack run between its layers: {strays}")
    # sequence parallelism's region: its first node carries the entry's collective, its last
    # the exit's, so it must be the whole stack (first layer to last), each layer alike; the
    # first and the last layer are kept as profiled, so both stay where they are
    with_sp = [n for n in nodes if "sequence_parallel" in n]
    if with_sp:
        outside = [n["name"] for n in with_sp if layer[n["id"]] is None]
        if outside:
            raise ValueError(f"{where}: sequence-parallel fields on nodes outside the stack: "
                             f"{outside[:3]}; only a region that is the whole stack repeats")
        per_layer = [sorted(layer[n["id"]][1] for n in with_sp if layer[n["id"]][0] == i)
                     for i in indices]
        if any(names != per_layer[0] for names in per_layer):
            differ = next(i for i, names in enumerate(per_layer) if names != per_layer[0])
            raise ValueError(f"{where}: layers 0 and {differ} carry sequence-parallel fields on "
                             f"different nodes ({per_layer[0][:3]} against "
                             f"{per_layer[differ][:3]}); only a region that is the whole stack, "
                             f"every layer alike, repeats")
    for tied in graph.get("tied_params", []):
        if any(layer.get(i) is not None for i in tied["nodes"]):
            raise ValueError(f"{where}: a tied parameter is held by a layer node "
                             f"({tied['nodes']}): repeating it would tie every layer")

    def template(j: int) -> int:
        return 0 if j == 0 else last if j == depth - 1 else 1

    before = [n for n in nodes[:positions[0]]]
    after = [n for n in nodes[positions[-1] + 1:]]
    by_layer: Dict[int, List[dict]] = {}
    for n in nodes[positions[0]:positions[-1] + 1]:
        by_layer.setdefault(layer[n["id"]][0], []).append(n)

    out_nodes: List[dict] = []
    new_id: Dict[Tuple[Optional[int], int], int] = {}  # (full layer or None, old id) -> id

    def add(node: dict, j: Optional[int]) -> None:
        copied = copy.deepcopy(node)
        copied["id"] = len(out_nodes)
        if j is not None:
            copied["name"] = f"{prefix}{j}{layer[node['id']][1]}"
        new_id[(j, node["id"])] = copied["id"]
        out_nodes.append(copied)

    for n in before:
        add(n, None)
    for j in range(depth):
        for n in by_layer[template(j)]:
            add(n, j)
    for n in after:
        add(n, None)

    def layers_of_role(t: int) -> List[int]:
        return [j for j in range(depth) if template(j) == t]

    edges: List[dict] = []
    for e in graph["edges"]:
        src, dst = layer[e["src"]], layer[e["dst"]]
        pairs: List[Tuple[int, int]] = []
        if src is None and dst is None:
            pairs = [(new_id[(None, e["src"])], new_id[(None, e["dst"])])]
        elif src is None:
            pairs = [(new_id[(None, e["src"])], new_id[(j, e["dst"])])
                     for j in layers_of_role(dst[0])]
        elif dst is None:
            pairs = [(new_id[(j, e["src"])], new_id[(None, e["dst"])])
                     for j in layers_of_role(src[0])]
        elif src[0] == dst[0]:
            pairs = [(new_id[(j, e["src"])], new_id[(j, e["dst"])])
                     for j in layers_of_role(src[0])]
        elif dst[0] == src[0] + 1:
            # layer j into layer j + 1: the first layer's edges into the template for j = 0,
            # the template's into the last layer for every later j (the same local names)
            if src[0] == 0:
                js = [0]
            elif dst[0] == last:
                js = list(range(1, depth - 1))
            else:
                continue  # a further middle pair (n > 3): the same edges again
            dst_local = layer[e["dst"]][1]
            dst_old = {layer[n["id"]][1]: n["id"] for n in by_layer[1]}
            last_old = {layer[n["id"]][1]: n["id"] for n in by_layer[last]}
            for j in js:
                target = (last_old if j + 1 == depth - 1 else dst_old)[dst_local]
                pairs.append((new_id[(j, e["src"])] if j == 0 else
                              new_id[(j, _same_local(by_layer, layer, 1, e["src"]))],
                              new_id[(j + 1, target)]))
        else:
            raise ValueError(f"{where}: edge {e['src']} -> {e['dst']} skips from layer "
                             f"{src[0]} to layer {dst[0]}; only edges to the next layer repeat")
        for s, d in pairs:
            edges.append({**{k: v for k, v in e.items() if k not in ("src", "dst")},
                          "src": s, "dst": d})
    out = {k: copy.deepcopy(v) for k, v in graph.items() if k not in ("nodes", "edges")}
    out["nodes"], out["edges"] = out_nodes, edges
    out["tied_params"] = [{**t, "nodes": [new_id[(None, i)] for i in t["nodes"]]}
                          for t in graph.get("tied_params", [])]
    return out


def _same_local(by_layer, layer, t: int, old_id: int) -> int:
    """The id of the node of layer `t` with the same local name as node `old_id`."""
    local = layer[old_id][1]
    return next(n["id"] for n in by_layer[t] if layer[n["id"]][1] == local)
