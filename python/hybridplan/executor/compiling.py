"""torch.compile per graph block: `apply(..., compile=True)` (docs/training_step.md "Compiled
blocks").

Each graph node's module (profiler.block_list: the modules the plan places, one definition)
gets its forward compiled by torch.compile as one graph (fullgraph=True), the way torchtitan
compiles each transformer block: the module object, its parameters, its names and its hooks
stay as they are, so the plan applies to the compiled module unchanged. nn.Module.compile()
is not used: it compiles the module's _call_impl, a frame Dynamo skips (torch/nn is in its skip
list: "torch.compile with fullgraph=True found no compiled frames"); a function of this module
calling the forward is a frame Dynamo traces, inlining the forward.

Every plan kind, in torchtitan's order of the axes (TP, activation checkpointing, compile per
block, fully_shard) as far as what runs around the compiled forward goes: the compile is lazy
(the first call traces), so the parameters it sees are the ones tensor parallelism (DTensor
slices) and FSDP2 (gathered, unsharded) leave in the module at that call, and their hooks run
outside the compiled forward, as do the placement's input moves and DDP's reducer:
  placement  the node modules (compile_blocks), before place() and the data-parallel wrapper;
  FSDP2      zero2 and zero3 alike: fully_shard's pre-forward gathers the parameters, then the
             compiled forward runs on them; zero3's re-gather for backward restores the storage
             the compiled backward saved;
  TP         the compiled forward receives DTensors (a column-wise node's input, a row-wise
             node's shards) and traces DTensor's ops; the row-wise output's all-reduce, in the
             style's hook, reaches the next block as an AsyncCollectiveTensor, waited for
             before the compiled region (_plain_inputs: torch 2.13 drops the gradient of such an
             input otherwise);
             a vocabulary-split embedding runs eager (node_eager_reason: its masked partial
             output cannot leave a compiled region);
  recompute  a block recomputed in full runs its compiled forward under the checkpoint, and
             again in the recompute (torchtitan compiles the checkpointed block instead: here
             the checkpoint's buffer-restoring contexts stay outside Dynamo); a block recomputed
             selectively runs eager (compiled_names says why);
  pipeline   a stage is a torch.export graph whose node modules are InterpreterModules under
             their own names; each of those is compiled (compile_stage_blocks) before the
             stage's recompute, TP and data-parallel wrappers. The zero-bubble schedules
             (interleaved-zb, zbv) run eager (eager_reason): their weight pass would run each
             compiled block's whole backward a second time.

Where torch cannot compile a block (a graph break under fullgraph, a backend failure: any
torch._dynamo exception), its first call raises; that call then runs the block's forward
eagerly, and if that succeeds the block stays eager from then on, with one warning naming the
block, its class and torch's first line of the reason. An error the eager forward raises too
is the block's own and propagates unchanged, as does any exception that is not Dynamo's (the
early stop of a checkpoint's recompute, which passes through the block by design).

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


ZERO_BUBBLE = ("interleaved-zb", "zbv")  # the schedules that split a stage's backward


def eager_reason(spec: Any) -> Optional[str]:
    """Why a plan runs its blocks eager although compile was asked for, or None: the zero-bubble
    schedules split each stage's backward into I (input gradients) and W (weight gradients,
    autograd.split_backward), which runs the graph's nodes that reach a parameter once more in
    W. A compiled block's backward is one autograd node (AOTAutograd's CompiledFunctionBackward)
    computing its input and weight gradients together: W would run that whole node again,
    every parametrised block's backward twice per micro-batch (the gradients stay right; the
    split's saving is lost and the step pays more than eager)."""
    if spec.mode == "pipeline" and spec.schedule in ZERO_BUBBLE:
        return (f"schedule {spec.schedule!r} splits each backward into input and weight passes, "
                f"and a compiled block's backward is one autograd node computing both: the "
                f"weight pass would run every compiled block's whole backward a second time")
    return None


def compile_of(spec: Any, option: Any, rank: int = 0) -> Optional[Dict[str, Any]]:
    """The torch.compile options a plan runs with: apply's `compile` where given, else the
    plan's "compile" (Plan.compile: the planner priced compiled blocks); None: eager. Every plan
    kind compiles its blocks, except the zero-bubble schedules (eager_reason), whose blocks run
    eager with a warning from rank 0 naming the reason."""
    options = compile_options(spec.compile if option is None else option)
    reason = eager_reason(spec) if options is not None else None
    if reason is not None:
        if rank == 0:
            warnings.warn(f"hybridplan compile: {spec.source}: every block runs eager: {reason}",
                          stacklevel=3)
        return None
    return options


class _Waited(torch.autograd.Function):
    """An AsyncCollectiveTensor's value as a plain tensor (its collective waited for), the
    gradient passed through unchanged (see _plain_inputs)."""

    @staticmethod
    def forward(ctx, value):
        return value.trigger_wait()

    @staticmethod
    def backward(ctx, grad):
        return grad


def _plain(value: Any) -> Any:
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    if not isinstance(value, AsyncCollectiveTensor):
        return value
    return _Waited.apply(value) if value.requires_grad else value.trigger_wait()


def _plain_inputs(args: tuple, kwargs: Dict[str, Any]) -> tuple:
    """The block's inputs with every AsyncCollectiveTensor waited for, in eager, before the
    compiled region. A tensor-parallel row-wise node's output (DTensor.to_local() of the
    all-reduce, use_local_output) is one; torch 2.13 unwraps such an input when it traces the
    region (trigger_wait) and loses its requires_grad there, so AOTAutograd builds a graph
    without backward and every gradient above the block is silently dropped (torch after 2.13
    restores the flag: "Preserve requires_grad when unwrapping ACT inputs in process_inputs").
    Waited for here, under an autograd function that passes the gradient on, the region
    receives a plain tensor that needs it."""
    from torch.utils import _pytree as pytree

    if not torch.distributed.is_available():
        return args, kwargs
    return pytree.tree_map(_plain, (args, kwargs))


def node_eager_reason(style: Optional[str]) -> Optional[str]:
    """Why a node split by tensor parallelism in `style` (tensor_parallel.check_layout's style of
    a node that splits at the plan's tp; None: not split) runs eager under compile, or None.
    A vocabulary-split embedding (vocab_rowwise) computes a partial lookup whose placement,
    DTensor's _MaskPartial, keeps the mask of the rows this rank does not hold in a buffer that
    the all-reduce in the style's output hook, outside the compiled region, reads and releases.
    Compiled, torch 2.13 leaves its trace's fake mask in that buffer: the compile fails ("Mixing
    fake modes", BackendCompilerFailed) and the buffer stays held, so the block's eager forward
    fails after it too; traced together with the all-reduce, the lookup's output comes out
    wrong (pytorch/pytorch#160697). The planner prices such a node eager under a compiled job
    (C++ node_runs_eager, csrc/planner/costs/evaluate.h)."""
    if style == "vocab_rowwise":
        return ("a vocabulary-split embedding's masked partial lookup (DTensor _MaskPartial) "
                f"cannot leave a compiled region in torch {torch.__version__}: its mask buffer "
                "keeps the trace's fake tensor")
    return None


def compiled_names(spec: Any, rank: int = 0,
                   tp_styles: Optional[Mapping[str, str]] = None) -> list:
    """The plan's node names whose blocks compile: all but those recomputed selectively and
    those tensor parallelism splits in a style that runs eager (node_eager_reason; `tp_styles`:
    node -> style of the nodes that split, tensor_parallel.check_layout), which run eager (rank
    0 warns once per reason, naming them). Selective recompute's policy is a dispatch mode that
    keeps chosen ops' outputs in the forward and hands them back in the recompute
    (autograd.recompute); around a compiled block torch 2.13 either fails to compile under it
    (aot_eager: BackendCompilerFailed, the block falls back) or, with inductor, compiles and
    then fails the recompute ("Tensor cached during selective activation checkpoint has been
    mutated"). Blocks recomputed in full compile: the checkpoint runs the compiled forward
    again."""
    selective = [n for n in spec.assignment if n in spec.selective]
    if selective and rank == 0:
        warnings.warn(f"hybridplan compile: {spec.source}: {len(selective)} block(s) recomputed "
                      f"selectively run eager ({', '.join(selective[:5])}"
                      f"{', ...' if len(selective) > 5 else ''}): selective recompute's policy "
                      f"does not run around a compiled block in torch {torch.__version__}",
                      stacklevel=3)
    split_eager = {n: reason for n in spec.assignment
                   for reason in [node_eager_reason((tp_styles or {}).get(n))] if reason}
    if rank == 0:
        for name, reason in split_eager.items():
            warnings.warn(f"hybridplan compile: {spec.source}: block {name!r} "
                          f"({tp_styles[name]} under tp={spec.tp}) runs eager: {reason}",
                          stacklevel=3)
    return [n for n in spec.assignment if n not in spec.selective and n not in split_eager]


def _guarded(name: str, module: nn.Module, eager, compiled):
    """The forward that runs `compiled`, or `eager` for good once compiled fails where eager
    does not (the module doc)."""
    state: Dict[str, Any] = {"compiled": True}

    @functools.wraps(eager)
    def forward(*args, **kwargs):
        if not state["compiled"]:
            return eager(*args, **kwargs)
        try:
            plain_args, plain_kwargs = _plain_inputs(args, kwargs)
            return compiled(*plain_args, **plain_kwargs)
        except torch._dynamo.exc.TorchDynamoException as error:
            # what compiling raises (Unsupported, BackendCompilerFailed, TorchRuntimeError...);
            # anything else passes through as it would eager: the block's own errors, and
            # the exceptions others raise through the block to stop it, such as the early
            # stop of a non-reentrant checkpoint's recompute (_StopRecomputationError)
            out = eager(*args, **kwargs)  # the block's own error propagates from here
            state["compiled"] = False
            cause = getattr(error, "inner_exception", None) or error  # a backend's own error
            reason = (str(cause).strip().splitlines() or [""])[0][:300]
            what = type(error).__name__ if cause is error else \
                f"{type(error).__name__}: {type(cause).__name__}"
            warnings.warn(f"hybridplan compile: block {name!r} ({type(module).__name__}) runs "
                          f"eager: torch.compile cannot compile it as one graph "
                          f"({what}: {reason})", stacklevel=2)
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


def _compile_module(name: str, node: nn.Module, options: Dict[str, Any]) -> None:
    """Compiles `node`'s forward in place (the module doc); nothing for one compiled already."""
    if getattr(node.forward, "_hybridplan_compiled", None) is not None:
        return
    eager = node.forward
    own = node.__dict__.get("forward")  # an instance forward to restore, else the class's
    compiled = torch.compile(_entry(eager, name), fullgraph=True, **options)
    node.forward = _guarded(name, node, eager, compiled)
    node.forward._hybridplan_compiled["own"] = own


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
        _compile_module(name, node, options)
        done[name] = node
    return done


def compile_stage_blocks(stage: nn.Module, names: Iterable[str], options: Dict[str, Any]
                         ) -> Dict[str, nn.Module]:
    """A pipeline stage's blocks (a CarryStage of profiler.stage_split): the export keeps each
    node module as an InterpreterModule under its own name ("part.module.<name>"; a module's
    later call "name@k" is a module of its own there, the parameters shared), whose forward is
    the traced graph's code, which Dynamo traces. Each node of `names` the stage holds is
    compiled as compile_blocks compiles it; the operations between nodes (the stage's own
    graph) run eager, as they do in a placement. Returns name -> module compiled."""
    wanted = set(names)
    done: Dict[str, nn.Module] = {}
    for qualified, node in stage.named_modules():
        name = qualified
        for prefix in ("part.", "module."):
            name = name[len(prefix):] if name.startswith(prefix) else name
        if name in wanted and name not in done:
            _compile_module(name, node, options)
            done[name] = node
    return done


def compiled_state(node: nn.Module) -> Optional[bool]:
    """True while a block compiled by compile_blocks runs compiled, False once it fell back to
    eager, None for a block never compiled."""
    state = getattr(node.forward, "_hybridplan_compiled", None)
    return None if state is None else bool(state["compiled"])


def compiled_blocks(module: nn.Module) -> Dict[str, bool]:
    """Every submodule of `module` (itself included) compiled by compile_blocks or
    compile_stage_blocks: qualified name -> compiled_state (True: runs compiled, False: fell
    back to eager)."""
    return {name: bool(state["compiled"]) for name, sub in module.named_modules()
            for state in [getattr(sub.forward, "_hybridplan_compiled", None)]
            if state is not None}


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
