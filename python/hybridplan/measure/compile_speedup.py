"""Each graph node compiled against eager: the per-node speed-up the planner applies to a Job
with "compile" (Graph nodes[].compile_speedup, docs/formats.md; `hybridplan calibrate --model M
--graph G --compile-graph OUT`, docs/calibration.md "Compiled blocks").

One forward of the model records each node module's inputs (its first call); then each node is
timed alone on them, eager and then compiled the way the executor compiles it
(executor/compiling.compile_blocks: one graph per block, fullgraph), forward alone and forward
with backward (every floating input and parameter requiring its gradient, the output's
gradient ones), timing.timed_samples' medians. speed-up = eager seconds / compiled seconds, the
backward's from the differences (forward+backward - forward). A node torch cannot compile runs
eager in the executor and is recorded at 1 (its eager time). The compiled runs reuse one
compilation: the warm-up calls compile.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from ..executor.compiling import compile_blocks, compiled_state
from ..profiler import block_list
from ..profiler.dataflow import map_tensors
from .timing import timed_samples


def _capture_inputs(module: nn.Module, names, inputs: Tuple[Any, ...]) -> Dict[str, Any]:
    """name -> (args, kwargs) of each named node module's first call in one forward."""
    seen: Dict[str, Any] = {}
    handles = []
    for name in names:
        node = module.get_submodule(name)

        def hook(mod, args, kwargs, _name=name):
            if _name not in seen:
                seen[_name] = map_tensors((args, kwargs), lambda t: t.detach().clone())
        handles.append(node.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _runs(node: nn.Module, call: Any) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    """(forward, forward + backward) of `node` on its recorded call."""
    args, kwargs = call

    def leaf(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.requires_grad_() if t.is_floating_point() else t

    def forward():
        with torch.no_grad():
            return node(*args, **kwargs)

    def forward_backward():
        a, k = map_tensors((args, kwargs), leaf)
        out = node(*a, **k)
        roots = []
        map_tensors(out, lambda t: roots.append(t) or t)
        roots = [t for t in roots if t.requires_grad]
        if roots:
            torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
        node.zero_grad(set_to_none=True)

    return forward, forward_backward


def _seconds(run: Callable[[], Any], device, warmup: int, repeats: int) -> float:
    return statistics.median(timed_samples(run, device, warmup, repeats))


def compile_speedups(module: nn.Module, inputs: Tuple[Any, ...], node_names, device,
                     warmup: int = 3, repeats: int = 11,
                     options: Optional[Dict[str, Any]] = None) -> Dict[str, Dict[str, float]]:
    """name -> {"forward": s_f, "backward": s_b, "eager_s": ..., "compiled_s": ..., "compiled":
    bool} for each graph node name of `module` (a copy is compiled; `module` stays eager)."""
    names = [n for n in node_names if block_list.split_call_name(n)[1] == 0]
    calls = _capture_inputs(module, names, inputs)
    compiled_module = copy.deepcopy(module)
    compile_blocks(compiled_module, names, dict(options or {}))
    out: Dict[str, Dict[str, float]] = {}
    for name in names:
        if name not in calls:
            continue  # never called in forward (block_list.uncalled_nodes): no time of its own
        eager_f, eager_fb = _runs(module.get_submodule(name), calls[name])
        node = compiled_module.get_submodule(name)
        comp_f, comp_fb = _runs(node, calls[name])
        # the compiled ones first: their warm-up compiles (and may fall back to eager)
        cf = _seconds(comp_f, device, max(warmup, 2), repeats)
        cfb = _seconds(comp_fb, device, max(warmup, 2), repeats)
        ef = _seconds(eager_f, device, warmup, repeats)
        efb = _seconds(eager_fb, device, warmup, repeats)
        compiled = bool(compiled_state(node))
        if not compiled:  # the executor runs it eager: priced eager
            out[name] = {"forward": 1.0, "backward": 1.0, "compiled": False,
                         "eager_s": efb, "compiled_s": efb}
            continue
        eb, cb = max(efb - ef, 1e-9), max(cfb - cf, 1e-9)
        out[name] = {"forward": ef / cf, "backward": eb / cb, "compiled": True,
                     "eager_s": efb, "compiled_s": cfb}
    return out


def with_compile_speedups(graph: dict, speedups: Dict[str, Dict[str, float]]) -> dict:
    """A copy of the Graph dict with each measured node's "compile_speedup" (its later calls
    "name@k" take the module's)."""
    g = copy.deepcopy(graph)
    for node in g["nodes"]:
        measured = speedups.get(block_list.split_call_name(node["name"])[0])
        if measured is not None:
            node["compile_speedup"] = {"forward": measured["forward"],
                                       "backward": measured["backward"]}
    return g
