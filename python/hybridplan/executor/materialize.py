"""Models built on the meta device (`with torch.device("meta"): model = Model(config)`): every
rank materialises only what it holds under the plan, with the values one process makes from the
same seed (docs/real_size.md).

    with torch.device("meta"):
        model = LlamaForCausalLM(config)          # no memory for the parameters
    hp = hybridplan.apply(plan, model, init_weights=None, init_seed=0, ...)
    ref = hybridplan.materialize(copy.deepcopy(model), init_seed=0)   # the one-process twin

The initialisation rule. The initialiser (`init_weights`) is called once per module, children
before their parent (torch's Module.apply order), and each call runs with the random state
seeded from `init_seed` and the module's qualified name (seed_of). The default initialiser is
the module's `reset_parameters()` (or `_reset_parameters()`, nn.MultiheadAttention's), and for
a Hugging Face PreTrainedModel its nearest PreTrainedModel ancestor's `_init_weights(module)`
(what `from_config` runs; it recomputes rotary embeddings' `inv_freq` too). A callable
`init_weights(module)` replaces it. Because every call draws from a stream of its own, a
tensor's value depends only on the calls that write it, never on what else a rank computes: a
rank holding one pipeline stage, one FSDP shard or one tensor-parallel slice computes the same
values for it as one process initialising the whole model does.

How. First the initialiser runs on the meta module itself (free: the meta device computes no
values) under a dispatch mode that records which of the model's tensors each call writes in
place (a view's writes count for its base: `weight[padding_idx].zero_()`). A rank then
materialises the tensors it holds: for each call that writes one of them, in the same order,
it swaps CPU tensors (zeros, or the value an earlier call wrote) in for the tensors the call
writes, runs it, and keeps the results; once a tensor's last writer has run, the rank copies
its part into the tensor it holds (a DTensor's local shard: distribute_tensor with
src_data_rank=None, each rank cutting its own piece from the value it computed, with no
communication) and drops the rest. Peak memory above what the rank holds is the tensors of the
one call being run (a module's own weights), not the model.

Refused with ValueError, naming the tensors: a tensor that no call writes (a parameter
created with torch.randn in __init__ and no reset_parameters: the meta device kept no value),
a call that replaces a tensor instead of writing it (`self.weight = nn.Parameter(...)`), and a
call that fails on the meta device (one that reads values, `.item()`). A tensor not on the
meta device keeps its value.

Pipeline plans: the meta module is cut on the meta device (profiler.stage_split: torch.export
needs shapes, not values), so the stages hold the model's own meta tensors; each rank gives
storage to its stages' tensors only and fills them (Weights.before_axes), the other stages
stay on the meta device. A real model's stages take pretrained weights the same way.
Tensor-parallel plans find their split by running the model on values (tensor_parallel.detect):
for a meta model that check runs on a materialised copy of the whole model, freed before
anything else is built, so a TP plan's peak includes the model once.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["materialize", "on_meta", "seed_of", "Initializer", "canonical_names",
           "fill", "targets_of", "Weights"]


def on_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of `module` is on the meta device."""
    return any(t.is_meta for t in _tensors(module))


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from (b for b in module.buffers() if b is not None)


def seed_of(seed: int, name: str) -> int:
    """The random seed of module `name`'s initialisation: a hash of the run's seed and the
    module's qualified name ("" for the root), the same on every rank and in every process."""
    digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def canonical_names(module: nn.Module) -> Dict[str, str]:
    """Every parameter and buffer name of `module` -> the first name of the same tensor
    (tied weights: lm_head.weight -> transformer.wte.weight)."""
    first: Dict[int, str] = {}
    out: Dict[str, str] = {}
    for name, t in list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)):
        out[name] = first.setdefault(id(t), name)
    return out


def _post_order(module: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(qualified name, module), children before their parent, each module once (first name)."""
    seen: Set[int] = set()
    out: List[Tuple[str, nn.Module]] = []

    def visit(name: str, mod: nn.Module) -> None:
        if id(mod) in seen:
            return
        seen.add(id(mod))
        for child_name, child in mod.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)
        out.append((name, mod))
    visit("", module)
    return out


def default_initializer(module: nn.Module) -> Callable[[nn.Module], None]:
    """The default init_weights for `module` (see the module doc)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a test dependency
        PreTrainedModel = ()  # type: ignore[assignment]
    owners: Dict[int, Any] = {}  # module -> its nearest PreTrainedModel ancestor (itself too)

    def mark(mod: nn.Module, owner: Any) -> None:
        if PreTrainedModel and isinstance(mod, PreTrainedModel):
            owner = mod
        owners[id(mod)] = owner
        for child in mod.children():
            if id(child) not in owners:
                mark(child, owner)
    mark(module, None)

    def init(mod: nn.Module) -> None:
        owner = owners.get(id(mod))
        if owner is not None:
            owner._init_weights(mod)
            return
        reset = getattr(mod, "reset_parameters", None) or getattr(mod, "_reset_parameters", None)
        if callable(reset):
            reset()
    return init


class _Writes(TorchDispatchMode):
    """Records which of the model's tensors (by storage) each op writes in place."""

    def __init__(self, storage_names: Dict[int, str]):
        super().__init__()
        self.storage_names = storage_names
        self.written: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    name = self.storage_names.get(t.untyped_storage()._cdata)
                    if name is not None and name not in self.written:
                        self.written.append(name)
        return func(*args, **kwargs)


class Initializer:
    """The initialisation rule (module doc) over a meta-built module: `values(names)` yields
    the full CPU value of each named tensor (canonical names, canonical_names) as one process
    initialising the whole model computes it. Built once per rank; the recording pass runs in
    the constructor, which raises ValueError for an initialiser the rule cannot use."""

    def __init__(self, module: nn.Module, init_weights: Optional[Callable] = None,
                 seed: int = 0, source: str = "apply"):
        if init_weights is not None and not callable(init_weights):
            raise ValueError(f"{source}: init_weights must be a callable(module) or None (got "
                             f"{type(init_weights).__name__})")
        self.module, self.seed, self.source = module, int(seed), source
        self.init = init_weights or default_initializer(module)
        self.canonical = canonical_names(module)
        self.tensor: Dict[str, torch.Tensor] = {}   # canonical name -> the module's tensor
        by_id: Dict[int, str] = {}
        for name, t in list(module.named_parameters(remove_duplicate=False)) + list(
                module.named_buffers(remove_duplicate=False)):
            by_id.setdefault(id(t), self.canonical[name])
            self.tensor.setdefault(self.canonical[name], t)
        # canonical name -> every (table, key) registering it (a tied weight: several)
        self.registrations: Dict[str, List[Tuple[Dict[str, Any], str]]] = {}
        for mod in module.modules():
            for table in (mod._parameters, mod._buffers):
                for key, t in table.items():
                    if t is not None:
                        self.registrations.setdefault(by_id[id(t)], []).append((table, key))
        self.meta = {n for n, t in self.tensor.items() if t.is_meta}
        self.calls: List[Tuple[str, nn.Module, List[str]]] = []  # (name, module, writes)
        self._record()
        written = {n for _, _, w in self.calls for n in w}
        self.unwritten = sorted(self.meta - written)

    def _record(self) -> None:
        storage_names = {self.tensor[n].untyped_storage()._cdata: n for n in self.meta}
        for name, mod in _post_order(self.module):
            before = self._snapshot()
            recorder = _Writes(storage_names)
            try:
                with torch.no_grad(), recorder:
                    self.init(mod)
            except Exception as e:
                self._restore(before)
                raise ValueError(
                    f"{self.source}: init_weights fails on the meta-built module "
                    f"{name or '<root>'} ({type(mod).__name__}): {type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0] if str(e).strip() else ''} (an "
                    f"initialiser must write the module's tensors in place without reading "
                    f"their values)") from None
            self._check_same(before, name, mod)
            writes = [n for n in recorder.written if n in self.meta]
            if writes:
                self.calls.append((name, mod, writes))

    def _snapshot(self) -> List[Tuple[Dict[str, Any], str, Any]]:
        return [(table, key, table[key]) for regs in self.registrations.values()
                for table, key in regs]

    @staticmethod
    def _restore(snapshot) -> None:
        for table, key, value in snapshot:
            table[key] = value

    def _check_same(self, before, name: str, mod: nn.Module) -> None:
        replaced = [key for table, key, value in before if table.get(key) is not value]
        if replaced:
            self._restore(before)
            raise ValueError(
                f"{self.source}: init_weights replaced tensors of the meta-built module instead "
                f"of writing them in place (module {name or '<root>'}, {type(mod).__name__}: "
                f"{replaced[:5]}); write them in place (torch.nn.init.*_ or .copy_)")

    def check_covers(self, names: Set[str], other_source: str = "") -> None:
        """ValueError unless every meta tensor among `names` is written by some call."""
        missing = [n for n in self.unwritten if n in names]
        if missing:
            also = f" nor {other_source}" if other_source else ""
            raise ValueError(
                f"{self.source}: {len(missing)} tensors of the meta-built "
                f"{type(self.module).__name__} are set by no initialiser{also}: {missing[:8]} "
                f"(the meta device keeps no values: the default init_weights calls each "
                f"module's reset_parameters, or _init_weights for a Hugging Face model; pass "
                f"init_weights=callable(module) that writes them in place)")

    def values(self, names: Set[str]) -> Iterator[Tuple[str, torch.Tensor]]:
        """(canonical name, full CPU value) for each of `names`, each once, in the order their
        last writer runs (tensors not on the meta device first: their own values)."""
        names = set(names)
        for n in sorted(names - self.meta):
            yield n, self.tensor[n].detach()
        self.check_covers(names)
        calls = [c for c in self.calls if names.intersection(c[2])]
        last = {n: i for i, (_, _, writes) in enumerate(calls) for n in writes}
        current: Dict[str, torch.Tensor] = {}
        for i, (name, mod, writes) in enumerate(calls):
            scratch = {}
            for n in writes:
                like = self.tensor[n]
                value = current.pop(n, None)
                if value is None:
                    value = torch.zeros(like.shape, dtype=like.dtype)
                scratch[n] = (nn.Parameter(value, requires_grad=like.requires_grad)
                              if isinstance(like, nn.Parameter) else value)
            before = self._snapshot()
            try:
                for n, value in scratch.items():
                    for table, key in self.registrations[n]:
                        table[key] = value
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed_of(self.seed, name))
                    self.init(mod)
            finally:
                self._restore(before)
            for n in writes:
                value = scratch[n].detach()
                if last[n] == i:
                    if n in names:
                        yield n, value
                else:
                    current[n] = value


def materialize(module: nn.Module, init_weights: Optional[Callable] = None, init_seed: int = 0,
                device: Any = "cpu") -> nn.Module:
    """Gives every meta tensor of `module` storage on `device` and its value under the
    initialisation rule (module doc), in place; returns `module`. The one-process twin of
    apply(..., init_weights=, init_seed=) on a meta-built model: the weights every plan's ranks
    hold are pieces of these. Tied tensors stay tied; tensors not on the meta device are kept."""
    init = Initializer(module, init_weights, init_seed, "materialize")
    init.check_covers(set(init.meta))
    fill_module(module, init.canonical, init.values, lambda _name: torch.device(device))
    return module


def give_storage(module: nn.Module, device_of: Callable[[str], torch.device]) -> Set[int]:
    """Replaces every meta tensor of `module` (plain or DTensor: FSDP2 shards, TP slices) by an
    uninitialised one on device_of(qualified name of the module holding it), as
    Module.to_empty does, keeping tied registrations tied; returns the new tensors' ids."""
    new: Dict[int, torch.Tensor] = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for table in (mod._parameters, mod._buffers):
            for key, t in list(table.items()):
                if t is None or not t.is_meta:
                    continue
                if id(t) not in new:
                    value = torch.empty_like(t, device=device_of(mod_name))
                    new[id(t)] = (nn.Parameter(value, requires_grad=t.requires_grad)
                                  if isinstance(t, nn.Parameter) else value)
                table[key] = new[id(t)]
    return {id(t) for t in new.values()}


def fill_module(module: nn.Module, canonical: Dict[str, str],
                values: Callable[[Set[str]], Iterator[Tuple[str, torch.Tensor]]],
                device_of: Callable[[str], torch.device],
                name_of: Callable[[str], str] = lambda n: n) -> None:
    """give_storage, then each new tensor's part of its value (`values(canonical names)`)."""
    fresh = give_storage(module, device_of)
    targets = {n: [t for t in ts if id(t) in fresh]
               for n, ts in targets_of(module, canonical, name_of).items()}
    targets = {n: ts for n, ts in targets.items() if ts}
    fill(targets, values(set(targets)))


def targets_of(module: nn.Module, canonical: Dict[str, str],
               name_of: Callable[[str], str] = lambda n: n) -> Dict[str, List[torch.Tensor]]:
    """canonical name -> the tensors `module` (this rank's part) holds for it, each once
    (a part's parameter names map to the original module's through name_of)."""
    out: Dict[str, List[torch.Tensor]] = {}
    seen: Set[int] = set()
    for name, t in list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)):
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        original = name_of(name)
        if original not in canonical:
            raise ValueError(f"materialize: {name} ({original}) is no tensor of the model")
        out.setdefault(canonical[original], []).append(t)
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def piece(target: torch.Tensor, full: torch.Tensor, narrow_rank: int = 0) -> torch.Tensor:
    """The part of `full` that `target` holds: a DTensor's local shard (each rank cuts its own
    from the full value it holds: distribute_tensor with src_data_rank=None, no communication),
    the whole tensor, or a tensor-parallel rank's narrowed slice (a pipeline stage traced at a
    TP rank's shapes: one dimension 1/tp as long; slice narrow_rank of it)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        if tuple(target.shape) != tuple(full.shape):
            raise ValueError(f"shape {list(full.shape)} does not match {list(target.shape)}")
        return distribute_tensor(full.to(target.device), target.device_mesh, target.placements,
                                 src_data_rank=None).to_local()
    if tuple(target.shape) == tuple(full.shape):
        return full
    dims = [d for d in range(full.dim()) if target.shape[d] != full.shape[d]]
    if full.dim() != target.dim() or len(dims) != 1 or full.shape[dims[0]] % target.shape[dims[0]]:
        raise ValueError(f"shape {list(full.shape)} does not match {list(target.shape)}")
    k = target.shape[dims[0]]
    return full.narrow(dims[0], narrow_rank * k, k)


def fill(targets: Dict[str, List[torch.Tensor]], values: Iterator[Tuple[str, torch.Tensor]],
         narrow_rank: int = 0) -> None:
    """Copies each value's part into the tensors that hold it (targets: canonical name ->
    tensors, already with storage). Every target must be filled."""
    left = set(targets)
    with torch.no_grad():
        for name, full in values:
            for target in targets.get(name, ()):
                _local(target).copy_(piece(target, full, narrow_rank))
            left.discard(name)
    if left:
        raise RuntimeError(f"materialize: no value for {sorted(left)[:5]}")


def twin(module: nn.Module, init_weights: Optional[Callable], init_seed: int) -> nn.Module:
    """A materialised CPU copy of a meta-built module (tensor parallelism's split check runs
    the model on values)."""
    return materialize(copy.deepcopy(module), init_weights, init_seed)


# ---- what apply() does with them -----------------------------------------------------------

class Weights:
    """Where this rank's weights come from when apply() gets a meta-built model or
    load_pretrained: the initialiser (meta tensors) and the pretrained files. Built in apply's
    checks (every error raised there, before any rank builds anything); `before_axes` and
    `after_axes` fill what the rank holds at the two points of the recipe where it holds it."""

    def __init__(self, module: nn.Module, init_weights: Optional[Callable], init_seed: int,
                 load_pretrained: Any, source: str, mode: str = "placement"):
        from .pretrained import Pretrained

        self.meta = on_meta(module)
        if not self.meta and init_weights is not None:
            raise ValueError(f"{source}: init_weights applies to a model built on the meta "
                             f"device (with torch.device('meta'): ...); this "
                             f"{type(module).__name__} has no meta tensors")
        self.init_weights, self.init_seed = init_weights, init_seed
        self.canonical = canonical_names(module)
        self.init = Initializer(module, init_weights, init_seed, source) if self.meta else None
        self.pretrained = (Pretrained(load_pretrained, module, self.canonical, source)
                           if load_pretrained is not None else None)
        self.from_file = self.pretrained.holds() if self.pretrained is not None else set()
        if self.init is not None:
            self.init.check_covers(set(self.init.meta) - self.from_file,
                                   "the pretrained files" if self.pretrained else "")

    @staticmethod
    def of(module: nn.Module, init_weights: Optional[Callable], init_seed: int,
           load_pretrained: Any, source: str, mode: str = "placement") -> Optional["Weights"]:
        """None when there is nothing to do (a real model, nothing to load)."""
        if init_weights is None and load_pretrained is None and not on_meta(module):
            return None
        return Weights(module, init_weights, init_seed, load_pretrained, source, mode)

    def detection_module(self, module: nn.Module) -> nn.Module:
        """The module tensor parallelism's split check runs (module doc)."""
        if not self.meta:
            return module
        return twin(module, self.init_weights, self.init_seed)

    def fill(self, targets: Dict[str, List[torch.Tensor]], narrow_rank: int = 0) -> None:
        """File values where the files hold them, the initialiser's for the rest of the meta
        ones; a real model's other tensors keep their values."""
        if self.pretrained is not None:
            self.pretrained.load({n: ts for n, ts in targets.items() if n in self.from_file},
                                 narrow_rank)
        rest = {n: ts for n, ts in targets.items() if n not in self.from_file}
        if self.init is not None:
            rest = {n: ts for n, ts in rest.items() if n in self.init.meta}
            if rest:
                fill(rest, self.init.values(set(rest)), narrow_rank)

    def fill_module(self, module: nn.Module, device_of: Callable[[str], torch.device],
                    name_of: Callable[[str], str] = lambda n: n, narrow_rank: int = 0) -> None:
        """A placement replica (the original module, maybe sharded or split) or this rank's
        pipeline stages (an nn.ModuleList of them; name_of: a stage's names -> the model's):
        storage for its meta tensors (device_of: the module holding them -> device), then
        values. A real model's tensors keep theirs unless the files hold them."""
        fresh = give_storage(module, device_of) if self.meta else set()
        targets = targets_of(module, self.canonical, name_of)
        targets = {n: [t for t in ts if id(t) in fresh or n in self.from_file]
                   for n, ts in targets.items()}
        self.fill({n: ts for n, ts in targets.items() if ts}, narrow_rank)

    # -- the two points of the recipe --
    def before_axes(self, spec: Any, module: nn.Module, cut: Any, rank: int) -> None:
        """Before placement or the pipeline runner: a whole DDP replica (DDP broadcasts
        rank 0's tensors: they must exist), or this rank's pipeline stages."""
        from ..profiler.stage_split import original_name
        from .calls import device_for
        from .layout import Layout

        layout = Layout.of(spec)
        replica, tp_rank = layout.replica_of(rank), layout.tp_rank_of(rank)
        if spec.mode == "pipeline":  # one ModuleList: a tensor two stages share stays one
            stage = layout.stage_of(rank)
            device = device_for(spec, spec.mesh[replica][stage] + tp_rank)
            # a meta cut's graphs name the meta device where the trace made tensors (arange,
            # .to(device)): set to the rank's (stage_split.StageCut.stage_on)
            self.fill_module(nn.ModuleList([cut.stage_on(s, device)
                                            for s in spec.stages_of(stage)]),
                             lambda _name: device, lambda n: original_name(n.split(".", 1)[1]),
                             tp_rank)
        elif spec.sharding == "none" and spec.tp == 1:
            self.fill_module(module, self._device_of(spec, module, replica, tp_rank))

    def after_axes(self, spec: Any, module: nn.Module, rank: int) -> bool:
        """After the axes of a sharded or tensor-parallel placement replica: the shards and
        slices this rank holds. True when it filled (the optimizer's parameters are new)."""
        from .layout import Layout

        if spec.mode == "pipeline" or (spec.sharding == "none" and spec.tp == 1):
            return False
        layout = Layout.of(spec)
        self.fill_module(module, self._device_of(spec, module, layout.replica_of(rank),
                                                 layout.tp_rank_of(rank)))
        return True

    @staticmethod
    def _device_of(spec: Any, module: nn.Module, replica: int, tp_rank: int
                   ) -> Callable[[str], torch.device]:
        """A placement replica's module name -> the device of the graph node holding it (the
        replica's first device for the root's own tensors), as placement.place moves them."""
        from ..profiler.block_list import split_call_name
        from .calls import device_for

        devices = [device_for(spec, g + tp_rank) for g in spec.mesh[replica]]
        nodes = {}
        for name, k in spec.assignment.items():
            name, call = split_call_name(name)
            if not call:
                nodes[name] = devices[k]

        def device_of(mod_name: str) -> torch.device:
            parts = mod_name.split(".") if mod_name else []
            for i in range(len(parts), 0, -1):
                found = nodes.get(".".join(parts[:i]))
                if found is not None:
                    return found
            return devices[0]
        return device_of
