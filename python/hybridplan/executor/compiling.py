"""torch.compile per graph block: `apply(..., compile=True)` (docs/training_step.md "Compiled
blocks").

Each graph node's module (profiler.block_list: the modules the plan places, one definition)
gets its forward compiled by torch.compile as one graph (fullgraph=True), the way torchtitan
compiles each transformer block: the module object, its parameters, its names and its hooks
stay as they are (the placement's input moves, DDP's hooks and recompute's checkpoint wrap the
compiled forward), so the plan applies to the compiled module unchanged. nn.Module.compile()
is not used: it compiles the module's _call_impl, a frame Dynamo skips (torch/nn is in its skip
list: "torch.compile with fullgraph=True found no compiled frames"); a function of this module
calling the forward is a frame Dynamo traces, inlining the forward.

Where torch cannot compile a block (a graph break under fullgraph, a backend failure), its
first call raises; that call then runs the block's forward eagerly, and if that succeeds the
block stays eager from then on, with one warning naming the block, its class and torch's
first line of the reason. An error the eager forward raises too is the block's own and
propagates unchanged.

Compiling a call is torch's business: the first call of each block compiles it (seconds per
block with inductor on a CPU), later calls with the same shapes reuse it.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Dict, Iterable, Mapping, Optional

import torch
from torch import nn

from ..profiler.block_list import split_call_name


def compile_options(option: Any) -> Optional[Dict[str, Any]]:
    """apply's `compile` as torch.compile's keyword arguments: None for False; {} (torch's
    defaults: inductor) for True; a dict as given (e.g. {"backend": "aot_eager"}, {"mode":
    "max-autotune"}). fullgraph is always True (one graph per block, or eager). ValueError
    naming the option otherwise."""
    if option is False or option is None:
        return None
    if option is True:
        return {}
    if isinstance(option, Mapping) and all(isinstance(k, str) for k in option):
        if "fullgraph" in option:
            raise ValueError("hybridplan.apply: compile must not set fullgraph (each block is "
                             "compiled as one graph, else runs eager)")
        return dict(option)
    raise ValueError(f"hybridplan.apply: compile must be True, False or a dict of "
                     f"torch.compile keyword arguments (got {option!r})")


def compile_of(spec: Any, option: Any) -> Optional[Dict[str, Any]]:
    """The torch.compile options a plan runs with: apply's `compile` where given, else the
    plan's "compile" (Plan.compile: the planner priced compiled blocks); None: eager.
    ValueError naming the plan for a plan kind the compiled blocks are not applied to."""
    options = compile_options(spec.compile if option is None else option)
    if options is not None and (spec.mode != "placement" or spec.sharding != "none"
                                or spec.tp > 1):
        raise ValueError(f"{spec.source}: compile applies to placement plans without sharding "
                         f"or tensor parallelism (got mode {spec.mode!r}, sharding "
                         f"{spec.sharding!r}, tp {spec.tp}): a pipeline's stages are "
                         f"torch.export graphs, and FSDP2's and DTensor's hooks inside a "
                         f"compiled block are not checked here")
    return options


def _guarded(name: str, module: nn.Module, eager, compiled):
    """The forward that runs `compiled`, or `eager` for good once compiled fails where eager
    does not (the module doc)."""
    state: Dict[str, Any] = {"compiled": True}

    @functools.wraps(eager)
    def forward(*args, **kwargs):
        if not state["compiled"]:
            return eager(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - torch.compile raises many kinds
            out = eager(*args, **kwargs)  # the block's own error propagates from here
            state["compiled"] = False
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            warnings.warn(f"hybridplan compile: block {name!r} ({type(module).__name__}) runs "
                          f"eager: torch.compile cannot compile it as one graph "
                          f"({type(error).__name__}: {reason})", stacklevel=2)
            return out

    forward._hybridplan_compiled = state
    return forward


def _entry(forward, name: str):
    """The frame Dynamo compiles for one block: a call of its forward, with a code object of
    its own. Dynamo keeps compiled code per code object and recompiles one at most
    torch._dynamo.config.recompile_limit (8) times before running it eagerly, silently: one
    shared function would spend that limit over the blocks (each block, each grad mode, a
    recompile) and leave the later blocks eager."""
    def run(*args, **kwargs):
        return forward(*args, **kwargs)

    label = "".join(c if c.isalnum() else "_" for c in name)
    run.__code__ = run.__code__.replace(co_name=f"block_{label}_{id(forward):x}")
    return run


def compile_blocks(module: nn.Module, names: Iterable[str], options: Dict[str, Any]
                   ) -> Dict[str, nn.Module]:
    """Compiles the forward of each node module of `names` (a plan's assignment names; a
    module's later calls "name@k" share its one compiled forward) in place. Returns name ->
    module compiled. Idempotent."""
    done: Dict[str, nn.Module] = {}
    for name in names:
        name, call = split_call_name(name)
        if call or name in done:
            continue
        node = module.get_submodule(name)
        if getattr(node.forward, "_hybridplan_compiled", None) is not None:
            done[name] = node
            continue
        eager = node.forward
        own = node.__dict__.get("forward")  # an instance forward to restore, else the class's

        compiled = torch.compile(_entry(eager, name), fullgraph=True, **options)
        node.forward = _guarded(name, node, eager, compiled)
        node.forward._hybridplan_compiled["own"] = own
        done[name] = node
    return done


def compiled_state(node: nn.Module) -> Optional[bool]:
    """True while a block compiled by compile_blocks runs compiled, False once it fell back to
    eager, None for a block never compiled."""
    state = getattr(node.forward, "_hybridplan_compiled", None)
    return None if state is None else bool(state["compiled"])


def uncompile_blocks(module: nn.Module, names: Iterable[str]) -> None:
    """Undoes compile_blocks on the node modules of `names` (a switch hands the module to the
    next plan eager)."""
    for name in names:
        node = module.get_submodule(split_call_name(name)[0])
        state = getattr(node.__dict__.get("forward"), "_hybridplan_compiled", None)
        if state is None:
            continue
        if state["own"] is not None:
            node.forward = state["own"]
        else:
            del node.forward
