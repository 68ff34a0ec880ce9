"""Splits the time of one forward+backward step among the graph's nodes.

Every moment of the step is charged to exactly one node, except the hooks' own bookkeeping, so
the nodes' times add up to the step's time (plus the small cost of entering the hooks):

    forward   |--gap + node A--|--gap + node B--|--tail--|
                charged to A     charged to B     charged to the last node that ran
    backward  |--seed--|--B's grads ready .. A's grads ready--|--A's grads ready .. end--|
               charged     charged to B                         charged to A
               to B

- Forward: a forward hook on each node marks the clock when the node returns. The time between
  two nodes (functional ops such as add, cat, flatten, softmax) is charged to the node that runs
  next, i.e. the op's consumer; the time after the last node (e.g. a trailing flatten) to it.
- Backward: a pre-hook on the autograd node (grad_fn) of each node's outputs fires when the
  gradient of that output is ready, just before the autograd engine runs the node's own
  backward. The time from there to the next node's mark is charged to the node; so the backward
  of a functional op (cat, add) that runs right after a node's backward is charged to that node,
  which is again the op's consumer in the forward pass. The seed gradient's time goes to the
  first node to start. On CPU the engine runs one autograd node at a time, most recently
  created first, so node backward intervals do not interleave. A node that returns its input
  unchanged (dropout with p=0, Identity) shares its producer's autograd node and is marked
  once, for the producer: marked twice, the second mark would take the producer's whole
  backward (a transformer layer's attention, 3.5 ms at batch 16, went to its dropout=0.0 that
  way, and so across a pipeline cut between the two).
- Clock (`clock`): "wall" = time.perf_counter (CPU default); "cuda" = CUDA events (read after
  one synchronize per step; the default on GPU); "thread" = time.thread_time, the CPU time of
  the calling thread, which on a shared, busy CPU excludes the time other processes hold the
  cores. "thread" needs torch.get_num_threads() == 1: the CPU autograd engine runs backward on
  the calling thread, and with one intra-op thread so does every kernel.
"""

import contextlib
import functools
from dataclasses import dataclass
import ctypes
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode

from ..autograd.recompute import saves
from ..autograd.split_backward import backward_input, backward_weight
from . import block_list
from .dataflow import _SavedBytes, record_dataflow, storage_key, tensors_in


CLOCKS = ("auto", "wall", "thread", "cuda")


def resolve_clock(clock: str, device: torch.device) -> str:
    """The clock to use for `clock` on `device`; ValueError where it cannot measure there."""
    if clock not in CLOCKS:
        raise ValueError(f"profile: clock must be one of {', '.join(CLOCKS)} (got {clock!r})")
    if clock == "auto":
        return "cuda" if device.type == "cuda" else "wall"
    if (clock == "cuda") != (device.type == "cuda"):
        raise ValueError(f"profile: clock {clock!r} cannot time device {device} "
                         "(cuda events time cuda devices; wall and thread time the cpu)")
    if clock == "thread" and torch.get_num_threads() != 1:
        raise ValueError("profile: clock 'thread' measures one thread; call "
                         "torch.set_num_threads(1) first (got torch.get_num_threads() = "
                         f"{torch.get_num_threads()})")
    return clock


def retain_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory in the process: mmap and trim thresholds of 1 GiB
    (mallopt; process-wide, it stays). By default glibc returns a freed block of 128 KiB or more
    (a threshold it adapts) to the kernel, and the next allocation of it page-faults on every
    page, which on CPU adds up to milliseconds to whichever op allocates, varying with the
    process's allocation history; caching allocators (CUDA's, jemalloc, tcmalloc) never do.
    The C++ profiler does the same (csrc/profiler/profile.h). False where the C library is not
    glibc (nothing changed)."""
    one_gib = 1 << 30
    return _mallopt({M_MMAP_THRESHOLD: one_gib, M_TRIM_THRESHOLD: one_gib})


def return_freed_memory() -> bool:
    """The opposite policy, for memory: glibc's malloc serves every block of 1 MiB or more with
    mmap and gives it back to the kernel when it is freed (mallopt M_MMAP_THRESHOLD fixed at
    1 MiB; process-wide, it stays). glibc's default threshold starts at 128 KiB but rises to
    the largest mmapped block freed (up to 32 MiB), after which blocks below it come from the
    heap, and freed ones stay resident wherever a live block sits above them: a zero3 rank
    training a 0.11 B Llama held 0.4-0.66 GiB freed in its heaps at its peak, 1.46-1.57 GiB
    resident against 0.98 GiB with this policy (benchmarks/meta-memory-2026-12-06.md). The
    price is a page fault on each first touch of a new block (retain_freed_memory's reason).
    False where the C library is not glibc (nothing changed)."""
    return _mallopt({M_MMAP_THRESHOLD: 1 << 20})


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def _mallopt(settings: Dict[int, int]) -> bool:
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all(bool(mallopt(param, ctypes.c_int(value))) for param, value in settings.items())


def busy_cpu_warning(device: torch.device, clock: str) -> Optional[str]:
    """A warning when wall-clock CPU times with several intra-op threads are taken on a CPU that
    other processes keep busy (1-minute load average above half the cores): a kernel then waits
    for its slowest OpenMP thread, and one descheduled thread can inflate a 25 us op to
    milliseconds. None otherwise."""
    if device.type != "cpu" or clock != "wall" or torch.get_num_threads() == 1:
        return None
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load <= cores / 2:
        return None
    return (f"profile: the CPU is busy (load average {load:.1f} on {cores} cores) and "
            f"{torch.get_num_threads()} intra-op threads time each op; times may be inflated "
            "by descheduled threads. For repeatable profiles call torch.set_num_threads(1) "
            "and pass clock='thread'.")


class _Clock:
    def __init__(self, clock: str):
        self.cuda = clock == "cuda"
        self._now = time.thread_time if clock == "thread" else time.perf_counter

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self._now()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            return start.elapsed_time(end) / 1e3  # elapsed_time is in ms
        return end - start

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


Loss = Callable[[Any], torch.Tensor]  # the model's output -> the scalar a step minimises


def backward_roots(output: Any, loss: Optional[Loss] = None) -> List[torch.Tensor]:
    """The tensors a profiled step back-propagates from, each seeded with ones: the loss of the
    output where the profile has one (its forward and backward are then part of the step,
    charged to the last node like any op after it), else the output tensors that require grad
    (the gradient of sum(output))."""
    if loss is not None:
        return [loss(output)]
    return [t for t in tensors_in(output) if t.requires_grad]


def loss_times(output: Any, loss: Loss, clock: str, repeats: int = 5) -> Tuple[float, float]:
    """(forward, backward) seconds of the loss alone on the model's `output`: the loss's forward,
    and its backward down to the output's gradient (on detached copies of the output tensors,
    _loss_leaves: nothing of the model runs, as in loss_backward_bytes); the median of
    `repeats` after one warm-up, on the profile's `clock`. A profiled step charges the loss to
    the last node (backward_roots); tensor parallelism splits that node's own work but not the
    loss, which every rank of the group computes whole on the gathered output
    (tensor_parallel.graph_fields)."""
    output, roots = _loss_leaves(output)
    timer = _Clock(clock)
    forward, backward = [], []
    for i in range(repeats + 1):
        timer.sync()
        t0 = timer.mark()
        value = loss(output)
        timer.sync()
        t1 = timer.mark()
        torch.autograd.grad(value, roots, allow_unused=True)
        timer.sync()
        t2 = timer.mark()
        if i:
            forward.append(timer.seconds(t0, t1))
            backward.append(timer.seconds(t1, t2))
    return statistics.median(forward), statistics.median(backward)


def loss_backward_bytes(output: Any, loss: Loss) -> int:
    """Peak bytes the loss's backward allocates, from the loss down to the gradient of the
    model's output, with the loss's forward already done (what it saves is the last node's
    saved bytes, record_dataflow). Cross-entropy over logits holds the gradient of its
    log-softmax and the logits' gradient at once: twice the logits, which a language model's
    large vocabulary makes a large part of a step's peak. Measured from torch.profiler's
    allocation events (the instrument `validate` reads peak memory with)."""
    output, roots = _loss_leaves(output)
    value = loss(output)
    with _quiet_profiler() as prof:
        grads = torch.autograd.grad(value, roots, allow_unused=True)
        del grads
    return allocation_peak_bytes(prof)


# The 16-bit precisions (the core's names, documents/precision.h) a float32 profile measures
# again under torch.autocast (saved_under_autocast).
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class AutocastSaved:
    """What one forward (and the loss) saves for backward under torch.autocast, per graph node:
    `saved` as the profile's saved_bytes counts it (dataflow._SavedBytes) without the weight
    copies, `weight_copies` autocast's 16-bit copies of parameters that the node's ops save
    (cast once a step, whatever the batch), and the loss's backward peak under autocast
    (loss_backward_bytes; None without a loss)."""
    saved: Dict[str, int]
    weight_copies: Dict[str, int]
    loss_backward_bytes: Optional[int]


class _WeightCopies(TorchDispatchMode):
    """Notes the storages of the casts (_to_copy) of `module`'s parameters: under autocast, the
    per-step 16-bit weight copies its cache keeps (autocast casts above the Python dispatch key,
    so the cast reaches this mode)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.params = {storage_key(t) for t in module.parameters()
                       if t.layout == torch.strided and t.device.type != "meta"}
        self.copies: Set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func.overloadpacket is torch.ops.aten._to_copy and isinstance(args[0], torch.Tensor)
                and storage_key(args[0]) in self.params):
            self.copies.add(storage_key(out))
        return out


class _AutocastSavedBytes(_SavedBytes):
    """_SavedBytes that charges the storages in `copies` (autocast's weight copies) apart, into
    `weight_copies` (node -> bytes), and tells `observe(node, tensor, nbytes, is_weight_copy)` of
    every storage it charges (node None before the first node ran)."""

    def __init__(self, module, flow, running, copies: Set[int], weight_copies: Dict[str, int],
                 observe: Optional[Callable[[Optional[str], torch.Tensor, int, bool], None]]):
        super().__init__(module, flow, running)
        self.copies, self.weight_copies, self.observe = copies, weight_copies, observe

    def charge(self, owner: Optional[str], t: torch.Tensor, nbytes: int) -> None:
        copy = storage_key(t) in self.copies
        if self.observe is not None:
            self.observe(owner, t, nbytes, copy)
        if not copy:
            super().charge(owner, t, nbytes)
        elif owner is not None:  # (a weight copy before the first node: none is known)
            self.weight_copies[owner] = self.weight_copies.get(owner, 0) + nbytes


def saved_under_autocast(module: nn.Module, nodes: Dict[str, nn.Module], inputs: Sequence[Any],
                         kwargs: Optional[Dict[str, Any]] = None,
                         loss: Optional[Loss] = None, dtype: Optional[torch.dtype] = None,
                         observe: Optional[Callable[[Optional[str], torch.Tensor, int, bool],
                                                    None]] = None) -> AutocastSaved:
    """One forward (and `loss`, whose saved tensors are the last node's) under
    torch.autocast(device of the module, `dtype`) (None: no autocast, the profile's own
    counting), counted per graph node by the profile's own pass (dataflow.record_dataflow,
    which counts saved_bytes); then the loss's backward peak under autocast. The executor runs
    every plan but FSDP2's under autocast (executor/precision.py), where layer norm keeps its
    float32 input, cross-entropy its float32 log-softmax, and the matrix products the 16-bit
    weight copies: the planner prices those plans' kept activations from this
    (csrc/planner/costs/precision_cost.h). `observe` sees each saved storage
    (bench/bench_autocast_saved.py names its op)."""
    params = list(module.parameters())
    device_type = params[0].device.type if params else "cpu"
    copies = _WeightCopies(module)
    weight_copies: Dict[str, int] = {}
    counter = functools.partial(_AutocastSavedBytes, copies=copies.copies,
                                weight_copies=weight_copies, observe=observe)
    with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        with copies:
            flow, output = record_dataflow(module, nodes, inputs, kwargs, loss,
                                           saved_bytes=counter)
        peak = loss_backward_bytes(output, loss) if loss is not None else None
    del output
    return AutocastSaved(dict(flow.saved_bytes), weight_copies, peak)


# autograd's message where a backward reaches a graph that an earlier backward freed
_FREED_GRAPH = "backward through the graph a second time"


def _freed_graph_error(module: nn.Module, exc: RuntimeError) -> ValueError:
    """What to do about `exc`, autograd's _FREED_GRAPH error in a profiled step: the profile
    back-propagates once per step (from the loss, or from all the outputs together), so the
    freed graph is one an earlier step built and this step's forward read, which is state the
    module keeps across calls."""
    return ValueError(
        f"profile: {type(module).__name__}'s backward reached a graph an earlier step already "
        "freed: its forward reads a tensor kept from an earlier forward (a hidden state or a "
        "cache stored on a module, past_key_values); store it detached (.detach()), or turn "
        "the cache off (Hugging Face: use_cache=False) (got: "
        f"{str(exc).splitlines()[0]})")


def _loss_leaves(output: Any) -> Tuple[Any, List[torch.Tensor]]:
    """`output` (any structure, a ModelOutput included) with each tensor that requires grad
    replaced by a detached copy that requires grad, and those copies. The loss's backward from
    them stops at the output: with the model's own tensors, an output computed from another
    (T5's logits from its encoder_last_hidden_state, a model returning (embedding, logits))
    takes the gradient back through the model between them, which frees that part of its
    graph, and the next repeat fails with "Trying to backward through the graph a second
    time"."""
    leaves: List[torch.Tensor] = []

    def leaf(t: torch.Tensor) -> torch.Tensor:
        if not t.requires_grad:
            return t
        leaves.append(t.detach().requires_grad_())
        return leaves[-1]
    return pytree.tree_map_only(torch.Tensor, leaf, output), leaves


def profiler_events(prof) -> Iterator[Any]:
    """Every event of a finished torch.profiler run, its ops, record_function ranges and
    allocations, each parents before its children (the tree torch builds of them)."""
    return _descendants(prof.profiler.kineto_results.experimental_event_tree())


def _descendants(events) -> Iterator[Any]:
    """`events` and all their descendants in the profiler's event tree, parents first."""
    stack = list(events)
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


def _allocations(events) -> List[Tuple[int, int, int]]:
    """(time ns, bytes, address) of every allocation event, a free's bytes negative, in time
    order."""
    return sorted((e.start_time_ns, e.extra_fields.alloc_size, e.extra_fields.ptr)
                  for e in events if e.tag == _EventType.Allocation)


def unreported_collective_frees(events: List[Any]) -> List[Tuple[int, int, int, int, int]]:
    """(free time ns, address, allocation time ns, bytes, time ns the address is allocated
    again or 0) of each block a functional collective
    (torch.distributed._functional_collectives, as DTensor redistributes) read or allocated whose
    free the profiler never saw: its time is when the collective's wait_tensor returned. c10d's
    work object holds the collective's input and output until Gloo's thread, done with it,
    drops it; that thread often drops the last reference, and torch reports a free to the
    profiler only on a thread the profiler runs on. Measured on BigLSTM's tp2 plan: its LM
    head's all-gather input (4 MiB) and output (8 MiB) stayed counted until the run's end in 4
    of 13 launches, one rank's peak 43.7-52.1 MiB against 39.5 in the others. `events`: the
    run's, list(profiler_events(prof))."""
    blocks: Dict[int, List[List[int]]] = {}  # address -> [allocated at, freed at or 0, bytes]
    for t, nbytes, ptr in _allocations(events):
        if nbytes > 0:
            blocks.setdefault(ptr, []).append([t, 0, nbytes])
        elif blocks.get(ptr) and not blocks[ptr][-1][1]:
            blocks[ptr][-1][1] = t

    def again(ptr: int, t: int) -> int:  # when `ptr` is next allocated after t, or 0
        return next((b[0] for b in blocks[ptr] if b[0] > t), 0)

    def block_at(ptr: int, t: int) -> Optional[List[int]]:  # the block at `ptr` alive at t
        held = [b for b in blocks.get(ptr, ()) if b[0] <= t and (not b[1] or b[1] > t)]
        return held[-1] if held else None

    def storages(op) -> List[int]:  # of its tensor inputs (record_shapes=True), lists opened
        out = []
        for x in op.extra_fields.inputs:
            out += [m.storage_data_ptr for m in (x if isinstance(x, list) else [x])
                    if getattr(m, "storage_data_ptr", None) is not None]
        return out

    def allocated_under(op) -> List[int]:
        return [e.extra_fields.ptr for e in _descendants(op.children)
                if e.tag == _EventType.Allocation and e.extra_fields.alloc_size > 0]

    ops = [e for e in events if e.tag == _EventType.TorchOp
           and e.name.startswith("_c10d_functional::")]
    waits = sorted((e.start_time_ns, e.end_time_ns, storages(e)[0]) for e in ops
                   if e.name == "_c10d_functional::wait_tensor" and storages(e))
    frees = []
    for op in ops:
        if op.name in ("_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd"):
            continue
        outputs = allocated_under(op)
        done = next((end for start, end, ptr in waits
                     if start >= op.start_time_ns and ptr in outputs), None)
        if done is None:
            continue
        for ptr in set(storages(op) + outputs):
            block = block_at(ptr, op.end_time_ns)
            if block is not None and not block[1]:
                frees.append((done, ptr, block[0], block[2], again(ptr, block[0])))
    return sorted(frees)


def allocation_peak_bytes(prof, since_ns: Optional[int] = None,
                          counted: Optional[Set[int]] = None) -> int:
    """The peak, over a finished torch.profiler run (profile_memory=True), of the bytes allocated
    since it started less those freed: its allocation events in time order. Tensors alive before
    the run are not in it, and neither are their frees: torch reports a free to the profiler
    only for a block allocated while it ran, and only on a thread the profiler runs on. A block
    allocated again at the same address was freed before, reported or not: it is counted freed
    there; a functional collective's buffer whose free went unreported is counted freed when
    its wait returned (unreported_collective_frees).
    `since_ns`: the peak from that time on (a step after a profiled warm-up step, so that the
    frees of what the warm-up step allocated are reported; validate_worker._peak_tensor_bytes),
    counting the blocks the run allocated before it and still held then, except those at an
    address in `counted` (the storages the caller counts itself)."""
    counted = counted or set()
    live = peak = 0
    alive: Dict[int, Tuple[int, int]] = {}  # address -> (bytes, allocated at), not yet freed
    measuring = since_ns is None

    def held() -> int:  # what the run allocated and still holds, beyond `counted`
        return sum(n for p, (n, _) in alive.items() if p not in counted)

    # a collective's unreported free sorts as (time, 0, ...): after an allocation at its time
    events = list(profiler_events(prof))
    timeline = [(t, nbytes, ptr, None) for t, nbytes, ptr in _allocations(events)]
    timeline += [(t, 0, ptr, since) for t, ptr, since, _, _ in unreported_collective_frees(events)]
    for t, nbytes, ptr, allocated_at in sorted(timeline, key=lambda e: e[:3]):
        if not measuring and t >= since_ns:
            measuring, live = True, held()
            peak = live
        if allocated_at is not None:
            if ptr in alive and alive[ptr][1] == allocated_at:
                live -= alive.pop(ptr)[0]
            continue
        if nbytes > 0:
            live -= alive.get(ptr, (0, 0))[0]  # its free went unreported
            alive[ptr] = (nbytes, t)
        else:
            alive.pop(ptr, None)
        live += nbytes
        peak = max(peak, live)
    return int(peak if measuring else held())


class StepTimer:
    """Hooks on the node modules that time steps; `step()` runs one and returns
    (forward_s, backward_s) per graph node (one per call of a node module, block_list)."""

    def __init__(self, module: nn.Module, nodes: Dict[str, nn.Module], clock: str):
        self.module = module
        self.clock = _Clock(clock)
        self._handles = []
        self._calls = block_list.CallCounter()
        self._grad_hooks: Dict[str, Callable] = {}  # graph node -> its autograd pre-hook
        for name, mod in nodes.items():
            # Only a forward hook: the interval from the previous node's end to this node's end
            # is this node's, gap (its input's functional ops) included. A pre-hook would only
            # split that interval, at the cost of a second Python call per node.
            self._handles.append(mod.register_forward_hook(self._forward_end(name)))
        self._reset()

    def _reset(self) -> None:
        # (clock mark, node charged for the interval ending there; None: the profiler's own)
        self.forward_marks: List[Tuple[Any, Optional[str]]] = []
        self.backward_marks: List[Tuple[Any, str]] = []
        self.last_forward: Optional[str] = None
        self.backward_owner: Optional[str] = None
        self._hooked: set = set()  # the autograd nodes of this step's marked outputs
        self._calls.reset()

    def _forward_end(self, name: str) -> Callable:
        def hook(mod, args, output):
            mark = self.clock.mark()
            node = self._calls.finish(name)
            self.forward_marks.append((mark, node))
            self.last_forward = node
            if node not in self._grad_hooks:
                self._grad_hooks[node] = self._grads_ready(node)
            for t in tensors_in(output):
                fn = t.grad_fn
                if fn is not None and fn not in self._hooked:
                    # a pre-hook on the autograd node that computes this output: it runs when
                    # the output's gradient is complete (cheaper than Tensor.register_hook).
                    # An output whose autograd node an earlier node's hook already marks is
                    # that node's output returned unchanged (dropout with p=0, Identity): the
                    # backward run from there is the earlier node's, so no second mark.
                    fn.register_prehook(self._grad_hooks[node])
                    self._hooked.add(fn)
            # registering costs tens of microseconds per node: the profiler's own time, charged
            # to no node (None) so that it does not inflate the next node's forward
            self.forward_marks.append((self.clock.mark(), None))
        return hook

    def _grads_ready(self, name: str) -> Callable:
        def hook(grad_outputs):
            self.backward_marks.append((self.clock.mark(), self.backward_owner or name))
            self.backward_owner = name
        return hook

    def step(self, inputs: Sequence[Any], kwargs: Optional[Dict[str, Any]] = None,
             loss: Optional[Loss] = None, accumulate: bool = False
             ) -> Tuple[Dict[str, float], Dict[str, float]]:
        """One step from no gradients, or (accumulate) adding to the gradients there are, as
        every micro-batch after a pipeline's first does."""
        if not accumulate:
            self.module.zero_grad(set_to_none=True)
        self._reset()
        self.clock.sync()
        start = self.clock.mark()
        roots = backward_roots(self.module(*inputs, **(kwargs or {})), loss)
        seeds = [torch.ones_like(t) for t in roots]
        forward_end = self.forward_end = self.clock.mark()
        try:
            torch.autograd.backward(roots, seeds)
        except RuntimeError as exc:
            if _FREED_GRAPH not in str(exc):
                raise
            raise _freed_graph_error(self.module, exc) from exc
        backward_end = self.backward_end = self.clock.mark()
        self.clock.sync()
        last = self.last_forward
        forward_s = self._split(start, self.forward_marks + [(forward_end, last)])
        backward_s = self._split(
            forward_end, self.backward_marks + [(backward_end, self.backward_owner or last)])
        return forward_s, backward_s

    def _split(self, start: Any, marks: List[Tuple[Any, str]]) -> Dict[str, float]:
        charged: Dict[str, float] = {}
        previous = start
        for mark, owner in marks:
            if owner is not None:
                charged[owner] = charged.get(owner, 0.0) + self.clock.seconds(previous, mark)
            previous = mark
        return charged

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@contextlib.contextmanager
def _quiet_profiler():
    """torch.profiler over the block, with the process's stderr (file descriptor 2) sent to
    /dev/null meanwhile: this torch build's kineto writes a "profiler_start"/"profiler_stop"
    line there from C++ for every profile, which no setting turns off, and `profile` promises
    silence unless verbose. Python's own sys.stderr is flushed first and restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield prof
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _ProfilerMarks:
    """A StepTimer clock whose marks are torch.profiler events (an empty record_function each,
    numbered), so that a profiled step's allocation events can be split at the same marks as
    its time."""
    cuda = False

    def __init__(self):
        self.count = 0

    def mark(self) -> int:
        with record_function(f"hybridplan.mark.{self.count}"):
            pass
        self.count += 1
        return self.count - 1

    def seconds(self, start: Any, end: Any) -> float:
        return 0.0

    def sync(self) -> None:
        pass


def backward_workspace_bytes(module: nn.Module, nodes: Dict[str, nn.Module], inputs: Sequence[Any],
                             kwargs: Optional[Dict[str, Any]], loss: Optional[Loss],
                             output_bytes: Dict[str, int]) -> Dict[str, int]:
    """Per graph node, the bytes its backward needs above what is held when it starts: the peak,
    over the node's backward interval (StepTimer's split: from its outputs' gradients being
    ready to the next node's), of the bytes allocated since the interval began less those freed,
    plus its output's gradient (`output_bytes`; alive when the interval begins). The loss's
    backward, down to the model's output gradient, is not a node's (loss_backward_bytes
    measures it). Measured on a step that adds to existing gradients, as
    every micro-batch after a pipeline's first does: a parameter's gradient is then a
    temporary the size of the parameter (autograd adds it into .grad and frees it), which is
    the part memory_cost.h keeps at the parameter's size when it scales the rest with the
    batch. From torch.profiler's allocation events, the instrument `validate` reads peak
    memory with."""
    timer = StepTimer(module, nodes, "wall")
    timer.clock = marks = _ProfilerMarks()
    try:
        timer.step(inputs, kwargs, loss)  # gradients exist from here on
        first_mark = marks.count
        with _quiet_profiler() as prof:
            timer.step(inputs, kwargs, loss, accumulate=True)
    finally:
        timer.remove()
        module.zero_grad(set_to_none=True)
    at_mark: Dict[int, int] = {}
    allocations: List[Tuple[int, int]] = []
    for event in profiler_events(prof):
        if event.tag == _EventType.Allocation:
            allocations.append((event.start_time_ns, event.extra_fields.alloc_size))
        elif event.name.startswith("hybridplan.mark."):
            at_mark[int(event.name.rsplit(".", 1)[1]) - first_mark] = event.start_time_ns
    # the backward's intervals: (start mark, end mark, owner), in time order
    bounds = [timer.forward_end] + [m for m, _ in timer.backward_marks] + [timer.backward_end]
    owners = [owner for _, owner in timer.backward_marks] + [
        timer.backward_owner or timer.last_forward]
    allocations.sort()
    out: Dict[str, int] = {}
    live, i = 0, 0
    for k, owner in enumerate(owners):
        start, end = at_mark[bounds[k] - first_mark], at_mark[bounds[k + 1] - first_mark]
        while i < len(allocations) and allocations[i][0] < start:
            live += allocations[i][1]
            i += 1
        base = peak = live
        while i < len(allocations) and allocations[i][0] < end:
            live += allocations[i][1]
            peak = max(peak, live)
            i += 1
        if k > 0:  # the first interval is the loss's backward (loss_backward_bytes)
            need = peak - base + output_bytes.get(owner, 0)
            out[owner] = max(out.get(owner, 0), int(need))
    return out


def split_backward(module: nn.Module, nodes: Dict[str, nn.Module], inputs: Sequence[Any],
                   kwargs: Optional[Dict[str, Any]], clock: str, repeats: int = 3
                   ) -> Dict[str, Dict[str, float]]:
    """Per graph node with parameters whose inputs carry a gradient, its backward under the
    zero-bubble schedules' split (autograd.split_backward, the one the executor runs):
    {"weight_backward_fraction": W / (I + W),
     "split_backward_extra_s": I + W less the node's plain backward (at least 0),
     "split_held_bytes": the gradients I records for W, each storage once (held between them)}.
    Each node runs alone on the inputs it received in a forward of the model (copies, requiring
    a gradient where the originals did), from an output gradient of ones, timed three ways:
    backward_input (I), backward_weight (W) and one plain autograd backward, each the fastest of
    `repeats`. The extra is the split's bookkeeping (the autograd graph walked in Python, a
    pre-hook on each node W runs through), which does not grow with the batch: 4.9-6.1 ms
    for each of BigLSTM's projected nn.LSTMs (run step by step, a weight-gradient product per
    step) at batch 2 and 32 alike, growing with the steps; 0.1-0.5 ms for a transformer
    layer's modules. The planner divides the plain backward
    plus the extra by the share (compute_cost.h split_backward). Left out: nodes whose inputs
    carry no gradient (a first stage's, where W is the plain backward) and nodes that cannot
    run alone on their recorded inputs (the planner then estimates)."""
    recorded: Dict[str, Tuple[Tuple[Any, ...], Dict[str, Any]]] = {}
    calls = block_list.CallCounter()

    def record(name):
        def hook(mod, args, kw):
            recorded[calls.finish(name)] = (args, kw)
        return hook

    handles = [mod.register_forward_pre_hook(record(name), with_kwargs=True)
               for name, mod in nodes.items()
               if any(p.requires_grad for p in mod.parameters())]
    try:
        output = module(*inputs, **(kwargs or {}))  # with autograd: which inputs carry a gradient
        del output
    finally:
        for h in handles:
            h.remove()

    def leaves(value):
        if isinstance(value, torch.Tensor):
            return value.detach().clone().requires_grad_(value.requires_grad)
        if isinstance(value, (list, tuple)):
            return type(value)(leaves(v) for v in value)
        if isinstance(value, dict):
            return {k: leaves(v) for k, v in value.items()}
        return value

    timer = _Clock(clock)
    out: Dict[str, Dict[str, float]] = {}
    for node, (args, kw) in recorded.items():
        mod = nodes[block_list.module_name(node)]
        params = [p for p in mod.parameters() if p.requires_grad]
        args, kw = leaves(args), leaves(kw)
        needing = [t for t in tensors_in((args, kw)) if t.requires_grad]
        if not needing:
            continue

        def forward():
            # a clone, so that a module writing into its input in place does not write into a
            # leaf
            output = mod(*[x.clone() if isinstance(x, torch.Tensor) and x.requires_grad else x
                           for x in args], **kw)
            outs = [t for t in tensors_in(output) if t.requires_grad]
            return outs, [torch.ones_like(t) for t in outs]

        took: Dict[str, List[float]] = {"i": [], "w": [], "b": []}
        held: Dict[int, int] = {}
        try:
            for repeat in range(max(1, repeats) + 1):  # the first run warms up
                outs, grads = forward()
                timer.sync()
                start = timer.mark()
                _, state = backward_input(outs, grads, needing, params)
                middle = timer.mark()
                if repeat == 0:  # counted in the warm-up run, whose times are dropped
                    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                            for recorded_grads in state.grads.values() for t in recorded_grads
                            if isinstance(t, torch.Tensor)}
                backward_weight(state)
                end = timer.mark()
                timer.sync()
                took["i"].append(timer.seconds(start, middle))
                took["w"].append(timer.seconds(middle, end))
                del outs, grads, state
                outs, grads = forward()
                timer.sync()
                start = timer.mark()
                torch.autograd.backward(outs, grads)
                end = timer.mark()
                timer.sync()
                took["b"].append(timer.seconds(start, end))
                del outs, grads
        # Any error: running a module alone on recorded inputs can fail in ways the model's own
        # forward never meets (state set up by a parent, a hook); the measurement is optional
        # and the planner's estimate stands in.
        except Exception:  # noqa: BLE001
            continue
        finally:
            mod.zero_grad(set_to_none=True)
            for t in needing:
                t.grad = None
        i_s, w_s, b_s = (min(took[k][1:]) for k in ("i", "w", "b"))
        if i_s + w_s > 0:
            out[node] = {"weight_backward_fraction": w_s / (i_s + w_s),
                         "split_backward_extra_s": max(0.0, i_s + w_s - b_s),
                         "split_held_bytes": int(sum(held.values()))}
    return out


def count_flops(module: nn.Module, nodes: Dict[str, nn.Module], inputs: Sequence[Any],
                kwargs: Optional[Dict[str, Any]] = None) -> Dict[str, float]:
    """Forward FLOPs per node (torch.utils.flop_counter), charged like forward time: a
    functional op's FLOPs (e.g. attention's bmm in a parent's forward) go to the next node.
    RNN nodes are counted by formula (rnn_flops), not by the counter."""
    counter = FlopCounterMode(display=False)
    marks: List[Tuple[float, str]] = []
    last: List[str] = []
    rnn_input_shapes: Dict[str, torch.Size] = {}
    calls = block_list.CallCounter()

    def mark(name, ends):
        def hook(mod, args, *output):
            node = calls.finish(name) if ends else calls.current(name)
            marks.append((counter.get_total_flops(), node))
            last[:] = [node]
            if isinstance(mod, nn.RNNBase) and args and isinstance(args[0], torch.Tensor):
                rnn_input_shapes.setdefault(node, args[0].shape)
        return hook

    handles = []
    for name, mod in nodes.items():
        handles.append(mod.register_forward_pre_hook(mark(name, False)))
        handles.append(mod.register_forward_hook(mark(name, True)))
    rnns = [mod for mod in nodes.values() if isinstance(mod, nn.RNNBase)]
    try:
        for mod in rnns:
            mod.forward = _outside_dispatch_modes(mod.forward)
        with counter:
            module(*inputs, **(kwargs or {}))
    finally:
        for h in handles:
            h.remove()
        for mod in rnns:
            del mod.forward  # the instance attribute: back to the class's forward
    flops: Dict[str, float] = {}
    previous = 0
    for total, name in marks + [(counter.get_total_flops(), last[0] if last else "")]:
        if name:
            flops[name] = flops.get(name, 0.0) + float(total - previous)
        previous = total
    for node, shape in rnn_input_shapes.items():
        flops[node] = flops.get(node, 0.0) + rnn_flops(nodes[block_list.module_name(node)],
                                                       shape)
    return flops


def _outside_dispatch_modes(forward: Callable) -> Callable:
    """forward run with the FLOP counter's dispatch mode off: an RNN that the counter cannot
    see through fused kernels anyway, and whose decomposed CPU path (LSTM with proj_size)
    would take seconds under it; rnn_flops counts it instead."""
    def run(*args, **kwargs):
        with _disable_current_modes():
            return forward(*args, **kwargs)
    return run


def rnn_flops(mod: nn.RNNBase, input_shape: torch.Size) -> float:
    """Forward FLOPs of an nn.LSTM/GRU/RNN where fused kernels (oneDNN, cuDNN) hide them from
    the FLOP counter: per layer, direction, step and sample, 2 * gates * hidden * (input +
    recurrent) for the gate matmuls, plus 2 * hidden * proj for an LSTM projection."""
    if len(input_shape) == 3:
        batch, steps = (input_shape[0], input_shape[1]) if mod.batch_first else (
            input_shape[1], input_shape[0])
    else:  # unbatched (steps, features)
        batch, steps = 1, input_shape[0]
    gates = {"LSTM": 4, "GRU": 3}.get(mod.mode, 1)
    directions = 2 if mod.bidirectional else 1
    recurrent = mod.proj_size or mod.hidden_size
    per_sample_step = 0
    for layer in range(mod.num_layers):
        layer_input = mod.input_size if layer == 0 else recurrent * directions
        per_sample_step += 2 * gates * mod.hidden_size * (layer_input + recurrent)
        per_sample_step += 2 * mod.hidden_size * mod.proj_size
    return float(per_sample_step * directions * batch * steps)


def selective_recompute(module: nn.Module, nodes: Dict[str, nn.Module], inputs: Sequence[Any],
                        kwargs: Optional[Dict[str, Any]] = None, repeats: int = 3
                        ) -> Dict[str, Dict[str, float]]:
    """Per node, what selective recompute (autograd.recompute: torch's selective activation
    checkpointing, keeping the outputs of recompute.SAVED_OPS) would keep and run again:
    {"selective_saved_bytes": bytes of the outputs of the saved ops (each storage once),
     "selective_recompute_fraction": the share of the node's forward time spent in the other
     ops, which run again before its backward,
     "selective_ops": the aten ops its forward dispatches, each of which the policy's dispatch
     mode sees in the forward and again in the recompute (the cluster's
     runtime.selective_op_s prices that per op)}. Measured from the aten ops the forward runs
    (a dispatch mode times each: the fastest of `repeats` forwards, op by op; profile passes
    its own repeats, at most 3), charged like FLOPs (count_flops): a functional op between nodes goes to the next node. RNN nodes, whose
    fused kernels the mode cannot see into, are left out (the planner then offers them full
    recompute only)."""
    class OpLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: List[Tuple[bool, float, Dict[int, int]]] = []
            # the kept storages, alive while the log is: an address names one storage only
            # while it lives, and one freed in the forward would hand it to a later one
            self.held: List[Any] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            started = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            took = time.perf_counter() - started
            kept: Dict[int, int] = {}
            if saves(func):
                for t in _tensors(out):
                    if t.layout == torch.strided and t.device.type != "meta" and t.numel():
                        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                        self.held.append(t.untyped_storage())
            self.ops.append((saves(func), took, kept))
            return out

    runs: List[Tuple[List[Tuple[bool, float, Dict[int, int]]], List[Tuple[int, str]]]] = []
    rnn = {name for name, mod in nodes.items() if isinstance(mod, nn.RNNBase)}
    for _ in range(max(1, repeats)):
        log = OpLog()
        marks: List[Tuple[int, str]] = []
        calls = block_list.CallCounter()

        def mark(name, ends):
            def hook(mod, args, *output):
                node = calls.finish(name) if ends else calls.current(name)
                marks.append((len(log.ops), node))
            return hook

        handles = []
        for name, mod in nodes.items():
            handles.append(mod.register_forward_pre_hook(mark(name, False)))
            handles.append(mod.register_forward_hook(mark(name, True)))
        rnns = [nodes[n] for n in rnn]
        try:
            for mod in rnns:
                mod.forward = _outside_dispatch_modes(mod.forward)
            with log:
                output = module(*inputs, **(kwargs or {}))
            del output
        finally:
            for h in handles:
                h.remove()
            for mod in rnns:
                del mod.forward
        runs.append((log.ops, marks))
    ops, marks = runs[0]
    same = [r for r in runs if len(r[0]) == len(ops)]
    took = [min(r[0][i][1] for r in same) for i in range(len(ops))]  # fastest per op
    owner: List[str] = [""] * len(ops)
    start = 0
    for end, node in marks:  # ops before a mark belong to the node the mark names
        for i in range(start, end):
            owner[i] = node
        start = max(start, end)
    last = marks[-1][1] if marks else ""
    for i in range(start, len(ops)):
        owner[i] = last
    total: Dict[str, float] = {}
    again: Dict[str, float] = {}
    kept: Dict[str, Dict[int, int]] = {}
    count: Dict[str, int] = {}
    for i, (saved, _, storages) in enumerate(ops):
        node = owner[i]
        if not node:
            continue
        total[node] = total.get(node, 0.0) + took[i]
        count[node] = count.get(node, 0) + 1
        if saved:
            kept.setdefault(node, {}).update(storages)
        else:
            again[node] = again.get(node, 0.0) + took[i]
    for _, node in marks:  # a node that ran no op (a dropout of p = 0) keeps and reruns nothing
        total.setdefault(node, 0.0)
    out: Dict[str, Dict[str, float]] = {}
    for node, t in total.items():
        if block_list.module_name(node) in rnn:
            continue
        out[node] = {"selective_saved_bytes": int(sum(kept.get(node, {}).values())),
                     "selective_recompute_fraction": (again.get(node, 0.0) / t) if t > 0
                     else 0.0,
                     "selective_ops": count.get(node, 0)}
    return out


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
