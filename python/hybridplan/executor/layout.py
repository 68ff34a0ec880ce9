"""Where each process of a plan sits, and the process groups it talks over: one object per plan.

A plan's processes form one named grid, outermost dimension first (docs/formats.md "Plan";
the rank is the row-major index, as torch's init_device_mesh numbers it):

    placement  ("dp", "tp")                        rank = r * tp + t
    pipeline   ("dp", "pp", "tp")                  rank = (r * mp + k) * tp + t
    hybrid sharding (HSDP, dp_shard < dp): "dp" is ("dp_replicate", "dp_shard"), replica
               r = i * dp_shard + j; replicas with the same i shard among themselves, those with
               the same j all-reduce their shards (FSDP2 on a 2-D mesh: replicate over its first
               dimension, shard over its second).

r is the replica (0..dp-1), k the pipeline rank within it (0..mp-1: which stages it holds is
the schedule's, Plan.stage_ranks), t the TP rank (0..tp-1). "tp" is left out when tp == 1;
a placement plan has no "pp" (one process runs all its replica's devices).

Every group a rank needs is a slice of that grid: its data-parallel group is the "dp" slice
through it (the replicas of its pipeline rank and TP rank), its pipeline the "pp" slice, its TP
group the "tp" slice. Two groups are derived from it rather than sliced: the ranks holding the
copies of a tied parameter on different pipeline ranks (a subset of a "pp" slice) and the whole
world for the sharded checkpoint's writer thread. `Layout` is the arithmetic alone (no process
group; unit-tested against every plan shape); `Layout.build` creates the groups with one
init_device_mesh, and `Mesh` holds them until close() or a switch destroys them.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

# Each built mesh's dimension names carry a serial of their own. DeviceMesh equality (and
# hash) compares ranks, device type and dimension names, not the process groups, and DTensor
# caches each op's output layout, mesh included, by its inputs' layouts: with the same names, a
# plan applied after another over the same ranks was closed got tensors on the closed plan's
# mesh from that cache (`detach()` of a parameter, the optimizer's `zeros_like`), whose
# collectives then failed on the destroyed group ("Could not resolve the process group
# registered under the name 1").
_serial = itertools.count()


@dataclasses.dataclass(frozen=True)
class Layout:
    """The process grid of one plan: its dimensions' names and sizes, outermost first."""
    mode: str         # "placement" | "pipeline"
    dp: int
    mp: int
    tp: int = 1
    dp_shard: int = 0  # < dp: hybrid sharding splits "dp" in two; 0 or dp: one "dp"

    @classmethod
    def of(cls, plan: Any) -> "Layout":
        """The layout of a plan (a hybridplan Plan, or anything with its mode, dp, mp, tp,
        sharding and dp_shard)."""
        hybrid = plan.sharding != "none" and plan.dp_shard < plan.dp
        return cls(plan.mode, plan.dp, plan.mp, plan.tp, plan.dp_shard if hybrid else 0)

    # ---- the grid ---------------------------------------------------------------------------
    @property
    def hybrid(self) -> bool:
        return 0 < self.dp_shard < self.dp

    @property
    def dims(self) -> Tuple[Tuple[str, int], ...]:
        """(name, size) of each dimension, outermost first."""
        dims: List[Tuple[str, int]] = (
            [("dp_replicate", self.dp // self.dp_shard), ("dp_shard", self.dp_shard)]
            if self.hybrid else [("dp", self.dp)])
        if self.mode == "pipeline":
            dims.append(("pp", self.mp))
        if self.tp > 1:
            dims.append(("tp", self.tp))
        return tuple(dims)

    @property
    def world_size(self) -> int:
        size = 1
        for _, n in self.dims:
            size *= n
        return size

    def grid(self) -> torch.Tensor:
        """The ranks laid out on the grid (init_device_mesh's rank map)."""
        return torch.arange(self.world_size).reshape([n for _, n in self.dims])

    def rank_lists(self, dims: Sequence[str]) -> List[List[int]]:
        """The groups along `dims` (one name, or several flattened, such as the two of "dp"
        under hybrid sharding): every slice of the grid through them, each in grid order, as
        init_device_mesh creates them."""
        names = [n for n, _ in self.dims]
        missing = [d for d in dims if d not in names]
        if missing:
            raise ValueError(f"layout: dims must be among {names} (got {missing})")
        axes = [names.index(d) for d in dims]
        grid = self.grid()
        rest = [i for i in range(grid.dim()) if i not in axes]
        size = 1
        for a in axes:
            size *= grid.shape[a]
        return grid.permute(rest + axes).reshape(-1, size).tolist()

    @property
    def dp_dims(self) -> Tuple[str, ...]:
        """The dimensions the data-parallel group spans."""
        return ("dp_replicate", "dp_shard") if self.hybrid else ("dp",)

    # ---- one rank ---------------------------------------------------------------------------
    @property
    def _per_replica(self) -> int:
        return (self.mp if self.mode == "pipeline" else 1) * self.tp

    def replica_of(self, rank: int) -> int:
        return rank // self._per_replica

    def stage_of(self, rank: int) -> int:
        """Pipeline rank of `rank` within its replica, 0..mp-1 (0 in placement mode, where a
        process holds all stages)."""
        return 0 if self.mode == "placement" else (rank // self.tp) % self.mp

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp

    def rank_of(self, replica: int, stage: int = 0, tp_rank: int = 0) -> int:
        """Process rank of pipeline rank `stage` (0 in placement mode) of `replica`, TP rank
        `tp_rank`."""
        return (replica * (self.mp if self.mode == "pipeline" else 1) + stage) * self.tp \
            + tp_rank

    def dp_group_ranks(self, stage: int = 0, tp_rank: int = 0) -> List[int]:
        """The ranks of pipeline rank `stage`, TP rank `tp_rank`, in every replica, in replica
        order: they hold the same stages (the same slice of them)."""
        return [self.rank_of(r, stage, tp_rank) for r in range(self.dp)]

    def tp_group_ranks(self, replica: int, stage: int = 0) -> List[int]:
        return [self.rank_of(replica, stage, t) for t in range(self.tp)]

    def replica_ranks(self, replica: int, tp_rank: int = 0) -> List[int]:
        """TP rank `tp_rank`'s pipeline of `replica`: its ranks in pipeline-rank order."""
        return [self.rank_of(replica, k, tp_rank) for k in range(self.mp)]

    def tied_rank_lists(self, holders: Sequence[int]) -> List[List[int]]:
        """Per replica and TP rank (in that order), the ranks at pipeline ranks `holders` (those
        holding a copy of one tied parameter)."""
        return [[self.rank_of(r, k, t) for k in holders]
                for r in range(self.dp) for t in range(self.tp)]

    # ---- the process groups -----------------------------------------------------------------
    def build(self, timeout: datetime.timedelta, device_type: Optional[str] = None) -> "Mesh":
        """The process groups of this layout (collective: every rank calls it, with the same
        layout), created by one init_device_mesh over the grid, plus the flattened
        data-parallel dimension under hybrid sharding. Groups of their own, never the default
        group (which the user may own): close() must be able to destroy every group whose
        Gloo threads ran the plan's collectives."""
        device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
        serial = next(_serial)
        names = {n: f"{n}{serial}" for n, _ in self.dims}
        # options are the only way to give init_device_mesh's groups a timeout; a backend named
        # also keeps a dimension spanning the world from reusing the default group
        override = {names[n]: (dist.get_backend(), _options(device_type, timeout))
                    for n, _ in self.dims}
        root = init_device_mesh(device_type, tuple(n for _, n in self.dims),
                                mesh_dim_names=tuple(names[n] for n, _ in self.dims),
                                backend_override=override)
        return Mesh(self, root, names, serial, timeout)


def _options(device_type: str, timeout: datetime.timedelta) -> Any:
    """The backend options of a group with `timeout` (NCCL's for CUDA: a "cpu:gloo,cuda:nccl"
    group hands them to NCCL, and Gloo takes the timeout alone)."""
    options = (dist.ProcessGroupNCCL.Options() if device_type == "cuda"
               else dist.ProcessGroupGloo._Options())
    options._timeout = timeout
    return options


class Mesh:
    """A layout's live process groups on this rank (Layout.build). `root` is the named
    DeviceMesh; dp(), pp_group(), tp(), dp_tp() and hsdp() are its slices through this rank.
    `groups` lists every group created here, for close() and switches to destroy."""

    def __init__(self, layout: Layout, root: Any, names: Dict[str, str], serial: int,
                 timeout: datetime.timedelta):
        self.layout, self.root, self._names, self._timeout = layout, root, names, timeout
        self.groups: List[Any] = list(root.get_all_groups())
        if layout.hybrid:  # the data-parallel group: both dimensions flattened
            self._dp = root[tuple(names[d] for d in layout.dp_dims)]._flatten(
                f"dp{serial}", backend_override=(dist.get_backend(),
                                                _options(root.device_type, timeout)))
            self.groups.append(self._dp.get_group())
        else:
            self._dp = root[names["dp"]]
        self._world: Any = None

    def dp(self) -> Any:
        """This rank's data-parallel dimension (1-D DeviceMesh): the replicas of its pipeline
        rank and TP rank."""
        return self._dp

    def dp_group(self) -> Any:
        return self._dp.get_group()

    def hsdp(self) -> Any:
        """Hybrid sharding's 2-D (replicate, shard) mesh through this rank."""
        return self.root[tuple(self._names[d] for d in ("dp_replicate", "dp_shard"))]

    def pp_group(self) -> Any:
        """This rank's pipeline (its TP rank's, of its replica)."""
        return self.root.get_group(self._names["pp"])

    def tp(self) -> Any:
        """This rank's tensor-parallel dimension (1-D DeviceMesh)."""
        return self.root[self._names["tp"]]

    def dp_tp(self) -> Any:
        """The 2-D (dp, tp) mesh of this rank's pipeline rank: tensor parallelism over "tp",
        data parallelism (FSDP2's replicate or fully_shard) over "dp"."""
        return self.root[(self._names["dp"], self._names["tp"])]

    def tied_group(self, holders: Sequence[int]) -> Any:
        """The group of this rank's replica and TP rank at pipeline ranks `holders` (creates
        one per replica and TP rank: collective, in the same order on every rank)."""
        rank = dist.get_rank()
        mine = None
        for ranks in self.layout.tied_rank_lists(holders):
            group = dist.new_group(ranks, timeout=self._timeout)
            self.groups.append(group)
            if rank in ranks:
                mine = group
        return mine

    def world_group(self) -> Any:
        """A group of every rank (made on first use; collective): the sharded checkpoint's
        writer thread runs its collectives there, apart from the training's groups."""
        if self._world is None:
            self._world = dist.new_group(list(range(self.layout.world_size)),
                                         timeout=self._timeout)
            self.groups.append(self._world)
        return self._world
