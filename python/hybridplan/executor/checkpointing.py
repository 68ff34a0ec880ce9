"""An AppliedPlan's state, its role in the class (applied.py assembles the roles): the whole
model's state_dict on every rank, the consolidated checkpoint (gathered on rank 0, which writes
it: rank_agreement.rank_zero_acts), sharded checkpoints with torch.distributed.checkpoint
(sharded_checkpoint) and the Hugging Face export (hf_export)."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Union

import torch
import torch.distributed as dist

from . import checkpoint, hf_export, rank_agreement, sharded_checkpoint, sharding
from .pipeline import merge_states


class Checkpointing:
    """AppliedPlan's checkpointing role; the attributes it reads are set by AppliedPlan.__init__."""

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The whole model's state, keyed as the original module's state_dict, on every rank
        (pipeline: the stages' tensors gathered over the replica's ranks; sharded plans: each
        parameter gathered over the DP group; CPU copies). Collective: every rank calls it."""
        self._check_open("state_dict")
        if self.plan.mode == "placement":
            return sharding.full_cpu_state(self.original.state_dict(keep_vars=True))
        self._settle()
        parts: List[Optional[Dict[str, torch.Tensor]]] = [None] * self.plan.mp
        dist.all_gather_object(parts, self._runner.local_state(), group=self._replica_group)
        return merge_states(self.original, parts)


    def _param_names(self) -> Dict[int, str]:
        """id(parameter) -> canonical name, for this rank's parameters (a tied weight's copies
        on several stages share the name; a parameter-free stage's placeholder has none)."""
        if self.plan.mode == "placement":
            named = self.original.named_parameters(remove_duplicate=False)
        else:
            named = self._runner.named_parameters()
        return {id(p): self._aliases.get(name, name) for name, p in named}

    def _gather_parts(self) -> Optional[List[Any]]:
        """Replica 0's ranks' model states and optimizer states by name, gathered on rank 0 (a
        list, one entry per rank, None for ranks that contribute nothing); None on the other
        ranks. Collective: every rank must call it. A sharded plan's ranks all gather their
        full parameters and optimizer state first (DTensor.full_tensor is collective over the DP
        group), then replica 0's contribute as without sharding."""
        self._settle()
        part = None
        # sharded or TP plans: each parameter is a DTensor over a mesh with the other replicas
        # (FSDP2's), gathered whole by every rank of it
        if self.replica == 0 or self.plan.sharding != "none" or self.plan.tp > 1:
            model = (sharding.full_cpu_state(self.original.state_dict(keep_vars=True))
                     if self.plan.mode == "placement" else self._runner.local_state())
            part = {"model": model,
                    "optimizer": checkpoint.optimizer_state_by_name(self.optimizer,
                                                                     self._param_names())}
            if self.replica != 0 or self.tp_rank != 0:
                part = None  # gathered for replica 0's TP rank 0 ranks, which contribute it
        parts: Optional[List[Any]] = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(part, parts, dst=0)  # every rank has contributed once it returns
        return parts

    def _build_consolidated(self, parts: List[Any]) -> Dict[str, Any]:
        """The consolidated checkpoint (checkpoint.build) from _gather_parts' list (rank 0)."""
        mine = [p for p in parts if p is not None]
        return checkpoint.build(
            merge_states(self.original, [p["model"] for p in mine]),
            checkpoint.merge_optimizer_states([p["optimizer"] for p in mine]),
            self.step_count, self.plan.to_json(), self.plan.graph_sha256,
            checkpoint.scheduler_state(self._scheduler), checkpoint.scaler_state(self._scaler))

    def consolidated_state(self) -> Dict[str, Any]:
        """The whole training state in memory, on every rank, as save_checkpoint writes it
        (docs/formats.md "Checkpoint": the model under the original module's state_dict keys,
        the optimizer state by parameter name, step, plan). Collective: every rank must call
        it; rank 0 gathers and broadcasts it."""
        self._check_open("consolidated_state")
        parts = self._gather_parts()
        return rank_agreement.rank_zero_acts(
            lambda: self._build_consolidated(parts), rank_agreement.rank_zero_error(
                lambda why: f"hybridplan: the training state could not be gathered (rank 0: "
                            f"{why})"))

    def save_checkpoint(self, path: Union[str, os.PathLike]) -> None:
        """Writes one consolidated checkpoint to `path` (docs/formats.md "Checkpoint"): the
        whole model under the original module's state_dict keys, the optimizer state keyed by
        parameter name, step_count, the plan and its graph hash. Every rank must call it (it is
        collective); replica 0's ranks contribute their parts (_gather_parts), rank 0 writes.
        Atomic: the file at `path` is the previous one until the new one is complete (see
        checkpoint). Raises RuntimeError on every rank if the write failed."""
        self._check_open("save_checkpoint")
        path = os.fspath(path)
        parts = self._gather_parts()
        rank_agreement.rank_zero_acts(
            lambda: checkpoint.write_atomic(self._build_consolidated(parts), path),
            rank_agreement.rank_zero_error(
                lambda why: f"{path}: checkpoint not written (rank 0: {why}); the previous "
                            f"file, if any, is unchanged"))

    def save_sharded(self, directory: Union[str, os.PathLike, None] = None, *,
                     async_save: bool = False, keep: int = 2, extra: Any = None
                     ) -> Optional[str]:
        """Writes a sharded checkpoint with torch.distributed.checkpoint to
        `<directory>/step-<step_count>/` (default directory: apply's checkpoint_dir): every rank
        writes its own part in parallel, and a manifest of every file's size and sha256 is
        written last (docs/checkpoints.md; sharded_checkpoint). `keep`: the newest checkpoints
        kept (0: all). `extra`: any picklable object (say, the data loader's position), given
        back as hp.resumed_extra on resume; rank 0's is kept. Collective.

        async_save: the state is copied to CPU memory and written by a thread while training
        goes on; the checkpoint becomes complete (manifest, final name) at the next
        save_sharded, wait_checkpoint() or close(). Returns the completed checkpoint's path:
        this one's when synchronous, else the previous asynchronous one's if this call
        completed it (None otherwise). Raises RuntimeError on every rank if a write failed;
        the checkpoints already complete are left as they were."""
        self._check_open("save_sharded")
        self._settle()
        if directory is None:
            directory = self.checkpoint_dir
        if directory is None:
            raise ValueError("save_sharded: directory must be given (or apply's checkpoint_dir)")
        if not isinstance(keep, int) or keep < 0:
            raise ValueError(f"save_sharded: keep must be an int >= 0 (got {keep!r})")
        completed = self.wait_checkpoint()
        started = time.perf_counter()
        pending = sharded_checkpoint.begin(self, os.fspath(directory), self._mesh.world_group(),
                                           async_save, extra)
        pending.keep = keep
        pending.stall_s = time.perf_counter() - started
        self.last_save_stall_s = pending.stall_s
        self._pending_save = pending
        if not async_save:
            return self.wait_checkpoint()
        return completed

    def wait_checkpoint(self) -> Optional[str]:
        """Completes the asynchronous save in flight, if any (waits for every rank's write,
        writes the manifest, gives the directory its final name); returns its path. Collective."""
        pending, self._pending_save = getattr(self, "_pending_save", None), None
        if pending is None:
            return None
        return sharded_checkpoint.finalize(pending, self._mesh.world_group(), pending.keep)

    def export_pretrained(self, directory: Union[str, os.PathLike], **kw: Any) -> None:
        """Writes the trained model to `directory` as a Hugging Face checkpoint (config.json +
        model.safetensors) that from_pretrained loads; the original module must be a
        transformers.PreTrainedModel. Collective, atomic: see hf_export.export_pretrained."""
        hf_export.export_pretrained(self, directory, **kw)
